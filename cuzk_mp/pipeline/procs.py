"""Child-process scaffolding shared by synthesis workers and prover processes.

Owns: the spawn of one child (``spawn`` context only, never fork: CUDA must not
be initialised in a forked child), its command pipe and death pipe, and the
child-side bootstrap (environment before any heavy import, process name, log
prefix, signal handling, the death-pipe watcher).

Protocol (kept consistent with :class:`cuzk_mp.pipeline.engine.RunningEngine`):

1. parent: ``spawn_child`` starts the process with the child ends of a duplex
   command pipe and of a one-way death pipe (the parent keeps the write end);
2. child: ``bootstrap`` sets the environment (``CUDA_VISIBLE_DEVICES`` for a
   prover process, ``NUMBA_NUM_THREADS``) *before* importing the role module,
   then runs the role's ``main(ctx)``, which sends ``Ready`` when warmed up;
3. the parent watches the command pipe and the process sentinel; the child
   watches the death pipe: EOF means the parent is gone, and it stops itself
   (SIGTERM to itself, hard exit 10 s later);
4. the parent's messages to a child go through an outbox that a writer thread
   of the handle empties, in order: a child that stops reading (stopped, busy
   in a long key load) fills its pipe and blocks that thread alone, never the
   engine (which sends while holding its lock) nor the other children.

Process names are ``cuzk-synth-<i>`` and ``cuzk-prover-<dev>`` (the prover role on
every backend); every log line of a child starts with ``(<name> pid=<pid>)``.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import multiprocessing as mp
import os
import queue
import signal
import threading
import time
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import msgspec

from .. import stackprof
from ..logs import configure_child
from . import messages as msg

log = logging.getLogger("cuzk_mp.pipeline")
_CTX = mp.get_context("spawn")
HARD_EXIT_S = 10.0
# how long a child dying of an error waits to learn whether the engine died too: the death pipe's
# EOF comes microseconds after the broken command pipe; a genuine crash just exits 1 s later
ORPHAN_WAIT_S = 1.0


@dataclass
class ChildSpec:
    """What to start: a role module (with ``main(ctx)``), a name, the environment and a payload."""

    role: str  # "synth" | "prover"
    index: int  # worker index (synth) or device id (prover)
    module: str
    env: dict[str, str]
    payload: Any  # picklable start arguments for the role's main
    ring_prefix: str = ""  # the engine's IPC prefix: unlinked by an orphaned child (see _watch_parent)

    @property
    def name(self) -> str:
        """``cuzk-synth-<i>`` or ``cuzk-prover-<dev>``."""
        return f"cuzk-{self.role}-{self.index}"


@dataclass
class ChildHandle:
    """The parent's view of one running child."""

    spec: ChildSpec
    proc: BaseProcess
    conn: Connection
    death_w: Connection
    started_at: float
    ready: bool = False
    reaped: bool = False  # its death was handled (the sentinel is no longer watched)
    broken: bool = False  # a write to the pipe failed (the child is gone): later messages are dropped
    outbox: queue.SimpleQueue[bytes | None] = field(default_factory=queue.SimpleQueue)
    writer: threading.Thread = field(init=False)

    def __post_init__(self) -> None:
        self.writer = threading.Thread(target=self._write, name=f"{self.spec.name}-writer", daemon=True)
        self.writer.start()

    @property
    def pid(self) -> int:
        """The child's pid."""
        return int(self.proc.pid or 0)

    def send(self, message: msgspec.Struct) -> bool:
        """Queue one message for the child (never blocks); False once its pipe is known to be broken
        or closed (the child is dying: its death is handled through its sentinel)."""
        if self.broken or self.conn.closed:
            return False
        self.outbox.put(msg.encode(message))
        return True

    def _write(self) -> None:
        """The writer thread: the outbox's frames to the pipe, in order, until :meth:`close` or a failed write."""
        while (frame := self.outbox.get()) is not None:
            try:
                self.conn.send_bytes(frame)
            except (OSError, ValueError):  # the child is gone, or close() closed the pipe
                self.broken = True
                return

    def close(self) -> None:
        """Close the parent's pipe ends (idempotent); queued messages are dropped."""
        self.broken = True
        self.outbox.put(None)
        for c in (self.conn, self.death_w):
            try:
                c.close()
            except OSError:
                pass


