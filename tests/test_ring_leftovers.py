"""What a process SIGKILLed early in its start, or in its stop, leaves in /dev/shm, and who removes it.

A process killed after it made its ring but before any child existed has nobody to remove the
ring (the children's orphan cleanup needs children). The next ring made on this machine removes
it, whatever its prefix (an engine's default prefix, ``cuzk-<pid>``, is never used again), and
never the ring of a live process or another user's objects. An engine killed at any point of its
stop leaves nothing: its ring's names are gone before its last child (which would remove them) is.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cuzk_mp.pipeline import shm_names
from cuzk_mp.pipeline.engine import Engine
from cuzk_mp.pipeline.ring import Ring, RingHandle
from cuzk_mp.pipeline.shm_names import cleanup_stale, live_segments, shm_entries
from cuzk_mp.pipeline.types import EngineConfig

from tests.helpers import KEY_CACHE, LOG_N, wait_until

REPO = Path(__file__).resolve().parents[1]

# Each makes the ring of prefix argv[1] (or starts an engine with that prefix) and is SIGKILLed at
# one point of it: the pid of a child that died this way is gone, nothing of it runs any more.
KILL_AT = {
    # after the control block, before the semaphores
    "control-block": "import posix_ipc\n"
                     "posix_ipc.Semaphore = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)\n"
                     "Ring.create(sys.argv[1], 2)\n",
    # after the whole ring
    "ring": "Ring.create(sys.argv[1], 2)\nos.kill(os.getpid(), signal.SIGKILL)\n",
    # an engine's start, right after its ring, before its children are spawned
    "engine-start": "from cuzk_mp.pipeline import engine as eng\n"
                    "from cuzk_mp.pipeline.types import EngineConfig\n"
                    "eng.Supervisor.start = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)\n"
                    "eng.Engine(EngineConfig(backend='cpu', devices=[0], partition_workers=1, ring_slots=2,\n"
                    "                        shm_prefix=sys.argv[1])).start()\n",
}
PRELUDE = "import os, signal, sys\nfrom cuzk_mp.pipeline.ring import Ring\n"


@pytest.fixture
def prefixes() -> Iterator[list[str]]:
    made: list[str] = []
    yield made
    for p in made:
        cleanup_stale(p)


def _prefix(made: list[str], tag: str) -> str:
    name = f"cuzk-test-left-{tag}-{os.getpid()}-{time.monotonic_ns() % 10**9}"
    made.append(name)
    return name


def _killed_during_start(where: str, prefix: str) -> None:
    proc = subprocess.run([sys.executable, "-c", PRELUDE + KILL_AT[where], prefix], cwd=REPO, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert shm_entries(prefix), f"killed at {where}: nothing was left to remove"


@pytest.mark.parametrize("where", list(KILL_AT))
def test_the_next_ring_removes_what_a_process_killed_in_its_start_left(prefixes: list[str], where: str) -> None:
    dead = _prefix(prefixes, "dead")
    _killed_during_start(where, dead)
    other = Ring.create(_prefix(prefixes, "next"), 1)  # another engine's start, its own prefix
    try:
        assert shm_entries(dead) == []
    finally:
        other.destroy()


def test_a_restart_under_the_same_prefix_removes_them_too(prefixes: list[str]) -> None:
    dead = _prefix(prefixes, "same")
    _killed_during_start("ring", dead)
    old = shm_entries(dead)
    again = Ring.create(dead, 1)
    assert not set(old) & set(shm_entries(dead))
    again.destroy()
    assert shm_entries(dead) == []


def test_the_ring_of_a_live_process_is_never_touched(prefixes: list[str]) -> None:
    """Another process runs a ring of the same prefix (a second engine configured with it): a
    new ring of that prefix, one of any other, and an engine of that prefix that gives it back
    unstarted leave it whole and usable."""
    live = _prefix(prefixes, "live")
    code = PRELUDE + ("r = Ring.create(sys.argv[1], 2)\nprint(r.handle.prefix, flush=True)\n"
                      "sys.stdin.read()\nr.destroy()\n")
    proc = subprocess.Popen([sys.executable, "-c", code, live], cwd=REPO, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout is not None
        name = proc.stdout.readline().strip()
        before = shm_entries(live)
        assert len(before) == 3
        mine = Ring.create(live, 1)
        other = Ring.create(_prefix(prefixes, "other"), 1)
        Engine(EngineConfig(backend="cpu", devices=[0], shm_prefix=live)).stop()  # its finalizer, too
        assert set(before) <= set(shm_entries(live))
        attached = Ring.attach(RingHandle(name, 2))  # still whole
        assert [r.state for r in attached.snapshot()] == ["free", "free"]
        attached.close()
        mine.destroy()
        other.destroy()
        assert shm_entries(live) == before
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(30)
    assert shm_entries(live) == []


def _forge(prefix: str, pid: int, start: int, pidns: int) -> str:
    """A ring of ``prefix`` whose control block names the maker (pid, start time, pid namespace) given."""
    import mmap

    r = Ring.create(prefix, 1)
    with mmap.mmap(os.open(f"/dev/shm/{r.handle.prefix}-ctl", os.O_RDWR), 0) as m:
        for word, value in ((shm_names._OWNER_PID, pid), (shm_names._OWNER_START, start),
                            (shm_names._OWNER_PIDNS, pidns)):
            m[8 * word : 8 * word + 8] = value.to_bytes(8, "little")
    r.close()
    return r.handle.prefix


def test_a_reused_pid_does_not_keep_a_dead_ring_and_a_foreign_namespace_is_not_judged(prefixes: list[str]) -> None:
    """The maker is its pid *and* its start time: pid 1 runs, but not the process that made this
    ring. A ring made in another pid namespace is left: its pid says nothing here."""
    here = shm_names._pid_namespace()
    init_start = shm_names._start_time(1)
    if init_start is None:
        pytest.skip("/proc/1/stat is not readable here")
    reused = _forge(_prefix(prefixes, "reused"), 1, init_start + 12345, here)
    running = _forge(_prefix(prefixes, "init"), 1, init_start, here)
    foreign = _forge(_prefix(prefixes, "foreign"), 1, init_start + 12345, here + 1)
    Ring.create(_prefix(prefixes, "judge"), 1).destroy()
    assert shm_entries(reused) == []
    assert len(shm_entries(running)) == 3 and len(shm_entries(foreign)) == 3


def test_the_ring_of_a_twin_in_another_pid_namespace_is_not_taken_for_this_processs(prefixes: list[str]) -> None:
    """Two benches in two containers that share /dev/shm (``--ipc=host``) may run as the same pid, and
    so with the same prefix (``cuzk-bench-<pid>``): the other's ring is not this process's own, and
    neither this process's new ring nor its engine's stop (:func:`~.shm_names.remove_abandoned` of the
    prefix) removes it."""
    prefix = _prefix(prefixes, "twin")
    twin = _forge(prefix, os.getpid(), shm_names._start_time(os.getpid()) or 0, shm_names._pid_namespace() + 1)
    Ring.create(prefix, 1).destroy()
    shm_names.remove_abandoned(prefix)
    assert len(shm_entries(twin)) == 3


# An engine that has proved one partition (its ring holds a segment) is stopped, and SIGKILLed at one
# point of the stop: with a child still alive (the provers, once the synthesis workers have left), once
# every child has left, or as it begins to remove the ring.
KILL_IN_STOP = {
    "first-children-gone": "Supervisor.stop_all = kill_after(Supervisor.stop_all, lambda only: True)\n",
    # the stop of every child (no ``only``): each has exited when it returns (is_alive() may lag behind the
    # event thread's reaping, so the call, not sup.live(), says when)
    "every-child-gone": "Supervisor.stop_all = kill_after(Supervisor.stop_all, lambda only: only is None)\n",
    "ring-removal": "RunningEngine._remove_ipc = lambda self: os.kill(os.getpid(), signal.SIGKILL)\n",
}
STOP_SCRIPT = """
import os, signal, sys, threading
from pathlib import Path
from cuzk_mp.pipeline.engine import Engine, RunningEngine
from cuzk_mp.pipeline.supervisor import Supervisor
from cuzk_mp.pipeline.types import CircuitSpec, EngineConfig, JobSpec, PartitionInput

