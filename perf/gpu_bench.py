"""GPU benchmark for the H200 machine: field multiply rates, NTTs, H step, H2D, MSMs, whole proofs.

Run from the repository root on the GPU machine:
    python3 perf/gpu_bench.py [--out DIR] [--quick] [--sizes 20,24,26]
Prints a table (last) and writes ``perf/results/gpu-h200.json`` (and DIR/gpu-h200.json) on an
H200, ``gpu-<model>.json`` on another GPU (``gpu-h100-80gb-hbm3.json``): a flat JSON object with gpu,
date and one key per row, written again after each section (a run cut short keeps what it measured). Every figure is the median
of several CUDA-event-timed runs after a warm-up run; every timed kernel's output
is checked (field chains against Python ints, NTTs by a round trip). A section
that fails is recorded as "<section>_error" and the others still run.
perf/gpu_session.py is the one-call device session (tests, checked MSM and
partition rows of old and new variants, fresh-box timings).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "perf"))

from cuzk_mp.algebra.field import FQ, FR, Q_MOD, R_MOD, ints_to_limbs, limbs_to_ints  # noqa: E402
from cuzk_mp.paths import default_cache_dir  # noqa: E402

from device_run import GpuStack, result_name  # noqa: E402

with GpuStack(__name__) as GPU_STACK:  # run as a script without it, only --help works (main() exits 2 saying why)
    import cupy

    from cuzk_mp.backends.gpu import memory
    from cuzk_mp.backends.gpu.modules import get_module
    from cuzk_mp.backends.gpu.ntt import GpuNtt

REPS = 5
BENCH_KERNELS = ROOT / "perf" / "kernels"  # ff/bench.cu: multiply-throughput kernels (not shipped)


def time_ms(fn: Callable[[], Any], reps: int = REPS) -> float:
    """Median CUDA-event time of fn() on the current stream, after one warm-up call."""
    fn()
    cupy.cuda.get_current_stream().synchronize()
    times = []
    for _ in range(reps):
        a, b = cupy.cuda.Event(), cupy.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(cupy.cuda.get_elapsed_time(a, b))
    return statistics.median(times)


# ---------------------------------------------------------------- field multiply rates

def _fq2_mul(x: tuple[int, int], y: tuple[int, int], ri: int) -> tuple[int, int]:
    return ((x[0] * y[0] - x[1] * y[1]) * ri % Q_MOD, (x[0] * y[1] + x[1] * y[0]) * ri % Q_MOD)


def _expected_row(kind: str, x: list[int], y: list[int], iters: int, chains: int) -> int:
    if kind == "fq2":
        ri = pow(1 << 384, -1, Q_MOD)
        acc = (x[0], x[1])
        for _ in range(iters):
            acc = _fq2_mul(acc, (y[0], y[1]), ri)
        return (acc[0] * chains % Q_MOD) | ((acc[1] * chains % Q_MOD) << 384)
    p, r = (Q_MOD, FQ.r) if kind.startswith("fq") else (R_MOD, FR.r)
    if kind.endswith("_sqr"):
        v, ri = x[0], pow(r, -1, p)
        for _ in range(iters):
            v = v * v * ri % p
        return v * chains % p
    return x[0] * pow(y[0] * pow(r, -1, p), iters, p) * chains % p


def field_rate(kind: str, chains: int, n_threads: int, iters: int, rng: random.Random) -> float:
    """Multiplies per second of one bench kernel (ff/bench.cu), output checked on 64 rows."""
    words = {"fq": 6, "fr": 4, "fq2": 12, "fq_sqr": 6, "fr_sqr": 4}[kind]
    p = R_MOD if kind.startswith("fr") else Q_MOD
    n_el = 2 if kind == "fq2" else 1
    vals = [[rng.randrange(p) for _ in range(n_el)] for _ in range(4096)]
    if kind == "fq2":
        host = ints_to_limbs([v[0] | v[1] << 384 for v in vals], 12)
    else:
        host = ints_to_limbs([v[0] for v in vals], words)
    rows = np.resize(host, (n_threads, words))
    d_in, d_out = cupy.asarray(rows), cupy.empty((n_threads, words), dtype=np.uint64)
    kern = get_module("ff/bench.cu", {"FF_BENCH_CHAINS": chains}, root=BENCH_KERNELS).get_function(f"ff_bench_{kind}")
    grid = (n_threads + 255) // 256
    ms = time_ms(lambda: kern((grid,), (256,), (d_in, d_out, np.uint64(n_threads), np.uint32(iters))))
    out = limbs_to_ints(cupy.asnumpy(d_out[:64]))
    for i in range(64):
        x, y = vals[i % 4096], vals[(i + 1) % n_threads % 4096]
        want = _expected_row(kind, x, y, iters, chains)
        if out[i] != want:
            raise AssertionError(f"ff_bench_{kind} chains={chains}: row {i} is wrong")
    muls = n_threads * iters * chains
    return muls / (ms / 1000.0)


def field_rows(quick: bool) -> dict[str, Any]:
    """fq_mul_per_s (best variant) and every variant's rate."""
    rng = random.Random(1)
    n, iters = (1 << 18, 256) if quick else (1 << 20, 1024)
    rows: dict[str, Any] = {}
    for kind in ("fq", "fq_sqr", "fr", "fr_sqr", "fq2"):
        for chains in (1, 2):
            label = kind.replace("_sqr", "") + ("_sqr" if kind.endswith("_sqr") else "_mul")
            rows[f"{label}_chains{chains}_per_s"] = field_rate(kind, chains, n, iters, rng)
    rows["fq_mul_per_s"] = max(rows["fq_mul_chains1_per_s"], rows["fq_mul_chains2_per_s"])
    rows["fr_mul_per_s"] = max(rows["fr_mul_chains1_per_s"], rows["fr_mul_chains2_per_s"])
    return rows


