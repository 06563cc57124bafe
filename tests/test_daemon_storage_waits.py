"""A submit whose key file or journal does not answer (a hard NFS mount whose server is gone) is refused after
a bounded wait, not left waiting for ever with its place under the queue caps held; while that call hangs, the
next submit that needs the same storage is refused at once, the status says what does not answer, and once it
answers, what the late call did is undone (the job the engine took is cancelled, the journal row removed)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cuzk_mp.daemon import protocol as P
from cuzk_mp.daemon import storage_waits
from cuzk_mp.daemon.client import AsyncClient
from cuzk_mp.daemon.journal import Journal
from cuzk_mp.daemon.server import Daemon
from cuzk_mp.errors import Unavailable
from cuzk_mp.pipeline.keys import ensure_synthetic_key
from cuzk_mp.pipeline.types import JobSpec
from tests.fake_engine import FakeEngine, run_daemon

WAIT_S = 0.5


class Storage:
    """A dead mount that comes back: calls on it block until :meth:`answer`; ``entered`` counts them."""

    def __init__(self) -> None:
        self.back = threading.Event()
        self.entered = 0

    def hang(self) -> None:
        self.entered += 1
        self.back.wait()

    def answer(self) -> None:
        self.back.set()


def _submit(seed: int, cid: str = "syn", request_id: str = "") -> P.SubmitProof:
    return P.SubmitProof(id=0, circuit_id=cid, request_id=request_id,
                         partitions=[P.PartitionIn(kind="synthetic", seed=seed)])


async def _until(check: Any) -> None:
    async with asyncio.timeout(20):
        while not check():
            await asyncio.sleep(0.01)


@pytest.fixture(autouse=True)
def short_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage_waits, "ACCEPT_WAIT_S", WAIT_S)


async def _taken_again(c: AsyncClient) -> None:
    """The refused job, sent again under its request_id once the storage answers, is taken and proved."""
    again = await c.prove("syn", [P.PartitionIn(kind="synthetic", seed=1)], request_id="first", timeout_s=20)
    assert again.state == "done"


def test_a_submit_whose_key_file_hangs_is_refused_and_frees_its_place(tmp_path: Path) -> None:
    mount = Storage()

    class KeyOnDeadMount(FakeEngine):  # circuit "syn"'s key file lies on the dead mount; "crit"'s is fine
        def submit(self, job: JobSpec) -> None:
            if job.circuit_id == "syn":
                mount.hang()  # the engine reads the key file's header as it takes a job
            super().submit(job)

    async def body(d: Daemon, addr: str) -> None:
        async with asyncio.timeout(60), await AsyncClient.connect(addr) as c:
            with pytest.raises(Unavailable, match=f"the key file of circuit syn did not answer within {WAIT_S:g} "
                                                  r"s \(its storage hangs\?\); no job was taken"):
                await c.request(_submit(1, request_id="first"))
            assert d.jobs is not None and d.jobs.queued().jobs == 0  # its place under max_queued_jobs is free
            with pytest.raises(Unavailable, match="needs the key file of circuit syn now: it has not answered"):
                await c.request(_submit(2))
            assert mount.entered == 1  # refused at once: no second thread stuck on the mount
            [stuck] = (await c.status())["storage_not_answering"]
            assert stuck["what"] == "the key file of circuit syn" and stuck["for_s"] >= WAIT_S
            crit = await c.prove("crit", [P.PartitionIn(kind="synthetic", seed=3)], timeout_s=20)
            assert crit.state == "done"  # the one place the cap allows was free for it

            engine = d.engine
            assert isinstance(engine, KeyOnDeadMount)
            engine.gate.clear()  # the engine starts no partition until the late job's fate is seen
            mount.answer()  # the late call takes the job in the engine: it is cancelled there, never proved
            await _until(lambda: "first" in engine.jobs and engine.jobs["first"]["done"])
            engine.gate.set()
            assert ("first", 0) not in engine.proved
            assert (await c.status())["storage_not_answering"] == []
            await _taken_again(c)

    run_daemon(tmp_path, body, engine=KeyOnDeadMount, max_queued_jobs=1)


def test_a_submit_in_turn_behind_a_hung_key_read_is_refused_too(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Two submits of one circuit sent together while its key file hangs: the first is refused after the wait,
    and the second, whose hand-over waits its turn behind the first, is refused with it, never begun."""
    monkeypatch.setattr(storage_waits, "TURN_CHECK_S", 0.05)
    mount = Storage()

    class KeyOnDeadMount(FakeEngine):
        def submit(self, job: JobSpec) -> None:
            mount.hang()
            super().submit(job)

    async def body(d: Daemon, addr: str) -> None:
        async with asyncio.timeout(60), await AsyncClient.connect(addr) as c:
            outcomes = await asyncio.gather(c.request(_submit(1)), c.request(_submit(2)), return_exceptions=True)
            assert [type(o) for o in outcomes] == [Unavailable, Unavailable], outcomes
            assert all("the key file of circuit syn did not answer" in str(o) for o in outcomes)
            assert mount.entered == 1  # the second one's turn never came
            [stuck] = (await c.status())["storage_not_answering"]
            assert stuck["what"] == "the key file of circuit syn"
            mount.answer()

    run_daemon(tmp_path, body, engine=KeyOnDeadMount)


