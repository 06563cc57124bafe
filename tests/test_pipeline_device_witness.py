"""A generated key on the GPU backend: synthesis writes w alone into the ring, the prover makes a, b, c.

The ring, a synthesis worker and a prover's threads run in this process (no engine), the prover on
the GPU backend's host code over the kernel emulator (tests/gpu_emu). The circuit table gives a
device-key circuit the device witness map on "gpu" (and not on "cpu", nor with the env override);
the worker publishes segments of w alone (a quarter of the bytes), checked; the prover generates the
INSECURE dev key, stages each partition with ``stage_witness`` from the circuit data and proves it:
every proof verifies with the key's verification key and has the partition's public signals. A
witness from outside (.wtns) of that circuit keeps the host's map (its check against C).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cuzk_mp.circuits.synthetic import PorepLike
from cuzk_mp.pipeline import messages as msg
from cuzk_mp.pipeline.circuits import WITNESS_MAP_ENV, CircuitTable
from cuzk_mp.pipeline.ring import Ring
from cuzk_mp.pipeline.segment import partition_segment_bytes, partition_shapes, segment_bytes
from cuzk_mp.pipeline.types import CircuitSpec
from tests.helpers import LOG_N, prefix_for
from tests.test_prover_batching import _Ctx, run_until_answered


@pytest.fixture(scope="module")
def emu_backend() -> Any:
    from tests import gpu_emu

    if not gpu_emu.available():
        pytest.skip("no host C++ compiler for the kernel emulator")
    from tests.gpu_emu.backend import load_backend

    backend = load_backend().GpuBackend(0)
    yield backend
    backend.close()


def _spec() -> CircuitSpec:
    return CircuitSpec("syn", synthetic="porep-like", log_n=LOG_N, key_source="device", partitions=2)


def test_the_table_gives_device_key_circuits_the_gpus_witness_map(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    assert CircuitTable(tmp_path, "gpu").make_ref(_spec()).witness_map == "device"
    assert CircuitTable(tmp_path, "cpu").make_ref(_spec()).witness_map == "host"
    from cuzk_mp.backends import resolve_backend_name

    auto = "device" if resolve_backend_name("auto") == "gpu" else "host"
    assert CircuitTable(tmp_path, "auto").make_ref(_spec()).witness_map == auto
    monkeypatch.setenv(WITNESS_MAP_ENV, "host")
    assert CircuitTable(tmp_path, "gpu").make_ref(_spec()).witness_map == "host"
    monkeypatch.setenv(WITNESS_MAP_ENV, "gpu")
    with pytest.raises(Exception, match="expected host or device"):
        CircuitTable(tmp_path, "gpu").make_ref(_spec())


def _task(ref: msg.CircuitRef, task_id: int, seed: int, kind: str = "synthetic", data: bytes = b"") -> msg.SynthTask:
    now = time.monotonic()
    return msg.SynthTask(task_id, f"job-{task_id}", 1, 0, 0, 1, ref, kind, data, seed, now, now)


def test_w_alone_through_the_ring_proves_on_the_device_witness_map(tmp_path: Path, emu_backend: Any,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from cuzk_mp.formats.snarkjs_json import proof_from_json, vk_from_json
    from cuzk_mp.groth16.keys import prepare_vk
    from cuzk_mp.groth16.verifier import verify
    from cuzk_mp.pipeline.prover_proc import Prover, ProverPayload
    from cuzk_mp.pipeline.synth import SynthWorker

    # the prover's device-memory sampler reads the emulated backend's memory module
    monkeypatch.setitem(sys.modules, "cuzk_mp.backends.gpu.memory", type(emu_backend)._upload.__globals__["memory"])
    ref = CircuitTable(tmp_path, "gpu").make_ref(_spec())
    ring = Ring.create(prefix_for("devwit"), 3)
    ctx = _Ctx()
    seeds = [5, 6]
    try:
        worker = SynthWorker(ctx, ring, 1)  # type: ignore[arg-type]
        for i, seed in enumerate(seeds):
            worker.run_task(_task(ref, i + 1, seed))
        circuit = worker.circuits["syn"]
        ev = circuit.evaluator
        published = ctx.done((msg.Published,))
        assert [p.nbytes for p in published] == [partition_segment_bytes(ev.domain_size, ev.n_vars, False)] * 2
        assert published[0].nbytes < partition_segment_bytes(ev.domain_size, ev.n_vars) / 2  # pages, header
        prover = Prover(ctx, ring, emu_backend, ProverPayload(ring.handle, "gpu", 0, 1, True, None, 1))  # type: ignore[arg-type]
        run_until_answered(ctx, prover, len(seeds), 600)
        assert not ctx.done((msg.TaskFailed,)), ctx.done((msg.TaskFailed,))
        assert ring.stats().live == 0 and all(r.state == "free" for r in ring.snapshot())
        vks = [m.vk for m in ctx.done((msg.KeyState,)) if m.vk]
        assert vks, "the prover reported no verification key for the key it generated"
        pvk = prepare_vk(vk_from_json(json.loads(vks[0])))
        circuit_gen = PorepLike(LOG_N)
        done = ctx.done((msg.ProofDone,))
        assert sorted(m.task_id for m in done) == [1, 2]
        for m in done:
            public = [int(x) for x in m.public]
            assert public == circuit_gen.public_inputs(seeds[m.task_id - 1], 0)
            assert verify(pvk, public, proof_from_json(m.proof)), f"task {m.task_id}"
            bad = [public[0] + 1, *public[1:]]
            assert not verify(pvk, bad, proof_from_json(m.proof))
        # a .wtns witness of the same circuit: the host's map (a, b, c and w in the slot, checked against C)
        assert not circuit.w_only(_task(ref, 9, 0, kind="wtns")) and circuit.w_only(_task(ref, 9, 0))
        keys = prover.keys.keys
        assert keys["syn"].rows is not None
    finally:
        ring.destroy()


def test_segments_of_w_alone_are_a_quarter_of_the_bytes(tmp_path: Path) -> None:
    """The ring's segment of w alone, and the memory model's, which the bench sizes the ring with."""
    from cuzk_mp.pipeline.keys import ensure_synthetic_circuit_data
    from cuzk_mp.pipeline.memory import circuit_data_size

    n = 1 << 20
    assert partition_shapes(n, n - 7, abc=False) == [(n - 7, 4)]
    full, w_only = partition_segment_bytes(n, n - 7), partition_segment_bytes(n, n - 7, abc=False)
    assert 3.9 < full / w_only < 4.1
    assert np.dtype(np.uint64).itemsize * 4 * (n - 7) <= w_only
    data = ensure_synthetic_circuit_data("porep-like", LOG_N, tmp_path)
    host, device = circuit_data_size(data), circuit_data_size(data, abc=False)
    assert host.segment_bytes == partition_segment_bytes(host.domain_size, host.n_vars)
    assert device.segment_bytes == partition_segment_bytes(host.domain_size, host.n_vars, False)
    assert device.segment_bytes == segment_bytes(partition_shapes(host.domain_size, host.n_vars, False))


def test_the_daemons_budget_sizes_those_segments_as_w_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon's host budget sizes a generated-key circuit's ring segments as its engine's
    backend fills them: w alone on the GPU, a, b, c and w on the CPU or with the override."""
    from cuzk_mp.daemon.budget import circuit_size, largest

    spec = _spec()
    on_gpu, on_cpu = circuit_size(spec, "gpu"), circuit_size(spec, "cpu")
    assert not on_gpu.abc and on_cpu.abc and on_gpu.key_bytes == on_cpu.key_bytes == 0
    assert 2.9 < on_cpu.segment_bytes / on_gpu.segment_bytes <= 4.1  # 3 at 2^10: the header and page rounding
    assert largest([spec], "gpu").segment_bytes == on_gpu.segment_bytes
    file_key = CircuitSpec("f", synthetic="porep-like", log_n=LOG_N)
    assert circuit_size(file_key, "gpu").abc  # a key file: the host's map
    monkeypatch.setenv(WITNESS_MAP_ENV, "host")
    assert circuit_size(spec, "gpu").abc


