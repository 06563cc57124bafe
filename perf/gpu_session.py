#!/usr/bin/env python3
"""One GPU session in one call: the GPU tests of what changed, checked MSM and partition timings
(old and new variants side by side), optionally fresh-box CLI timings and real 2^20 proofs; a
table last.

On the GPU machine (repository root, the cp312 wheels installed as README "The GPU machine" says):

    python3 perf/gpu_session.py --out $OUT            # ~4.5 min: tests, msm, partition
    python3 perf/gpu_session.py --out $OUT --sections fresh,tests,msm,partition,proofs   # ~7 min

writes ``$OUT/gpu-session.tar.gz`` (``gpu-session.json``, ``logs/``, ``proofs/`` with snarkjs
JSON of each real proof) and prints the table last. Sections, in this order (``--sections``
picks, ``--skip`` drops):

* ``fresh``  whole processes on a box where nothing ran yet: ``cuzk-mp circuit porep-like
  --log-n 16``, ``cuzk-mp setup --backend gpu``, the first ``cuzk-mp groth16 prove --backend gpu``
  and three warm ones (``fresh_*_s``), and how many kernel modules fell back to NVRTC
  (``fresh_nvrtc_fallbacks``: 0 when the shipped binaries load);
* ``tests``  ``pytest -m gpu`` on what changed (:data:`TEST_GROUPS`: the MSM tests and the backend's
  page-release and whole-proof tests), bounded by a
  timeout, failures named (``-rfE``) and the slowest listed (``--durations``):
  ``tests_passed`` / ``tests_failed``, the log in ``logs/tests.log``;
* ``msm``    G1 random 2^24 and 2^26, G2 random 2^24, with the default bucket accumulation
  (``*_ms``), plain and with precomputed multiples (``*_multiples_ms``, one table per size, its build
  ``*_multiples_build_ms``); every result checked by the discrete-log identity (``*_ok``);
* ``partition``  the device work of one 2^24 partition (stage, h_values, the five MSMs: the
  protocol recipe ``groth16.prover.prove_start``) on a key-shaped set of points t_i G (the four
  G1 sections share one set; no dev setup needed), witness PoRep-like (40 % 0, 40 % 1) and
  dense-random; ``prove_{porep,random}_2^24_total_ms`` with the default multiples plan
  and ``..._multiples_none_total_ms`` without (one key load per plan), each stage's split, every sum checked;
  ``--partition-log-n 27 --partition-quick``: one 2^27 partition's split (default plan, XYZZ,
  PoRep-like: ``prove_porep_2^27_*_ms``); ``--partition-witnesses`` picks the witnesses, among
  them ``boolean`` (every scalar 0 or 1: ``prove_boolean_2^24_*``); ``--partition-key circuit``
  shapes the key as the PoRep-like circuit's own (its wire count; infinity points on the wires a
  section's side does not use, 55 % of B's) and allows its own witness ``circuit``
  (``prove_circuit_2^24_circuit_key_*``, every row of that key ending in ``_circuit_key``);
* ``proofs``  real 2^20 proofs of both synthetic circuits (GPU dev setup, ``prove``, self-verified,
  written for ``snarkjs groth16 verify``): ``prove_{porep,random}_2^20_s`` and device totals.

Each section checks the time left against its estimate and records "not run: ..." instead of
overrunning. ``--dry-run`` (no GPU): parses, runs the MSM section on the CPU kernel emulator at
2^7, the partition section's CPU references at 2^10, the fresh-box command lines with the CPU
backend at 2^10, collects the tests, and writes the tar, so the device run does not die on a typo.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from device_run import DeviceRun, cli, table  # perf/, the script's own folder

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "perf"))

BUDGET_S = 290.0
DEFAULT_SECTIONS = "tests,msm,partition"
# The gpu-marked tests of what changed, in two pytest runs so that the first (the new kernel's
# tests and the backend tests that failed or matter here) completes even if the second runs out
# of time: (label, paths, -k expression, timeout s). The shipped-binaries tests need no GPU.
# (-k applies to every path, the backend tests' node ids included: their names are in it too.)
_NEW = ("grid_affine or accumulation or repeated or large or params_defines or fp2_lazy or bucket_chunks"
        " or second_reduction or lets_file_pages or whole_proof_on_gpu or compiles_no_kernel")
TEST_GROUPS = [
    ("new", ["tests/test_gpu_msm.py", "tests/test_gpu_backend.py::test_load_key_lets_file_pages_go",
             "tests/test_gpu_backend.py::test_whole_proof_on_gpu_verifies",
             "tests/test_gpu_backend.py::test_a_one_shot_gpu_proof_compiles_no_kernel_at_run_time"], _NEW, 100.0),
    ("msm", ["tests/test_gpu_msm.py"], f"not ({_NEW})", 45.0),
]
# Estimated seconds per section on the H200 (for the budget check before each one starts).
ESTIMATE_S = {"fresh": 90.0, "tests": 140.0, "msm": 75.0, "partition": 80.0, "proofs": 45.0}
_MSM = ["g1_msm_random_2^24", "g1_msm_random_2^26", "g2_msm_random_2^24"]
# the partition section's witnesses (gpu_msm_bench.random_scalars; "circuit": the PoRep-like circuit's own)
WITNESSES = ("porep", "random", "boolean", "circuit")
_PART = [f"prove_{w}_2^24" for w in WITNESSES]
TABLE_KEYS = [
    "fresh_setup_2^16_s", "fresh_prove_2^16_first_s", "fresh_prove_2^16_warm_s", "fresh_nvrtc_fallbacks",
    "tests_passed", "tests_failed",
    *[f"{b}{m}_ms" for b in _MSM for m in ("", "_multiples")],
    *[f"{b}_multiples_none_total_ms" for b in _PART],
    *[f"{b}{a}_total_ms" for b in _PART for a in ("", "_circuit_key")],
    *[f"{b}{a}_{k}_ms" for b in _PART for a in ("", "_circuit_key") for k in ("msm_b2", "msm_a", "msm_h")],
    "prove_porep_2^20_s", "prove_random_2^20_s", "checks_failed",
]


# ---------------------------------------------------------------- fresh box (whole processes)

def fresh_rows(ses: DeviceRun, backend: str, log_n: int) -> None:
    """circuit, setup, first prove and warm proves of the 2^log_n PoRep-like circuit, as processes."""
    work = Path(tempfile.mkdtemp(prefix="cuzk-fresh-"))
    ses.rows[f"fresh_circuit_2^{log_n}_s"], _ = ses.command(
        "fresh_circuit", cli("circuit", "porep-like", "--log-n", str(log_n), str(work)), 300)
    r1cs, wtns = work / f"porep-like-{log_n}.r1cs", work / f"porep-like-{log_n}.wtns"
    zkey = work / "k.zkey"
    took, out = ses.command("fresh_setup", cli("--log-level", "INFO", "setup", "--backend", backend, str(r1cs),
                                                   str(zkey)), 240)
    ses.rows[f"fresh_setup_2^{log_n}_s"] = took
    fallbacks = out.count("compiling with NVRTC")
    prove = cli("--log-level", "INFO", "groth16", "prove", "--backend", backend, str(zkey), str(wtns),
                 str(work / "proof.json"), str(work / "public.json"))
    took, out = ses.command("fresh_prove_first", prove, 240)
    ses.rows[f"fresh_prove_2^{log_n}_first_s"] = took
    fallbacks += out.count("compiling with NVRTC")
    warm = [ses.command(f"fresh_prove_warm{i}", prove, 120)[0] for i in range(3)]
    ses.rows[f"fresh_prove_2^{log_n}_warm_s"] = statistics.median(warm)
    ses.rows["fresh_nvrtc_fallbacks"] = fallbacks
    (ses.out / "proofs" / f"fresh-porep-2^{log_n}").mkdir(parents=True, exist_ok=True)
    for name in ("proof.json", "public.json"):
        (ses.out / "proofs" / f"fresh-porep-2^{log_n}" / name).write_bytes((work / name).read_bytes())


# ---------------------------------------------------------------- GPU tests

def _text(x: str | bytes | None) -> str:
    return x.decode(errors="replace") if isinstance(x, bytes) else (x or "")


def test_rows(ses: DeviceRun, collect_only: bool) -> None:
    """The gpu-marked tests of what changed (:data:`TEST_GROUPS`), each run bounded by a timeout."""
    import re

    passed = failed = collected = 0
    ok = True
    logs = []
    for label, paths, expr, limit in TEST_GROUPS:
        cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "--durations=10", "-p", "no:cacheprovider",
               "-m", "gpu" if not collect_only else "gpu or not gpu", "-k", expr, *paths]
        if collect_only:
            cmd.append("--collect-only")
        t0 = time.perf_counter()
        timeout = max(20.0, min(limit, ses.left() - ESTIMATE_S["msm"] - ESTIMATE_S["partition"]))
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False)
            text, rc = res.stdout + res.stderr, res.returncode
        except subprocess.TimeoutExpired as exc:
            text, rc = f"{_text(exc.stdout)}\n{_text(exc.stderr)}\nTIMEOUT after {timeout:.0f} s", -1
        logs.append(f"$ {' '.join(cmd)}\n{text}")
        ses.rows[f"tests_{label}_s"] = time.perf_counter() - t0
        tail = text.strip().splitlines()[-1] if text.strip() else ""
        ses.rows[f"tests_{label}_summary"] = tail

        def count(word: str, tail: str = tail) -> int:
            m = re.search(rf"(\d+) {word}", tail)
            return int(m.group(1)) if m else 0

        if collect_only:
            m = re.search(r"(\d+)(?:/\d+)? tests? collected", tail)
            collected += int(m.group(1)) if m else 0
            continue
        names = [ln.split()[1] for ln in text.splitlines() if ln.startswith(("FAILED ", "ERROR ")) and " " in ln]
        if names:
            ses.rows[f"tests_{label}_failed_names"] = names
            ses.log(f"tests {label}: failed " + ", ".join(names))
        passed += count("passed")
        failed += count("failed") + count("error")
        ok = ok and rc == 0
        ses.log(f"tests {label}: {tail} ({ses.rows[f'tests_{label}_s']:.0f} s)")
    (ses.logs / "tests.log").write_text("\n\n".join(logs))
    if collect_only:
        ses.rows["tests_collected"] = collected
        return
    ses.rows["tests_passed"], ses.rows["tests_failed"] = passed, failed
    ses.check("tests_ok", ok)


# ---------------------------------------------------------------- MSM rows

def msm_rows(ses: DeviceRun, sizes_g1: tuple[int, ...], lg_g2: int, reps: int) -> None:
    """G1/G2 random MSMs with the default bucket accumulation (grid rounds for G2, XYZZ for G1), plain
    and with precomputed multiples; checked."""
    import gpu_msm_bench as mb

    from cuzk_mp.backends.gpu import msm

    params = msm.MsmParams()

    def put(key: str, r: dict[str, Any]) -> None:
        mb._flatten(ses.rows, key, r)
        ses.check(f"{key}_ok", bool(r["ok"]))
        ses.log(f"{key}: {r['ms']:.2f} ms (accumulate {r['accumulate']:.1f}, sort {r['sort']:.1f}, reduce "
                f"{r['reduce']:.1f}) ok={r['ok']}")

    def rows_for(grp: str, bases: Any, lg: int) -> None:
        s = mb.random_scalars(1 << lg, "random", lg)
        put(f"{grp}_msm_random_2^{lg}", mb.time_msm(bases, s, reps, params))
        c = msm.choose_multiples_window(1 << lg)
        try:
            mult, build_ms = mb.multiples_of(bases, 1 << lg, c)
        except Exception as exc:  # noqa: BLE001 - a card too small for the table: its rows only are not run
            if type(exc).__name__ != "OutOfMemoryError":
                raise
            ses.rows[f"{grp}_msm_random_2^{lg}_multiples_status"] = f"not run: the multiples table does not fit ({exc})"
            ses.log(ses.rows[f"{grp}_msm_random_2^{lg}_multiples_status"])
            _free()
            return
        ses.rows[f"{grp}_msm_random_2^{lg}_multiples_build_ms"] = build_ms
        put(f"{grp}_msm_random_2^{lg}_multiples", mb.time_msm(bases, s, reps, params, multiples=mult))
        del mult
        _free()

    g1 = mb.Bases(False, 1 << max(sizes_g1), seed=7)
    ses.rows[f"g1_bases_2^{max(sizes_g1)}_ms"] = g1.make_ms
    for lg in sizes_g1:
        rows_for("g1", g1, lg)
    del g1
    _free()
    g2 = mb.Bases(True, 1 << lg_g2, seed=8)
    rows_for("g2", g2, lg_g2)
    del g2
    _free()


def _free() -> None:
    import cupy

    cupy.get_default_memory_pool().free_all_blocks()
    cupy.get_default_pinned_memory_pool().free_all_blocks()


# ---------------------------------------------------------------- one partition's device work

def _witness(n: int, dist: str, seed: int) -> np.ndarray:
    import gpu_msm_bench as mb

    return mb.random_scalars(n, dist, seed)


def _dense_mont(n: int, seed: int) -> np.ndarray:
    """n canonical Fr rows (any value < r works as Montgomery form)."""
    import gpu_msm_bench as mb

    return mb.random_scalars(n, "random", seed)


KEYS = ("points", "circuit")  # the partition section's key shapes (--partition-key)
# From this size the circuit-shaped key masks B1 / B2 alone: A and C keep a point on every row (their
# masks leave out under 0.3 % of the rows, and only the B sections are packed to their support), so
# the host holds one masked copy per B section instead of four (2^27: ~60 GB instead of ~125 GB).
LEAN_CIRCUIT_KEY_LOG_N = 26


def circuit_shape(lg: int, n_public: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The PoRep-like circuit at 2^lg rows: per key section a, b1 (= b2), c, the wires whose point a
    snarkjs key of it holds (not infinity: A's, with the public inputs, which setup gives an A
    term; B's; C's section, over the private wires, combines A, B and C), and its witness (seed 1,
    partition 0)."""
    from cuzk_mp.circuits.synthetic import PorepLike

    circuit = PorepLike(lg, n_public)
    r1cs = circuit.r1cs()
    used = {}
    for side in "abc":
        u = np.zeros(r1cs.n_wires, dtype=bool)
        u[getattr(r1cs, side).indices] = True
        used[side] = u
    used["a"][: n_public + 1] = True
    sections = {"a": used["a"], "b1": used["b"], "c": (used["a"] | used["b"] | used["c"])[n_public + 1 :]}
    return sections, circuit.witness(1, 0)