def test_a_submit_whose_journal_hangs_is_refused_and_its_late_row_removed(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    mount = Storage()
    insert = Journal._insert

    def hung_insert(self: Journal, entry: Any) -> None:
        if not mount.back.is_set():
            mount.hang()
        insert(self, entry)

    monkeypatch.setattr(Journal, "_insert", hung_insert)

    async def body(d: Daemon, addr: str) -> None:
        async with asyncio.timeout(60), await AsyncClient.connect(addr) as c:
            with pytest.raises(Unavailable, match=f"the journal did not answer within {WAIT_S:g} s"):
                await c.request(_submit(1, request_id="first"))
            assert isinstance(d.engine, FakeEngine) and d.engine.jobs["first"]["done"]  # cancelled: not durable
            with pytest.raises(Unavailable, match="needs the journal now"):
                await c.request(_submit(2, cid="crit"))
            assert mount.entered == 1
            healthy, why = d.health()  # /healthz: 503, no job is accepted anywhere
            assert not healthy and why.startswith("the journal has not answered for ")
            mount.answer()  # the late write lands, and the removal queued behind it takes the row away
            assert d.jobs is not None
            await _until(lambda: d.jobs is not None and not d.jobs.storage.report())
            await d.jobs.flush()
            rows = sqlite3.connect(d.cfg.journal_path).execute("SELECT job_id FROM jobs").fetchall()
            assert rows == [] and d.health() == (True, "ok")
            await _taken_again(c)

    run_daemon(tmp_path, body)


def test_a_finished_jobs_journal_write_that_hangs_holds_neither_its_waiter_nor_the_daemon(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The journal's write of a job's end hangs: the client waiting for the job gets its proofs after the wait
    (as where the disk is full: the journal says queued until the write lands), new submits are refused at once
    and /healthz says why; once the journal answers, the end is journaled and submits are taken again."""
    mount = Storage()
    finish = Journal._finish

    def hung_finish(self: Journal, *args: Any) -> None:
        if not mount.back.is_set():
            mount.hang()
        finish(self, *args)

    monkeypatch.setattr(Journal, "_finish", hung_finish)

    async def body(d: Daemon, addr: str) -> None:
        async with asyncio.timeout(60), await AsyncClient.connect(addr) as c:
            done = await c.prove("syn", [P.PartitionIn(kind="synthetic", seed=1)], request_id="first", timeout_s=20)
            assert done.state == "done" and mount.entered == 1  # answered although its end is not journaled
            with pytest.raises(Unavailable, match="needs the journal now: it has not answered for"):
                await c.request(_submit(2, cid="crit"))
            assert not d.health()[0]
            mount.answer()
            assert d.jobs is not None
            await _until(lambda: d.jobs is not None and not d.jobs.storage.report())
            assert await d.jobs.write_pending() == 0
            rows = sqlite3.connect(d.cfg.journal_path).execute("SELECT state FROM jobs WHERE job_id='first'")
            assert rows.fetchall() == [("done",)] and d.health() == (True, "ok")
            crit = await c.prove("crit", [P.PartitionIn(kind="synthetic", seed=2)], timeout_s=20)
            assert crit.state == "done"

    run_daemon(tmp_path, body)


def test_a_verification_key_read_that_hangs_is_refused_after_the_wait(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """GetVerificationKey of a circuit whose key file hangs (``client await --out`` asks for it to write
    verification_key.json) answers Unavailable after the storage wait, where it waited for ever; another
    circuit's vk is served meanwhile, and once the file answers, its own."""
    from cuzk_mp.daemon.status import StatusView

    mount = Storage()
    identity = StatusView._key_identity

    def hung_identity(self: StatusView, cid: str) -> Any:
        if cid == "syn" and not mount.back.is_set():
            mount.hang()
        return identity(self, cid)

    monkeypatch.setattr(StatusView, "_key_identity", hung_identity)
    # both circuits prove with one dev key: made here, so that crit's read during the hang reads a file (making
    # the key there, the first in a process, took longer than the wait when this test ran first in its process)
    ensure_synthetic_key("porep-like", 10, tmp_path / "cache")

    async def body(d: Daemon, addr: str) -> None:
        async with asyncio.timeout(60), await AsyncClient.connect(addr) as c:
            with pytest.raises(Unavailable, match=f"circuit syn: its key file did not answer within {WAIT_S:g} s"):
                await c.verification_key("syn")
            assert (await c.vk_reply("crit")).vk
            mount.answer()
            assert (await c.vk_reply("syn")).vk

    run_daemon(tmp_path, body)


def test_pipelined_submits_of_a_circuit_reach_the_engine_in_their_order(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Three submits sent back to back on one connection are queued by the engine in the order sent, even where
    the first one's hand-over is the slowest (its key file's header read from a slow disk): a batch that submits
    jobs in order has them proved in that order at one priority. Each waits for its turn, and the storage wait
    counts from its own start: the last one's turn comes after the wait, and it is taken all the same."""
    monkeypatch.setattr(storage_waits, "ACCEPT_WAIT_S", 1.0)

    class SlowReads(FakeEngine):
        def submit(self, job: JobSpec) -> None:
            time.sleep(0.6 if job.job_id == "a" else 0.45)
            super().submit(job)

    async def body(d: Daemon, addr: str) -> None:
        async with asyncio.timeout(60), await AsyncClient.connect(addr) as c:
            await asyncio.gather(*(c.request(_submit(i, request_id=rid)) for i, rid in enumerate("abc")))
            assert isinstance(d.engine, SlowReads) and d.engine.submitted == ["a", "b", "c"]

    run_daemon(tmp_path, body, engine=SlowReads)
