"""Where cuzk-mp keeps files that outlive a process, and whether a place given for them can take them.

The cache of generated development keys: one function decides it, so the CLI, the benchmark
and the daemon's defaults agree:
``$CUZK_MP_CACHE`` if set, else ``$XDG_CACHE_HOME/cuzk-mp`` (the XDG base directory
specification; a relative ``XDG_CACHE_HOME`` is ignored, as the specification says), else
``~/.cache/cuzk-mp``. :func:`folder_problem` and :func:`output_file_problem` say, before any
work, why a folder or an output file given on the command line or in a config could not be
written (the daemon's journal and cache folders, the benchmark's outputs). :class:`FileArg` is the
type of every file and folder argument of the command line: what no verb can take is refused there.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
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
    path the system refuses to look at (a name longer than the file system takes). Writable means a
    file could be made there (:func:`_probe_problem`), not only that the permission bits allow it."""
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
    return _probe_problem(nearest)


def _probe_problem(folder: Path) -> str | None:
    """Why no file can be made in the existing ``folder`` (one made and removed at once), or None.
    The permission bits do not say it for root, whom they let through (``/proc``, a file system
    that refuses new files): only a file made there does, before the work, not after it."""
    try:
        fd, name = tempfile.mkstemp(prefix=f".{APP}-probe-", dir=folder)
    except OSError as exc:
        return f"{folder} is not writable (a file made there to try it failed: {exc.strerror or exc})"
    os.close(fd)
    with contextlib.suppress(OSError):  # removed by whoever can; a file left there is no reason to refuse
        os.unlink(name)
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


@dataclass(frozen=True)
class FileArg:
    """The type of a file (or folder) argument: the Path given, refusing what no verb can take:
    an empty name, ``-``, a file's name with a trailing slash and a ``~`` that no shell expanded
    (README: "Proving like snarkjs").

    ``what`` names the file in the refusals ("the proving key"); ``stream`` is the path that reads or
    writes the standard stream where the verb takes one there (/dev/stdin for a JSON input,
    /dev/stdout for an output written in place: :func:`~.formats.atomic.atomic_output`)."""

    what: str
    output: bool = False
    stream: str = ""
    folder: bool = False  # the argument is a folder, which a trailing slash may name

    def __call__(self, value: str) -> Path:
        """``value`` as a Path; argparse reports the ArgumentTypeError of one refused, naming the argument."""
        if not value:  # an unset shell variable (``g16p "$KEY" ...``): as a Path, the current folder (".")
            raise argparse.ArgumentTypeError("an empty file name (an unset variable?)")
        if "\0" in value:  # no command line carries one; cli.main's caller may (the open said "embedded null byte")
            raise argparse.ArgumentTypeError(f"{value!r}: a NUL byte in a file name")
        if value == "-":  # snarkjs opens a file named "-"; here it would be one in the working folder
            std = "output" if self.output else "input"
            how = f" ({self.stream} {'writes to' if self.output else 'reads'} standard {std})" if self.stream else ""
            raise argparse.ArgumentTypeError(f"- (standard {std}) is not accepted for the {self.what}: "
                                             f"give a path{how}")
        home = os.path.expanduser(value)
        if home != value and not os.path.lexists(value.split("/", 1)[0]):  # "~" or "~user": no such folder here
            raise argparse.ArgumentTypeError(f"{value}: the shell did not expand its ~: give {home} (no shell "
                                             "expands a ~ after --option= or in quotes)")
        path = Path(value)  # "k.zkey/" and "k.zkey/." are Path("k.zkey"): the slash that says "a folder" is gone
        if not self.folder and value.endswith(("/", "/.")) and not os.path.isdir(value):
            # POSIX refuses such a name for a file (ENOTDIR); the Path would have opened or written the file
            which = f"{path} is a file" if os.path.exists(path) else f"the {self.what} is a file"
            raise argparse.ArgumentTypeError(f"{value}: names a folder, but {which}")
        return path