def partition_keys(lg: int, n_public: int, seed: int, used: dict[str, np.ndarray] | None = None
                   ) -> tuple[Any, Any, Any, dict[str, np.ndarray]]:
    """(key namespace, G1 bases, G2 bases, discrete log of each section's points) of a key-shaped
    set of points: t_i G (G1, shared by a, b1, c, h) and u_i G (G2). ``used`` (:func:`circuit_shape`):
    the key has the circuit's wire count and its points are infinity (discrete log 0) on the rows
    each section's mask leaves out, as the circuit's own key has them (from
    :data:`LEAN_CIRCUIT_KEY_LOG_N`, B1 and B2 alone)."""
    from types import SimpleNamespace

    import gpu_msm_bench as mb

    n = 1 << lg
    g1, g2 = mb.Bases(False, n, seed), mb.Bases(True, n, seed + 1)
    p1, p2 = _to_host(g1.d_points), _to_host(g2.d_points)
    g1.d_points = g2.d_points = None  # the key's own upload holds them; the checks need only t and G
    k = n_public + 1
    if used is None:
        key = SimpleNamespace(path=None, domain_size=n, n_vars=n, n_public=n_public, a=p1, b1=p1, b2=p2,
                              c=p1[: n - k], h=p1)
        return key, g1, g2, {"a": g1.t, "b1": g1.t, "b2": g2.t, "c": g1.t[: n - k], "h": g1.t}
    nv = int(used["a"].shape[0])

    def keep(a: np.ndarray, mask: np.ndarray, side: str) -> np.ndarray:
        if lg >= LEAN_CIRCUIT_KEY_LOG_N and side in ("a", "c"):
            return a[: mask.shape[0]]
        return np.where(mask[:, None], a[: mask.shape[0]], np.uint64(0))

    key = SimpleNamespace(path=None, domain_size=n, n_vars=nv, n_public=n_public, a=keep(p1, used["a"], "a"),
                          b1=keep(p1, used["b1"], "b1"), b2=keep(p2, used["b1"], "b2"), c=keep(p1, used["c"], "c"),
                          h=p1)
    del p2
    logs = {"a": keep(g1.t, used["a"], "a"), "b1": keep(g1.t, used["b1"], "b1"),
            "b2": keep(g2.t, used["b1"], "b2"), "c": keep(g1.t, used["c"], "c"), "h": g1.t}
    return key, g1, g2, logs


