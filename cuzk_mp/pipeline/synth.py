"""Synthesis worker processes (``cuzk-synth-<i>``): partition input -> a, b, c, w in a ring slot.

Owns, per process: the circuits it has seen (mapped zkey, the
:class:`~cuzk_mp.groth16.synthesis.ConstraintEvaluator` with its CSR matrices,
the witness source), the vectors of the partition in hand, and at most one ring
slot in FILLING state.

One task at a time (the engine hands a worker a new task only when it is idle):

1. witness: circom wasm on the input JSON, the given ``.wtns`` bytes, or the
   PoRep-shaped synthetic generator (seed, partition index);
2. a = A w, b = B w, c = a o b (numba kernels), plus the witness check against
   the r1cs when the circuit has one: an unsatisfied witness fails this task
   (``UnsatisfiedWitness`` names the first failing constraint) and the engine
   fails that job alone;
3. wait for a free slot, holding the finished vectors (backpressure: this is
   what bounds host memory by the ring), write them, publish the slot.

Cancellation is checked at each boundary (after the witness, after a/b/c,
while waiting for a slot); a cancelled task gives its slot back and reports
``Cancelled``. A reader thread takes engine messages off the pipe, so a cancel
or a stop is seen while the main thread computes or waits.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import Cancelled, InputError
from . import messages as msg
from .procs import ChildContext
from .ring import Ring, RingHandle, SlotClaim

CIRCUIT_CACHE = 2  # circuits kept per worker (each holds its CSR matrices)


@dataclass(frozen=True)
class SynthPayload:
    """Start arguments of a synthesis worker."""

    ring: RingHandle


class _Circuit:
    """One circuit as a synthesis worker holds it: evaluator + witness source."""

    def __init__(self, ref: msg.CircuitRef) -> None:
        from ..formats.r1cs import read_r1cs
        from ..formats.zkey import read_zkey
        from ..groth16.synthesis import ConstraintEvaluator

        self.ref = ref
        self.zkey = read_zkey(ref.zkey)
        r1cs = read_r1cs(ref.r1cs) if ref.r1cs else None
        self.evaluator = ConstraintEvaluator.from_zkey(self.zkey, r1cs)
        self._wasm: Any = None
        self._synthetic: Any = None

    def witness(self, task: msg.SynthTask) -> np.ndarray:
        """The partition's full witness (standard form, ``(n_vars, 4) uint64``)."""
        if task.kind == "wtns":
            from ..formats.wtns import read_wtns

            return read_wtns(task.data, name=f"job {task.job_id} partition {task.partition} (.wtns)")
        if task.kind == "json":
            return self._wasm_calculator().calculate(_input_json(task.data, task))
        if task.kind == "synthetic":
            return self._synthetic_circuit().witness(task.seed, task.partition)
        raise InputError(f"job {task.job_id} partition {task.partition}: unknown input kind {task.kind!r}")

    def _wasm_calculator(self) -> Any:
        if self._wasm is None:
            if not self.ref.wasm:
                raise InputError(f"circuit {self.ref.circuit_id} has no wasm: 'json' inputs need one")
            from ..circuits.circom import WitnessCalculator

            self._wasm = WitnessCalculator(self.ref.wasm)
        return self._wasm

    def _synthetic_circuit(self) -> Any:
        if self._synthetic is None:
            if self.ref.synthetic is None or self.ref.log_n is None:
                raise InputError(f"circuit {self.ref.circuit_id} is not synthetic: 'synthetic' inputs need one")
            from ..circuits.synthetic_kinds import synthetic_circuit

            self._synthetic = synthetic_circuit(self.ref.synthetic, self.ref.log_n)
        return self._synthetic

    def close(self) -> None:
        """Drop the key mapping."""
        self.zkey.close()


def _input_json(data: bytes, task: msg.SynthTask) -> dict[str, object]:
    """Parse circom input JSON with the same rules as ``cuzk-mp wtns calculate`` (one implementation)."""
    from ..circuits.circom import parse_input_json

    return parse_input_json(data, f"job {task.job_id} partition {task.partition} input JSON")


