#!/usr/bin/env python3
"""Small circuits on the GPU in one call (~4 min): where a small proof's time goes, lone and batched
device time per proof, the pipeline at 2^16, the one-shot CLI, the daemon's latency; a table last.

On the GPU machine (repository root, the cp312 wheels installed as README "The GPU machine" says):

    python3 perf/gpu_small.py --out $OUT          # budget 230 s

writes ``$OUT/gpu-small.json`` (the rows for perf/results/gpu-small-h200.json), ``$OUT/logs/`` and
``$OUT/timeline-2^16.json``, and prints the table last. Sections, in this order (``--skip`` any):

* ``warm``      ``scripts/warm_caches.py``, as an install runs it (numba's kernels into its cache);
* ``keys``      GPU dev keys of the porep-like circuit at 2^12, 2^14, 2^16, 2^18 (``setup_2^N_s``);
* ``timeline``  one traced 2^16 proof, lone and in a batch of 4: every kernel launch and every CuPy
  call of the backend and the MSMs between two CUDA events on its stream, with host clocks around
  it; ``timeline_2^16_*``: the device span, the kernel-busy time (union of the intervals), the
  idle gaps, the host time spent blocked in calls that wait for the device (sorts, index lists,
  copies back), the launch count; the full list goes to ``timeline-2^16.json``;
* ``device``    per size: ``device_2^N_lone_ms`` (prove_start wall, median of 10, resident key with
  its default multiples; ``..._events_ms`` the backend's CUDA-event total) and
  ``device_2^N_batch4_ms`` / ``_batch8_ms`` (prove_start_batch over 4 / 8 staged partitions, per
  proof; the copies of staging are waited for before the clock starts); at 2^16 also without
  multiples (``..._multiples_none``); every proof assembled and self-verified (pairing);
* ``params``    at 2^12 and 2^16, lone device time per proof for MSM launch geometries (sorted entries
  per accumulation thread, heads per combine thread, group sums, buckets per reduction thread;
  ``_graph``: the dense passes as CUDA graphs):
  ``device_2^N_lone_s{seg}c{combine_seg}[g{group}b{bucket_chunk_min}][_graph]_ms``,
  and which one the backend picks for the size (``params_2^N_chosen``);
* ``oneshot``   ``cuzk-mp groth16 prove --backend gpu`` at 2^16 as whole processes after ``warm``:
  the first and the median of three warm ones (``oneshot_2^16_first_s`` / ``_warm_s``), the
  in-process steps from its log line (``oneshot_2^16_step_*_ms``), the start (imports, key and
  witness: ``_start_s``; the backend ready after that: ``_backend_after_s``), imports (``-X
  importtime``) and one warm process under cProfile (``_profile_top``: cumulative ms by function);
  then ``perf/keep_warm.py``: the call that starts the key's warm daemon (``_keep_warm_start_s``)
  and the median of three calls that find it (``_keep_warm_s``);
* ``pipeline``  ``cuzk-mp bench --backend gpu --log-n 16`` (10 jobs x 10 partitions, 8 synthesis
  workers): ``pipeline_2^16_s_per_partition`` with batching (the default cap, 8) and
  ``..._nobatch`` (``CUZK_MP_PROVER_BATCH=1``) and ``..._batch4`` (4), the ring slots derived;
  ``..._inflight8``: 30 jobs, 8 at a time, ``..._inflight8_w3`` with 3 prover workers
  (:data:`PIPELINE_VARIANTS`); every proof verified by the bench (``--pipeline-sizes``: the sizes;
  ``CUZK_MP_STACK_PROFILE=DIR``: a stack profile of each bench's processes under DIR);
* ``daemon``    ``perf/daemon_latency.py --backend gpu --log-n 12``: ``daemon_2^12_latency_p50_ms``
  (client submit -> proof on disk) and the daemon's own overhead.

``--dry-run`` (no GPU): the backend's host code on the kernel emulator (tests/gpu_emu) at 2^10 for
keys, timeline and device; warm and oneshot with the CPU backend at 2^10; pipeline and daemon skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import re
import statistics
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from device_run import DeviceRun, cli, table  # perf/, the script's own folder

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BUDGET_S = 230.0
ESTIMATE_S = {"warm": 60.0, "keys": 25.0, "timeline": 8.0, "device": 20.0, "params": 25.0, "oneshot": 45.0,
              "pipeline": 60.0, "daemon": 45.0}
SIZES = (12, 14, 16, 18)
BATCH = 4
BIG_BATCH = 8  # device rows also at this batch size (one batched MSM per section for small keys)
REPS = 20
# label -> MsmParams knobs: sorted entries per accumulation thread (s), heads per combine thread (c), group
# sums per thread (g), fewest buckets per reduction thread (b)
PARAM_SWEEP = {
    "s16c16": {"seg": 16, "combine_seg": 16},
    "s8c8": {"seg": 8, "combine_seg": 8},
    "s4c4": {"seg": 4, "combine_seg": 4},
    "s4c4g4b2": {"seg": 4, "combine_seg": 4, "group": 4, "bucket_chunk_min": 2},
    "s4c4g4b1": {"seg": 4, "combine_seg": 4, "group": 4, "bucket_chunk_min": 1},
    "s2c2g2b2": {"seg": 2, "combine_seg": 2, "group": 2, "bucket_chunk_min": 2},
    "s8c8g8b4": {"seg": 8, "combine_seg": 8, "group": 8, "bucket_chunk_min": 4},
    "s4c4g4b2_graph": {"seg": 4, "combine_seg": 4, "group": 4, "bucket_chunk_min": 2, "graphs": True},
    "s2c2g2b2_graph": {"seg": 2, "combine_seg": 2, "group": 2, "bucket_chunk_min": 2, "graphs": True},
    "s2c2g2b1_graph": {"seg": 2, "combine_seg": 2, "group": 2, "bucket_chunk_min": 1, "graphs": True},
    "s4c2g2b2_graph": {"seg": 4, "combine_seg": 2, "group": 2, "bucket_chunk_min": 2, "graphs": True},
    "s8c4g4b4_graph": {"seg": 8, "combine_seg": 4, "group": 4, "bucket_chunk_min": 4, "graphs": True},
}
TABLE_KEYS = [
    "warm_s", *(f"setup_2^{n}_s" for n in SIZES),
    *(f"timeline_2^{n}_{k}" for n in SIZES for k in ("lone_span_ms", "lone_busy_ms", "lone_idle_ms",
                                                      "lone_host_blocked_ms", "lone_launches", "batch4_span_ms",
                                                      "batch4_busy_ms")),
    *(f"device_2^{n}_{k}_ms" for n in SIZES for k in ("lone", "lone_events", "batch4", "batch8")),
    "device_2^16_lone_multiples_none_ms", "device_2^16_batch4_multiples_none_ms",
    *(f"device_2^{n}_lone_{label}_ms" for n in (12, 16, 18) for label in PARAM_SWEEP),
    "params_2^12_chosen", "params_2^16_chosen",
    "oneshot_2^16_first_s", "oneshot_2^16_warm_s", "oneshot_2^16_import_s", "oneshot_2^16_keep_warm_start_s",
    "oneshot_2^16_keep_warm_s",
    *(f"pipeline_2^{n}_{k}" for n in SIZES for k in ("s_per_partition", "s_per_partition_nobatch",
                                                      "s_per_partition_batch4", "s_per_partition_inflight8",
                                                      "device_ms", "device_ms_nobatch", "device_ms_batch4",
                                                      "device_ms_inflight8", "s_per_partition_inflight8_w3",
                                                      "proofs_verified")),
    "daemon_2^12_latency_p50_ms", "daemon_2^12_overhead_ms", "daemon_2^12_proofs_verified",
    "proofs_verified", "checks_failed",
]


class Session(DeviceRun):
    """The run's rows, logs and budget (:class:`device_run.DeviceRun`), and the folder of its dev keys."""

    def __init__(self, out: Path, budget_s: float, dry: bool) -> None:
        super().__init__(out, budget_s, dry, "gpu-small.json", ESTIMATE_S, proofs_verified=0)
        self.cache = Path(tempfile.mkdtemp(prefix="cuzk-small-keys-"))


