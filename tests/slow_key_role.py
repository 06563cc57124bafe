"""The prover role with a key load that takes a minute (spawned in place of
``cuzk_mp.pipeline.prover_proc``): a process busy loading or generating its key, whose
reader thread takes no engine message meanwhile, as a large key's load keeps it."""

from __future__ import annotations

import time
from typing import Any

from cuzk_mp.pipeline import prover_proc
from cuzk_mp.pipeline.key_cache import KeyCache


def main(ctx: Any, payload: Any) -> None:
    """The real prover, its preloads each a minute long."""
    real = KeyCache.preload

    def slow(self: KeyCache, ref: Any) -> None:
        time.sleep(60)
        real(self, ref)

    KeyCache.preload = slow  # type: ignore[method-assign]
    prover_proc.main(ctx, payload)
