"""A prover worker batches the small partitions that wait READY in the ring (CPU backend).

The ring and the Prover's threads run in this process (no engine): partitions of the
porep-like 2^10 test key are synthesised into ring slots as a synthesis worker does, then one
worker thread proves them. With three READY at once and ``batch_max`` 4 they go in one pass;
with ``batch_max`` 1 one at a time; a lone partition goes alone at once. Every slot is freed,
every proof verifies with the right public signals, and a partition cancelled while READY fails
alone while the rest of its batch is proved. The finalizer takes the partitions queued for it at
once and verifies those of one key together, skipping one cancelled while it waited; a partition
whose finalize raises or fails self-verification fails alone, the rest of its batch is proved; its
error names the key where the synthesis worker checked the witness against the circuit's r1cs.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from py_arkworks_bls12381 import G1Point

from cuzk_mp.backends.cpu import CpuBackend
from cuzk_mp.circuits.synthetic import PorepLike
from cuzk_mp.formats.zkey import read_zkey
from cuzk_mp.groth16.synthesis import ConstraintEvaluator
from cuzk_mp.pipeline import messages as msg
from cuzk_mp.pipeline.prover_proc import Prover, ProverPayload
from cuzk_mp.pipeline.types import FINALIZE_BATCH_ENV
from cuzk_mp.pipeline.ring import Ring, SlotClaim
from cuzk_mp.pipeline.segment import partition_shapes
from tests.helpers import LOG_N, ProofChecker, prefix_for


class _Ctx:
    """The parts of a ChildContext a Prover uses; messages are kept."""

    def __init__(self) -> None:
        self.name = "test-prover"
        self.stopping = threading.Event()
        self.log = logging.getLogger("test-prover")
        self.sent: list[Any] = []
        self.cond = threading.Condition()

    def send(self, m: Any) -> None:
        with self.cond:
            self.sent.append(m)
            self.cond.notify_all()

    def fail(self, task_id: int, exc: BaseException) -> None:
        self.send(msg.TaskFailed(task_id, type(exc).__name__, str(exc), ""))

    def done(self, kinds: tuple[type, ...]) -> list[Any]:
        return [m for m in self.sent if isinstance(m, kinds)]


@pytest.fixture(scope="module")
def setup(test_key: tuple[Path, Path]):  # type: ignore[no-untyped-def]
    zkey_path = test_key[0]
    with read_zkey(zkey_path) as zkey:
        ev = ConstraintEvaluator.from_zkey(zkey)
    yield SimpleNamespace(ev=ev, ref=msg.CircuitRef("syn", str(zkey_path)), checker=ProofChecker(zkey_path))


def _publish(ring: Ring, setup: SimpleNamespace, task_id: int, seed: int) -> None:
    ev = setup.ev
    slot = ring.acquire_free(SlotClaim(task_id, 1, 0, 0), abort=lambda: False)
    assert slot is not None
    seg = ring.writable_segment(slot, partition_shapes(ev.domain_size, ev.n_vars))
    a, b, c, w = seg.arrays
    w[:] = PorepLike(LOG_N).witness(seed, 0)
    ev.evaluate_into(w, a, b, c, threads=1)
    meta = msg.SegmentMeta(task_id, f"job-{task_id}", 0, 1, setup.ref, ev.n_public, {})
    ring.publish(slot, seg, msg.encode(meta))


def run_until_answered(ctx: _Ctx, prover: Prover, n: int, timeout_s: float) -> None:
    """Run the prover's worker and finalizer threads until n partitions are answered (proved or
    failed), then stop them."""
    threads = [threading.Thread(target=prover.work, daemon=True), threading.Thread(target=prover.finalize)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s
    with ctx.cond:
        while len(ctx.done((msg.ProofDone, msg.TaskFailed))) < n:
            assert ctx.cond.wait(max(0.0, deadline - time.monotonic())), "no answer for every partition"
    ctx.stopping.set()
    prover.finalize_q.put(None)
    for t in threads:
        t.join(60)
    if prover.memwatch is not None:
        prover.memwatch.stop()


def _run(setup: SimpleNamespace, batch_max: int, seeds: list[int], cancel: set[int] = frozenset()  # type: ignore[assignment]
         ) -> tuple[_Ctx, Ring]:
    """Publish one partition per seed (task ids 1, 2, ...), then run one worker until each is answered."""
    ring = Ring.create(prefix_for(f"pb{batch_max}{len(seeds)}"), 4)
    ctx = _Ctx()
    backend = CpuBackend(threads=2)
    try:
        for i, seed in enumerate(seeds):
            _publish(ring, setup, i + 1, seed)
        prover = Prover(ctx, ring, backend, ProverPayload(ring.handle, "cpu", 0, 1, True, None, batch_max))  # type: ignore[arg-type]
        prover.cancelled.update(cancel)
        run_until_answered(ctx, prover, len(seeds), 300)
        assert ring.stats().live == 0 and all(r.state == "free" for r in ring.snapshot())
        return ctx, ring
    finally:
        backend.close()
        ring.destroy()


def _check_proofs(ctx: _Ctx, setup: SimpleNamespace, seeds: list[int], batch: float) -> None:
    done = {m.task_id: m for m in ctx.done((msg.ProofDone,))}
    for task_id, m in done.items():
        public = [int(x) for x in m.public]
        assert public == setup.checker.expected_public(seeds[task_id - 1], 0)
        assert setup.checker.verifies(public, m.proof)
        assert m.timings["device_batch"] == batch and m.timings["device"] > 0


def test_ready_partitions_are_proved_in_one_pass(setup: SimpleNamespace) -> None:
    seeds = [11, 12, 13]
    ctx, _ = _run(setup, 4, seeds)
    assert sorted(m.task_id for m in ctx.done((msg.Taken,))) == [1, 2, 3]
    assert len(ctx.done((msg.ProofDone,))) == 3
    _check_proofs(ctx, setup, seeds, 3.0)


def test_batch_cap_one_proves_one_at_a_time(setup: SimpleNamespace) -> None:
    seeds = [11, 12]
    ctx, _ = _run(setup, 1, seeds)
    assert len(ctx.done((msg.ProofDone,))) == 2
    _check_proofs(ctx, setup, seeds, 1.0)


def test_lone_partition_goes_alone(setup: SimpleNamespace) -> None:
    ctx, _ = _run(setup, 4, [21])
    _check_proofs(ctx, setup, [21], 1.0)
    assert [m.timings["finalize_batch"] for m in ctx.done((msg.ProofDone,))] == [1.0]


def test_cancelled_partition_fails_alone_in_its_batch(setup: SimpleNamespace) -> None:
    seeds = [31, 32, 33]
    ctx, _ = _run(setup, 4, seeds, cancel={2})
    failed = ctx.done((msg.TaskFailed,))
    assert [m.task_id for m in failed] == [2] and failed[0].kind == "Cancelled"
    assert sorted(m.task_id for m in ctx.done((msg.ProofDone,))) == [1, 3]
    _check_proofs(ctx, setup, seeds, 2.0)


class _CappedCpu(CpuBackend):
    """The CPU backend with a batch cap, as a GPU backend's device plan sets it: from the start
    (``limit``), or once a key is loaded (``on_load``)."""

    def __init__(self, limit: int | None = None, on_load: int | None = None) -> None:
        super().__init__(threads=2)
        self.batch_limit, self.on_load = limit, on_load

    def load_key(self, zkey: Any, **kwargs: Any) -> Any:
        key = super().load_key(zkey, **kwargs)
        if self.on_load is not None:
            self.batch_limit = self.on_load
        return key


def test_the_backend_batch_limit_caps_what_a_worker_takes(setup: SimpleNamespace) -> None:
    """With four small partitions READY and ``batch_max`` 8 a worker takes them all; with the
    backend's ``batch_limit`` at 2 (its device plan allows batches of two), one more than the first."""
    for limit, more in ((None, 3), (2, 1)):
        ring = Ring.create(prefix_for(f"pbcap{limit}"), 4)
        backend = _CappedCpu(limit)
        try:
            for i in range(4):
                _publish(ring, setup, i + 1, 80 + i)
            prover = Prover(_Ctx(), ring, backend, ProverPayload(ring.handle, "cpu", 0, 1, True, None, 8))  # type: ignore[arg-type]
            assert prover.batch_cap() == (8 if limit is None else limit)
            first = ring.take_ready(abort=lambda: True, timeout_s=0)
            assert first is not None
            assert len(prover._more_ready(first)) == more
        finally:
            backend.close()
            ring.destroy()