def kill_after(stop_all, when):
    def wrapped(self, *args, **kwargs):
        stop_all(self, *args, **kwargs)
        if when(kwargs.get("only")):
            os.kill(os.getpid(), signal.SIGKILL)
    return wrapped

"""
STOP_RUN = """
done = threading.Event()
engine = Engine(EngineConfig(backend="cpu", devices=[0], partition_workers=1, ring_slots=2, start_timeout_s=120,
                             shm_prefix=sys.argv[1], param_cache=Path(sys.argv[2])),
                on_job_done=lambda result: done.set()).start()
engine.register_circuit(CircuitSpec("porep", synthetic="porep-like", log_n=int(sys.argv[3])))
engine.submit(JobSpec("one", "porep", [PartitionInput("synthetic", seed=1)]))
done.wait()
print(" ".join(str(p.pid) for p in engine.status().processes), flush=True)
sys.stdin.read()
engine.stop(grace_s=0)
"""


@pytest.mark.parametrize("where", list(KILL_IN_STOP))
def test_an_engine_killed_in_its_stop_leaves_nothing(prefixes: list[str], test_key: object, where: str) -> None:
    import psutil

    prefix = _prefix(prefixes, "stop")
    proc = subprocess.Popen([sys.executable, "-c", STOP_SCRIPT + KILL_IN_STOP[where] + STOP_RUN, prefix,
                             str(KEY_CACHE), str(LOG_N)], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdin is not None and proc.stdout is not None
        children = [psutil.Process(int(pid)) for pid in proc.stdout.readline().split()]
        assert len(children) == 2
        assert live_segments(prefix) >= 1 and len(shm_entries(prefix)) >= 4  # control block, semaphores, segment
        proc.stdin.close()  # the engine stops
        assert proc.wait(120) == -signal.SIGKILL
        # what a live child (an orphan now) removes, it removes before it exits: once none runs, nothing
        # else will
        wait_until(lambda: not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children),
                   timeout=60)
        assert shm_entries(prefix) == [], f"killed at {where}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def test_shm_clean_removes_the_rings_of_gone_engines_without_starting_one(
        prefixes: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """An engine killed with its children leaves a ring that only another engine's start of this
    user would remove: ``cuzk-mp shm clean`` removes it, and
    says what it removed, with no engine started; a running process's ring stays whole."""
    from cuzk_mp import cli

    live = Ring.create(_prefix(prefixes, "kept"), 1)  # this process's: it runs
    try:
        dead = _prefix(prefixes, "clean")
        _killed_during_start("ring", dead)
        left = shm_entries(dead)
        assert cli.main(["shm", "clean"]) == 0
        assert shm_entries(dead) == []
        assert {f"/dev/shm/{name}" for name in left} <= set(capsys.readouterr().out.split())
        assert len(shm_entries(live.handle.prefix)) == 3
    finally:
        live.destroy()


@pytest.mark.skipif(os.geteuid() != 0, reason="making another user's objects needs root")
def test_another_users_objects_are_never_removed(prefixes: list[str]) -> None:
    """Root may unlink anything in /dev/shm: the cleanup must still leave another user's alone,
    whether its ring's maker is gone or the prefix is the one being started."""
    dead = _prefix(prefixes, "foreign")
    _killed_during_start("ring", dead)
    entries = shm_entries(dead)
    for name in entries:
        os.chown(f"/dev/shm/{name}", 65534, 65534)
    try:
        Ring.create(_prefix(prefixes, "other"), 1).destroy()
        again = Ring.create(dead, 1)
        assert set(entries) <= set(shm_entries(dead))
        again.destroy()
        assert cleanup_stale(dead) == [] and shm_entries(dead) == entries
    finally:
        for name in entries:
            with contextlib.suppress(FileNotFoundError):
                os.chown(f"/dev/shm/{name}", 0, 0)
