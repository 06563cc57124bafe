"""Where cuzk-mp keeps files that outlive a process, and whether a place given for them can take them.

The cache of generated development keys: one function decides it, so the CLI, the benchmark
and the daemon's defaults agree:
``$CUZK_MP_CACHE`` if set, else ``$XDG_CACHE_HOME/cuzk-mp`` (the XDG base directory
specification; a relative ``XDG_CACHE_HOME`` is ignored, as the specification says), else
``~/.cache/cuzk-mp``. :func:`folder_problem` and :func:`output_file_problem` say, before any
work, why a folder or an output file given on the command line or in a config could not be
written (the daemon's journal and cache folders, the benchmark's outputs).
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


def folder_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a folder this process writes into (made first where missing: its
    nearest existing parent decides), or None if it can. A symbolic link on the way whose target
    is missing (or a loop) cannot be made into a folder: it is named, with where it leads; so is a
    path the system refuses to look at (a name longer than the file system takes)."""
    nearest = Path(path)
    try:
        while not nearest.exists() and nearest != nearest.parent:
            if nearest.is_symlink():
                return f"{nearest} is a symbolic link that leads nowhere ({os.readlink(nearest)})"
            nearest = nearest.parent
    except OSError as exc:
        return f"{nearest} cannot be a folder: {exc.strerror or exc}"
    if not nearest.is_dir():
        return f"{nearest} is not a folder"
    if not os.access(nearest, os.W_OK | os.X_OK):
        return f"{nearest} is not writable (a read-only file system, or no write permission)"
    return None


def output_file_problem(path: Path, *, folder_made: bool = True) -> str | None:
    """Why ``path`` cannot be an output file (a folder in the way, or its folder unusable; without
    ``folder_made``, for a writer that makes no folder, a missing one too), or None."""
    if Path(path).is_dir():  # "" too: Path("") is the current folder
        return "is a folder"
    folder = Path(path).absolute().parent
    problem = folder_problem(folder)
    if problem is None and not folder_made and not folder.is_dir():
        return f"no such folder: {folder}"
    return problem