def test_a_batch_lowered_by_its_key_plan_stages_no_more_than_it_allows(setup: SimpleNamespace) -> None:
    """Three READY partitions are taken at once before their key is loaded; loading it (the first
    partition's staging) lowers the backend's cap to 2: the worker computes the two it staged before
    it stages the third, so no more than two are ever staged together, and every proof comes out."""
    ring = Ring.create(prefix_for("pbplan"), 4)
    ctx = _Ctx()
    backend = _CappedCpu(on_load=2)
    staged: set[int] = set()  # ids of the partitions staged and not yet released
    most = [0]
    stage, release = backend.stage, backend.release

    def counted_stage(key: Any, inputs: Any) -> Any:
        out = stage(key, inputs)
        staged.add(id(out))
        most[0] = max(most[0], len(staged))
        return out

    def counted_release(s: Any) -> dict[str, float]:
        staged.discard(id(s))
        return release(s)

    backend.stage, backend.release = counted_stage, counted_release  # type: ignore[method-assign]
    seeds = [91, 92, 93]
    try:
        for i, seed in enumerate(seeds):
            _publish(ring, setup, i + 1, seed)
        prover = Prover(ctx, ring, backend, ProverPayload(ring.handle, "cpu", 0, 1, True, None, 4))  # type: ignore[arg-type]
        run_until_answered(ctx, prover, len(seeds), 300)
        assert sorted(m.task_id for m in ctx.done((msg.Taken,))) == [1, 2, 3]
        done = {m.task_id: m.timings["device_batch"] for m in ctx.done((msg.ProofDone,))}
        assert done == {1: 2.0, 2: 2.0, 3: 1.0} and most[0] == 2
        for m in ctx.done((msg.ProofDone,)):
            public = [int(x) for x in m.public]
            assert public == setup.checker.expected_public(seeds[m.task_id - 1], 0)
            assert setup.checker.verifies(public, m.proof)
    finally:
        backend.close()
        ring.destroy()