def test_a_hand_made_circuit_data_file_fails_the_task_and_the_worker_carries_on(tmp_path: Path,
                                                                               caplog: Any) -> None:
    """The circuit data of a generated key, changed by hand after the engine made it (a column past
    the wires, with a valid body hash): the synthesis worker that maps it fails that task with a
    FormatError naming the file and the defect (data, never a read outside an array); the same
    worker takes the next task once the engine has made the file again (the hand-made one moved aside)."""
    import logging
    import threading

    from cuzk_mp.pipeline.keys import ensure_synthetic_circuit_data
    from cuzk_mp.pipeline.synth import SynthWorker
    from tests.helpers import rewrite_cache

    ref = CircuitTable(tmp_path, "gpu").make_ref(_spec())  # the device witness map: w alone, no kernel here
    assert ref.circuit_data is not None
    path = Path(ref.circuit_data)
    rewrite_cache(path, body_change=("a_col", 0, 1 << 30))
    ring = Ring.create(prefix_for("handmade"), 2)
    ctx = _Ctx()
    worker = SynthWorker(ctx, ring, 1)  # type: ignore[arg-type]
    loop = threading.Thread(target=worker.run, daemon=True)
    loop.start()
    try:
        worker.tasks.put(_task(ref, 1, 5))
        with ctx.cond:
            assert ctx.cond.wait_for(lambda: ctx.done((msg.TaskFailed, msg.Published)), 60)
        failed = ctx.done((msg.TaskFailed,))
        assert [m.task_id for m in failed] == [1] and not ctx.done((msg.Published,))
        assert failed[0].kind == "FormatError"
        assert failed[0].message.startswith(f"{path}, section A columns: entry 0 is 1073741824, not below")
        with caplog.at_level(logging.WARNING, logger="cuzk_mp.groth16.circuit_data"):
            assert ensure_synthetic_circuit_data("porep-like", LOG_N, tmp_path) == path
        assert "moved to" in caplog.text and path.with_name(path.name + ".damaged").exists()
        worker.tasks.put(_task(ref, 2, 6))
        with ctx.cond:
            assert ctx.cond.wait_for(lambda: ctx.done((msg.Published,)), 60)
        assert loop.is_alive() and [m.task_id for m in ctx.done((msg.Published,))] == [2]
    finally:
        ctx.stopping.set()
        loop.join(10)
        ring.destroy()