# ---------------------------------------------------------------- NTT and H

def _random_fr_device(n: int, seed: int) -> Any:
    """n canonical Fr rows on the device: a random host block of <= 2^20 rows, tiled, with
    the row index xored into limb 0 so no two rows are equal (top limb < r's keeps them < r)."""
    g = np.random.default_rng(seed)
    m = min(n, 1 << 20)
    block = g.integers(0, 1 << 63, size=(m, 4), dtype=np.uint64)
    block[:, 3] %= np.uint64(R_MOD >> 192)
    d = cupy.tile(cupy.asarray(block), (n // m, 1))
    d[:, 0] ^= cupy.arange(n, dtype=cupy.uint64)
    return d


def ntt_rows(sizes: list[int]) -> dict[str, Any]:
    """Forward / inverse NTT and the whole H step (3 arrays) per size; round trip checked."""
    eng = GpuNtt()
    rows: dict[str, Any] = {}
    for lg in sizes:
        n = 1 << lg
        memory.ensure_free(4 * n * 32, f"the 2^{lg} NTT benchmark")
        x = _random_fr_device(n, lg)
        ref = x.copy()
        rows[f"ntt_2^{lg}_ms"] = time_ms(lambda: eng.ntt_in_place(x))
        rows[f"intt_2^{lg}_ms"] = time_ms(lambda: eng.ntt_in_place(x, inverse=True))
        x[...] = ref
        eng.ntt_in_place(x)
        eng.ntt_in_place(x, inverse=True)
        if not bool(cupy.array_equal(x, ref)):
            raise AssertionError(f"NTT round trip failed at 2^{lg}")
        b, c = _random_fr_device(n, lg + 100), _random_fr_device(n, lg + 200)
        rows[f"coset_2^{lg}_ms"] = time_ms(lambda: eng.to_odd_coset_in_place(x))
        rows[f"ntt_h_2^{lg}_ms"] = time_ms(lambda: eng.coset_h_in_place(x, b, c))
        del x, ref, b, c
        cupy.get_default_memory_pool().free_all_blocks()
    return rows


def h2d_rows(gib: float = 1.0) -> dict[str, Any]:
    """Host-to-device GB/s of a ~1 GiB array: pageable, and pinned with registration included."""
    host = np.ones(int(gib * (1 << 30)) // 8, dtype=np.uint64)
    dev = cupy.empty_like(host)
    s = cupy.cuda.get_current_stream()

    def copy() -> None:
        cupy.cuda.runtime.memcpyAsync(dev.data.ptr, host.ctypes.data, host.nbytes, 1, s.ptr)

    def pinned_copy() -> None:
        with memory.PinnedRanges([host]):
            copy()
            s.synchronize()

    t0 = time.perf_counter()
    for _ in range(3):
        copy()
        s.synchronize()
    pageable = (time.perf_counter() - t0) / 3
    t0 = time.perf_counter()
    for _ in range(3):
        pinned_copy()
    pinned = (time.perf_counter() - t0) / 3
    return {"h2d_pageable_GB_per_s": host.nbytes / pageable / 1e9,
            "h2d_pinned_incl_register_GB_per_s": host.nbytes / pinned / 1e9}


def ntt_knob_rows(sizes: tuple[int, ...] = (24, 26, 27)) -> dict[str, Any]:
    """Forward 2^lg NTT time for a few kernel-knob choices (tile, chunk, threads)."""
    from cuzk_mp.backends.gpu.ntt import NttParams, pass_schedule

    rows: dict[str, Any] = {}
    for lg in sizes:
        x = _random_fr_device(1 << lg, 7)
        for tile, chunk, threads in ((10, 2, 256), (10, 1, 256), (10, 3, 256), (10, 2, 128), (9, 1, 256)):
            p = NttParams(tile_lg=tile, chunk_lg=chunk, threads=threads, adapt_chunk=False)
            eng = GpuNtt(p)
            key = f"ntt_2^{lg}_tile{tile}_chunk{chunk}_t{threads}_{len(pass_schedule(lg, p))}pass_ms"
            rows[key] = time_ms(lambda: eng.ntt_in_place(x))
        del x
        cupy.get_default_memory_pool().free_all_blocks()
    return rows


def sass_rows(out_dir: Path | None) -> dict[str, Any]:
    """Instruction counts of the field bench kernels from nvcc + cuobjdump (when installed)."""
    import re
    import shutil
    import subprocess
    import tempfile

    from cuzk_mp.backends.gpu.source import assemble

    if not (shutil.which("nvcc") and shutil.which("cuobjdump")):
        return {"sass": "not run: nvcc or cuobjdump missing"}
    with tempfile.TemporaryDirectory() as tmp:
        cu, cubin = Path(tmp) / "bench.cu", Path(tmp) / "bench.cubin"
        cu.write_text(assemble("ff/bench.cu", BENCH_KERNELS))
        subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-cubin", "-o", str(cubin), str(cu)], check=True)
        sass = subprocess.run(["cuobjdump", "-sass", str(cubin)], check=True, capture_output=True, text=True).stdout
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "ff_bench.sass").write_text(sass)
    rows: dict[str, Any] = {}
    for name, body in re.findall(r"Function : (\w+)(.*?)(?=Function :|\Z)", sass, flags=re.S):
        ins = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", body)
        rows[f"sass_{name}_instructions"] = len(ins)
        rows[f"sass_{name}_imad"] = sum(1 for i in ins if i.startswith("IMAD"))
    return rows


# ---------------------------------------------------------------- MSM and whole-proof rows

def msm_rows(quick: bool) -> dict[str, Any]:
    """The MSM rows of perf/gpu_msm_bench.py (msm_rows(quick))."""
    import gpu_msm_bench

    return dict(gpu_msm_bench.msm_rows(quick))


def prove_rows(sizes: list[int], cache_dir: Path, proof_dir: Path | None = None) -> dict[str, Any]:
    """Whole proofs on the GPU with dev keys made by the GPU setup, each self-verified:
    prove_porep_2^N_s (PoRep-like witness, 80% 0/1), prove_random_2^N_s (dense-random: every
    witness value full-width), with the stage splits of the last run, and prove_msms_random_2^N_s
    (device part only, dense random a, b, c, w against the porep key). With ``proof_dir``, each
    kind's last proof, public signals and verification key are written as snarkjs JSON
    (``<tag>-2^N/{proof,public,verification_key}.json``) for ``snarkjs groth16 verify`` elsewhere."""
    from cuzk_mp.backends.base import ProverInputs
    from cuzk_mp.backends.gpu.backend import GpuBackend
    from cuzk_mp.circuits.synthetic_kinds import synthetic_circuit
    from cuzk_mp.formats.snarkjs_json import proof_to_json, public_to_json, vk_to_json, write_json
    from cuzk_mp.formats.zkey import read_zkey
    from cuzk_mp.groth16.keys import vk_from_zkey
    from cuzk_mp.groth16.prover import prove, prove_start
    from cuzk_mp.groth16.synthesis import ConstraintEvaluator
    from cuzk_mp.pipeline.keys import ensure_synthetic_key

    backend, rows = GpuBackend(0), {}
    for lg in sizes:
        for kind, tag in (("porep-like", "porep"), ("dense-random", "random")):
            t0 = time.perf_counter()
            zkey = read_zkey(ensure_synthetic_key(kind, lg, cache_dir, backend="gpu")[0])
            rows[f"setup_or_cached_{tag}_2^{lg}_s"] = time.perf_counter() - t0
            key, ev = backend.load_key(zkey), ConstraintEvaluator.from_zkey(zkey)
            w = synthetic_circuit(kind, lg).witness(seed=1, partition=0)
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                proof, public = prove(backend, zkey, w, key=key, evaluator=ev)  # self-verified
                times.append(time.perf_counter() - t0)
            rows[f"prove_{tag}_2^{lg}_s"] = statistics.median(times)
            rows.update({f"prove_{tag}_2^{lg}_{k}_ms": v for k, v in backend.last_timings.items()})
            if proof_dir is not None:
                out = proof_dir / f"{tag}-2^{lg}"
                out.mkdir(parents=True, exist_ok=True)
                write_json(out / "proof.json", proof_to_json(proof))
                write_json(out / "public.json", public_to_json(public))
                write_json(out / "verification_key.json", vk_to_json(vk_from_zkey(zkey)))
            if kind == "porep-like":
                g = np.random.default_rng(lg)
                dense = [np.asarray(cupy.asnumpy(_random_fr_device(zkey.domain_size, lg + i))) for i in range(3)]
                w_rand = g.integers(0, 1 << 62, size=(zkey.n_vars, 4), dtype=np.uint64)
                staged = backend.stage(key, ProverInputs(*dense, w_rand))
                t0 = time.perf_counter()
                prove_start(backend, key, staged, zkey.n_public)
                rows[f"prove_msms_random_2^{lg}_s"] = time.perf_counter() - t0
                backend.release(staged)
                rows.update({f"prove_msms_random_2^{lg}_{k}_ms": v for k, v in backend.last_timings.items()})
            key.close()
            zkey.close()
    return rows


def prove_msms_random_rows(sizes: tuple[int, ...] = (20,)) -> dict[str, Any]:
    """The device work of a partition (H + the five MSMs, groth16.prover.prove_start) on dense
    random a, b, c, w against a key-shaped set of random points (64 G1 / 16 G2 points repeated:
    the work per MSM is that of distinct points), with the backend's per-stage splits."""
    from types import SimpleNamespace

    from py_arkworks_bls12381 import G1Point, G2Point, Scalar

    from cuzk_mp.algebra import curve
    from cuzk_mp.backends.base import ProverInputs
    from cuzk_mp.backends.gpu.backend import GpuBackend
    from cuzk_mp.groth16.prover import prove_start

    rng = random.Random(3)
    scal = lambda: Scalar.from_le_bytes(rng.randrange(1, R_MOD).to_bytes(32, "little"))  # noqa: E731
    g1 = np.stack([curve.g1_ark_to_lem(G1Point() * scal()) for _ in range(64)])
    g2 = np.stack([curve.g2_ark_to_lem(G2Point() * scal()) for _ in range(16)])
    backend, rows = GpuBackend(0), {}
    for lg in sizes:
        n, n_pub = 1 << lg, 4
        idx = np.random.default_rng(lg).integers(0, 64, size=n)
        zkey = SimpleNamespace(path=f"random-2^{lg}", domain_size=n, n_vars=n, n_public=n_pub,
                               a=g1[idx], b1=g1[idx[::-1]], b2=g2[idx % 16], c=g1[idx[: n - n_pub - 1]], h=g1[idx])
        dense = [cupy.asnumpy(_random_fr_device(n, lg + i)) for i in range(4)]
        key = backend.load_key(zkey)
        times = []
        for _ in range(3):
            staged = backend.stage(key, ProverInputs(*dense))
            t0 = time.perf_counter()
            prove_start(backend, key, staged, n_pub)
            times.append(time.perf_counter() - t0)
            backend.release(staged)
        rows[f"prove_msms_random_2^{lg}_s"] = statistics.median(times)
        rows.update({f"prove_msms_random_2^{lg}_{k}_ms": v for k, v in backend.last_timings.items()})
        key.close()
    return rows


# ---------------------------------------------------------------- main


def main() -> None:
    """Run the rows, print a table, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON (and nothing else) here")
    ap.add_argument("--quick", action="store_true", help="smaller sizes, fewer iterations")
    ap.add_argument("--sizes", default="20,24,26", help="NTT sizes as log2, comma separated")
    ap.add_argument("--skip", default="", help="comma list of sections to skip: field,ntt,h2d,msm,ntt_knobs,prove_msms,sass,prove")
    ap.add_argument("--prove-sizes", default="20,24", help="whole-proof sizes as log2")
    ap.add_argument("--key-cache", type=Path, default=default_cache_dir(),
                    help="dev key cache (default: cuzk-mp's cache folder, $CUZK_MP_CACHE or $XDG_CACHE_HOME/cuzk-mp)")
    args = ap.parse_args()
    GPU_STACK.require("gpu_bench.py")
    skip = set(filter(None, args.skip.split(",")))
    sizes = [int(s) for s in args.sizes.split(",")]
    props = cupy.cuda.runtime.getDeviceProperties(0)
    res: dict[str, Any] = {"gpu": props["name"].decode(), "date": _dt.date.today().isoformat(),
                           "sm_count": props["multiProcessorCount"]}
    sections = {"field": lambda: field_rows(args.quick), "ntt": lambda: ntt_rows(sizes), "h2d": h2d_rows,
                "msm": lambda: msm_rows(args.quick),
                "ntt_knobs": ntt_knob_rows, "prove_msms": prove_msms_random_rows, "sass": lambda: sass_rows(args.out), "prove": lambda: prove_rows([int(x) for x in args.prove_sizes.split(",")], args.key_cache.expanduser(),
                                        args.out / "proofs" if args.out else None)}
    places = [ROOT / "perf" / "results" / result_name(res["gpu"])]
    if args.out:
        places.append(args.out / places[0].name)
    for name, fn in sections.items():
        if name in skip:
            continue
        t0 = time.perf_counter()
        try:
            res.update(fn())
        except Exception as exc:  # noqa: BLE001 - a failed section is recorded, the others still run
            res[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
        print(f"[bench] {name}: {time.perf_counter() - t0:.1f} s", flush=True)
        res["sections_done"] = [*res.get("sections_done", []), name]
        text = json.dumps(res, indent=1, sort_keys=True)
        for place in places:
            place.parent.mkdir(parents=True, exist_ok=True)
            place.write_text(text + "\n")
    for k, v in sorted(res.items()):
        print(f"{k:40s} {v:.4g}" if isinstance(v, float) else f"{k:40s} {v}")


if __name__ == "__main__":
    main()