def _to_host(a: Any) -> np.ndarray:
    return np.asarray(a.get() if hasattr(a, "get") else a)


def partition_rows(ses: DeviceRun, lg: int, reps: int, quick: bool = False,
                   tags: tuple[str, ...] | None = None, key_shape: str = "points",
                   accumulate: tuple[str, ...] = ("",), counting_keys: tuple[int | None, ...] = (None,),
                   profile_last: bool = False) -> None:
    """Device work of one 2^lg partition through the protocol recipe: multiples none vs default,
    each with the accumulations of ``accumulate`` (``quick``: the default multiples, XYZZ and the PoRep-like
    witness alone: at 2^27, where no multiples fit, one 77 GB key and ~3 s a partition).
    ``tags``: the witnesses (porep, random, boolean, circuit; default porep and random, quick: porep).
    ``key_shape`` "circuit": the key has the PoRep-like circuit's wire count and infinity points
    (:func:`circuit_shape`), the witness "circuit" is the circuit's own, and the rows end in
    ``_circuit_key``; "points": a point on every row. ``accumulate``: the loaded key's MSMs as its
    plan set them ("") and/or with XYZZ level 1 alone ("xyzz": no grid rounds, rows ``*_xyzz``) and/or
    with the bucket reduction's ``MsmParams.reduce_levels`` L ("reduceL": 0 by size, 1 a scalar
    multiplication a thread, 2 a second reduction; rows ``*_reduceL``),
    timed on the same key, interleaved rep by rep. ``counting_keys``: the counting sort's key limit
    (``msm_passes.COUNTING_SORT_KEYS``) as 2^N for each N, None the shipped one; rows ``*_ckN``.
    ``profile_last``: the last timed partition of each witness and variant between cudaProfilerStart
    and Stop."""
    from cuzk_mp.backends.gpu import msm_passes as passes
    from cuzk_mp.backends.gpu.backend import GpuBackend
    from cuzk_mp.backends.gpu.msm_geometry import MULTIPLES_ENV

    shipped_keys = passes.COUNTING_SORT_KEYS

    n_public = 4
    tags = tags or (("porep",) if quick else ("porep", "random"))
    used, own = circuit_shape(lg, n_public) if key_shape == "circuit" else (None, None)
    zkey, g1, g2, logs = partition_keys(lg, n_public, seed=11, used=used)
    _free()
    n, nv = 1 << lg, int(zkey.n_vars)
    abc = [_dense_mont(n, 100 + i) for i in range(3)]
    witnesses = {tag: own if tag == "circuit" else _witness(nv, tag, 200 + i) for i, tag in enumerate(tags)}
    if any(w is None for w in witnesses.values()):
        raise ValueError("the circuit witness needs the circuit key (--partition-key circuit)")
    backend = GpuBackend(0)
    for variant in ("none", "auto") if not quick else ("auto",):
        os.environ[MULTIPLES_ENV] = variant
        t0 = time.perf_counter()
        key = backend.load_key(zkey)
        suffix = ("_multiples_none" if variant == "none" else "") + ("_circuit_key" if used is not None else "")
        ses.rows[f"partition_2^{lg}{suffix}_load_key_s"] = time.perf_counter() - t0
        ses.rows[f"partition_2^{lg}{suffix}_multiples"] = ",".join(sorted(key.multiples)) or "-"
        ses.log(f"key 2^{lg} multiples={variant}: {ses.rows[f'partition_2^{lg}{suffix}_load_key_s']:.1f} s, "
                f"tables for {ses.rows[f'partition_2^{lg}{suffix}_multiples']}")
        planned = {name: m.params for name, m in key.msms.items()}
        ses.rows[f"partition_2^{lg}{suffix}_grid_rounds"] = ",".join(
            f"{name}={m.params.ga_rounds if m.params.grid(m.G2) else 0}" for name, m in key.msms.items())
        variants: dict[str, tuple[dict[str, Any], int]] = {}
        for acc in accumulate:  # launch knobs and the sort rule only: the same compiled modules
            for ck in counting_keys:
                tag = (f"_{acc}" if acc else "") + (f"_ck{ck}" if ck is not None else "")
                knobs = ({"ga_rounds": 0} if acc == "xyzz"
                         else {"reduce_levels": int(acc[6:])} if acc.startswith("reduce") else {})
                variants[tag] = (knobs, shipped_keys if ck is None else 1 << ck)

        def use(knobs: dict[str, Any], keys: int) -> None:
            passes.COUNTING_SORT_KEYS = keys
            for name, m in key.msms.items():
                m.params = dataclasses.replace(planned[name], **knobs)

        _partition_runs(ses, backend, key, abc, witnesses, suffix, lg, n_public, reps, g1, g2, logs,
                        {tag: (lambda v=v: use(*v)) for tag, v in variants.items()}, profile_last)
        use({}, shipped_keys)
        ses.rows.update({f"partition_2^{lg}{suffix}_stats_{k}": v for k, v in backend.stats().items()})
        key.close()
        _free()
    os.environ.pop(MULTIPLES_ENV, None)
    backend.close()


