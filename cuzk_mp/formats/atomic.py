"""Files that appear whole or not at all: :func:`atomic_output` and the snarkjs-style :func:`write_json`;
:func:`refuse_outputs_over_inputs`, which keeps an output from replacing an input (and refuses one
that has no folder to be written in) before any work; and
:func:`read_at_most`, an input's bytes read within a limit, whatever the file (a pipe has no size).

Standard library only (and the exception classes and :mod:`cuzk_mp.paths`), so that a process that
just writes a proof it received (``cuzk-mp client prove``) imports neither numpy nor the curve
arithmetic that reading these formats needs.

What an output path may be, and what happens to it:

* nothing yet, or a regular file: the bytes go to a temporary file in the same folder, renamed
  onto the path once whole. A file that was there keeps its permission bits (a witness made
  private with ``chmod 600`` stays private) and, where this process may set it, its owner; its
  other hard links keep the old contents, as with any replacement by rename.
* a symbolic link: the file it points to is written, as above; the link stays a link.
* a FIFO, a character or block device, or an open descriptor (``/dev/stdout``, ``/dev/fd/3``, a
  named pipe): written in place (appended to), as snarkjs writes it; never replaced by a regular
  file. Not atomic: such a file has no rename.
* a folder, or a path that cannot be written: :class:`~cuzk_mp.errors.OutputError`, naming the
  path the user gave (never the temporary file) and why.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import signal
import stat
import threading
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import IO, Any

from ..errors import InputError, OutputError
from ..paths import output_file_problem


@contextmanager
def atomic_output(path: str | os.PathLike[str], mode: str = "wb") -> Iterator[IO[Any]]:
    """A file to write ``path``'s new contents into: see the module's docstring for what each kind
    of path gets. On a regular file, readers never see half a file, and a failed write leaves
    nothing behind (the old file, if any, stays as it was). New files get the umask as usual."""
    given = os.fspath(path)
    try:
        old: os.stat_result | None = os.stat(given)  # through links
    except FileNotFoundError:
        old = None
    except OSError as exc:
        raise OutputError(given, exc.strerror or str(exc)) from exc
    if old is not None and stat.S_ISDIR(old.st_mode):
        raise OutputError(given, "is a folder")
    if old is not None and (not stat.S_ISREG(old.st_mode) or _a_descriptor(given)):
        # a FIFO, a device, a socket, or an open descriptor (/dev/stdout, /dev/fd/N): no rename over
        # it; appended to, so that a shell's `>> log` stays a log
        with _as_output_error(given, None):
            f = open(given, mode.replace("w", "a"))  # noqa: SIM115 - closed below, its errors named after the path
        with _as_output_error(given, None), f:
            yield f
        return
    real = os.path.realpath(given)  # a link's target; the path itself otherwise
    # a short name of its own, so that a target name near the 255-byte limit still has a temporary
    tmp = os.path.join(os.path.dirname(real), f".cuzk-mp-{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        with _as_output_error(given, tmp):
            f = open(tmp, mode.replace("w", "x"))  # noqa: SIM115 - closed by the with below
        with _as_output_error(given, tmp), f:
            if old is not None:
                _keep_mode_and_owner(f.fileno(), old)
            yield f
        with _as_output_error(given, tmp):
            os.replace(tmp, real)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def _a_descriptor(path: str) -> bool:
    """Whether ``path`` names an open file descriptor: it lies in a folder under /proc, or a chain
    of links leads there (/dev/stdout -> /proc/self/fd/1; /dev/fd/3, /dev/fd being /proc/self/fd)."""
    for _ in range(40):  # the kernel's own limit on a chain of links
        if os.path.realpath(os.path.dirname(path) or ".").startswith("/proc/"):  # /dev/fd is /proc/self/fd
            return True
        if not os.path.islink(path):
            return False
        path = os.path.join(os.path.dirname(path), os.readlink(path))
    return False


@contextmanager
def _as_output_error(given: str, tmp: str | None) -> Iterator[None]:
    """Turn the OSErrors of writing ``given`` (through ``tmp``) into an OutputError naming ``given``.

    An OSError naming another file (an input the caller reads while it writes) passes through."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None and exc.filename not in (given, tmp) and exc.filename2 is None:
            raise
        raise OutputError(given, exc.strerror or str(exc)) from exc


