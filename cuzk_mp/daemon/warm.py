"""Warm daemons: a private proving daemon per key, started on demand, gone when idle.

Why: a one-shot ``cuzk-mp groth16 prove`` process pays the interpreter, numpy, the accelerator's
context and the key's load every time (~1.4 s for a 2^16 proof on the H200, most of it before the
first kernel; perf/results/oneshot-numba-free-h200.json), while a resident daemon proves the same
witness in ~20 ms and a client process that only talks to it takes ~0.2 s
(perf/results/daemon-latency-gpu-2^16-h200.json). Shell scripts that prove in a loop want the
second without running a service: ``groth16 prove --keep-warm SECONDS`` (and ``fullprove``, whose
daemon also keeps the witness generator's wasm compiled) asks :func:`ensure` for
the daemon of its key, which starts one (``cuzk-mp daemon`` in its own session, detached) when
none answers, and that daemon drains and exits after SECONDS with no connection and no job
(``[daemon] exit_when_idle``). The same pattern as a build tool's background server.

One daemon per (key file, backend, r1cs, verify, wasm, protocol): its id (:func:`warm_id`) hashes the key's
resolved path and identity (device, inode, size, mtime, ctime), so an edited or replaced key gets a new
daemon and the old one idles out, and the wire protocol the client speaks (:func:`protocol_digest`): a
daemon outlives the package it was started from, and after an upgrade or a rollback of the package a
client of one release never asks the still running daemon of another (which might send reply fields it
cannot read, or refuse request fields it does not know); it starts its own, and the other idles out.
Its files live in :func:`warm_dir` (``$XDG_RUNTIME_DIR/cuzk-mp``, else ``/tmp/cuzk-mp-UID``), a
directory of mode 0700 that must belong to this user: a directory another user made there is refused,
never used. Each daemon has there ``ID.toml`` (its config),
``ID.sock`` (its unix socket, 0600), ``ID.journal`` (with SQLite's ``-wal``/``-shm`` files and its
``.id`` marker), the lock files ``ID.journal.lock`` and ``ID.sock.lock``, and ``ID.log`` (what it
logs; ``ID.log.1`` the older part).

Those files outlive their daemon (its log to read), and a key regenerated in a loop would pile them
up: a call that starts a daemon (never one that finds its daemon answering, so a warm call costs
nothing more) removes, while that daemon loads, in one pass over the directory, the files of every
daemon there that is gone (:func:`remove_gone`): no process holds its journal lock (tried without
waiting, the lock a second daemon finds taken), its socket does not answer, and none of its files
was written for :data:`GONE_GRACE_S`. A key's next daemon makes its files afresh.

Two invocations that race to start the same daemon are safe: the second daemon finds the first
one's journal lock and exits (code 75), and both invocations wait for the one socket.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.resources
import json
import logging
import os
import re
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from cuzk_mp.daemon.instance_lock import lock_paths, try_lock
from cuzk_mp.daemon.blocking_comm import open_socket
from cuzk_mp.daemon.transport import MAX_LISTEN_PATH_BYTES, CommClosedError, parse_address
from cuzk_mp.errors import ConfigError, CuzkError, InputError, ResourceError
from cuzk_mp.formats.atomic import atomic_output
from cuzk_mp.exit_codes import EXIT_ALREADY_RUNNING, EXIT_FAILED, EXIT_INPUT

log = logging.getLogger("cuzk_mp.daemon.warm")

CIRCUIT_ID = "key"  # the one circuit of a warm daemon's config
START_TIMEOUT_S = 900.0  # engine start (kernel loads on a fresh box) + the key's load
POLL_S = 0.05
PROGRESS_EVERY_S = 5.0
MAX_RESTARTS = 2  # starts again, at most, where a daemon (this call's or another's) died before it was ready
LOG_KEEP_BYTES = 1 << 20  # a daemon's log is rotated (one old copy) when it grows past this
# files of a daemon written this recently are never removed: a daemon takes its journal lock early in
# its start, and every start writes its config first and is waited for START_TIMEOUT_S at most
GONE_GRACE_S = START_TIMEOUT_S
# the files a warm daemon leaves, after its id: config, socket, journal (SQLite's side files, the
# marker), lock files (:func:`.instance_lock.lock_paths`), log and its rotated copy
FILE_SUFFIXES = (".toml", ".sock", ".sock.lock", ".journal", ".journal-wal", ".journal-shm", ".journal-journal",
                 ".journal.id", ".journal.lock", ".log", ".log.1")
_ID = re.compile(r"[0-9a-f]{16}")


@dataclass(frozen=True)
class WarmSpec:
    """What a warm daemon proves with: the key and the one-shot prove's options."""

    zkey: Path
    backend: str = "auto"  # "auto", "cpu" or "gpu"
    r1cs: Path | None = None  # check each witness against it first
    verify: bool = True  # self-verify each proof
    idle_s: float = 300.0  # exit_when_idle
    wasm: Path | None = None  # the witness generator: jobs send input JSON (fullprove)