def _partition_runs(ses: DeviceRun, backend: Any, key: Any, abc: list[np.ndarray], witnesses: dict[str, np.ndarray],
                    suffix: str, lg: int, n_public: int, reps: int, g1: Any, g2: Any,
                    logs: dict[str, np.ndarray], variants: dict[str, Callable[[], None]],
                    profile_last: bool = False) -> None:
    """A checked warm-up and ``reps`` timed partitions per witness and variant on a loaded key;
    ``variants``: row suffix -> what sets the key's MSM knobs for it, taken in turn each rep (so
    that drift between the first and the last run falls on every variant alike)."""
    import cupy
    import gpu_msm_bench as mb

    from cuzk_mp.backends.base import ProverInputs
    from cuzk_mp.groth16.prover import prove_start

    for tag, w in witnesses.items():
        runs: dict[str, list[tuple[dict[str, float], float, float]]] = {v: [] for v in variants}
        for rep in range(reps + 1):
            for var, setup in variants.items():
                setup()
                t0 = time.perf_counter()
                staged = backend.stage(key, ProverInputs(*abc, w))
                stage_s = time.perf_counter() - t0
                profiled = profile_last and rep == reps
                if profiled:  # Nsight Compute's range: this partition's kernels alone (perf/partition_census.py)
                    cupy.cuda.Device().synchronize()
                    cupy.cuda.profiler.start()
                t0 = time.perf_counter()
                sums = prove_start(backend, key, staged, n_public)
                wall = time.perf_counter() - t0
                if profiled:
                    cupy.cuda.Device().synchronize()
                    cupy.cuda.profiler.stop()
                if rep == 0:  # warm-up run, checked
                    p = cupy.asnumpy(staged.h)
                    _check_sums(ses, f"prove_{tag}_2^{lg}{suffix}{var}", sums, w, p, g1, g2, logs, n_public, mb)
                backend.release(staged)
                if rep:
                    runs[var].append((dict(backend.last_timings), wall, stage_s))
        for var, got in runs.items():
            base = f"prove_{tag}_2^{lg}{suffix}{var}"
            for k in got[0][0]:
                ses.rows[f"{base}_{k}_ms"] = statistics.median(r[0][k] for r in got)
            ses.rows[f"{base}_wall_ms"] = 1e3 * statistics.median(r[1] for r in got)
            ses.rows[f"{base}_stage_wall_ms"] = 1e3 * statistics.median(r[2] for r in got)
            ses.log(f"{base}: total {ses.rows[f'{base}_total_ms']:.1f} ms, wall {ses.rows[f'{base}_wall_ms']:.1f} ms, "
                    + ", ".join(f"{k} {ses.rows[f'{base}_{k}_ms']:.1f}" for k in got[0][0] if k != "total"))