def spawn_child(spec: ChildSpec) -> ChildHandle:
    """Start one child with the spawn context; returns at once (no READY wait here)."""
    parent_conn, child_conn = _CTX.Pipe(duplex=True)
    death_r, death_w = _CTX.Pipe(duplex=False)
    proc = _CTX.Process(target=bootstrap, name=spec.name, args=(spec, child_conn, death_r), daemon=True)
    proc.start()
    child_conn.close()
    death_r.close()
    return ChildHandle(spec, proc, parent_conn, death_w, time.monotonic())


class CancelledIds:
    """The task ids a child was told are cancelled, the latest :data:`CANCELLED_KEPT` of them: a cancel
    concerns an attempt in flight (a handful a child), and a daemon that runs for months must not
    keep every id it ever cancelled."""

    def __init__(self) -> None:
        self._ids: dict[int, None] = {}  # insertion-ordered: the oldest go first
        self._lock = threading.Lock()

    def update(self, task_ids: Iterable[int]) -> None:
        """Add ids (the reader thread)."""
        with self._lock:
            for task_id in task_ids:
                self._ids[task_id] = None
            while len(self._ids) > CANCELLED_KEPT:
                del self._ids[next(iter(self._ids))]

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._ids


CANCELLED_KEPT = 1 << 16


class EngineGone(BrokenPipeError):
    """A child's message could not be sent: the engine's end of the pipe is closed (the engine died
    or stopped). Not a task's failure: the child is about to leave (its death pipe says so too)."""


class ChildContext:
    """The child's side: its name, the command pipe (thread-safe send) and the stop flag."""

    def __init__(self, spec: ChildSpec, conn: Connection) -> None:
        self.spec = spec
        self.name = spec.name
        self.conn = conn
        self.stopping = threading.Event()
        self.engine_gone = threading.Event()  # set by the death-pipe watcher on EOF
        self.signalled: str | None = None  # the signal this process stops on ("SIGTERM"; its handler's record)
        self.engine_pid = os.getppid()  # the engine, alive while it is our parent
        self._send_lock = threading.Lock()
        self._orphan_lock = threading.Lock()
        self.log = logging.getLogger(f"cuzk_mp.pipeline.{spec.role}")

    def send(self, message: msgspec.Struct) -> None:
        """Send one message to the engine (any thread); EngineGone where the engine's end is closed."""
        with self._send_lock:
            try:
                self.conn.send_bytes(msg.encode(message))
            except (BrokenPipeError, ConnectionResetError, EOFError) as exc:
                raise EngineGone(f"{type(message).__name__} not sent: the engine is gone ({exc})") from None

    def recv(self) -> msg.ToChild:
        """Block for the next engine message (EOFError when the engine closed the pipe)."""
        return msg.decode_to_child(self.conn.recv_bytes())

    def messages(self) -> Iterator[msg.ToChild]:
        """The engine's messages for a role's reader thread, until it stops: a Stop, or the pipe's
        EOF (the engine closed it or died), sets ``stopping`` and ends the iteration."""
        while not self.stopping.is_set():
            try:
                m = self.recv()
            except (EOFError, OSError):
                self.stopping.set()
                return
            if isinstance(m, msg.Stop):
                self.stopping.set()
                return
            yield m

    def engine_dead(self, wait_s: float = 0.0) -> bool:
        """Whether the engine process has exited (we were re-parented), waiting up to ``wait_s``.

        The precise test: pipe EOFs also follow from the engine closing our handle, and
        the kernel closes a dying process's pipes a moment before it re-parents its children.
        """
        end = time.monotonic() + wait_s
        while os.getppid() == self.engine_pid:
            if time.monotonic() >= end:
                return False
            time.sleep(0.01)
        return True

    def remove_orphaned_ring(self) -> None:
        """Unlink every IPC object of the engine's prefix (the engine is dead; idempotent).

        Every way out of an orphaned child comes here (see :func:`_leave_no_orphans`): the
        death-pipe watcher as soon as the engine dies, and the process's last step, whether it
        stopped on its command pipe's EOF or died of the broken pipe (``os._exit`` would kill
        the watcher mid-way). The last step runs it again on purpose: a synthesis worker may
        have created its next segment after the watcher's pass. The lock serialises callers.
        """
        if not self.spec.ring_prefix:
            return
        from .shm_names import cleanup_stale

        with self._orphan_lock:
            cleanup_stale(self.spec.ring_prefix)

    def fail(self, task_id: int, exc: BaseException) -> None:
        """Report a task failure as data (kind + message + traceback), log the traceback here."""
        from ..errors import error_kind

        if isinstance(exc, EngineGone):  # nobody to tell: the engine is gone, and this child leaves
            self.log.info("task %d not finished: %s", task_id, exc)
            return
        tb = "".join(traceback.format_exception(exc))
        kind, text = error_kind(exc), str(exc) or type(exc).__name__
        if kind == "InternalError" and self.signalled is not None:
            # what fails as the process goes on a signal (a wait it cut short, work the interpreter's exit
            # refuses) is the attempt lost with its process, as the engine counts one whose process died
            kind = "WorkerDied"
            text = f"{self.name} stopped on {self.signalled} before the task finished ({text})"
            self.log.info("task %d not finished: %s", task_id, text)
            self.log.debug("task %d:\n%s", task_id, tb)
        elif kind == "InternalError":
            self.log.error("task %d failed:\n%s", task_id, tb)
        try:
            self.send(msg.TaskFailed(task_id, kind, text, tb[-4000:]))
        except EngineGone as gone:
            self.log.info("task %d's failure not reported: %s", task_id, gone)


