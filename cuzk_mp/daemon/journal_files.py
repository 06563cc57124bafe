"""The journal's files on disk, as the daemon finds them before SQLite opens the journal.

Beside the journal SQLite keeps a write-ahead log, its shared-memory index and, at times, a rollback
journal (:func:`side_paths`: beside the file a journal link leads to); the daemon keeps the journal's
identity in ``<journal>.id`` (:func:`marker_path`) and its instance lock beside it. This module says
what each of them must be (:func:`check_start_files`: a regular file or nothing, found without
waiting on a FIFO) and gives a journal of an earlier release the owner-only modes (:func:`owner_only`).
:mod:`.journal` opens the journal once these hold.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from cuzk_mp.daemon.config import check_regular_file
from cuzk_mp.daemon.instance_lock import check_lock_file, lock_paths
from cuzk_mp.errors import ConfigError
from cuzk_mp.paths import folder_problem

log = logging.getLogger("cuzk_mp.daemon.journal")


def marker_path(path: Path) -> Path:
    """Where the journal's identity is kept (the id of the journal first made at ``path``)."""
    return path.with_name(path.name + ".id")


def side_paths(path: Path) -> tuple[Path, Path, Path]:
    """The journal's write-ahead log, its shared-memory index and its rollback journal (which SQLite
    looks for, and reads where it is there, at the first read of a journal that has pages), where SQLite
    keeps them: beside the file ``path`` leads to (SQLite follows a link to the database, and names
    these after the file)."""
    real = os.path.realpath(path)
    return Path(f"{real}-wal"), Path(f"{real}-shm"), Path(f"{real}-journal")


def check_start_files(path: Path, key: str = "daemon.journal") -> None:
    """ConfigError naming ``key``, the file and what it is where a file the journal opens at start is
    there but is no regular file this process can open: the journal (SQLite says "unable to open
    database file" or "disk I/O error" of a folder, a FIFO or a device), its -wal, -shm and -journal
    (which SQLite opens without following a link: a link there fails as "unable to open database
    file"; SQLite waits for ever on a FIFO at the -journal), its .id. A FIFO is looked at, never waited
    on (:func:`~cuzk_mp.daemon.config.check_regular_file`); nothing is changed. The folder SQLite makes
    the -wal and -shm in (beside the file a link leads to) must be one this process may write
    (:func:`~cuzk_mp.paths.folder_problem`): SQLite says "attempt to write a readonly database". The
    daemon's lock files beside the journal (:func:`~cuzk_mp.daemon.instance_lock.lock_paths`, taken before
    the journal is opened) are held to the same rule (:func:`~cuzk_mp.daemon.instance_lock.check_lock_file`)."""
    sides = side_paths(path)
    locks = lock_paths(path, [])
    problem = folder_problem(sides[0].parent)
    if problem is not None:
        raise ConfigError(f"{key}: {sides[0].parent} cannot be written (SQLite makes the journal's -wal and -shm "
                          f"there): {problem}")
    for p in (path, *sides, marker_path(path), *locks):
        if p in sides and p.is_symlink():
            raise ConfigError(f"{key}: {p}: a symbolic link, which SQLite does not follow there (it cannot "
                              "open the journal): remove it; SQLite makes the file itself")
        if p in locks:
            check_lock_file(key, p)
        elif os.path.lexists(p):
            check_regular_file(key, p)


def owner_only(path: Path) -> None:
    """Give a journal made by a release before owner-only journals (by the umask: 0644, or 0640 under
    the unit's UMask=0027) the mode a new one has, 0600, with its -wal and -shm: it holds the witnesses
    of unfinished jobs. A file this user may not change keeps its mode, with a warning."""
    for p in (path, *side_paths(path)[:2]):
        try:
            mode = stat.S_IMODE(p.stat().st_mode)
            if mode & 0o077:
                os.chmod(p, 0o600)
                log.warning("[start] journal %s: %s was mode %04o, readable by others (made by an earlier release); "
                            "now 0600: it holds the witnesses of unfinished jobs", path, p.name, mode)
        except FileNotFoundError:
            continue
        except OSError as e:
            log.warning("[start] journal %s: %s is readable by others and its mode cannot be changed (%s); "
                        "it holds the witnesses of unfinished jobs", path, p.name, e.strerror or e)