# ---------------------------------------------------------------- keys and the backend

def _backend(ses: Session) -> tuple[types.ModuleType, Any]:
    """(the backend module, a GpuBackend on device 0): the emulated one in a dry run."""
    if ses.dry:
        from tests.gpu_emu.backend import load_backend

        mod = load_backend()
    else:
        from cuzk_mp.backends.gpu import backend as mod
    return mod, mod.GpuBackend(0)


def key_rows(ses: Session, sizes: tuple[int, ...]) -> None:
    """GPU dev keys of the porep-like circuit (the CPU setup in a dry run)."""
    from cuzk_mp.pipeline.keys import ensure_synthetic_key

    for n in sizes:
        t0 = time.perf_counter()
        ensure_synthetic_key("porep-like", n, ses.cache, backend="cpu" if ses.dry else "gpu")
        ses.rows[f"setup_2^{n}_s"] = time.perf_counter() - t0
        ses.log(f"key 2^{n}: {ses.rows[f'setup_2^{n}_s']:.1f} s")


class _Prover:
    """One resident key, its evaluator and fresh witnesses; proves lone or batched, every proof checked."""

    def __init__(self, ses: Session, backend: Any, n: int, lasting: bool = True) -> None:
        from cuzk_mp.circuits.synthetic import PorepLike
        from cuzk_mp.formats.zkey import read_zkey
        from cuzk_mp.groth16.synthesis import ConstraintEvaluator
        from cuzk_mp.pipeline.keys import synthetic_key_paths

        self.ses, self.backend, self.n = ses, backend, n
        self.zkey = read_zkey(synthetic_key_paths("porep-like", n, ses.cache)[0])
        self.key = backend.load_key(self.zkey, lasting=lasting)
        ev = ConstraintEvaluator.from_zkey(self.zkey)
        circuit = PorepLike(n)
        self.inputs = [ev.evaluate(circuit.witness(100 + i, 0)) for i in range(BIG_BATCH)]

    def prove(self, k: int) -> float:
        """Stage k partitions, prove them in one pass (k = 1: prove_start), check every proof;
        seconds of the device pass (prove_start[_batch] wall)."""
        from cuzk_mp.groth16.prover import prove_finalize, prove_start, prove_start_batch, public_signals

        staged = [self.backend.stage(self.key, x) for x in self.inputs[:k]]
        try:
            self.backend.stream().synchronize()  # the copies (staging waits for nothing on small keys)
            t0 = time.perf_counter()
            if k == 1:
                sums = [prove_start(self.backend, self.key, staged[0], self.zkey.n_public)]
            else:
                sums = prove_start_batch(self.backend, self.key, staged, self.zkey.n_public)
            took = time.perf_counter() - t0
        finally:
            for s in staged:
                self.backend.release(s)
        for x, s in zip(self.inputs, sums):
            prove_finalize(self.zkey, s, public_signals(x.w, self.zkey.n_public))  # raises unless it verifies
            self.ses.rows["proofs_verified"] += 1
        return took

    def close(self) -> None:
        self.key.close()
        self.zkey.close()