def _check_sums(ses: DeviceRun, base: str, sums: Any, w: np.ndarray, p: np.ndarray, g1: Any, g2: Any,
                logs: dict[str, np.ndarray], n_public: int, mb: Any) -> None:
    """Each of the five sums against (sum_i s_i t_i) G with the known discrete logs of each
    section's points (``logs``, :func:`partition_keys`)."""
    from py_arkworks_bls12381 import Scalar

    def at(bases: Any, s: np.ndarray, t: np.ndarray) -> Any:
        return bases.gen * Scalar.from_le_bytes(mb.dot_mod_r(s, t[: s.shape[0]]).to_bytes(32, "little"))

    k = n_public + 1
    want = {"a": at(g1, w, logs["a"]), "b1": at(g1, w, logs["b1"]), "b2": at(g2, w, logs["b2"]),
            "c": at(g1, w[k:], logs["c"]), "h": at(g1, p, logs["h"])}
    for name, point in want.items():
        ses.check(f"{base}_{name}_ok", getattr(sums, name) == point)


def partition_cpu_references(ses: DeviceRun, lg: int) -> None:
    """The partition section's host side without a GPU: witnesses, the dot products of the checks,
    the circuit key's shape."""
    import gpu_msm_bench as mb

    used, own = circuit_shape(lg, 4)
    ses.rows["dry_circuit_key_supports"] = {s: round(float(u.mean()), 4) for s, u in used.items()}
    ses.check("dry_circuit_witness_rows_ok", own.shape == (used["a"].shape[0], 4))
    n = 1 << lg
    w = _witness(n, "porep", 1)
    t = mb.random_scalars(n, "random", 2)
    frac = float(np.mean(~w.any(axis=1))), float(np.mean((w[:, 0] == 1) & ~w[:, 1:].any(axis=1)))
    direct = sum(int.from_bytes(a.tobytes(), "little") * int.from_bytes(b.tobytes(), "little")
                 for a, b in zip(w, t)) % mb.R_MOD
    ses.check("dry_dot_mod_r_ok", mb.dot_mod_r(w, t) == direct)
    ses.rows["dry_porep_zero_one_fraction"] = frac


