"""Storage that hangs under a running daemon: a key file, the param cache or the journal's folder on a
hard NFS mount whose server went away, where open, read, stat and fsync never return.

Whatever hangs, the daemon keeps answering the others (GetStatus, the other circuits' requests), and
its stop (SIGTERM) ends with its process exiting: a call stuck on such a mount must neither block the
asyncio loop, nor hold a lock or a thread that other work waits for, nor be joined at the exit (as a
thread of the loop's default executor is, at the end of ``asyncio.run`` and at interpreter exit).

Each case runs a daemon (the engine's in-process double, with the one call that touches the dead
mount made to block for ever) in a process of its own, which prints what it could do and must exit
after its SIGTERM.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

# argv: a folder, what hangs. Prints one line per check, then "stopped" once the daemon's run returned.
_HUNG_DAEMON = """
import asyncio, dataclasses, os, signal, sys, threading
from pathlib import Path
from tests.fake_engine import FakeEngine, make_config
from cuzk_mp.daemon import protocol as P
from cuzk_mp.daemon.client import AsyncClient
from cuzk_mp.daemon.instance_lock import InstanceLock
from cuzk_mp.daemon.journal import Journal
from cuzk_mp.daemon.server import Daemon
from cuzk_mp.daemon.status import StatusView

tmp, what = Path(sys.argv[1]), sys.argv[2]
import cuzk_mp.daemon.server as server_module
server_module.JOURNAL_STOP_WAIT_S = 1.0  # the stop gives a hung journal or lock file up after 1 s, not 10
entered = []  # one entry per call stuck on the dead mount (or, "vk", per read asked for)

def hung(*args, **kw):
    entered.append(threading.current_thread().name)
    threading.Event().wait()

class HungEngine(FakeEngine):  # circuit "syn"'s key lies on the dead mount; "crit"'s is fine
    def preload(self, cid):
        if cid == "syn" and what in ("preload", "start"):
            hung()
        super().preload(cid)

    def submit(self, job):
        if job.circuit_id == "syn" and what in ("submit", "restore"):
            hung()  # the engine reads the key file's header as it accepts a job
        super().submit(job)

class Idle(FakeEngine):  # proves nothing: a job submitted stays queued
    def start(self):
        self.gate.clear()
        return super().start()

if what == "vk":
    read_vk = StatusView.verification_key
    StatusView.verification_key = lambda self, cid: (entered.append(cid), read_vk(self, cid))[1]
    StatusView._key_identity = lambda self, cid: threading.Event().wait() if cid == "syn" else None
    StatusView._make_vk = lambda self, cid: {"circuit": cid}
if what == "journal":
    Journal._insert = lambda self, entry: hung()
if what == "lock":  # the daemon's lock file lies beside the journal
    InstanceLock.acquire = lambda self: hung()
if what == "unlock":  # the mount went away while the daemon ran: its lock files' close never returns
    InstanceLock.release = lambda self: hung()

def stuck_calls():  # as many as the loop's default executor has threads, where a request takes one
    return min(32, (os.cpu_count() or 1) + 4) if what in ("preload", "vk") else 0 if what == "unlock" else 1

def request(cid):
    if what in ("preload", "start"):
        return P.PreloadSRS(id=0, circuit_id=cid)
    if what == "vk":
        return P.GetVerificationKey(id=0, circuit_id=cid)
    if what == "journal" and cid == "crit":  # every submit waits for the journal: another request
        return P.GetMetrics(id=0)
    return P.SubmitProof(id=0, circuit_id=cid, partitions=[P.PartitionIn(kind="synthetic", seed=1)])

async def answered(call, label):
    try:
        await asyncio.wait_for(call, 20)
        print(label, "answered", flush=True)
    except asyncio.TimeoutError:
        print(label, "NOT answered", flush=True)

async def main():
    cfg = make_config(tmp)
    if what == "start":
        cfg = dataclasses.replace(cfg, preload=("syn",))
    if what == "restore":  # a job journaled by an earlier run and not proved: the start hands it over again
        first = Daemon(cfg, engine_factory=Idle)
        await first.start()
        async with await AsyncClient.connect(str(cfg.listen)) as c:
            await c.request(request("syn"))
        await first.stop()
    d = Daemon(cfg, engine_factory=HungEngine)
    served = asyncio.ensure_future(d.run())
    if what in ("start", "restore", "lock"):  # a start step hangs: the lock, a preload, a journaled job's resubmit
        while not entered:
            await asyncio.sleep(0.02)
    else:
        while d.state.value != "running":
            await asyncio.sleep(0.02)
        clients = [await AsyncClient.connect(str(cfg.listen)) for _ in range(stuck_calls() + 1)]
        stuck = [asyncio.ensure_future(c.request(request("syn"))) for c in clients[1:]]
        while len(entered) < len(stuck) and not any(s.done() for s in stuck) and what != "unlock":
            await asyncio.sleep(0.02)
        await answered(clients[0].status(), "status")
        await answered(clients[0].request(request("crit")), "crit")
    os.kill(os.getpid(), signal.SIGTERM)
    await served
    print("stopped", flush=True)

asyncio.run(main())
"""


def _run_hung(tmp_path: Path, what: str) -> str:
    """Run the daemon of ``_HUNG_DAEMON`` with ``what`` hanging; its output once its process exited."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUZK_MP_CACHE": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-c", _HUNG_DAEMON, str(tmp_path), what], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"the daemon's process did not exit after its stop (stdout {out!r}); stderr:\n"
                             f"{err[-3000:]}") from None
    assert proc.returncode == 0, err[-3000:]
    return out


@pytest.mark.parametrize("what", ["preload", "vk", "submit", "journal", "unlock"])
def test_a_request_stuck_on_a_dead_mount_leaves_the_daemon_answering_and_stoppable(tmp_path: Path,
                                                                                   what: str) -> None:
    """Key loads (PreloadSRS), verification-key reads, a submit whose key file's header read hangs, and a
    journal write that never returns: the daemon still answers GetStatus and the same request for a
    circuit whose storage is fine (with the journal, whose writes every submit waits for: GetMetrics),
    and exits after SIGTERM, also where its lock files' release at the stop hangs (``unlock``)."""
    assert _run_hung(tmp_path, what) == "status answered\ncrit answered\nstopped\n"


@pytest.mark.parametrize("what", ["start", "restore", "lock"])
def test_a_stop_during_a_start_stuck_on_a_dead_mount_ends_the_process(tmp_path: Path, what: str) -> None:
    """``[srs] preload`` of a key on the dead mount, a journaled job of that key handed to the engine
    again, the daemon's lock file beside a journal on the dead mount: the start never ends by itself;
    SIGTERM stops the daemon all the same, and its process exits."""
    assert _run_hung(tmp_path, what) == "stopped\n"