# ---------------------------------------------------------------- the timeline of one proof

class _CupyProxy:
    """CuPy with some calls traced (the module attribute ``cupy`` of the traced modules)."""

    def __init__(self, real: Any, tracer: Tracer, names: tuple[str, ...]) -> None:
        self._real = real
        for name in names:
            setattr(self, name, tracer.wrap(f"cupy.{name}", getattr(real, name)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _TracedKernel:
    def __init__(self, kernel: Any, name: str, tracer: Tracer) -> None:
        self._kernel, self.name, self._call = kernel, name, tracer.wrap(f"k.{name}", kernel)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kernel, name)


class Tracer:
    """Each traced call between two CUDA events on the current stream, with host clocks."""

    CUPY_CALLS = ("argsort", "flatnonzero", "count_nonzero", "asnumpy", "concatenate", "zeros", "empty", "arange",
                  "searchsorted", "stack", "ascontiguousarray", "asarray")

    def __init__(self, cupy: Any) -> None:
        self.cupy = cupy
        self.ops: list[tuple[str, int, float, float, Any, Any, str]] = []
        self.lock = threading.Lock()
        self.on = False
        self.ref: Any = None
        self.h_ref = 0.0

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return fn(*args, **kwargs)
            s = self.cupy.cuda.get_current_stream()
            e0 = self.cupy.cuda.Event()
            e0.record(s)
            h0 = time.perf_counter()
            out = fn(*args, **kwargs)
            h1 = time.perf_counter()
            e1 = self.cupy.cuda.Event()
            e1.record(s)
            with self.lock:
                self.ops.append((name, int(s.ptr), h0, h1, e0, e1, threading.current_thread().name))
            return out
        return call

    def start(self) -> None:
        self.ops = []
        self.ref = self.cupy.cuda.Event()
        self.ref.record(self.cupy.cuda.get_current_stream())
        self.h_ref = time.perf_counter()
        self.on = True

    def stop(self) -> list[dict[str, Any]]:
        self.on = False
        rows = []
        for name, stream, h0, h1, e0, e1, thread in self.ops:
            e1.synchronize()
            rows.append({"op": name, "stream": stream, "thread": thread,
                         "host_start_ms": 1e3 * (h0 - self.h_ref), "host_ms": 1e3 * (h1 - h0),
                         "dev_start_ms": float(self.cupy.cuda.get_elapsed_time(self.ref, e0)),
                         "dev_ms": float(self.cupy.cuda.get_elapsed_time(e0, e1))})
        return sorted(rows, key=lambda r: r["dev_start_ms"])


def _install_tracer(backend_mod: Any, backend: Any, key: Any) -> Tracer:
    """Trace the kernels of the key's MSMs, the NTT engine and classify, and the CuPy calls of the
    backend (with its staging and proving modules) and msm modules."""
    msm_mod = backend_mod.gmsm
    tracer = Tracer(backend_mod.cupy)
    for m in key.msms.values():
        m._k = {name: _TracedKernel(k, name, tracer) for name, k in m._k.items()}
    real_get_module = msm_mod.get_module

    def get_module(path: str, defines: Any = None) -> Any:
        mod = real_get_module(path, defines)
        return types.SimpleNamespace(get_function=lambda name: _TracedKernel(mod.get_function(name), name, tracer))

    msm_mod.get_module = get_module
    msm_mod.cupy = _CupyProxy(msm_mod.cupy, tracer, Tracer.CUPY_CALLS)
    for part in (backend_mod, backend_mod.staging, backend_mod.proving):
        part.cupy = _CupyProxy(part.cupy, tracer, Tracer.CUPY_CALLS)
    ntt = backend.ntt_engine
    for attr in ("_bitrev", "_combine"):
        if hasattr(ntt, attr):
            setattr(ntt, attr, _TracedKernel(getattr(ntt, attr), attr.strip("_"), tracer))
    for plan in getattr(ntt, "_plans", {}).values():
        plan.pass_kernel = _TracedKernel(plan.pass_kernel, "ntt_pass", tracer)
    if not hasattr(ntt, "_plans"):  # the dry run's CPU H step
        ntt.coset_h_in_place = tracer.wrap("cpu.coset_h", ntt.coset_h_in_place)
    pending = msm_mod.PendingMsm
    pending.result = tracer.wrap("host.msm_result", pending.result)
    return tracer


def _union_ms(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _summary(rows: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    device = [r for r in rows if not r["op"].startswith("host.")]  # host.*: finisher-thread work, no device span
    ends = [(r["dev_start_ms"], r["dev_start_ms"] + r["dev_ms"]) for r in device]
    span = max(b for _, b in ends) - min(a for a, _ in ends) if ends else 0.0
    busy = _union_ms([(r["dev_start_ms"], r["dev_start_ms"] + r["dev_ms"]) for r in device if r["op"].startswith("k.")])
    blocked = sum(r["host_ms"] for r in rows if r["op"].startswith("cupy.") and r["host_ms"] > 0.2)
    by_op: dict[str, dict[str, float]] = {}
    for r in rows:
        agg = by_op.setdefault(r["op"], {"dev_ms": 0.0, "host_ms": 0.0, "count": 0})
        agg["dev_ms"] += r["dev_ms"]
        agg["host_ms"] += r["host_ms"]
        agg["count"] += 1
    return {"wall_ms": 1e3 * wall_s, "span_ms": span, "busy_ms": busy, "idle_ms": span - busy,
            "host_blocked_ms": blocked, "launches": sum(1 for r in rows if r["op"].startswith("k.")),
            "by_op": dict(sorted(by_op.items(), key=lambda kv: -kv[1]["dev_ms"]))}


def timeline_rows(ses: Session, n: int) -> None:
    """One traced proof at 2^n, lone, then a batch of 4 (after an untraced warm-up of each)."""
    backend_mod, backend = _backend(ses)
    p = _Prover(ses, backend, n)
    out: dict[str, Any] = {}
    try:
        p.prove(1)
        p.prove(BATCH)
        tracer = _install_tracer(backend_mod, backend, p.key)
        for label, k in (("lone", 1), (f"batch{BATCH}", BATCH)):
            tracer.start()
            wall = p.prove(k)
            rows = tracer.stop()
            s = _summary(rows, wall)
            out[label] = {"summary": s, "ops": rows, "backend_last_timings": dict(backend.last_timings)}
            for key in ("wall_ms", "span_ms", "busy_ms", "idle_ms", "host_blocked_ms", "launches"):
                ses.rows[f"timeline_2^{n}_{label}_{key}"] = s[key]
            top = ", ".join(f"{op} {v['dev_ms']:.2f}/{v['host_ms']:.2f} ms x{v['count']}"
                            for op, v in list(s["by_op"].items())[:8])
            ses.log(f"timeline 2^{n} {label}: wall {s['wall_ms']:.2f} ms, device span {s['span_ms']:.2f}, kernels "
                    f"busy {s['busy_ms']:.2f}, idle {s['idle_ms']:.2f}, host blocked {s['host_blocked_ms']:.2f} ms, "
                    f"{s['launches']} launches; top (device/host): {top}")
    finally:
        p.close()
        backend.close()
    (ses.out / f"timeline-2^{n}.json").write_text(json.dumps(out, indent=1) + "\n")


# ---------------------------------------------------------------- device time per proof

def device_rows(ses: Session, sizes: tuple[int, ...], reps: int) -> None:
    _, backend = _backend(ses)
    try:
        for n in sizes:
            for lasting, tag in ((True, ""), (False, "_multiples_none")):
                if not lasting and n != 16:
                    continue
                p = _Prover(ses, backend, n, lasting)
                try:
                    p.prove(1)
                    p.prove(BATCH)  # warm: plans, pools, bounce buffers
                    lone, events = [], []
                    for _ in range(reps):
                        lone.append(p.prove(1))
                        events.append(backend.last_timings.get("total", float("nan")))
                    batch = [p.prove(BATCH) / BATCH for _ in range(max(1, reps // BATCH))]
                    big = [p.prove(BIG_BATCH) / BIG_BATCH for _ in range(max(1, reps // BATCH))]
                finally:
                    p.close()
                ses.rows[f"device_2^{n}_lone{tag}_ms"] = 1e3 * statistics.median(lone)
                ses.rows[f"device_2^{n}_lone{tag}_events_ms"] = statistics.median(events)
                ses.rows[f"device_2^{n}_batch{BATCH}{tag}_ms"] = 1e3 * statistics.median(batch)
                ses.rows[f"device_2^{n}_batch{BIG_BATCH}{tag}_ms"] = 1e3 * statistics.median(big)
                ses.rows.update({f"device_2^{n}{tag}_split_{k}_ms": v for k, v in backend.last_timings.items()})
                ses.log(f"device 2^{n}{tag}: lone {ses.rows[f'device_2^{n}_lone{tag}_ms']:.2f} ms (events "
                        f"{ses.rows[f'device_2^{n}_lone{tag}_events_ms']:.2f}), batch of {BATCH} "
                        f"{ses.rows[f'device_2^{n}_batch{BATCH}{tag}_ms']:.2f} ms per proof, of {BIG_BATCH} "
                        f"{ses.rows[f'device_2^{n}_batch{BIG_BATCH}{tag}_ms']:.2f}")
    finally:
        backend.close()




def param_rows(ses: Session, sizes: tuple[int, ...], reps: int) -> None:
    """Lone device time per proof with each MSM launch geometry of :data:`PARAM_SWEEP` (the key's
    MSM objects rebuilt over the same resident points and multiples); the backend's own choice for
    the size is ``msm_params_for``."""
    backend_mod, backend = _backend(ses)
    try:
        for n in sizes:
            p = _Prover(ses, backend, n)
            try:
                chosen = backend_mod.msm_params_for(1 << n)
                ses.rows[f"params_2^{n}_chosen"] = (f"s{chosen.seg}c{chosen.combine_seg}g{chosen.group}"
                                                    f"b{chosen.bucket_chunk_min}{'_graph' if chosen.graphs else ''}")
                for label, knobs in PARAM_SWEEP.items():
                    params = backend_mod.gmsm.MsmParams(**knobs)
                    p.key.msms = {name: type(m)(m.d_points, params, m.multiples) for name, m in p.key.msms.items()}
                    p.prove(1)
                    times = [p.prove(1) for _ in range(reps)]
                    ses.rows[f"device_2^{n}_lone_{label}_ms"] = 1e3 * statistics.median(times)
                ses.log(f"MSM geometry 2^{n} (chosen {ses.rows[f'params_2^{n}_chosen']}): " + ", ".join(
                    f"{label} {ses.rows[f'device_2^{n}_lone_{label}_ms']:.2f} ms" for label in PARAM_SWEEP))
            finally:
                p.close()
    finally:
        backend.close()


# ---------------------------------------------------------------- whole processes

def warm_rows(ses: Session) -> None:
    ses.rows["warm_s"], _ = ses.command("warm_caches", [sys.executable, "scripts/warm_caches.py"], 300)


START = re.compile(r"imports, key and witness in ([0-9.]+) s, backend \S+ ready ([0-9.]+) s later")


def oneshot_rows(ses: Session, n: int, backend: str) -> None:
    """The one-shot CLI prove as whole processes: first after warm_caches, then three warm."""
    from cuzk_mp.circuits.synthetic import PorepLike
    from cuzk_mp.formats.wtns import write_wtns
    from cuzk_mp.groth16.prover import STEPS_LINE, steps_of
    from cuzk_mp.pipeline.keys import synthetic_key_paths

    zkey = synthetic_key_paths("porep-like", n, ses.cache)[0]
    work = Path(tempfile.mkdtemp(prefix="cuzk-oneshot-"))
    wtns = work / "w.wtns"
    write_wtns(wtns, PorepLike(n).witness(7, 0))
    cmd = cli("--log-level", "INFO", "groth16", "prove", "--backend", backend, str(zkey), str(wtns),
               str(work / "proof.json"), str(work / "public.json"))
    ses.rows[f"oneshot_2^{n}_first_s"], _ = ses.command("oneshot_first", cmd, 120)
    warm, text = [], ""
    for i in range(3):
        took, text = ses.command(f"oneshot_warm{i}", cmd, 60)
        warm.append(took)
    ses.rows[f"oneshot_2^{n}_warm_s"] = statistics.median(warm)
    ses.rows["proofs_verified"] += 4  # each process self-verified its proof (exit 0)
    # The same proof through `--keep-warm` (perf/keep_warm.py: one-shot, the call that starts the
    # key's warm daemon, calls that find it; every proof checked by `groth16 verify`)
    kw = work / "keep_warm.json"
    ses.command("keep_warm", [sys.executable, "perf/keep_warm.py", "--zkey", str(zkey), "--wtns", str(wtns),
                              "--backend", backend, "--runs", "3", "--idle", "5", "--out", str(kw)], 300)
    if kw.is_file():
        got = json.loads(kw.read_text())
        ses.rows[f"oneshot_2^{n}_keep_warm_start_s"] = got["keep_warm_start_s"]
        ses.rows[f"oneshot_2^{n}_keep_warm_s"] = got["keep_warm_median_s"]
        ses.rows[f"oneshot_2^{n}_keep_warm_runs_s"] = got["keep_warm_s"]
        ses.rows["proofs_verified"] += 2 * got["runs"] + 2
    m = re.search(rf"{re.escape(STEPS_LINE)}.*$", text, re.M)
    if m:
        for name, value in steps_of(m.group(0)).items():
            ses.rows[f"oneshot_2^{n}_step_{name}_ms"] = value
    m = START.search(text)
    if m:
        ses.rows[f"oneshot_2^{n}_start_s"], ses.rows[f"oneshot_2^{n}_backend_after_s"] = map(float, m.groups())
    # Where a warm process's wall goes, by function: one more warm run under cProfile (its own
    # overhead included), the 25 heaviest by cumulative time.
    prof = work / "oneshot.prof"
    # (cuzk_mp.cli.main under cProfile: the console script's run() leaves by os._exit, before
    # `python -m cProfile` would write its file)
    code = (f"import cProfile, sys; sys.argv = {['cuzk-mp', *cmd[3:]]!r}; import cuzk_mp.cli as c; "
            f"cProfile.run('c.main()', {str(prof)!r})")
    ses.command("oneshot_profile", [sys.executable, "-c", code], 60)
    stats = pstats.Stats(str(prof))
    heavy = sorted(stats.stats.items(), key=lambda kv: kv[1][3], reverse=True)[:25]  # type: ignore[attr-defined]
    ses.rows[f"oneshot_2^{n}_profile_top"] = {f"{Path(f).name}:{line}({fn})": round(v[3] * 1e3, 1)
                                               for (f, line, fn), v in heavy}
    imp = work / "importtime.txt"
    ses.command("oneshot_importtime", [sys.executable, "-X", "importtime", *cmd[1:]], 60)
    text = (ses.logs / "oneshot_importtime.log").read_text()
    imp.write_text(text)
    top = [(int(c), name.strip()) for _, c, name in re.findall(r"import time:\s+(\d+) \|\s+(\d+) \|( [^ ].*)$",
                                                                 text, re.M)]
    ses.rows[f"oneshot_2^{n}_import_s"] = sum(c for c, _ in top) / 1e6
    ses.rows[f"oneshot_2^{n}_imports_top"] = {name: c / 1e3 for c, name in sorted(top, reverse=True)[:8]}
    ses.log(f"one-shot 2^{n}: first {ses.rows[f'oneshot_2^{n}_first_s']:.2f} s, warm "
            f"{ses.rows[f'oneshot_2^{n}_warm_s']:.2f} s, imports {ses.rows[f'oneshot_2^{n}_import_s']:.2f} s; "
            f"steps {m.group(1) if m else '?'}")


# pipeline variants: (tag, env, bench flags beyond the common ones). The first three submit 2 jobs at a
# time (the bench's default); "_inflight8" keeps 8 jobs of 10 partitions in the system (a busy daemon),
# 30 of them, so the steady state is not bounded by two jobs' latency.
PIPELINE_VARIANTS: tuple[tuple[str, dict[str, str], tuple[str, ...]], ...] = (
    ("", {}, ("--jobs", "10")),
    ("_nobatch", {"CUZK_MP_PROVER_BATCH": "1"}, ("--jobs", "10")),
    (f"_batch{BATCH}", {"CUZK_MP_PROVER_BATCH": str(BATCH)}, ("--jobs", "10")),
    ("_inflight8", {}, ("--jobs", "30", "--in-flight", "8")),
    ("_inflight8_w3", {}, ("--jobs", "30", "--in-flight", "8", "--gpu-workers", "3")),
)


def pipeline_rows(ses: Session, n: int) -> None:
    for tag, env, flags in PIPELINE_VARIANTS:
        out = ses.out / f"bench-2^{n}{tag}.json"
        prof = os.environ.get("CUZK_MP_STACK_PROFILE")
        if prof:  # a profile per bench run
            env = {**env, "CUZK_MP_STACK_PROFILE": str(Path(prof) / f"2^{n}{tag}")}
        ses.command(f"bench_2^{n}{tag}", cli("bench", "--backend", "gpu", "--log-n", str(n), "--partitions", "10",
                                       *flags, "--partition-workers", "8",
                                       "--cache", str(ses.cache), "--json", str(out)), 150, env=env, dry_factor=6)
        r = json.loads(out.read_text())
        ses.rows[f"pipeline_2^{n}_s_per_partition{tag}"] = r["s_per_proof"]
        ses.rows[f"pipeline_2^{n}_device_ms{tag}"] = 1e3 * r["median_stage_s"].get("device", float("nan"))
        ses.rows[f"pipeline_2^{n}_proofs_verified{tag}"] = r["proofs_verified"]
        ses.rows["proofs_verified"] += r["proofs_verified"]
        if r["proofs_verified"] != r["proofs_total"]:
            ses.fail(f"pipeline{tag}: {r['proofs_verified']} of {r['proofs_total']} verified")
        ses.log(f"pipeline 2^{n}{tag}: {r['s_per_proof']:.4f} s/partition, device "
                f"{ses.rows[f'pipeline_2^{n}_device_ms{tag}']:.1f} ms, {r['proofs_verified']}/{r['proofs_total']}")


def daemon_rows(ses: Session, n: int) -> None:
    out = ses.out / f"daemon-latency-gpu-2^{n}.json"
    ses.command("daemon_latency", [sys.executable, "perf/daemon_latency.py", "--backend", "gpu", "--log-n", str(n),
                                 "--jobs", "20", "--cache", str(ses.cache), "--json", str(out)], 150)
    r = json.loads(out.read_text())
    ses.rows[f"daemon_2^{n}_latency_p50_ms"] = 1e3 * r["latency_s"]["p50"]
    ses.rows[f"daemon_2^{n}_latency_p90_ms"] = 1e3 * r["latency_s"]["p90"]
    ses.rows[f"daemon_2^{n}_overhead_ms"] = 1e3 * r["overhead_p50_s"]
    ses.rows[f"daemon_2^{n}_in_process_ms"] = 1e3 * r["in_process_proof_s"]["total"]
    ses.rows[f"daemon_2^{n}_proofs_verified"] = r["proofs_verified"]
    ses.rows["proofs_verified"] += r["proofs_verified"]
    ses.log(f"daemon 2^{n}: p50 {ses.rows[f'daemon_2^{n}_latency_p50_ms']:.1f} ms, overhead "
            f"{ses.rows[f'daemon_2^{n}_overhead_ms']:.1f} ms, {r['proofs_verified']}/{r['jobs']} verified")


# ---------------------------------------------------------------- driver

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")), help="output folder ($OUT)")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S, help="stop starting sections after this")
    ap.add_argument("--skip", default="", help=f"comma list of sections to skip: {','.join(ESTIMATE_S)}")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: the kernel emulator and the CPU backend at 2^10")
    ap.add_argument("--timeline-sizes", default="16", help="comma list of log2 sizes traced by the timeline section")
    ap.add_argument("--pipeline-sizes", default="16", help="comma list of log2 sizes of the pipeline section")
    args = ap.parse_args()
    # the GIL hand-over interval of a prover process (kernel launches on one thread, MSM finishers on
    # others): the in-process rows see the launch latency the pipeline's prover sees
    from cuzk_mp.pipeline.prover_proc import SWITCH_INTERVAL_S

    sys.setswitchinterval(SWITCH_INTERVAL_S)
    skip = set(filter(None, args.skip.split(",")))
    if skip - set(ESTIMATE_S):
        ap.error(f"unknown sections {sorted(skip - set(ESTIMATE_S))}")
    args.out.mkdir(parents=True, exist_ok=True)
    ses = Session(args.out, args.budget_s, args.dry_run)
    if args.dry_run:
        ses.rows["gpu"] = "none (dry run: kernel emulator, CPU backend)"
        skip |= {"pipeline", "daemon"}
    else:
        import cupy

        import cuzk_mp.backends.gpu  # noqa: F401 - its CUDA context settings before the first CUDA call

        props = cupy.cuda.runtime.getDeviceProperties(0)
        ses.rows.update({"gpu": props["name"].decode(), "sm_count": props["multiProcessorCount"],
                         "cupy": cupy.__version__, "cuda_driver": cupy.cuda.runtime.driverGetVersion()})
    ses.log(f"{ses.rows['gpu']}; budget {args.budget_s:.0f} s")
    sizes = (10,) if args.dry_run else SIZES
    mid = 10 if args.dry_run else 16
    tl_sizes = tuple(int(x) for x in args.timeline_sizes.split(",") if x)
    pl_sizes = tuple(int(x) for x in args.pipeline_sizes.split(",") if x)
    sections: dict[str, Callable[[], None]] = {
        "warm": lambda: warm_rows(ses),
        "keys": lambda: key_rows(ses, sizes),
        "timeline": lambda: [timeline_rows(ses, n) for n in ((10,) if args.dry_run else tl_sizes)],
        "device": lambda: device_rows(ses, sizes, 2 if args.dry_run else REPS),
        "params": lambda: param_rows(ses, sizes if args.dry_run else (12, 16, 18), 1 if args.dry_run else 5),
        "oneshot": lambda: oneshot_rows(ses, mid, "cpu" if args.dry_run else "gpu"),
        "pipeline": lambda: [pipeline_rows(ses, n) for n in pl_sizes],
        "daemon": lambda: daemon_rows(ses, 12),
    }
    for name, fn in sections.items():
        if name not in skip:
            ses.section(name, fn)
    ses.save()
    print(table(ses.rows, TABLE_KEYS))
    return 1 if ses.failed else 0


if __name__ == "__main__":
    sys.exit(main())