def _finalize_queued(setup: SimpleNamespace, seeds: list[int], tag: str, prepare: Any,
                     publish: Any = None) -> tuple[_Ctx, Prover]:
    """Prove one partition per seed (task ids 1, 2, ...) in one pass with the finalizer stopped, call
    ``prepare(prover)`` while they wait in its queue, then run the finalizer until each is answered.
    ``publish(ring, ctx, task_id, seed)`` fills a slot (default: :func:`_publish`)."""
    ring = Ring.create(prefix_for(tag), 4)
    ctx = _Ctx()
    backend = CpuBackend(threads=2)
    try:
        for i, seed in enumerate(seeds):
            if publish is None:
                _publish(ring, setup, i + 1, seed)
            else:
                publish(ring, ctx, i + 1, seed)
        prover = Prover(ctx, ring, backend, ProverPayload(ring.handle, "cpu", 0, 1, True, None, 4))  # type: ignore[arg-type]
        worker = threading.Thread(target=prover.work, daemon=True)
        worker.start()
        deadline = time.monotonic() + 300
        while prover.finalize_q.qsize() < len(seeds):
            assert time.monotonic() < deadline, "the partitions never reached the finalizer"
            time.sleep(0.05)
        prepare(prover)
        finalizer = threading.Thread(target=prover.finalize)
        finalizer.start()
        with ctx.cond:
            while len(ctx.done((msg.ProofDone, msg.TaskFailed))) < len(seeds):
                assert ctx.cond.wait(max(0.0, deadline - time.monotonic())), "no answer for every partition"
        ctx.stopping.set()
        prover.finalize_q.put(None)
        worker.join(30)
        finalizer.join(30)
        assert not finalizer.is_alive()
        assert [k.users for k in prover.keys.keys.values()] == [0] * len(prover.keys.keys)  # every use released
        assert ring.stats().live == 0
        return ctx, prover
    finally:
        backend.close()
        ring.destroy()


