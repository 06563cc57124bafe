"""Single-instance safety: one daemon per journal (and per unix socket) at a time.

A daemon takes an exclusive ``flock`` on ``<journal>.lock`` (and, for a unix-socket listener,
``<socket>.lock``), and binds the abstract unix socket ``cuzk-mp-shm:<prefix>`` for its shm
prefix, before it touches anything else: the status port, the journal, the engine, its shared
memory or its socket. A second daemon started with the same config (or one sharing the journal,
the socket or the shm prefix) therefore finds a lock taken and exits at once with
:class:`AlreadyRunning`, naming the holder's pid, having changed nothing; the first one never
notices. Both kinds of lock belong to the process's open files, so they go away with it, however
it dies (SIGKILL included): no stale lock can block a restart. The lock files are left in place on
exit; they hold the pid of the last daemon that took them, for messages only (none, where the disk
was full). Only a process that holds a lock unlinks its file (a gone warm daemon's files are removed
so, :mod:`.warm`), and :func:`try_lock` opens the name again where the file it locked is no longer
the one there, so two daemons never each hold the lock of their own file of one name. The abstract
socket leaves no file at all (so nothing in /dev/shm); it is per network namespace, which daemons
sharing /dev/shm share too in the usual setups. A journal path that is a symlink is locked beside
the file it leads to as well (:func:`lock_paths`): another config may name that file itself.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import stat
import struct
from pathlib import Path

from cuzk_mp.errors import ConfigError, CuzkError


class AlreadyRunning(CuzkError):
    """Another daemon holds the lock of this journal or socket."""


class InstanceLock:
    """Exclusive locks on a set of lock files, held until :meth:`release` or process exit."""

    def __init__(self, paths: list[Path], shm_prefix: str | None = None) -> None:
        self.paths = paths
        self.shm_prefix = shm_prefix
        self._fds: list[int] = []
        self._sock: socket.socket | None = None

    def acquire(self) -> None:
        """Take every lock, or none: AlreadyRunning (naming the holder) if one is taken."""
        try:
            for path in self.paths:
                self._fds.append(self._lock(path))
            if self.shm_prefix is not None:
                self._sock = self._bind(self.shm_prefix)
        except BaseException:
            self.release()
            raise

    @staticmethod
    def _bind(prefix: str) -> socket.socket:
        name = f"\0cuzk-mp-shm:{prefix}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(name)
            sock.listen(1)  # never accepted: a second daemon's connect only reads the holder's pid
        except OSError:
            sock.close()
            pid, uid = "unknown", None
            with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.settimeout(1.0)
                probe.connect(name)
                cred = struct.unpack("3i", probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                            struct.calcsize("3i")))
                pid, uid = str(cred[0]), cred[1]
            if uid is not None and uid != os.getuid():
                # the abstract namespace has no permissions: any local user may bind the name first. A
                # process of another user is no daemon of ours (its ring segments would be another
                # owner's), so say so: the operator must stop it or choose another prefix
                raise AlreadyRunning(f"the lock name of shm prefix {prefix!r} is held by pid {pid} of another "
                                     f"user (uid {uid}), not by a cuzk-mp daemon of this user (uid {os.getuid()}): "
                                     "it blocks this daemon's start; stop that process, or give this daemon "
                                     "another [pipeline] shm_prefix; this one exits without touching anything"
                                     ) from None
            raise AlreadyRunning(f"another cuzk-mp daemon (pid {pid}) already uses the shm prefix "
                                 f"{prefix!r}; this one exits without touching anything "
                                 "(give each daemon its own [pipeline] shm_prefix)") from None
        return sock

    @staticmethod
    def _lock(path: Path) -> int:
        fd = try_lock(path)
        if fd is None:
            raise AlreadyRunning(f"another cuzk-mp daemon (pid {_recorded_pid(path)}) already uses "
                                 f"{str(path).removesuffix('.lock')} (its lock {path} is held); "
                                 "this one exits without touching anything")
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                os.close(fd)
                raise
            # a full disk: the lock holds without the pid (recorded for messages only); what the
            # daemon writes next (the journal) says which folder is full
        except BaseException:
            os.close(fd)
            raise
        return fd

    def release(self) -> None:
        """Drop every lock held (idempotent)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        while self._fds:
            fd = self._fds.pop()
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def lock_paths(journal: Path, unix_sockets: list[str]) -> list[Path]:
    """The lock files of a daemon: beside its journal (and, for a journal path that is a symlink, beside
    the file it leads to too: another config may name that file itself) and beside each unix socket it
    binds."""
    journals = [journal, Path(os.path.realpath(journal))] if journal.is_symlink() else [journal]
    return [j.with_name(j.name + ".lock") for j in journals] + [Path(p + ".lock") for p in unix_sockets]


def check_lock_file(key: str, path: Path) -> None:
    """ConfigError naming ``key`` where a lock file of this daemon (:func:`lock_paths`) is there but is no
    regular file it can open: a link (refused as :func:`try_lock` refuses it), a folder, a FIFO (looked
    at, never waited on: :func:`~cuzk_mp.daemon.config.check_regular_file`). Nothing is changed: at
    ``daemon --check`` and at the start, before the lock is taken."""
    from cuzk_mp.daemon.config import check_regular_file

    if path.is_symlink():
        raise ConfigError(f"{key}: {path}: a symbolic link where the daemon keeps its lock file, which it does "
                          "not follow: remove it; the daemon makes the file itself")
    if os.path.lexists(path):
        check_regular_file(key, path)


REOPENS = 5  # a lock file replaced under each of this many locks in a row counts as held


def try_lock(path: Path) -> int | None:
    """A descriptor of the lock file ``path`` (made if missing) holding its exclusive lock, or None
    where another process holds it: never waits, writes nothing. ConfigError where ``path`` is a
    link (never followed: in a folder others may write, one could point it at any file we may
    write), not a regular file or another user's. A lock taken on a file that is no longer the one
    at ``path`` (its holder unlinked it meanwhile) is dropped and the name opened again."""
    for _ in range(REOPENS):
        fd = _open_lock_file(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        st = os.fstat(fd)
        try:
            now = os.lstat(path)
        except FileNotFoundError:
            now = None
        if now is not None and (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
            return fd
        os.close(fd)
    return None


def _open_lock_file(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise ConfigError(f"{path}: a symbolic link where the daemon keeps its lock file; refusing to "
                          "follow it (remove it)") from None
    st = os.fstat(fd)
    wrong = ("not a regular file" if not stat.S_ISREG(st.st_mode) else
             f"owned by uid {st.st_uid}" if st.st_uid != os.geteuid() else None)
    if wrong is not None:
        os.close(fd)
        raise ConfigError(f"{path}: the daemon's lock file is {wrong}; refusing to use it (remove it)")
    return fd


def _recorded_pid(path: Path) -> str:
    """The pid the lock file's last holder wrote (for messages; "unknown" if none can be read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return "unknown"
    try:
        return os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
    except OSError:
        return "unknown"
    finally:
        os.close(fd)