def _answer(ctx: _Ctx, task_id: int, timeout_s: float = 300) -> Any:
    """The prover's answer (ProofDone or TaskFailed) for ``task_id``, waited for."""
    def found() -> list[Any]:
        return [m for m in ctx.done((msg.ProofDone, msg.TaskFailed)) if m.task_id == task_id]

    with ctx.cond:
        assert ctx.cond.wait_for(found, timeout_s), f"no answer for task {task_id}"
    return found()[0]


def test_a_damaged_circuit_data_file_fails_the_provers_task_alone(tmp_path: Path, emu_backend: Any,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: Any) -> None:
    """The prover's side of a generated key whose circuit data is changed by hand after the engine made
    it (each partition synthesised before, from the sound file): with a column past the wires the key
    cannot be generated from it; with the key resident, a file that copies the circuit's identity but
    claims more wires than the key cannot give the device witness map its rows. Each is a FormatError
    naming the file (and both counts) that fails that partition's task alone: the prover's threads carry
    on, and once the engine has made the file again (the hand-made one moved aside) the next partition
    proves with the resident key."""
    import logging
    import threading

    from cuzk_mp.formats.snarkjs_json import proof_from_json, vk_from_json
    from cuzk_mp.groth16.circuit_data_file import read_counts
    from cuzk_mp.groth16.keys import prepare_vk
    from cuzk_mp.groth16.verifier import verify
    from cuzk_mp.pipeline.keys import ensure_synthetic_circuit_data
    from cuzk_mp.pipeline.prover_proc import Prover, ProverPayload
    from cuzk_mp.pipeline.synth import SynthWorker
    from tests.helpers import rewrite_cache

    monkeypatch.setitem(sys.modules, "cuzk_mp.backends.gpu.memory", type(emu_backend)._upload.__globals__["memory"])
    ref = CircuitTable(tmp_path, "gpu").make_ref(_spec())
    assert ref.circuit_data is not None
    path = Path(ref.circuit_data)
    ring = Ring.create(prefix_for("devbad"), 2)
    ctx = _Ctx()
    worker = SynthWorker(ctx, ring, 1)  # type: ignore[arg-type]
    prover = Prover(ctx, ring, emu_backend, ProverPayload(ring.handle, "gpu", 0, 1, True, None, 1))  # type: ignore[arg-type]
    threads = [threading.Thread(target=prover.work, daemon=True), threading.Thread(target=prover.finalize)]
    try:
        worker.run_task(_task(ref, 1, 5))
        rewrite_cache(path, body_change=("a_col", 0, 1 << 30))
        for t in threads:
            t.start()
        failed = _answer(ctx, 1)
        assert isinstance(failed, msg.TaskFailed) and failed.kind == "FormatError", failed
        assert failed.message.startswith(f"{path}, section A columns: entry 0 is 1073741824, not below")
        assert "syn" not in prover.keys.keys

        with caplog.at_level(logging.WARNING, logger="cuzk_mp.groth16.circuit_data"):
            ensure_synthetic_circuit_data("porep-like", LOG_N, tmp_path)  # the engine makes it again
        assert "moved to" in caplog.text
        prover.keys.preload(ref)  # the key generated from the sound file: resident, no rows mapped yet
        assert prover.keys.keys["syn"].rows is None
        n_vars = read_counts(path).n_vars
        rewrite_cache(path, {"n_vars": n_vars + 8})  # its indices stay within the key's wires
        worker.run_task(_task(ref, 2, 6))
        failed = _answer(ctx, 2)
        assert isinstance(failed, msg.TaskFailed) and failed.kind == "FormatError", failed
        assert failed.message == (f"{path}, section header: not the circuit of its key: {n_vars + 8} wires, "
                                  f"the key has {n_vars}")

        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="cuzk_mp.groth16.circuit_data"):
            ensure_synthetic_circuit_data("porep-like", LOG_N, tmp_path)
        assert f"not the circuit of its key: {n_vars + 8} wires, the key has {n_vars}: moved to" in caplog.text
        worker.run_task(_task(ref, 3, 7))
        done = _answer(ctx, 3)
        assert isinstance(done, msg.ProofDone), done
        assert all(t.is_alive() for t in threads)
        vk = [m.vk for m in ctx.done((msg.KeyState,)) if m.vk][-1]
        public = [int(x) for x in done.public]
        assert public == PorepLike(LOG_N).public_inputs(7, 0)
        assert verify(prepare_vk(vk_from_json(json.loads(vk))), public, proof_from_json(done.proof))
        assert ring.stats().live == 0 and all(r.state == "free" for r in ring.snapshot())
    finally:
        ctx.stopping.set()
        prover.finalize_q.put(None)
        for t in threads:
            if t.is_alive() or t.ident is not None:
                t.join(60)
        if prover.memwatch is not None:
            prover.memwatch.stop()
        ring.destroy()