def test_queued_partitions_are_finalized_together_and_a_cancelled_one_skipped(setup: SimpleNamespace) -> None:
    """Four partitions proved in one pass wait in the finalizer's queue; one is cancelled there. The
    finalizer takes the four at once: the three live ones are verified together (``finalize_batch``
    3), the cancelled one fails alone."""
    seeds = [51, 52, 53, 54]
    ctx, _ = _finalize_queued(setup, seeds, "pbfin", lambda prover: prover.cancelled.update([2]))
    failed = ctx.done((msg.TaskFailed,))
    assert [(m.task_id, m.kind) for m in failed] == [(2, "Cancelled")]
    done = ctx.done((msg.ProofDone,))
    assert sorted(m.task_id for m in done) == [1, 3, 4]
    _check_proofs(ctx, setup, seeds, 4.0)
    assert all(m.timings["finalize_batch"] == 3.0 and m.timings["finalize"] > 0 for m in done)


def test_a_bad_partition_fails_alone_in_its_finalize_batch(setup: SimpleNamespace) -> None:
    """Of four queued partitions, one's sums are not points of the right group (the batch raises)
    and one's proof fails self-verification: the finalizer falls back to one at a time, those two
    fail, each with its own error, and the other two are proved."""
    seeds = [61, 62, 63, 64]

    def spoil(prover: Prover) -> None:
        jobs = {job.meta.task_id: job for job in prover.finalize_q.queue if job is not None}
        jobs[2].sums = replace(jobs[2].sums, b2=jobs[2].sums.a)  # a G1 point where a G2 one belongs
        jobs[3].sums = replace(jobs[3].sums, h=jobs[3].sums.h + G1Point())

    ctx, _ = _finalize_queued(setup, seeds, "pbbad", spoil)
    failed = {m.task_id: m.kind for m in ctx.done((msg.TaskFailed,))}
    assert failed == {2: "TypeError", 3: "VerificationFailed"}
    done = ctx.done((msg.ProofDone,))
    assert sorted(m.task_id for m in done) == [1, 4]
    _check_proofs(ctx, setup, seeds, 4.0)
    assert all(m.timings["finalize_batch"] == 1.0 for m in done)


def test_finalize_batch_cap_one_finalizes_one_at_a_time(setup: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    monkeypatch.setenv(FINALIZE_BATCH_ENV, "1")
    seeds = [71, 72]
    ctx, _ = _finalize_queued(setup, seeds, "pbone", lambda prover: None)
    done = ctx.done((msg.ProofDone,))
    assert sorted(m.task_id for m in done) == [1, 2]
    _check_proofs(ctx, setup, seeds, 2.0)
    assert [m.timings["finalize_batch"] for m in done] == [1.0, 1.0]


def test_a_proof_failing_after_synthesis_checked_its_witness_names_the_key(
        setup: SimpleNamespace, test_key: tuple[Path, Path]) -> None:
    """A synthesis worker checks a witness against the r1cs of a circuit registered with one, and the
    partition's segment says so: a proof of it that then fails its self-check names the key. The same
    key registered without its r1cs: the witness went unchecked, and the message leaves it in doubt."""
    from cuzk_mp.pipeline.synth import SynthWorker

    zkey, r1cs = (str(p) for p in test_key)
    refs = {1: msg.CircuitRef("with-r1cs", zkey, r1cs, None, "porep-like", LOG_N),
            2: msg.CircuitRef("without-r1cs", zkey, None, None, "porep-like", LOG_N)}

    def synthesise(ring: Ring, ctx: _Ctx, task_id: int, seed: int) -> None:
        SynthWorker(ctx, ring, 1).run_task(msg.SynthTask(  # type: ignore[arg-type]
            task_id, f"job-{task_id}", task_id, 0, 0, 1, refs[task_id], "synthetic", b"", seed,
            time.time(), time.time()))

    def spoil(prover: Prover) -> None:
        for job in prover.finalize_q.queue:
            if job is not None:
                job.sums = replace(job.sums, h=job.sums.h + G1Point())

    ctx, _ = _finalize_queued(setup, [81, 82], "pbchk", spoil, synthesise)
    failed = {m.task_id: (m.kind, m.message) for m in ctx.done((msg.TaskFailed,))}
    assert failed[1] == ("VerificationFailed",
                         "the proof did not pass self-verification although the witness satisfies the r1cs: "
                         "the proving key does not match this circuit or is damaged")
    assert failed[2][0] == "VerificationFailed" and "give the .r1cs to find the failing constraint" in failed[2][1]
    assert not ctx.done((msg.ProofDone,))