def _keep_mode_and_owner(fd: int, old: os.stat_result) -> None:
    """Give the new file the replaced one's permission bits, and its owner where we may."""
    os.fchmod(fd, stat.S_IMODE(old.st_mode))
    if (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
        try:
            os.fchown(fd, old.st_uid, old.st_gid)
        except PermissionError:  # not ours to give away: the new file is ours, with the old mode
            pass


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as snarkjs does (bfj, ``space: 1``): one-space indent, no trailing newline.

    Byte-identical to snarkjs's output except for empty arrays/objects (bfj
    writes them over two lines, we write ``[]``); the JSON is equal.
    """
    write_json_files([(path, obj)])


def write_json_files(items: Sequence[tuple[str | os.PathLike[str], Any]]) -> None:
    """Write several JSON files (as :func:`write_json`) all or none: every one is written whole,
    and onto the disk (:func:`_write_through`), before the first is renamed into place, so a proof
    and its public signals are never left one without the other because a path could not be
    written. The renames of one call happen under a lock on their folders (``flock``), so two
    processes writing the same pair leave one's pair, never one's proof beside the other's public
    signals.

    Outputs written in place (a FIFO, /dev/stdout: see the module docstring) are written after every
    regular file is whole, each closed before the next opens and in the order given, so a reader
    of ``proof`` then ``public`` (snarkjs's order) sees them in that order and never waits on a pipe
    this process has not finished writing."""
    with ExitStack() as locks:
        with ExitStack() as files:
            streams = []
            for path, obj in items:
                data = json.dumps(obj, indent=1).encode("utf-8")
                if _written_in_place(path):
                    streams.append((path, data))
                else:
                    _write_through(files.enter_context(atomic_output(path, "wb")), data)
            for path, data in streams:
                with atomic_output(path, "wb") as f:
                    f.write(data)
            if len(items) - len(streams) > 1:
                for folder in sorted({os.path.dirname(os.path.realpath(path)) for path, _ in items}):
                    locks.enter_context(_folder_lock(folder))
                locks.enter_context(_stops_held())  # the renames, once begun, all run
        # the files' renames ran as ``files`` closed, under the locks; they are released now


_STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def _stops_held() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP held back while the renames of a call's files run, then raised
    as they came: Ctrl-C between the renames of a proof and its public signals would leave the new
    public.json beside the old proof (the second file's temporary removed as the stop unwinds). The
    renames take microseconds; the writes and the wait for the folders' locks stay stoppable, as
    they run before. Python runs signal handlers in the main thread alone, so elsewhere nothing is
    held; a signal that is ignored stays so."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous: dict[signal.Signals, Any] = {}
    for stop in _STOPS:
        if signal.getsignal(stop) not in (signal.SIG_IGN, None):
            previous[stop] = signal.signal(stop, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        for stop, handler in previous.items():
            signal.signal(stop, handler)
        for signum in dict.fromkeys(held):
            signal.raise_signal(signum)  # its own handler now: KeyboardInterrupt, Terminated, or the end


def _write_through(f: IO[bytes], data: bytes) -> None:
    """Write ``data`` and see it onto the disk now (flush, fsync), not when the file is closed: a full
    disk or a file size limit often refuses bytes only as they leave the process's buffer (and a
    network file system at close or fsync), and the files of one call are closed, each renamed into
    place, one after the other, so a refusal seen only then would leave the files renamed before it
    (a public.json beside no proof, or beside another run's) in place."""
    f.write(data)
    f.flush()
    os.fsync(f.fileno())


def _written_in_place(path: str | os.PathLike[str]) -> bool:
    """Whether :func:`atomic_output` writes ``path`` in place (a FIFO, a device, an open descriptor)
    rather than through a temporary file; False where it cannot tell (atomic_output names the error)."""
    given = os.fspath(path)
    try:
        mode = os.stat(given).st_mode
    except OSError:
        return False
    return not stat.S_ISDIR(mode) and (not stat.S_ISREG(mode) or _a_descriptor(given))


@contextmanager
def _folder_lock(folder: str) -> Iterator[None]:
    """An exclusive ``flock`` on a folder (best effort: a folder that cannot be opened or locked,
    such as /proc's, is not waited for)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass
        yield
    finally:
        os.close(fd)  # closing drops the lock


_READ_CHUNK = 1 << 20  # a pipe or a device is read this much at a time


def read_at_most(f: IO[bytes], limit: int) -> bytes:
    """The bytes of ``f`` up to one past ``limit`` (more than ``limit`` bytes back: the file is over
    it), in memory of about their size. A regular file is read at once at its size; a pipe or a
    device (``<(gen)``, /dev/stdin: size 0) and a file that grew are read on a chunk at a time to
    their end or past the limit. Not ``f.read(limit + 1)``: Python sets aside the whole
    ``limit + 1`` first, 1 GiB for a key of 4 KB, which a process under an address-space limit
    (``ulimit -v``) cannot have, and a reader of a pipe to its end takes whatever its writer sends."""
    size = os.fstat(f.fileno()).st_size
    parts = [f.read(min(size, limit) + 1)]
    total = len(parts[0])
    while parts[-1] and total <= limit:
        parts.append(f.read(min(_READ_CHUNK, limit + 1 - total)))
        total += len(parts[-1])
    parts = [part for part in parts if part]
    return parts[0] if len(parts) == 1 else b"".join(parts)  # one part: itself, not a copy


def refuse_outputs_over_inputs(args: Any, outputs: Sequence[str], inputs: Sequence[str], *,
                               places: bool = True) -> None:
    """Refuse, before any work, an output path that names one of the command's inputs or another
    of its outputs (``g16p k.zkey w.wtns k.zkey public.json`` would replace the key by the proof;
    ``bench --json`` naming its ``--r1cs``, the r1cs by the result). ``outputs`` and ``inputs`` are
    attribute names of ``args``; one that is None (an option not given) is left out. An output
    written in place (a device, a pipe: :func:`atomic_output`) replaces nothing, so it may be given
    twice, as snarkjs takes it (``g16p k.zkey w.wtns /dev/null /dev/null``). With ``places``, an
    output whose folder is missing (:func:`atomic_output` makes none), is no folder or cannot be
    written to is refused too (:func:`~cuzk_mp.paths.output_file_problem`), where a proof was made
    (minutes at 2^27) and then could not be written; a caller that makes the folders checks them."""
    seen: dict[str, str] = {}
    for name in outputs:
        path = getattr(args, name)
        if path is None or _written_in_place(path):
            continue
        if places:
            try:
                problem = output_file_problem(path, folder_made=False)
            except OSError:  # a relative path in a working folder that is gone: its read or write names it
                problem = None
            if problem is not None:
                raise OutputError(os.fspath(path), problem)
        try:
            real = os.path.realpath(path)
        except OSError:  # a relative path in a working folder that is gone: its read or write names it
            real = os.path.normpath(path)
        if real in seen:
            raise InputError(f"{path}: given as both the {seen[real]} and the {name} output: give two paths")
        seen[real] = name
        for source in inputs:
            other = getattr(args, source, None)
            with contextlib.suppress(OSError):  # a missing input is reported when it is read
                if other is not None and os.path.samefile(path, other):
                    what = source if source == "input" else f"{source} input"  # wtns calculate's input JSON
                    raise InputError(f"{path}: the {name} output would replace the {what}: give another path")


_NOT_REGULAR = ((stat.S_ISFIFO, "a FIFO (a named pipe)"), (stat.S_ISCHR, "a character device"),
                (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def open_regular(path: str | os.PathLike[str], shown: str) -> tuple[int, int]:
    """A descriptor of the regular file at ``path``, and its size; InputError naming ``shown`` for
    anything else. These files are read where they lie (mapped, or read at their sections'
    offsets), which a pipe or a device cannot do: its size reads as 0 (a message of "0 bytes" for a
    file that has bytes). The open does not wait for a writer, so a FIFO that no process writes is
    refused rather than waited on for ever."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise InputError(f"{shown}: cannot read: {exc.strerror or exc}") from exc
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode):
        return fd, st.st_size
    os.close(fd)
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{shown}: cannot read: {os.strerror(errno.EISDIR)}")
    what = next((kind for test, kind in _NOT_REGULAR if test(st.st_mode)), "a special file")
    raise InputError(f"{shown}: cannot read it in place: {what}, not a regular file (give the file itself)")


def open_regular_if_there(path: str | os.PathLike[str], shown: str) -> tuple[int, int] | None:
    """:func:`open_regular`, or None where no file is at ``path`` (nor where its link leads)."""
    try:
        return open_regular(path, shown)
    except InputError as e:
        if isinstance(e.__cause__, FileNotFoundError):
            return None
        raise


def read_id_file(path: str | os.PathLike[str], limit: int) -> str | None:
    """The id a marker file at ``path`` records (its text, stripped); None where there is none. It is read
    no further than ``limit`` + 1 bytes, from a regular file only (InputError naming it otherwise: a FIFO
    is not waited on, a device not read to its end); bytes that are no UTF-8 stand as replacement
    characters, an id that matches none."""
    opened = open_regular_if_there(path, str(path))
    if opened is None:
        return None
    with os.fdopen(opened[0], "rb") as f:
        return read_at_most(f, limit).decode(errors="replace").strip()