class SynthWorker:
    """The main loop of one synthesis worker process."""

    def __init__(self, ctx: ChildContext, ring: Ring) -> None:
        self.ctx = ctx
        self.ring = ring
        self.tasks: queue.Queue[msg.SynthTask] = queue.Queue()
        self.cancelled: set[int] = set()
        self.circuits: OrderedDict[str, _Circuit] = OrderedDict()

    def read_messages(self) -> None:
        """Reader thread: engine messages -> task queue / cancelled set / stop flag."""
        while not self.ctx.stopping.is_set():
            try:
                m = self.ctx.recv()
            except (EOFError, OSError):
                self.ctx.stopping.set()
                return
            if isinstance(m, msg.SynthTask):
                self.tasks.put(m)
            elif isinstance(m, msg.CancelTasks):
                self.cancelled.update(m.task_ids)
            elif isinstance(m, msg.Stop):
                self.ctx.stopping.set()

    def run(self) -> None:
        """Take tasks until stopped."""
        while not self.ctx.stopping.is_set():
            try:
                task = self.tasks.get(timeout=0.25)
            except queue.Empty:
                continue
            try:
                self.run_task(task)
            except Exception as exc:  # noqa: BLE001 - any task failure goes back to the engine as data
                self.ctx.fail(task.task_id, exc)

    def _check(self, task: msg.SynthTask) -> None:
        if task.task_id in self.cancelled:
            raise Cancelled(f"job {task.job_id} partition {task.partition} was cancelled")

    def run_task(self, task: msg.SynthTask) -> None:
        """Steps 1-3 of the module docstring for one task."""
        t0 = time.time()
        circuit = self._circuit(task.circuit)
        w = circuit.witness(task)
        self._check(task)
        t1 = time.time()
        inputs = circuit.evaluator.evaluate(w)
        self._check(task)
        t2 = time.time()
        claim = SlotClaim(task.task_id, task.job_seq, task.partition, task.priority)
        slot = self.ring.acquire_free(claim, abort=lambda: self.ctx.stopping.is_set() or task.task_id in self.cancelled)
        if slot is None:
            self._check(task)
            raise Cancelled(f"{self.ctx.name} is stopping: job {task.job_id} partition {task.partition} not published")
        t3 = time.time()
        timings = {"queue_wait": task.t_dispatch - task.t_submit, "witness": t1 - t0, "synthesis": t2 - t0,
                   "ring_wait": t3 - t2}
        meta = msg.SegmentMeta(task.task_id, task.job_id, task.partition, task.attempt, task.circuit,
                               circuit.evaluator.n_public, timings)
        try:
            nbytes = self.ring.write_segment(slot, msg.encode(meta), [inputs.a, inputs.b, inputs.c, inputs.w])
            self._check(task)
        except BaseException:
            self.ring.abandon(slot)
            raise
        timings["shm_write"] = time.time() - t3
        # order: the SegmentMeta above was written without shm_write; the prover adds its own stages
        self.ring.publish(slot)
        self.ctx.send(msg.Published(task.task_id, slot, nbytes, timings))

    def _circuit(self, ref: msg.CircuitRef) -> _Circuit:
        have = self.circuits.get(ref.circuit_id)
        if have is not None and have.ref == ref:
            self.circuits.move_to_end(ref.circuit_id)
            return have
        if have is not None:
            self.circuits.pop(ref.circuit_id).close()
        while len(self.circuits) >= CIRCUIT_CACHE:
            self.circuits.popitem(last=False)[1].close()
        self.circuits[ref.circuit_id] = _Circuit(ref)
        return self.circuits[ref.circuit_id]


def _warm_up() -> None:
    """Load (or compile, the first time) the numba kernels synthesis uses, before READY."""
    from ..algebra import fr

    one = fr.from_ints([1, 2, 3])
    fr.mul(one, one)
    fr.csr_matvec(np.array([0, 1, 2, 3], np.int64), np.array([0, 1, 2], np.uint32), one, fr.from_ints([1, 2, 3], mont=False))


def main(ctx: ChildContext, payload: SynthPayload) -> None:
    """Process entry (called by :func:`cuzk_mp.pipeline.procs.bootstrap`)."""
    ring = Ring.attach(payload.ring)
    try:
        _warm_up()
        worker = SynthWorker(ctx, ring)
        threading.Thread(target=worker.read_messages, name=f"{ctx.name}-io", daemon=True).start()
        ctx.send(msg.Ready(os.getpid(), ctx.name, {"numba_threads": os.environ.get("NUMBA_NUM_THREADS")}))
        ctx.log.info("[start] ready")
        worker.run()
    finally:
        ring.close()