# ---------------------------------------------------------------- real proofs

def proof_rows(ses: DeviceRun, lg: int, reps: int, kinds: tuple[str, ...] = ("porep-like", "dense-random")) -> None:
    """Real proofs of the synthetic circuits with GPU dev keys, self-verified, kept for snarkjs:
    ``prove()`` wall with a resident key, the witness map on the device (``prove_<tag>_2^N_s``, the
    default path) and on the host (``..._hostmap_s``: ConstraintEvaluator.evaluate, then a, b, c
    copied; ``witness_map_host_<tag>_2^N_ms`` the host map alone)."""
    from cuzk_mp.backends.gpu.backend import GpuBackend
    from cuzk_mp.circuits.synthetic_kinds import synthetic_circuit
    from cuzk_mp.formats.snarkjs_json import proof_to_json, public_to_json, vk_to_json, write_json
    from cuzk_mp.formats.zkey import read_zkey
    from cuzk_mp.groth16.keys import vk_from_zkey
    from cuzk_mp.groth16.prover import prove
    from cuzk_mp.groth16.synthesis import ConstraintEvaluator
    from cuzk_mp.pipeline.keys import ensure_synthetic_key

    backend = GpuBackend(0)
    cache = Path(tempfile.mkdtemp(prefix="cuzk-keys-"))
    tags = {"porep-like": "porep", "dense-random": "random"}
    for kind, tag in ((k, tags[k]) for k in kinds):
        t0 = time.perf_counter()
        zkey = read_zkey(ensure_synthetic_key(kind, lg, cache, backend="gpu")[0])
        ses.rows[f"setup_{tag}_2^{lg}_s"] = time.perf_counter() - t0
        key, ev = backend.load_key(zkey), ConstraintEvaluator.from_zkey(zkey)
        w = synthetic_circuit(kind, lg).witness(seed=1, partition=0)
        for label, on_device in (("_hostmap", False), ("", True)):  # the device map last: its proof is kept
            backend.witness_on_device = on_device  # this instance only: the A/B of the two maps
            prove(backend, zkey, w, key=key, evaluator=ev)  # warm-up (the device rows go up once)
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                proof, public = prove(backend, zkey, w, key=key, evaluator=ev)  # self-verified
                times.append(time.perf_counter() - t0)
            ses.rows[f"prove_{tag}_2^{lg}{label}_s"] = statistics.median(times)
            ses.rows.update({f"prove_{tag}_2^{lg}{label}_{k}_ms": v for k, v in backend.last_timings.items()})
            ses.log(f"prove {tag} 2^{lg}{label}: {ses.rows[f'prove_{tag}_2^{lg}{label}_s']:.3f} s")
        t0 = time.perf_counter()
        ev.evaluate(w)
        ses.rows[f"witness_map_host_{tag}_2^{lg}_ms"] = 1e3 * (time.perf_counter() - t0)
        ses.check(f"prove_{tag}_2^{lg}_verified", True)
        out = ses.out / "proofs" / f"{tag}-2^{lg}"
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "proof.json", proof_to_json(proof))
        write_json(out / "public.json", public_to_json(public))
        write_json(out / "verification_key.json", vk_to_json(vk_from_zkey(zkey)))
        ses.log(f"prove {tag} 2^{lg}: {ses.rows[f'prove_{tag}_2^{lg}_s']:.3f} s, device "
                f"{backend.last_timings.get('total', float('nan')):.1f} ms")
        key.close()
        zkey.close()
    backend.close()


