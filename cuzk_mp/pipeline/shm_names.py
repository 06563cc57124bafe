"""The /dev/shm names of slot rings: listing them, their sizes, and removing what dead processes left.

Every ring (:mod:`.ring`) is named ``<prefix>.<8 hex digits>``: an engine's prefix and a token drawn
for that ring alone, its objects ``/<ring>-ctl``, ``/<ring>-free``, ``/<ring>-ready`` and
``/<ring>-<slot>``. Names are matched exactly (:func:`shm_entries`): the prefix ``cuzk`` never claims
``cuzk-x``'s objects.

Leftovers of a process killed before any child existed (right after it made the ring, say) have
nobody to remove them, so a new ring removes them (:func:`remove_abandoned`): the control block
records the process that made the ring (pid, start time, pid namespace: :func:`stamp`, written before
the semaphores exist), and a new ring removes every ring of this user whose maker is gone, whatever
its prefix (``cuzk-<pid>``, the default one, is never used again), plus what its own prefix's
earlier rings left without a readable owner. It never touches another user's objects, nor the
ring of a live process (one whose pid runs with the same start time), nor one made in another
pid namespace (its pid says nothing here, even where it is this process's own: two benches in two
containers that share /dev/shm may run as the same pid, so with the same prefix).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence

import posix_ipc

SHM_DIR = "/dev/shm"
MAGIC = 0x676E6972_6B7A7563  # b"cuzkring" little-endian: word 0 of a ring's control block
HEADER_WORDS = 16  # u64 words of the control block's header (the ring's counters and its maker)
_OWNER_PID, _OWNER_START, _OWNER_PIDNS = 10, 11, 12  # the process that made the ring (see remove_abandoned)
# A control block without the magic (an older version's, or one whose maker has not written its header yet:
# microseconds after it exists) is taken for abandoned only once it is this old.
UNSTAMPED_GRACE_S = 60.0


def _statvfs(path: str) -> os.statvfs_result | None:
    """The file system figures at ``path``, or None where they cannot be read."""
    try:
        return os.statvfs(path)
    except OSError:
        return None


def shm_space(path: str = SHM_DIR) -> tuple[int, int] | None:
    """Free and total bytes of the tmpfs the ring lives in (/dev/shm: a container's may be 64 MiB), or
    None where it cannot be read."""
    st = _statvfs(path)
    return None if st is None else (st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize)


def shm_full(what: str) -> str:
    """The message of a ring object the shared-memory tmpfs has no room for (exit code 4): its free
    bytes, or that it has no inode left for another file (tmpfs ``nr_inodes``: bytes to spare then)."""
    st = _statvfs(SHM_DIR)
    room = "" if st is None else \
        f": {st.f_bavail * st.f_frsize / 2**20:.1f} MiB free of {st.f_blocks * st.f_frsize / 2**20:.1f} MiB"
    if st is not None and st.f_favail == 0 < st.f_files:
        return (f"{SHM_DIR} has no room for {what}{room}, but no file can be made there: all of its {st.f_files} "
                "inodes are in use (remove what other programs left there, or mount it with a larger nr_inodes)")
    return (f"{SHM_DIR} has no room for {what}{room} (give it more, e.g. a container's --shm-size, or fewer "
            "ring slots)")


TOKEN_BYTES = 4
_OBJECTS = r"-(?:ctl|free|ready|(?P<slot>\d+))"


def _names_of(prefix: str) -> re.Pattern[str]:
    """The /dev/shm names (semaphores as ``sem.<name>``) of a ring (``prefix`` holds its token) or of
    every ring of an engine prefix (tokens, and the token-less names of older versions)."""
    ring = re.escape(prefix) if "." in prefix else rf"{re.escape(prefix)}(?:\.[0-9a-f]{{{2 * TOKEN_BYTES}}})?"
    return re.compile(rf"(?:sem\.)?{ring}{_OBJECTS}")


def _matches(prefix: str) -> list[re.Match[str]]:
    """The /dev/shm names of ``prefix`` (:func:`_names_of`), matched, in name order."""
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    pattern = _names_of(prefix)
    return [m for m in map(pattern.fullmatch, sorted(names)) if m is not None]


def shm_entries(prefix: str) -> list[str]:
    """Names in /dev/shm that belong to ``prefix`` (a ring's name, or an engine prefix: all its rings):
    segments, control block and ``sem.`` semaphores, matched exactly."""
    return [m.string for m in _matches(prefix)]


def shm_bytes(prefix: str) -> int:
    """Bytes of tmpfs memory held by ``prefix``'s shm objects (allocated blocks, not logical size)."""
    total = 0
    for name in shm_entries(prefix):
        try:
            total += os.stat(os.path.join(SHM_DIR, name)).st_blocks * 512
        except FileNotFoundError:
            continue
    return total


def live_segments(prefix: str) -> int:
    """How many slot segments of ``prefix`` exist right now (from /dev/shm; at most the ring's slots)."""
    return sum(1 for m in _matches(prefix) if m["slot"] is not None)


def cleanup_stale(prefix: str) -> list[str]:
    """Unlink every shm segment and semaphore of ``prefix`` (a ring, or every ring of an engine
    prefix: :func:`shm_entries`) that is this user's; returns what was removed. For a ring its
    owner ends, or one whose maker is known to be gone; :func:`remove_abandoned` decides that."""
    return _unlink_own(shm_entries(prefix))


def _unlink_own(names: Sequence[str]) -> list[str]:
    """Unlink the /dev/shm entries ``names`` that this user owns; the ones removed. Another user's
    are left alone, also where this process could remove them (root; /dev/shm is sticky)."""
    removed = []
    for name in names:
        try:
            if os.lstat(os.path.join(SHM_DIR, name)).st_uid != os.geteuid():
                continue
            if name.startswith("sem."):
                posix_ipc.unlink_semaphore("/" + name[4:])
            else:
                posix_ipc.unlink_shared_memory("/" + name)
            removed.append(name)
        except (FileNotFoundError, posix_ipc.ExistentialError, posix_ipc.PermissionsError):
            continue
    return removed


# Any ring's objects, whatever its prefix (the engine's config allows 1-40 of [A-Za-z0-9_-]).
_ANY_RING = re.compile(rf"(?:sem\.)?(?P<ring>[A-Za-z0-9_-]{{1,64}}\.[0-9a-f]{{{2 * TOKEN_BYTES}}}){_OBJECTS}")


def remove_abandoned(prefix: str | None) -> list[str]:
    """Unlink what killed processes left in /dev/shm, as a new ring of ``prefix`` starts; returns
    what was removed (the module docstring says why and what is spared).

    Removed, of this user's objects only: every ring (any prefix) whose control block names a
    maker that is gone (no such pid, or a pid reused by a later process); and of ``prefix``'s own
    rings, also those made by this process (its pid in this pid namespace; one live engine per prefix
    and process: the engine's check) and those without a readable maker (semaphores or segments whose control block is
    gone, a control block older than :data:`UNSTAMPED_GRACE_S` without the magic, names of a
    version without tokens). ``prefix`` None: the rings whose maker is gone alone (``cuzk-mp shm
    clean``, for a ring that no later start of an engine of this user would remove).
    """
    try:
        names = sorted(os.listdir(SHM_DIR))
    except FileNotFoundError:
        return []
    own = _names_of(prefix) if prefix is not None else None
    rings: dict[str, list[str]] = {}
    untokened = []
    for name in names:
        m = _ANY_RING.fullmatch(name)
        if m is not None:
            rings.setdefault(m["ring"], []).append(name)
        elif own is not None and own.fullmatch(name):
            untokened.append(name)
    doomed = [n for ring, entries in rings.items()
              if _abandoned(ring, own is not None and own.fullmatch(f"{ring}-ctl") is not None) for n in entries]
    return _unlink_own(doomed + untokened)


def _abandoned(ring: str, of_prefix: bool) -> bool:
    """Whether ring ``ring``'s maker is gone (see :func:`remove_abandoned`); ``of_prefix``: the ring
    is of the prefix of the ring being made."""
    try:
        fd = os.open(os.path.join(SHM_DIR, f"{ring}-ctl"), os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return of_prefix  # no control block: a ring half removed, or not ours to judge
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        head = os.pread(fd, 8 * HEADER_WORDS, 0)
    finally:
        os.close(fd)
    if st.st_uid != os.geteuid():
        return False
    if len(head) < 8 * HEADER_WORDS or int.from_bytes(head[:8], "little") != MAGIC:
        return of_prefix and time.time() - st.st_mtime > UNSTAMPED_GRACE_S
    word = [int.from_bytes(head[8 * i : 8 * i + 8], "little") for i in (_OWNER_PID, _OWNER_START, _OWNER_PIDNS)]
    pid, start, pidns = word
    if pid == 0:  # made by a version that recorded no owner
        return of_prefix
    if pidns != _pid_namespace():
        # its pid means nothing here: the maker may well live, even where its pid is this process's (two
        # containers sharing /dev/shm, each a bench of the same pid, so of the same prefix)
        return False
    if pid == os.getpid():
        return of_prefix
    return not _alive(pid, start)


def stamp(fd: int, n_slots: int) -> None:
    """Write the header of a new control block: the magic, the slot count and its maker."""
    words = {0: MAGIC, 1: n_slots, _OWNER_PID: os.getpid(), _OWNER_START: _start_time(os.getpid()) or 0,
             _OWNER_PIDNS: _pid_namespace()}
    for i, value in words.items():
        os.pwrite(fd, value.to_bytes(8, "little"), 8 * i)


def _alive(pid: int, start: int) -> bool:
    """Whether process ``pid`` runs and is the one that started at ``start`` (0: unknown)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    now = _start_time(pid)
    return not start or now is None or now == start


def _start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, /proc/<pid>/stat field 22), None where unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat_line = f.read()
        return int(stat_line[stat_line.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _pid_namespace() -> int:
    """This process's pid namespace (the inode of /proc/self/ns/pid; 0 where unreadable)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0