def bootstrap(spec: ChildSpec, conn: Connection, death_r: Connection) -> None:
    """Entry point of every child (runs in the fresh spawned interpreter)."""
    os.environ.update(spec.env)  # before any import of numba / cupy (see the module docstring)
    _set_thread_name(spec.name)
    configure_child(spec.name, os.environ.get("CUZK_MP_LOG_LEVEL", "WARNING"))
    ctx = ChildContext(spec, conn)
    _install_signals(ctx)
    threading.Thread(target=_watch_parent, args=(death_r, ctx), name=f"{spec.name}-death", daemon=True).start()
    role = importlib.import_module(spec.module)
    sampler = stackprof.start_from_env()
    try:
        role.main(ctx, spec.payload)
    except SystemExit:
        pass
    except BaseException:  # noqa: BLE001 - the root cause must reach the log before the process exits
        if _leave_no_orphans(ctx, ORPHAN_WAIT_S):  # a broken pipe because the engine died
            os._exit(1)
        ctx.log.critical("[shutdown] fatal error:\n%s", traceback.format_exc())
        os._exit(3)
    _leave_no_orphans(ctx, ORPHAN_WAIT_S if ctx.engine_gone.is_set() else 0.0)
    stackprof.finish(sampler, spec.name)
    ctx.log.info("[shutdown] exiting")


def _leave_no_orphans(ctx: ChildContext, wait_s: float) -> bool:
    """If the engine is dead, remove its ring (nobody else will); returns whether it was dead."""
    if not ctx.engine_dead(wait_s):
        return False
    ctx.log.warning("[shutdown] the engine process is gone: removing its IPC objects")
    ctx.remove_orphaned_ring()
    return True


def _install_signals(ctx: ChildContext) -> None:
    def on_term(signum: int, frame: object) -> None:
        if ctx.stopping.is_set():
            return
        ctx.signalled = signal.Signals(signum).name
        ctx.stopping.set()
        ctx.log.info("[shutdown] signal %d: stopping", signum)
        hard_exit = threading.Timer(HARD_EXIT_S, os._exit, args=(1,))
        hard_exit.daemon = True  # only for a shutdown that hangs; a clean exit must not wait for it
        hard_exit.start()
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_term)
    # The engine decides what both mean (a command stops its engine, the daemon ignores SIGHUP): Ctrl-C
    # and a closed terminal's SIGHUP reach the whole process group, and a child that died of the
    # latter would leave its partition to a retry, or, with its engine stopping too, the ring to nobody.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def _watch_parent(death_r: Connection, ctx: ChildContext) -> None:
    """EOF on the death pipe: the engine died without stopping us (or closed our handle).

    Nobody is left to remove the ring, so every orphan unlinks every IPC object
    of the engine's prefix (idempotent; mappings still open stay valid until
    unmapped), then stops itself. Without this a killed daemon would leave up to
    ring_slots segments in /dev/shm until a restart with the same prefix.
    """
    try:
        death_r.recv_bytes()
    except (EOFError, OSError):
        pass
    ctx.engine_gone.set()
    # whether or not the main thread is already stopping (a command-pipe EOF stops it too): a dead
    # engine's ring is ours to remove; a live engine that closed our handle keeps its ring. Either
    # way nobody listens to us any more: stop.
    _leave_no_orphans(ctx, ORPHAN_WAIT_S)
    if not ctx.stopping.is_set():
        os.kill(os.getpid(), signal.SIGTERM)


def _set_thread_name(name: str) -> None:
    """Set the OS-visible process name (``ps -o comm``, 15 bytes) on Linux."""
    try:
        libc = ctypes.CDLL(None)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def describe_exit(code: int | None) -> str:
    """``exit code 3`` / ``killed by SIGKILL``."""
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