def warm_dir() -> Path:
    """The private directory of this user's warm daemons (made 0700 if missing; ConfigError if it
    exists but is not a directory of this user's alone)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    base = Path(runtime) / "cuzk-mp" if runtime and Path(runtime).is_dir() else Path(f"/tmp/cuzk-mp-{os.getuid()}")
    try:
        base.mkdir(mode=0o700, exist_ok=True)
        st = base.lstat()
    except OSError as e:
        raise ConfigError(f"{base}: cannot make the warm daemons' directory: {e}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
        raise ConfigError(f"{base}: the warm daemons' directory must be a directory of this user with mode 0700 "
                          f"(it is {stat.filemode(st.st_mode)}, owner uid {st.st_uid}); remove it or set "
                          "$XDG_RUNTIME_DIR")
    return base


@functools.cache
def protocol_digest() -> str:
    """A digest of the wire protocol this installation speaks: its version and the source of
    :mod:`cuzk_mp.daemon.protocol` (read, not imported; the version alone where an installation
    ships no source)."""
    from cuzk_mp import __version__

    try:
        source = (importlib.resources.files("cuzk_mp.daemon") / "protocol.py").read_bytes()
    except OSError:
        source = b""
    return f"{__version__}:{hashlib.sha256(source).hexdigest()}"


def warm_id(spec: WarmSpec) -> str:
    """16 hex digits naming the daemon of ``spec`` for a client of this protocol (InputError if the key
    is no file)."""
    parts = [CIRCUIT_ID, spec.backend, str(spec.verify)]
    for path in (spec.zkey, spec.r1cs, spec.wasm):
        if path is None:
            parts.append("-")
            continue
        try:
            real, st = os.path.realpath(path), os.stat(path)
        except OSError as e:
            raise InputError(f"{path}: {e.strerror or e}") from None
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{path}: not a file")
        # ctime too: a copy over the file that restores its size and mtime (`cp -p`, `rsync -t`)
        # still moves its ctime, which no user can set back
        parts += [real, str(st.st_dev), str(st.st_ino), str(st.st_size), str(st.st_mtime_ns), str(st.st_ctime_ns)]
    parts.append(protocol_digest())
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def config_text(spec: WarmSpec, sock: Path, journal: Path) -> str:
    """The warm daemon's TOML: a unix socket, the idle exit, one synthesis worker, the key
    preloaded before the socket opens (so a connect means ready)."""
    q = json.dumps  # a JSON string is a TOML basic string
    lines = [
        "# A warm daemon of `cuzk-mp groth16 prove --keep-warm` (written by cuzk_mp.daemon.warm).",
        "[daemon]", f"listen = {q('unix://' + str(sock))}", 'socket_mode = "0600"', f"journal = {q(str(journal))}",
        f"exit_when_idle = {spec.idle_s!r}", 'result_ttl = "10m"', 'shutdown_grace = "30s"',
        "[srs]", f"preload = [{q(CIRCUIT_ID)}]",
        "[synthesis]", "partition_workers = 1",
        "[pipeline]", "ring_slots = 2", f"verify_proofs = {'true' if spec.verify else 'false'}",
        "[gpus]", f"backend = {q(spec.backend)}", "gpu_workers_per_device = 1",
        f"[circuits.{CIRCUIT_ID}]", f"zkey = {q(os.path.realpath(spec.zkey))}",
    ]
    for name, path in (("r1cs", spec.r1cs), ("wasm", spec.wasm)):
        if path is not None:
            lines.append(f"{name} = {q(os.path.realpath(path))}")
    return "\n".join(lines) + "\n"


def ensure(spec: WarmSpec, timeout_s: float = START_TIMEOUT_S) -> str:
    """The address of the warm daemon of ``spec``, started first if none answers; returns once
    it accepts connections (its key loaded). A daemon that dies before it is ready (killed, or a
    process of it died: exit 1; or another call's, which this one waited for) is started again,
    :data:`MAX_RESTARTS` times at most. ResourceError if it does not come up in time or exits with
    an error (InputError for the input's: exit 2; the message quotes its log's last lines)."""
    base = warm_dir()
    wid = warm_id(spec)
    sock, log_path, journal = base / f"{wid}.sock", base / f"{wid}.log", base / f"{wid}.journal"
    if len(os.fsencode(sock)) > MAX_LISTEN_PATH_BYTES:
        raise ConfigError(f"{sock}: too long for a unix socket ({len(os.fsencode(sock))} bytes, at most "
                          f"{MAX_LISTEN_PATH_BYTES}); set $XDG_RUNTIME_DIR to a shorter directory")
    addr = f"unix://{sock}"
    if _answers(sock):
        return addr
    cfg = base / f"{wid}.toml"
    config = config_text(spec, sock, journal)
    _write_config(cfg, config)
    log.info("starting a warm daemon for %s (%s backend, exits after %g s idle; log %s)", spec.zkey, spec.backend,
             spec.idle_s, log_path)
    with contextlib.suppress(OSError):  # one older log is kept (a racing start may still write to it)
        if log_path.stat().st_size > LOG_KEEP_BYTES:
            os.replace(log_path, log_path.with_name(log_path.name + ".1"))
    since = _size(log_path)
    child = _spawn(cfg, log_path)
    remove_gone(base, keep=wid)  # while the daemon starts
    t0 = time.monotonic()
    next_note = t0 + PROGRESS_EVERY_S
    restarts = 0
    while True:
        if _answers(sock):
            log.info("warm daemon %s ready in %.1f s", wid, time.monotonic() - t0)
            return addr
        code = child.poll()
        # 75: another invocation's daemon holds the journal and is starting; while it lives, wait
        # a daemon that died before it was ready and not for its input is started again: the one
        # another invocation was starting (this one's exited 75), or this one's, killed (code < 0)
        # or ended 1 (a process of it died)
        gone = None
        if code == EXIT_ALREADY_RUNNING and not _holder_alive(journal):
            gone = f"the warm daemon that was starting for {spec.zkey} is gone"
        elif code is not None and (code < 0 or code == EXIT_FAILED):
            gone = f"the warm daemon starting for {spec.zkey} ended (code {code}) before it was ready"
        elif code not in (None, 0, EXIT_ALREADY_RUNNING) and not cfg.exists():
            # another call's remove_gone took the key's old config in the instant this call wrote it anew
            gone = f"the config of the warm daemon starting for {spec.zkey} was removed before it was read"
        if gone is not None and restarts < MAX_RESTARTS and not _answers(sock):
            log.info("%s: starting one again", gone)
            _write_config(cfg, config)  # fresh: GONE_GRACE_S keeps it while this start lasts
            child, restarts = _spawn(cfg, log_path), restarts + 1
            continue
        if code is not None and (code != EXIT_ALREADY_RUNNING or not _holder_alive(journal)) and not _answers(sock):
            # its exit 2 is the input's fault (a bad key, r1cs or wasm): the same code as a one-shot prove's
            kind = InputError if code == EXIT_INPUT else ResourceError
            raise kind(f"the warm daemon for {spec.zkey} exited (code {code}) before it was ready; "
                       f"its log {log_path} ends:\n{_tail(log_path, since)}")
        now = time.monotonic()
        if now - t0 > timeout_s:
            raise ResourceError(f"the warm daemon for {spec.zkey} was not ready within {timeout_s:g} s; "
                                f"see its log {log_path}")
        if now >= next_note:
            log.info("waiting for the warm daemon %s (%.0f s; a first start loads kernels and the key)", wid, now - t0)
            next_note = now + PROGRESS_EVERY_S
        time.sleep(POLL_S)


def _write_config(cfg: Path, text: str) -> None:
    with atomic_output(cfg, "w") as f:  # a racing start reads a whole config or the earlier one
        f.write(text)


def remove_gone(base: Path, keep: str = "") -> list[str]:
    """Remove the files of the warm daemons in ``base`` that are gone (all but ``keep``'s); returns
    their ids. A daemon is gone where none of its files was written for :data:`GONE_GRACE_S` (one
    that is starting has just written its config), its socket does not answer and its journal lock
    is free: that lock is then held, without waiting, while its files are looked at again and
    removed (the lock file last), so a daemon of the id starting meanwhile exits 75 and its call
    starts it again. Only names of :data:`FILE_SUFFIXES` after an id are touched, and an id with
    anything there but regular files and sockets of this user (a link, a folder) is left whole;
    a failure is logged at debug and leaves that id's files: it never fails the call."""
    try:
        names = os.listdir(base)
    except OSError as e:
        log.debug("%s: not looked for gone warm daemons: %s", base, e)
        return []
    by_id: dict[str, list[str]] = {}
    for name in names:
        wid = name[:16]
        if name[16:] in FILE_SUFFIXES and wid != keep and _ID.fullmatch(wid):
            by_id.setdefault(wid, []).append(name)
    removed = []
    for wid, files in sorted(by_id.items()):
        try:
            if _remove_if_gone(base, wid, files):
                removed.append(wid)
        except (OSError, CuzkError) as e:
            log.debug("the files of the warm daemon %s stay: %s", wid, e)
    return removed


def _remove_if_gone(base: Path, wid: str, files: list[str]) -> bool:
    if not _idle(base, files) or _answers(base / f"{wid}.sock"):
        return False
    lock = lock_paths(base / f"{wid}.journal", [])[0]
    fd = try_lock(lock)
    if fd is None:
        return False  # a daemon of it runs
    try:
        if not _idle(base, files) or _answers(base / f"{wid}.sock"):
            return False
        for name in sorted(set(files) - {lock.name}):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(base / name)  # a link itself, never what it points to
        os.unlink(lock)
    finally:
        os.close(fd)
    log.debug("removed the files of the gone warm daemon %s", wid)
    return True


def _idle(base: Path, files: list[str]) -> bool:
    """Whether none of ``files`` was written for GONE_GRACE_S and all are regular files or sockets of
    this user (a file since removed counts as idle)."""
    since = time.time() - GONE_GRACE_S
    for name in files:
        try:
            st = os.lstat(base / name)
        except FileNotFoundError:
            continue
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISSOCK(st.st_mode)) or st.st_uid != os.getuid() \
                or st.st_mtime > since:
            return False
    return True


def _spawn(cfg: Path, log_path: Path) -> subprocess.Popen[bytes]:
    """Start a warm daemon of the config ``cfg`` in its own session, its output appended to ``log_path``."""
    with open(log_path, "ab") as out:  # O_APPEND: racing starts both write whole lines
        return subprocess.Popen([sys.executable, "-m", "cuzk_mp.cli", "daemon", "--config", str(cfg)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)


def _answers(sock: Path) -> bool:
    """Whether a daemon accepts connections on ``sock`` (a stale socket file does not)."""
    if not sock.exists():
        return False
    try:
        open_socket(parse_address(f"unix://{sock}"), 1.0).close()
    except (OSError, CommClosedError):
        return False
    return True


def _holder_alive(journal: Path) -> bool:
    """Whether the daemon whose pid ``journal``'s instance lock records (:mod:`.instance_lock`)
    still runs. Read, never locked: taking the lock even for an instant could make a daemon that
    is starting exit 75."""
    try:
        pid = int(Path(f"{journal}.lock").read_text().strip())
        os.kill(pid, 0)
    except PermissionError:
        return True
    except (OSError, ValueError):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    return b"cuzk_mp" in cmdline or b"cuzk-mp" in cmdline  # not a reused pid


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _tail(path: Path, since: int = 0, lines: int = 15) -> str:
    """The last ``lines`` lines ``path`` got after byte ``since`` (where this call's daemon began to
    write: the key's log also holds earlier daemons' lines)."""
    try:
        with open(path, "rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(nothing written)"
