"""Synthesis worker processes (``cuzk-synth-<i>``): a partition's input -> w, a, b, c in a ring slot.

Owns, per process: the circuits it has seen (the
:class:`~cuzk_mp.groth16.synthesis.ConstraintEvaluator` of each, built from the
zkey and r1cs files, and the witness source) and at most one ring slot in
FILLING state with its mapped segment. It holds no copy of a partition's
vectors: they are computed in the slot (docs/ring.md).

One task at a time (the engine hands a worker a new task only when it is idle):

1. take a FREE slot (FILLING; this blocks while none is free: the backpressure
   that bounds host memory by the ring) and map its segment (``shm_write``: nothing
   in steady state, where the slot's segment and this worker's mapping of it are
   reused; the first touch of the pages when the segment is new, docs/ring.md);
2. the witness, straight into the slot's w: the synthetic generator (seed,
   partition index), or a given ``.wtns`` or the circom wasm's output copied in;
3. a = A w, b = B w, c = a o b into the slot's a, b, c with
   ``threads_per_partition`` threads, and the witness check against the r1cs when
   the circuit has one: an unsatisfied witness fails this task
   (``UnsatisfiedWitness`` names the first failing constraint) and the engine
   fails that job alone. A circuit whose prover makes a, b, c on the device
   (``CircuitRef.witness_map`` "device": a GPU prover, a generated key) gets w alone,
   checked (shape, range, w[0] = 1), in a segment a quarter the size, for the
   synthetic generator's witnesses (see ``_Circuit.w_only``);
4. publish the slot with the partition's metadata and stage timings, and whether the
   witness was checked against the r1cs (``SegmentMeta.witness_checked``: a proof of it that
   fails its self-check can then only be the key's fault, and the prover's error says so).

A task that fails or is cancelled gives its slot back (the slot FREE, its segment
kept for the next partition); a worker killed while FILLING leaves its slot to the engine,
which reclaims it. Cancellation is checked at each boundary (slot taken,
witness done, a/b/c done), and while a circom wasm computes the witness (it is stopped
then: a generator may never end); a reader thread takes engine messages off the pipe,
so a cancel or a stop is seen while the main thread computes or waits.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import Cancelled, InputError, WorkerDied
from . import messages as msg
from .circuits import check_pinned
from .procs import CancelledIds, ChildContext
from .ring import Ring, RingHandle, SlotClaim
from .segment import partition_shapes, segment_bytes

CIRCUIT_CACHE = 2  # circuits kept per worker (each maps its circuit's shared data)


@dataclass(frozen=True)
class SynthPayload:
    """Start arguments of a synthesis worker."""

    ring: RingHandle
    threads: int  # cores one partition's synthesis may use


class _Circuit:
    """One circuit as a synthesis worker holds it: evaluator + witness source."""

    def __init__(self, ref: msg.CircuitRef) -> None:
        from ..groth16.synthesis import ConstraintEvaluator

        self.ref = ref
        if ref.key_source == "device":  # no key file: the circuit data the engine made for the generated key
            from .keys import open_device_circuit_data

            assert ref.circuit_data and ref.synthetic and ref.log_n, "CircuitTable makes device refs whole"
            self.evaluator = ConstraintEvaluator(open_device_circuit_data(ref.circuit_data, ref.synthetic, ref.log_n),
                                                 ref.circuit_id)
        else:  # the circuit data of the key the job was accepted with (a replaced zkey: rebuilt for the new file,
            # SynthWorker._circuit having checked that the file still is that key)
            self.evaluator = ConstraintEvaluator.from_files(ref.zkey, ref.r1cs)
        self._wasm: Any = None
        self._synthetic: Any = None

    def w_only(self, task: msg.SynthTask) -> bool:
        """Whether this task's slot gets w alone (the prover makes a, b, c on the device,
        CircuitRef.witness_map): for the synthetic generator's witnesses, and for any witness of a
        circuit whose data has no C. A witness from outside (.wtns, the wasm) of a circuit with C keeps
        the host's map, whose check against C names the first unsatisfied constraint; the generator's
        witness satisfies the circuit by construction, and every proof is verified before it leaves."""
        return self.ref.witness_map == "device" and (task.kind == "synthetic" or self.evaluator.data.c is None)

    def witness_into(self, task: msg.SynthTask, out: np.ndarray, threads: int, abort: Callable[[], bool]) -> None:
        """Write the partition's full witness (standard form) into ``out``, the slot's w. The circom
        wasm, which may never end, asks ``abort`` as it runs and stops (Cancelled) once it is true."""
        if task.kind == "synthetic":
            self._synthetic_circuit().witness_into(task.seed, task.partition, out, threads=threads)
            return
        if task.kind == "wtns":
            from ..formats.wtns import read_wtns

            values = read_wtns(task.data, name=f"job {task.job_id} partition {task.partition} (.wtns)")
        else:
            values = self._wasm_calculator().calculate(_input_json(task.data, task), abort=abort)
        if values.shape != out.shape:
            raise InputError(f"job {task.job_id} partition {task.partition}: the witness has {values.shape[0]} "
                             f"values, circuit {self.ref.circuit_id} has {out.shape[0]} wires")
        np.copyto(out, values, casting="no")

    def _wasm_calculator(self) -> Any:
        if self._wasm is None:
            assert self.ref.wasm, "RunningEngine.submit lets 'json' inputs through only for circuits with a wasm"
            from ..circuits.circom import WitnessCalculator

            self._wasm = WitnessCalculator(self.ref.wasm, regular_only=True)  # the file may have changed since
        return self._wasm

    def _synthetic_circuit(self) -> Any:
        if self._synthetic is None:
            assert self.ref.synthetic is not None and self.ref.log_n is not None, \
                "RunningEngine.submit lets 'synthetic' inputs through only for synthetic circuits"
            from ..circuits.synthetic_kinds import synthetic_circuit

            self._synthetic = synthetic_circuit(self.ref.synthetic, self.ref.log_n)
        return self._synthetic


def _input_json(data: bytes, task: msg.SynthTask) -> dict[str, object]:
    """Parse circom input JSON with the same rules as ``cuzk-mp wtns calculate`` (one implementation)."""
    from ..circuits.circom import parse_input_json

    return parse_input_json(data, f"job {task.job_id} partition {task.partition} input JSON")


class SynthWorker:
    """The main loop of one synthesis worker process."""

    def __init__(self, ctx: ChildContext, ring: Ring, threads: int) -> None:
        self.ctx = ctx
        self.ring = ring
        self.threads = threads
        self.tasks: queue.Queue[msg.SynthTask] = queue.Queue()
        self.cancelled = CancelledIds()
        self.circuits: OrderedDict[str, _Circuit] = OrderedDict()

    def read_messages(self) -> None:
        """Reader thread: engine messages -> task queue / cancelled set (ChildContext.messages
        sets the stop flag)."""
        for m in self.ctx.messages():
            if isinstance(m, msg.SynthTask):
                self.tasks.put(m)
            elif isinstance(m, msg.CancelTasks):
                self.cancelled.update(m.task_ids)

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

    def _given_up(self, task: msg.SynthTask) -> bool:
        """Whether nobody waits for the task any more: it was cancelled, or this worker is stopping."""
        return self.ctx.stopping.is_set() or task.task_id in self.cancelled

    def _check(self, task: msg.SynthTask) -> None:
        if task.task_id in self.cancelled:
            raise Cancelled(f"job {task.job_id} partition {task.partition} was cancelled")

    def run_task(self, task: msg.SynthTask) -> None:
        """Steps 1-4 of the module docstring for one task."""
        t0 = time.monotonic()
        circuit = self._circuit(task.circuit)
        t_loaded = time.monotonic()
        ev = circuit.evaluator
        shapes = partition_shapes(ev.domain_size, ev.n_vars, abc=not circuit.w_only(task))
        claim = SlotClaim(task.task_id, task.job_seq, task.partition, task.priority)
        self.ctx.send(msg.RingWait(task.task_id, True))  # the engine's hung-process timer stops meanwhile
        slot = self.ring.acquire_free(claim, abort=lambda: self._given_up(task),
                                      nbytes=segment_bytes(shapes))
        self.ctx.send(msg.RingWait(task.task_id, False))
        if slot is None:
            self._check(task)
            what = f"job {task.job_id} partition {task.partition} not started"
            if self.ctx.signalled is not None:  # this worker alone may be going (a signal to the process group
                # while the engine drains): the partition is lost with it and goes to another, not cancelled
                raise WorkerDied(f"{self.ctx.name} stopped on {self.ctx.signalled}: {what}")
            raise Cancelled(f"{self.ctx.name} is stopping: {what}")
        t_slot = time.monotonic()
        timings = {"queue_wait": task.t_dispatch - task.t_submit, "ring_wait": t_slot - t_loaded}
        try:
            seg = self.ring.writable_segment(slot, shapes)
            try:
                timings["shm_write"] = time.monotonic() - t_slot
                checked = self._fill(task, circuit, seg.arrays, timings)
                timings["synthesis"] += t_loaded - t0  # a circuit's first task also loads it
                meta = msg.SegmentMeta(task.task_id, task.job_id, task.partition, task.attempt, task.circuit,
                                       ev.n_public, timings, witness_checked=checked)
                self.ring.publish(slot, seg, msg.encode(meta))
            finally:
                seg.close()  # idempotent: publish has dropped the views already
        except BaseException:
            self.ring.abandon(slot)  # FILLING -> FREE, the segment kept for the next partition (a no-op once published)
            raise
        self.ctx.send(msg.Published(task.task_id, slot, seg.nbytes, timings))

    def _fill(self, task: msg.SynthTask, circuit: _Circuit, arrays: list[np.ndarray],
              timings: dict[str, float]) -> bool:
        """Witness, then a, b, c, straight into the slot's views (they go out of scope on return); the
        witness alone, checked, where the prover makes a, b, c (:meth:`_Circuit.w_only`). Returns
        whether the witness was checked against the r1cs (the host's map of a circuit with C): the
        prover's error for a proof failing its self-check then names the key alone."""
        w = arrays[-1]
        t0, cpu0 = time.monotonic(), time.process_time()
        self._check(task)
        circuit.witness_into(task, w, self.threads, abort=lambda: self._given_up(task))
        timings["witness"] = time.monotonic() - t0
        self._check(task)
        checked = False
        if len(arrays) == 1:
            circuit.evaluator.validate_witness(w)
        else:
            a, b, c = arrays[:3]
            circuit.evaluator.evaluate_into(w, a, b, c, threads=self.threads)
            checked = circuit.evaluator.data.c is not None
        self._check(task)
        timings["synthesis"] = time.monotonic() - t0
        timings["synthesis_cpu"] = time.process_time() - cpu0  # core-seconds: every thread of this process
        return checked

    def _circuit(self, ref: msg.CircuitRef) -> _Circuit:
        have = self.circuits.get(ref.circuit_id)
        if have is not None and have.ref == ref:
            self.circuits.move_to_end(ref.circuit_id)
            return have
        check_pinned(ref)  # before anything goes: a job pinned to a replaced key file fails, and the circuit
        # data held for the file as it is now stays for the jobs using it
        if have is not None:
            self.circuits.pop(ref.circuit_id).evaluator.close()
        while len(self.circuits) >= CIRCUIT_CACHE:
            self.circuits.popitem(last=False)[1].evaluator.close()
        self.circuits[ref.circuit_id] = _Circuit(ref)
        return self.circuits[ref.circuit_id]


def main(ctx: ChildContext, payload: SynthPayload) -> None:
    """Process entry (called by :func:`cuzk_mp.pipeline.procs.bootstrap`)."""
    from ..groth16.synthesis import warm_up

    ring = Ring.attach(payload.ring)
    try:
        warm_up()  # load (or compile, the first time) the synthesis kernels before READY
        worker = SynthWorker(ctx, ring, payload.threads)
        threading.Thread(target=worker.read_messages, name=f"{ctx.name}-io", daemon=True).start()
        ctx.send(msg.Ready(os.getpid(), ctx.name, {"threads": payload.threads}))
        ctx.log.info("[start] ready (%d threads per partition)", payload.threads)
        worker.run()
    finally:
        ring.close()
