"""Where cuzk-mp keeps files that outlive a process: the cache of generated development keys.

One function decides it, so the CLI, the benchmark and the daemon's defaults agree:
``$CUZK_MP_CACHE`` if set, else ``$XDG_CACHE_HOME/cuzk-mp`` (the XDG base directory
specification; a relative ``XDG_CACHE_HOME`` is ignored, as the specification says), else
``~/.cache/cuzk-mp``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

APP = "cuzk-mp"
CACHE_ENV = "CUZK_MP_CACHE"


def default_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The cache folder for development keys (not created here); see the module docstring."""
    env = os.environ if environ is None else environ
    own = env.get(CACHE_ENV, "")
    if own:
        return Path(own).expanduser()
    xdg = env.get("XDG_CACHE_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / APP
    home = env.get("HOME") or str(Path.home())
    return Path(home) / ".cache" / APP