# ---------------------------------------------------------------- driver

def _protocol_ready() -> str:
    """'' when groth16.prover.prove_start is the backend-protocol recipe, else why not."""
    from cuzk_mp.groth16 import prover

    params = list(inspect.signature(prover.prove_start).parameters)
    return "" if "n_public" in params else ("groth16.prover.prove_start(backend, key, staged, n_public) is not "
                                            "in this checkout (the recipe of the backend protocol)")


def _dry_run_setup() -> None:
    """Bind cuzk_mp.backends.gpu to the CPU kernel emulator (numpy arrays as device arrays)."""
    import types

    from tests import gpu_emu

    fake_modules = types.ModuleType("cuzk_mp.backends.gpu.modules")
    fake_modules.get_module = gpu_emu.get_module  # type: ignore[attr-defined]
    fake_modules.occupancy = lambda kernel, nthreads: None  # type: ignore[attr-defined]
    sys.modules["cupy"] = gpu_emu.fake_cupy  # type: ignore[assignment]
    sys.modules["cuzk_mp.backends.gpu.modules"] = fake_modules
    from cuzk_mp.backends.gpu import msm, msm_plan

    msm._copy_to_host_async = gpu_emu._copy_to_host  # type: ignore[attr-defined]
    msm_plan._copy_to_host_async = gpu_emu._copy_to_host  # type: ignore[attr-defined]
    gpu_emu.fake_cupy.get_default_memory_pool = lambda: types.SimpleNamespace(free_all_blocks=lambda: None)
    gpu_emu.fake_cupy.get_default_pinned_memory_pool = gpu_emu.fake_cupy.get_default_memory_pool


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")), help="output folder ($OUT)")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S, help="stop starting sections after this")
    ap.add_argument("--sections", default=DEFAULT_SECTIONS,
                    help=f"sections to run, of fresh,tests,msm,partition,proofs (default {DEFAULT_SECTIONS})")
    ap.add_argument("--skip", default="", help="comma list of sections to skip")
    ap.add_argument("--reps", type=int, default=3, help="timed runs per row (after a checked warm-up)")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: emulator and CPU references at tiny sizes")
    ap.add_argument("--partition-log-n", type=int, default=24, help="rows of the partition section's partition")
    ap.add_argument("--proofs-log-n", type=int, default=20, help="rows of the proofs section's circuits")
    ap.add_argument("--proofs-kinds", default="porep-like,dense-random", help="the proofs section's circuits")
    ap.add_argument("--partition-quick", action="store_true",
                    help="partition section: default multiples, XYZZ, PoRep-like witness only (for 2^26, 2^27)")
    ap.add_argument("--partition-witnesses", default=None,
                    help="partition section: a comma list of porep, random, boolean (every scalar 0 or 1, the "
                         "production prover's PoRep kind); default porep,random (quick: porep)")
    ap.add_argument("--partition-key", choices=KEYS, default="points",
                    help="partition section: a point on every row (points), or the PoRep-like circuit's wire count "
                         "and infinity points, as its own key has them (circuit: rows *_circuit_key, witness "
                         "'circuit' allowed)")
    ap.add_argument("--partition-counting-keys", default="shipped",
                    help="partition section: a comma list of the counting sort's key limits to time on each loaded "
                         "key, interleaved: 'shipped' (msm_passes.COUNTING_SORT_KEYS) or N for 2^N (62: any "
                         "batch of few enough buckets, the rule before the key limit); rows *_ckN")
    ap.add_argument("--profile-last", action="store_true",
                    help="partition section: the last timed partition of each witness and variant between "
                         "cudaProfilerStart and Stop (for ncu --profile-from-start off: perf/partition_census.py)")
    ap.add_argument("--partition-accumulate", default="",
                    help="partition section: a comma list of the accumulations to time on each loaded key: "
                         "'plan' (as its device plan set them, the default), 'xyzz' (no grid rounds: rows *_xyzz) and "
                         "'reduce0', 'reduce1', 'reduce2' (MsmParams.reduce_levels: the bucket reduction's chunk "
                         "weights by size, by a scalar multiplication a thread, by a second reduction: rows *_reduceL)")
    args = ap.parse_args()
    witnesses = tuple(args.partition_witnesses.split(",")) if args.partition_witnesses else None
    accumulate = tuple("" if a == "plan" else a for a in (args.partition_accumulate or "plan").split(","))
    try:
        counting_keys = tuple(None if v == "shipped" else int(v) for v in args.partition_counting_keys.split(","))
    except ValueError:
        ap.error(f"--partition-counting-keys: shipped or integers, not {args.partition_counting_keys}")
    if set(accumulate) - {"", "xyzz", "reduce0", "reduce1", "reduce2"}:
        ap.error(f"--partition-accumulate: plan, xyzz, reduce0, reduce1, reduce2, not {args.partition_accumulate}")
    if witnesses and set(witnesses) - set(WITNESSES):
        ap.error(f"--partition-witnesses: {', '.join(WITNESSES)}, not {args.partition_witnesses}")
    if witnesses and "circuit" in witnesses and args.partition_key != "circuit":
        ap.error("--partition-witnesses circuit needs --partition-key circuit")
    skip = set(filter(None, args.skip.split(",")))
    chosen = set(filter(None, args.sections.split(",")))
    unknown = (skip | chosen) - set(ESTIMATE_S)
    if unknown:
        ap.error(f"unknown sections {sorted(unknown)}")
    args.out.mkdir(parents=True, exist_ok=True)
    ses = DeviceRun(args.out, args.budget_s, args.dry_run, "gpu-session.json", ESTIMATE_S)
    if args.dry_run:
        _dry_run_setup()
        ses.rows["gpu"] = "none (dry run: CPU kernel emulator)"
    else:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        ses.rows.update({"gpu": props["name"].decode(), "sm_count": props["multiProcessorCount"],
                         "cupy": cupy.__version__, "cuda_driver": cupy.cuda.runtime.driverGetVersion()})
    why = _protocol_ready()
    ses.rows["protocol_recipe"] = why or "ok"
    ses.log(f"{ses.rows['gpu']}; recipe: {ses.rows['protocol_recipe']}; budget {args.budget_s:.0f} s")
    backend = "cpu" if args.dry_run else "gpu"
    sections: dict[str, Callable[[], None]] = {
        "fresh": lambda: fresh_rows(ses, backend, 10 if args.dry_run else 16),
        "tests": lambda: test_rows(ses, collect_only=args.dry_run),
        "msm": (lambda: msm_rows(ses, (7,), 6, 1)) if args.dry_run else
        (lambda: msm_rows(ses, (24, 26), 24, args.reps)),
        "partition": (lambda: partition_cpu_references(ses, 10)) if args.dry_run else
        (lambda: partition_rows(ses, args.partition_log_n, args.reps, args.partition_quick,
                                witnesses, args.partition_key, accumulate, counting_keys, args.profile_last)),
        "proofs": (lambda: None) if args.dry_run else
        (lambda: proof_rows(ses, args.proofs_log_n, args.reps, tuple(args.proofs_kinds.split(",")))),
    }
    for name, fn in sections.items():
        if name in skip or name not in chosen:
            continue
        if why and name in ("partition", "proofs") and not args.dry_run:
            ses.rows[f"{name}_status"] = f"not run: {why}"
            continue
        ses.section(name, fn)
    ses.save()
    tar = args.out / "gpu-session.tar.gz"
    with tarfile.open(tar, "w:gz") as tf:
        for item in ("gpu-session.json", "logs", "proofs"):
            if (args.out / item).exists():
                tf.add(args.out / item, arcname=item)
    print(f"wrote {tar}")
    print(table(ses.rows, TABLE_KEYS))


if __name__ == "__main__":
    main()
