"""Files that appear whole or not at all: :func:`atomic_output` and the snarkjs-style :func:`write_json`.

Standard library only, so that a process that just writes a proof it received (``cuzk-mp client
prove``) imports neither numpy nor the curve arithmetic that reading these formats needs.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any


@contextmanager
def atomic_output(path: str | os.PathLike[str], mode: str = "wb") -> Iterator[IO[Any]]:
    """Open a uniquely named temporary file next to ``path``; rename it onto ``path`` on success.

    Readers never see half a file, and a failed write leaves nothing behind.
    The file is created with ``open(..., "x")``, so the umask applies as usual.
    """
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        with open(tmp, mode.replace("w", "x")) as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as snarkjs does (bfj, ``space: 1``): one-space indent, no trailing newline.

    Byte-identical to snarkjs's output except for empty arrays/objects (bfj
    writes them over two lines, we write ``[]``); the JSON is equal.
    """
    text = json.dumps(obj, indent=1)
    with atomic_output(path, "wb") as f:
        f.write(text.encode("utf-8"))
