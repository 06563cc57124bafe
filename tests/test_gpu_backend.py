"""GpuBackend and the GPU plumbing: source assembly, memory planning, host pages, the protocol.

CPU-only tests check the source assembler, the multiples planner and the release of
key-file pages, and, when ``nvcc`` is installed, that the test and benchmark kernels
kept outside the package still compile (the shipped ones are built and checked by
scripts/build_kernels.py and tests/test_gpu_kernels_shipped.py). GPU tests (marker
``gpu``) compare the backend's primitives and its protocol methods (stage, h_values,
msm Futures, release) with the CPU backend on random inputs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import json
import mmap
import os
import random
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from cuzk_mp.algebra import curve, fr
from cuzk_mp.backends.base import ProverInputs
from cuzk_mp.backends.gpu import hostmem
from cuzk_mp.backends.gpu.source import assemble, kernel_names, read_kernel_file
from cuzk_mp.errors import ConfigError, InputError, ResourceError
from tests.gpu_emu import KERNELS

SEED = int(os.environ.get("CUZK_TEST_SEED", random.randrange(1 << 30)))
ROOT = Path(__file__).resolve().parent.parent
OUTSIDE_UNITS = [("ff/check.cu", KERNELS), ("ec/check.cu", KERNELS), ("ff/bench.cu", ROOT / "perf" / "kernels")]


# ---------------------------------------------------------------- no GPU needed

def test_assemble_inlines_each_header_once() -> None:
    src = assemble("ntt/ntt.cu")
    assert src.count('#line 1 "ff/mont.cuh"') == 1
    assert src.count('#line 1 "common/types.cuh"') == 1
    assert '#include "' not in src
    assert "#pragma once" not in src
    assert 'extern "C" __global__' in src


def test_assemble_reports_missing_file() -> None:
    with pytest.raises(ConfigError, match="kernels/nope.cu"):
        read_kernel_file("nope.cu")


def test_assemble_outside_root_uses_package_headers() -> None:
    """A test kernel outside the package includes the package's headers unchanged."""
    src = assemble("ec/check.cu", KERNELS)
    assert src.count('#line 1 "ff/fp2_lazy.cuh"') == 1 and src.count('#line 1 "ff/mont.cuh"') == 1
    assert kernel_names("ec/check.cu", KERNELS) == ["ec_fp2_mul_check"]
    assert kernel_names("msm/msm.cu") == [
        "msm_classify", "msm_digits", "msm_sort_count", "msm_sort_scan", "msm_sort_scatter", "msm_radix_hist",
        "msm_radix_scatter", "msm_accumulate", "msm_ga_rows",
        "msm_ga_count", "msm_ga_den", "msm_ga_add", "msm_ga_inv", "msm_accumulate_list", "msm_reduce"]
    assert not (ROOT / "cuzk_mp" / "backends" / "gpu" / "kernels" / "ec" / "check.cu").exists()


@pytest.mark.slow
@pytest.mark.parametrize("unit,root", OUTSIDE_UNITS, ids=[u for u, _ in OUTSIDE_UNITS])
def test_outside_unit_compiles_with_nvcc(unit: str, root: Path, tmp_path: Path) -> None:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not installed")
    cu = tmp_path / "unit.cu"
    cu.write_text(assemble(unit, root))
    res = subprocess.run([nvcc, "-arch=sm_90", "-std=c++17", "-cubin", "-o", str(tmp_path / "u.cubin"), str(cu)],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr[-3000:]


def test_plan_multiples() -> None:
    """Sections in the order h, b2, a, b1, c while the tables leave the reserve free."""
    from cuzk_mp.backends.gpu.msm_geometry import RESERVE_FIXED, RESERVE_PER_ROW, plan_multiples

    n = 1 << 24
    sizes = {"a": 96 * n, "b1": 96 * n, "b2": 192 * n, "c": 96 * (n - 3), "h": 96 * n}
    assert plan_multiples(sizes, 133 << 30, n) == {s: 22 for s in ("h", "b2", "a", "b1", "c")}  # an H200
    free = 100 << 30
    got = plan_multiples(sizes, free, n)
    assert list(got) == ["h", "b2", "a"] and set(got.values()) == {22}
    used = sum(11 * sizes[s] for s in got)
    assert used <= free - RESERVE_FIXED - RESERVE_PER_ROW * n < used + 11 * sizes["b1"]
    assert plan_multiples(sizes, 20 << 30, n) == {}
    assert plan_multiples(sizes, free, n, "none") == {}
    assert plan_multiples(sizes, 1 << 20, n, "h, c") == {"h": 22, "c": 22}
    small = {k: v >> 14 for k, v in sizes.items()}
    assert plan_multiples(small, 8 << 30, 1 << 10) == {s: 10 for s in ("h", "b2", "a", "b1", "c")}
    with pytest.raises(InputError, match="unknown sections"):
        plan_multiples(sizes, free, n, "h,x")


def test_release_pages_of_a_file_mapping(tmp_path: Path) -> None:
    """A file-backed read-only view loses its pages (RSS) but keeps its contents; anonymous
    memory is never touched."""
    path = tmp_path / "k.bin"
    data = np.random.default_rng(SEED).integers(0, 1 << 63, size=(1 << 21) + 3, dtype=np.uint64)
    data.tofile(path)
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = np.frombuffer(mm, dtype=np.uint64, offset=24)  # not page aligned: the edges stay
    total = int(view.sum(dtype=np.uint64))
    assert hostmem.mapped_rss([view]) >= view.nbytes - hostmem.PAGE
    released = hostmem.release_pages(view)
    assert view.nbytes - 2 * hostmem.PAGE <= released <= view.nbytes
    assert hostmem.mapped_rss([view]) <= 2 * hostmem.PAGE
    assert int(view.sum(dtype=np.uint64)) == total  # read back from the file
    anon = data.copy()
    assert hostmem.release_pages(anon) == 0 and np.array_equal(anon, data)
    assert hostmem.release_pages(np.zeros(0, dtype=np.uint64)) == 0
    del view
    mm.close()


def _in_memory_fs(path: Path) -> bool:
    """Whether ``path`` lies on tmpfs / ramfs (its pages are the file: the page cache cannot drop them)."""
    best, fstype = "", ""
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 2 and str(path).startswith(parts[1]) and len(parts[1]) > len(best):
                best, fstype = parts[1], parts[2]
    return fstype in ("tmpfs", "ramfs")


def _cached_fraction(path: Path) -> float:
    """Fraction of ``path``'s pages in the page cache (``mincore`` over a fresh mapping of it)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = path.stat().st_size
    pages = -(-size // hostmem.PAGE)
    with open(path, "rb") as f:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), 0)
    assert addr not in (None, ctypes.c_void_p(-1).value)
    try:
        vec = ctypes.create_string_buffer(pages)
        assert libc.mincore(addr, size, vec) == 0, ctypes.get_errno()
        return sum(b & 1 for b in vec.raw) / pages
    finally:
        libc.munmap(addr, size)


def test_release_pages_keeps_the_page_cache_when_asked(tmp_path: Path) -> None:
    """``drop_cache=False`` (a key loaded for one proof) drops the process's pages but leaves the
    file in the page cache for the next process; the default drops it from the cache as well."""
    path = tmp_path / "k.bin"
    with open(path, "wb") as f:  # written back to disk: the page cache drops clean pages only
        np.random.default_rng(SEED).integers(0, 1 << 63, size=1 << 20, dtype=np.uint64).tofile(f)
        f.flush()
        os.fsync(f.fileno())
    for drop, want_cached in ((False, True), (True, False)):
        with open(path, "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        view = np.frombuffer(mm, dtype=np.uint64)
        view.sum()  # every page resident, in the process and in the page cache
        assert _cached_fraction(path) > 0.99
        assert hostmem.release_pages(view, drop_cache=drop) == view.nbytes
        assert hostmem.mapped_rss([view]) == 0
        cached = _cached_fraction(path)
        if want_cached:
            assert cached > 0.99, cached
        elif not _in_memory_fs(path):  # tmpfs keeps every page: nothing to drop there
            assert cached < 0.5, cached
        del view
        mm.close()


# ---------------------------------------------------------------- on the GPU

@pytest.fixture(scope="module")
def gpu() -> object:
    """A GpuBackend on device 0 (skips without CuPy or a device)."""
    pytest.importorskip("cupy")
    from cuzk_mp.backends import gpu_available

    if not gpu_available():
        pytest.skip("no CUDA device")
    from cuzk_mp.backends.gpu.backend import GpuBackend

    return GpuBackend(0)


def _as_large_key(monkeypatch: pytest.MonkeyPatch, backend_cls: Any) -> None:
    """Make every module of the backend that reads DENSE_KEY_ROWS (staging's, key loading's and
    key generation's) take any key as one above it: the 0/1 split and the packed supports."""
    for method in (backend_cls.stage, backend_cls._pack, backend_cls.generate_key):
        monkeypatch.setitem(method.__globals__, "DENSE_KEY_ROWS", 0)


def _random_mont(n: int, rng: random.Random) -> np.ndarray:
    return fr.from_ints([rng.randrange(fr.R_MOD) for _ in range(n)])


@pytest.mark.gpu
def test_primitives_match_cpu(gpu: object) -> None:
    from cuzk_mp.algebra import ntt as cpu_ntt

    rng = random.Random(SEED)
    a, b, c = (_random_mont(1 << 12, rng) for _ in range(3))
    assert np.array_equal(gpu.ntt(a), cpu_ntt.ntt(a)), f"seed={SEED}"
    assert np.array_equal(gpu.ntt(a, inverse=True), cpu_ntt.intt(a)), f"seed={SEED}"
    assert np.array_equal(gpu.coset_h(a, b, c), cpu_ntt.coset_h(a, b, c)), f"seed={SEED}"


@pytest.mark.gpu
def test_memory_check_names_need_and_free(gpu: object) -> None:
    from cuzk_mp.backends.gpu import memory

    with pytest.raises(ResourceError, match=r"needs 1048576\.00 GiB .* free"):
        memory.ensure_free(1 << 50, "a test allocation")
    free, total = memory.free_bytes()
    assert 0 < free <= total + (1 << 40)


@pytest.mark.gpu
def test_pinned_ranges_register_and_release(gpu: object) -> None:
    import cupy

    from cuzk_mp.backends.gpu import memory

    host = np.arange(8 << 20, dtype=np.uint64)  # 64 MiB
    views = [host[: 4 << 20], host[4 << 20 :]]  # two arrays sharing one page range
    with memory.PinnedRanges(views) as pins:
        assert len(pins.registered) == 1 and pins.nbytes >= host.nbytes
        d = cupy.asarray(host)
    assert pins.registered == []
    assert int(d[-1]) == (8 << 20) - 1


@pytest.mark.gpu
def test_threads_get_their_own_streams(gpu: object) -> None:
    seen = []
    t = threading.Thread(target=lambda: seen.append(gpu.streams()))
    t.start()
    t.join()
    mine = gpu.streams()
    assert seen[0] is not mine and seen[0].main is not mine.main
    assert mine.main is not mine.side and gpu.stream() is mine.main


@pytest.mark.gpu
def test_occupancy_query(gpu: object) -> None:
    """The accumulation kernel's resident threads come from the driver (no fallback)."""
    import cupy

    from cuzk_mp.backends.gpu import modules, msm

    k = modules.get_function(msm.MSM_PATH, "msm_accumulate", msm.MsmParams().defines(False))
    sms = cupy.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    got = modules.occupancy(k, 128)
    assert got % (128 * sms) == 0 and 128 * sms <= got <= 2048 * sms


def _random_points(n: int, g2: bool, rng: random.Random) -> np.ndarray:
    from py_arkworks_bls12381 import G1Point, G2Point, Scalar

    gen = G2Point() if g2 else G1Point()
    rows = []
    for _ in range(n):
        p = gen * Scalar.from_le_bytes(rng.randrange(1, fr.R_MOD).to_bytes(32, "little"))
        rows.append(curve.g2_ark_to_lem(p) if g2 else curve.g1_ark_to_lem(p))
    return np.stack(rows)


def _fake_zkey(log_n: int, n_vars: int, n_public: int, rng: random.Random) -> SimpleNamespace:
    """The fields of a ZKey that load_key and stage read, with random points (one infinity each)."""
    pts = _random_points(64, False, rng)
    g2 = _random_points(16, True, rng)
    pts[5] = 0
    g2[3] = 0

    def pick(m: int, src: np.ndarray) -> np.ndarray:
        return src[np.array([rng.randrange(len(src)) for _ in range(m)])]

    return SimpleNamespace(
        path="random-test-key", domain_size=1 << log_n, n_vars=n_vars, n_public=n_public,
        a=pick(n_vars, pts), b1=pick(n_vars, pts), b2=pick(n_vars, g2),
        c=pick(n_vars - n_public - 1, pts), h=pick(1 << log_n, pts))


def _cpu_sums(zkey: SimpleNamespace, inputs: ProverInputs) -> dict[str, object]:
    """The five MSMs on the CPU backend's primitives (arkworks), H through its coset_h."""
    from cuzk_mp.backends.cpu import CpuBackend

    cpu = CpuBackend(threads=2)
    w, k = inputs.w, zkey.n_public + 1
    return {"a": cpu.msm_g1(zkey.a, w), "b1": cpu.msm_g1(zkey.b1, w), "b2": cpu.msm_g2(zkey.b2, w),
            "c": cpu.msm_g1(zkey.c, w[k:]), "h": cpu.msm_g1(zkey.h, cpu.coset_h(inputs.a, inputs.b, inputs.c))}


@pytest.mark.gpu
@pytest.mark.parametrize(("multiples", "sparse_b"), [("none", False), ("auto", False), ("h,b2", False),
                                                     ("auto", True), ("none", True)])
def test_protocol_matches_cpu_backend(gpu: object, multiples: str, sparse_b: bool,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """stage, then the recipe's order (b2, a, b1, c on w[n_public + 1:], h on h_values), all
    enqueued before any result is taken; sums equal the CPU backend's. Witness: 0, 1, r - 1
    and random values; sizes that are no multiple of any block (700 variables, n_public 3).
    ``sparse_b``: B1 and B2 at infinity on 60 % of the wires, staged with the 0/1 split: their
    MSMs take the plan of the rows with points."""
    monkeypatch.setenv("CUZK_GPU_MSM_MULTIPLES", multiples)
    rng = random.Random(SEED)
    zkey = _fake_zkey(10, 700, 3, rng)
    if sparse_b:
        _as_large_key(monkeypatch, type(gpu))
        off = np.array([rng.random() < 0.6 for _ in range(700)])
        off |= ~zkey.b1.any(axis=1) | ~zkey.b2.any(axis=1)  # one mask for both (a wire outside B)
        zkey.b1, zkey.b2 = zkey.b1.copy(), zkey.b2.copy()
        zkey.b1[off] = 0
        zkey.b2[off] = 0
    w = fr.from_ints([rng.choice([0, 1, fr.R_MOD - 1, rng.randrange(fr.R_MOD)]) for _ in range(700)], mont=False)
    inputs = ProverInputs(*(_random_mont(1 << 10, rng) for _ in range(3)), w)
    want = _cpu_sums(zkey, inputs)
    key = gpu.load_key(zkey)
    assert set(key.multiples) == ({"a", "b1", "b2", "c", "h"} if multiples == "auto" else
                                  set() if multiples == "none" else {"h", "b2"})
    assert key.supports == ({"b2": "b2", "b1": "b2"} if sparse_b else {})
    busy0 = gpu.busy_seconds
    staged = gpu.stage(key, inputs)
    try:
        if sparse_b:
            sub = staged.plan.subsets["b2"]
            assert 0 < sub.n1 + sub.n2 < staged.plan.n1 + staged.plan.n2
        sw = staged.w
        pending = {"b2": gpu.msm(key, "b2", sw), "a": gpu.msm(key, "a", sw), "b1": gpu.msm(key, "b1", sw),
                   "c": gpu.msm(key, "c", sw[zkey.n_public + 1:])}
        pending["h"] = gpu.msm(key, "h", gpu.h_values(key, staged))
        got = {name: f.result() for name, f in pending.items()}
        with pytest.raises(InputError, match="699 scalars for the section's 700 points"):
            gpu.msm(key, "a", sw[1:])
        with pytest.raises(InputError, match="unknown MSM section"):
            gpu.msm(key, "z", sw)
    finally:
        split = gpu.release(staged)
        assert gpu.release(staged) == {}  # idempotent
    assert split == gpu.last_timings and split["msm_h"] > 0  # the partition's own spans, returned
    for name in ("a", "b1", "b2", "c", "h"):
        assert got[name] == want[name], f"seed={SEED}: MSM {name} differs ({multiples})"
    assert set(gpu.last_timings) >= {"h2d", "classify", "ntt_h", "msm_a", "msm_b1", "msm_b2", "msm_c", "msm_h",
                                     "total"}
    assert gpu.busy_seconds > busy0
    # a vector that is no staged partition's: classified on the spot
    import cupy

    assert gpu.msm(key, "a", cupy.asarray(w)).result() == want["a"]
    assert gpu.msm(key, "b2", cupy.asarray(w)).result() == want["b2"]  # packed on the spot when sparse_b
    stats = gpu.stats()
    # B1, B2 of the sparse key keep only their rows with a point (packed)
    kept = int(np.count_nonzero(zkey.b2.any(axis=1))) if sparse_b else 700
    assert key.msms["b1"].n == key.msms["b2"].n == kept
    assert stats["device_key_bytes"] >= (sum(getattr(zkey, s).nbytes for s in ("a", "b1", "b2", "c", "h"))
                                         - (700 - kept) * (zkey.b1.shape[1] + zkey.b2.shape[1]) * 8)
    key.close()
    with pytest.raises(InputError, match="closed key"):
        gpu.msm(key, "a", w)


@pytest.mark.gpu
def test_stage_rejects_wrong_shapes(gpu: object) -> None:
    zkey = SimpleNamespace(domain_size=16, n_vars=10, n_public=1)
    key = SimpleNamespace(zkey=zkey, msms={})
    good = np.zeros((16, 4), dtype=np.uint64)
    with pytest.raises(InputError, match="vector w"):
        gpu.stage(key, ProverInputs(good, good, good, np.zeros((9, 4), dtype=np.uint64)))


@pytest.mark.gpu
def test_load_key_lets_file_pages_go(gpu: object, tmp_path: Path) -> None:
    """Sections uploaded from the key file's mapping; afterwards this process holds (almost) none
    of their pages, the ZKey still reads them back from the file, and stats() says so."""
    from cuzk_mp.circuits.synthetic_kinds import synthetic_circuit
    from cuzk_mp.formats.zkey import read_zkey, write_zkey
    from cuzk_mp.groth16 import setup as dev

    write_zkey(tmp_path / "k.zkey", dev.setup(synthetic_circuit("porep-like", 12).r1cs(), gpu))
    with read_zkey(tmp_path / "k.zkey") as zkey:
        sections = ("a", "b1", "b2", "c", "h")
        section_bytes = sum(getattr(zkey, s).nbytes for s in sections)
        # Reading every section first makes all their pages resident, so `before` counts each
        # page that the upload can release (a section never read would be released without
        # ever having been counted, and the bound below would be short by its size).
        digests = {s: hashlib.sha256(getattr(zkey, s).tobytes()).hexdigest() for s in sections}
        before = hostmem.mapped_rss([zkey.a])
        key = gpu.load_key(zkey)
        try:
            assert key.host_released >= section_bytes - 10 * hostmem.PAGE
            stats = gpu.stats()
            assert stats["host_key_resident_bytes"] <= before - key.host_released + 16 * hostmem.PAGE
            assert stats["host_key_released_bytes"] >= key.host_released
            assert all(hashlib.sha256(getattr(zkey, s).tobytes()).hexdigest() == digests[s] for s in digests)
        finally:
            key.close()


def _prove_synthetic(backend: object, tmp_path: Path, log_n: int = 10, kind: str = "porep-like",
                     check_r1cs: bool = True) -> None:
    """Dev key (CPU setup) for the 2^log_n synthetic circuit, a proof on ``backend``, checks; without
    ``check_r1cs`` the prover's witness map runs where the backend keeps a, b, c (the device's)."""
    from cuzk_mp.backends.cpu import CpuBackend
    from cuzk_mp.circuits.synthetic_kinds import synthetic_circuit
    from cuzk_mp.formats.zkey import read_zkey, write_zkey
    from cuzk_mp.groth16 import setup as dev
    from cuzk_mp.groth16.keys import vk_from_zkey
    from cuzk_mp.groth16.prover import prove
    from cuzk_mp.groth16.verifier import verify

    circuit = synthetic_circuit(kind, log_n)
    r1cs = circuit.r1cs()
    write_zkey(tmp_path / "k.zkey", dev.setup(r1cs, CpuBackend(threads=2)))
    with read_zkey(tmp_path / "k.zkey") as zkey:
        w = circuit.witness(seed=SEED, partition=1)
        proof, public = prove(backend, zkey, w, r1cs=r1cs if check_r1cs else None)  # self-verifies
        vk = vk_from_zkey(zkey)
        assert verify(vk, public, proof), f"seed={SEED}"
        assert not verify(vk, [public[0] + 1, *public[1:]], proof)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["porep-like", "dense-random"])
def test_whole_proof_on_gpu_verifies(gpu: object, tmp_path: Path, kind: str) -> None:
    """Both witness shapes: mostly 0/1 (the MSMs' 0/1 split) and every value full-width; with the
    witness checked against the r1cs (the host's witness map) and without (the device's)."""
    _prove_synthetic(gpu, tmp_path, kind=kind)
    (tmp_path / "device-map").mkdir()
    _prove_synthetic(gpu, tmp_path / "device-map", kind=kind, check_r1cs=False)


COUNT_COMPILES = r"""
import json, sys
import cupy.cuda.compiler as cc
from cuzk_mp.cli import main
seen = []
real = cc._compile_module_with_cache
def counted(source, *args, **kwargs):
    seen.append(" ".join(source.split())[-160:])
    return real(source, *args, **kwargs)
cc._compile_module_with_cache = counted
code = main(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    json.dump({"code": code, "compiles": seen}, f)
"""


@pytest.mark.gpu
@pytest.mark.parametrize("binaries", ["auto", "cuda12"])
def test_a_one_shot_gpu_proof_compiles_no_kernel_at_run_time(gpu: object, tmp_path: Path, binaries: str) -> None:
    """A fresh process's GPU proof runs the shipped kernel binaries alone: CuPy compiles nothing (its
    first run-time compile in a process runs NVRTC on the proof's path, ~20 ms of a one-shot prove:
    a slice assignment of the window sums did, until they were written in place). Also with the
    set for drivers before CUDA 13 (``CUZK_GPU_BINARIES=cuda12``, NVRTC 12.9's cubins), whose proof
    must verify too."""
    from cuzk_mp.cli import main

    assert main(["circuit", "porep-like", "--log-n", "10", str(tmp_path)]) == 0
    assert main(["setup", "--backend", "cpu", str(tmp_path / "porep-like-10.r1cs"), str(tmp_path / "k.zkey")]) == 0
    args = ["groth16", "prove", "--backend", "gpu", str(tmp_path / "k.zkey"), str(tmp_path / "porep-like-10.wtns"),
            str(tmp_path / "p.json"), str(tmp_path / "pub.json")]
    out = tmp_path / "compiles.json"
    env = {**os.environ, "CUZK_GPU_BINARIES": binaries, "CUZK_MP_CACHE": str(tmp_path / "cache")}
    res = subprocess.run([sys.executable, "-c", COUNT_COMPILES, str(out), *args], capture_output=True, text=True,
                         check=False, cwd=Path(__file__).parents[1], timeout=300, env=env)
    assert res.returncode == 0 and out.exists(), res.stderr[-2000:]
    got = json.loads(out.read_text())
    assert got["code"] == 0, res.stderr[-2000:]
    assert got["compiles"] == [], f"CuPy compiled at run time: {got['compiles']}"
    assert "compiling with NVRTC" not in res.stderr, res.stderr[-2000:]
    if binaries == "cuda12":
        assert list((tmp_path / "cache" / "kernels").glob("*.cubin")), "no cuda12 cubin was loaded"
    assert main(["zkey", "export", "verificationkey", str(tmp_path / "k.zkey"), str(tmp_path / "vk.json")]) == 0
    assert main(["groth16", "verify", *(str(tmp_path / f) for f in ("vk.json", "pub.json", "p.json"))]) == 0


# ---------------------------------------------------------------- the backend's host code, emulated

@pytest.fixture(scope="module")
def emu_gpu() -> object:
    """A GpuBackend whose host code is the real one over a fake CuPy (tests/gpu_emu/backend.py):
    the MSM and fixed-base kernels compiled as host C++, the H step the CPU oracle's."""
    from tests import gpu_emu

    if not gpu_emu.available():
        pytest.skip("no host C++ compiler for the kernel emulator")
    from tests.gpu_emu.backend import load_backend

    backend = load_backend().GpuBackend(0)
    yield backend
    backend.close()


@pytest.mark.slow
def test_emulated_witness_map_stages_what_the_host_evaluates(emu_gpu: object, test_key: tuple[Path, Path]) -> None:
    """stage_witness (w copied; a, b, c made by the device witness map when the partition computes)
    gives the same a, b, c as the host's ConstraintEvaluator, reuses the key's device rows for the
    same circuit data and replaces them for another (a partition staged with the old ones keeps them
    until its release); prove() takes that path (no r1cs) and its proof verifies; with an r1cs it
    keeps the host's map, which names an unsatisfied constraint."""
    from cuzk_mp.circuits.synthetic import PorepLike
    from cuzk_mp.errors import UnsatisfiedWitness
    from cuzk_mp.formats.r1cs import read_r1cs
    from cuzk_mp.formats.zkey import read_zkey
    from cuzk_mp.groth16.keys import vk_from_zkey
    from cuzk_mp.groth16.prover import prove
    from cuzk_mp.groth16.synthesis import ConstraintEvaluator
    from cuzk_mp.groth16.verifier import verify
    from tests.helpers import LOG_N

    assert emu_gpu.witness_on_device
    with read_zkey(test_key[0]) as zkey:
        ev = ConstraintEvaluator.from_zkey(zkey)
        w = PorepLike(LOG_N).witness(SEED, 0)
        want = ev.evaluate(w)
        key = emu_gpu.load_key(zkey, lasting=False)
        try:
            for _ in range(2):
                staged = emu_gpu.stage_witness(key, ev.data, w)
                try:
                    assert set(staged.d) == {"w"}  # a, b, c come when the partition computes
                    emu_gpu.map_witness(key, staged)
                    for name in "abcw":
                        got = np.asarray(staged.d[name])
                        assert np.array_equal(got, getattr(want, name)), f"seed={SEED}: {name}"
                finally:
                    emu_gpu.release(staged)
            rows = key.witness_map[1]
            held = emu_gpu.stats()["device_witness_map_bytes"]
            assert held == rows.nbytes >= ev.data.a.nbytes + ev.data.b.nbytes > 0
            emu_gpu.release(emu_gpu.stage_witness(key, ev.data, w))
            assert key.witness_map[1] is rows  # the same data: the rows stay
            other = ConstraintEvaluator.from_zkey(zkey)
            emu_gpu.release(emu_gpu.stage_witness(key, other.data, w))
            assert key.witness_map[0] is other.data and rows._d == []  # replaced, the old rows freed
            # replaced while a partition staged with the old rows waits: it keeps them until released
            pending = emu_gpu.stage_witness(key, other.data, w)
            kept = key.witness_map[1]
            emu_gpu.release(emu_gpu.stage_witness(key, ev.data, w))
            assert key.witness_map[0] is ev.data and kept._d and pending.witness_map is kept
            try:
                emu_gpu.map_witness(key, pending)
                for name in "abc":
                    assert np.array_equal(np.asarray(pending.d[name]), getattr(want, name)), f"seed={SEED}: {name}"
            finally:
                emu_gpu.release(pending)
            assert pending.witness_map is None
            with pytest.raises(InputError, match="witness has shape"):
                emu_gpu.stage_witness(key, ev.data, w[:-1])
        finally:
            key.close()
        assert key.witness_map is None and emu_gpu.stats()["device_witness_map_bytes"] == 0
        proof, public = prove(emu_gpu, zkey, w, evaluator=ev)
        assert verify(vk_from_zkey(zkey), public, proof), f"seed={SEED}"
        bad = w.copy()
        bad[1:] = w[1:][::-1]  # the wires reversed: constraints fail
        with pytest.raises(UnsatisfiedWitness):
            prove(emu_gpu, zkey, bad, r1cs=read_r1cs(test_key[1]))


def _split_path_sums(emu_gpu: Any, zkey_path: Path, monkeypatch: pytest.MonkeyPatch,
                     witness: Callable[[np.ndarray], np.ndarray],
                     inspect: Callable[[Any, Any], None]) -> tuple[Any, Any]:
    """(the emulated GPU backend's five sums, the CPU backend's) of the test key's partition with
    ``witness(w)`` in place of the circuit's w, staged as a large key stages it (the 0/1 split);
    ``inspect(key, staged)`` runs on the staged partition before its MSMs."""
    _as_large_key(monkeypatch, type(emu_gpu))
    from cuzk_mp.backends.cpu import CpuBackend
    from cuzk_mp.circuits.synthetic import PorepLike
    from cuzk_mp.formats.zkey import read_zkey
    from cuzk_mp.groth16.prover import prove_start
    from cuzk_mp.groth16.synthesis import ConstraintEvaluator
    from tests.helpers import LOG_N

    cpu = CpuBackend(threads=2)
    with read_zkey(zkey_path) as zkey:
        x = ConstraintEvaluator.from_zkey(zkey).evaluate(PorepLike(LOG_N).witness(SEED, 0))
        inputs = ProverInputs(x.a, x.b, x.c, witness(x.w))
        ckey = cpu.load_key(zkey)
        s = cpu.stage(ckey, inputs)
        want = prove_start(cpu, ckey, s, zkey.n_public)
        cpu.release(s)
        key = emu_gpu.load_key(zkey, lasting=False)
        try:
            staged = emu_gpu.stage(key, inputs)
            try:
                inspect(key, staged)
                got = prove_start(emu_gpu, key, staged, zkey.n_public)
            finally:
                emu_gpu.release(staged)
        finally:
            key.close()
        assert key.supports == {} and key.support_rows == {}
    return got, want


def test_emulated_boolean_witness_on_the_split_path(emu_gpu: object, test_key: tuple[Path, Path],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A witness of zeros and ones alone (a boolean circuit: no scalar for Pippenger) staged as a
    large key stages it (the 0/1 split) gives the CPU backend's five sums (its staging once
    divided by the tail count)."""
    def boolean(w: np.ndarray) -> np.ndarray:
        out = np.zeros_like(w)
        out[:, 0] = np.random.default_rng(SEED).integers(0, 2, size=w.shape[0], dtype=np.uint64)
        out[0, 0] = 1
        return out

    def inspect(key: Any, staged: Any) -> None:
        assert staged.plan.other is not None and staged.plan.n2 == 0 < staged.plan.n1

    got, want = _split_path_sums(emu_gpu, test_key[0], monkeypatch, boolean, inspect)
    for name in ("a", "b1", "b2", "c", "h"):
        assert getattr(got, name) == getattr(want, name), f"seed={SEED}: MSM {name}"


def test_emulated_sparse_b_sections_take_the_rows_with_points(emu_gpu: object, test_key: tuple[Path, Path],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The PoRep-like key's B points are infinity on the wires no B side uses: B1 and B2 share one
    support, keep only its rows' points (the key's device bytes shrink by the rest), their MSMs
    take the plan of those rows' scalars, packed at staging (fewer ones and others than the
    witness's plan, which A keeps), and the five sums equal the CPU backend's."""
    def inspect(key: Any, staged: Any) -> None:
        assert key.supports == {"b2": "b2", "b1": "b2"}, key.supports
        rows = np.asarray(key.support_rows["b2"])
        m = staged.plan.m
        assert rows.dtype == np.int32 and 0.3 < rows.size / m < 0.7  # the B side uses ~45 % of wires
        assert np.all(np.diff(rows) > 0) and rows[-1] < m
        zkey = key.zkey
        for name in ("b1", "b2"):  # the packed points: the zkey's rows with a point, in order
            assert key.msms[name].n == rows.size and getattr(zkey, name)[rows].any(axis=1).all()
            assert not np.delete(getattr(zkey, name), rows, axis=0).any()
        assert key.plan.shape.packed == (("b2", rows.size), ("b1", rows.size))
        assert key.nbytes == sum(getattr(zkey, s).nbytes for s in ("a", "c", "h")) + (
            zkey.b1[rows].nbytes + zkey.b2[rows].nbytes)
        plan, sub = staged.plan, staged.plan.subsets["b2"]
        assert sub.m == rows.size and sub.n1 + sub.n2 < plan.n1 + plan.n2 and sub.n2 > 0
        assert np.array_equal(np.asarray(sub.scalars), np.asarray(staged.w)[rows])
        ones, other = np.asarray(plan.ones), np.asarray(plan.other)
        assert np.array_equal(rows[np.asarray(sub.ones)], ones[np.isin(ones, rows)])
        assert np.array_equal(rows[np.asarray(sub.other)], other[np.isin(other, rows)])
        # a whole-witness vector of no partition: packed on the spot, the same sum
        from cuzk_mp.backends.cpu import CpuBackend

        w = np.asarray(staged.w).copy()
        assert emu_gpu.msm(key, "b1", w).result() == CpuBackend(threads=1).msm_g1(zkey.b1, w)

    got, want = _split_path_sums(emu_gpu, test_key[0], monkeypatch, lambda w: w, inspect)
    for name in ("a", "b1", "b2", "c", "h"):
        assert getattr(got, name) == getattr(want, name), f"seed={SEED}: MSM {name}"


def test_emulated_key_load_makes_its_kernels_and_tables_beside_the_upload(
        emu_gpu: Any, test_key: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A key's MSM kernels and its NTT tables are made on helper threads while its sections upload,
    and a failure there fails the load as one in the load itself would: the error reaches the caller,
    the MSM objects made are closed, no key is registered; the next load of the key succeeds."""
    from cuzk_mp.formats.zkey import read_zkey

    caller = threading.get_ident()
    where: set[tuple[str, bool]] = set()  # (what, on the caller's thread)
    gmsm = type(emu_gpu)._resident.__globals__["gmsm"]  # the emulated backend's msm module
    load_kernels, plan = gmsm.load_kernels, emu_gpu.ntt_engine.plan

    def kernels(params: Any, g2: bool) -> Any:
        where.add(("g2" if g2 else "g1", threading.get_ident() == caller))
        return load_kernels(params, g2)

    def failing_plan(lg: int) -> Any:
        where.add(("ntt", threading.get_ident() == caller))
        raise ResourceError(f"no room for the 2^{lg} NTT tables")

    monkeypatch.setattr(gmsm, "load_kernels", kernels)
    monkeypatch.setattr(emu_gpu.ntt_engine, "plan", failing_plan)
    closed: list[object] = []
    monkeypatch.setattr(gmsm.MsmG1, "close", lambda self: closed.append(self))
    with read_zkey(test_key[0]) as zkey:
        before = list(emu_gpu._keys)
        with pytest.raises(ResourceError, match="NTT tables"):
            emu_gpu.load_key(zkey, lasting=False)
        # each made on a helper thread (the MSM objects ask again on the caller's, and find them)
        assert {("g1", False), ("g2", False), ("ntt", False)} <= where and ("ntt", True) not in where, where
        assert len(closed) == 4 and emu_gpu._keys == before  # A, B1, C, H made, then let go
        monkeypatch.setattr(emu_gpu.ntt_engine, "plan", plan)
        key = emu_gpu.load_key(zkey, lasting=False)
        try:
            assert set(key.msms) == {"a", "b1", "b2", "c", "h"}
            assert 1 << (zkey.domain_size.bit_length() - 1) in emu_gpu.ntt_engine.domain_sizes()
        finally:
            key.close()


def test_emulated_key_for_one_proof_grows_the_memory_pool_beside_the_upload(
        emu_gpu: Any, test_key: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A key for one proof has the memory pool take what its partition holds at its peak (its plan's
    in-flight total) in one block, on a helper thread while its sections upload; a lasting key does
    not; a block the driver refuses leaves the load to succeed (the proof then allocates as it goes)."""
    from cuzk_mp.formats.zkey import read_zkey

    memory = type(emu_gpu)._resident.__globals__["memory"]  # the emulated backend's
    grow, pool_class = memory.grow_pool, type(memory.cupy.get_default_memory_pool())
    caller = threading.get_ident()
    calls: list[tuple[int, bool, bool]] = []  # (bytes, on the caller's thread, taken)

    def spy(nbytes: int) -> bool:
        taken = grow(nbytes)
        calls.append((nbytes, threading.get_ident() == caller, taken))
        return bool(taken)

    def refuse(self: Any, nbytes: int) -> Any:
        raise memory.cupy.cuda.memory.OutOfMemoryError(f"out of memory allocating {nbytes} bytes")

    monkeypatch.setattr(memory, "grow_pool", spy)
    with read_zkey(test_key[0]) as zkey:
        key = emu_gpu.load_key(zkey, lasting=False)
        try:
            assert key.plan is not None and key.plan.in_flight_total > 0
            assert calls == [(key.plan.in_flight_total, False, True)]
            assert pool_class.mallocs[-1] == key.plan.in_flight_total
        finally:
            key.close()
        emu_gpu.load_key(zkey).close()
        assert len(calls) == 1  # none for a lasting key
        monkeypatch.setattr(pool_class, "malloc", refuse)
        key = emu_gpu.load_key(zkey, lasting=False)
        try:
            assert len(calls) == 2 and calls[1][2] is False and set(key.msms) == {"a", "b1", "b2", "c", "h"}
        finally:
            key.close()


def test_emulated_key_load_given_the_rows_maps_them_beside_the_upload(
        emu_gpu: Any, test_key: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A key loaded with the circuit's coded rows (``witness_rows``) makes their device copy on a
    helper thread while its sections upload; its partitions staged with those rows use it (no second
    copy) and it goes with the key. prove() given an evaluator passes its rows, and the proof verifies.
    A failure elsewhere in the load closes the copy made; a failure of the copy fails the load."""
    from cuzk_mp.circuits.synthetic import PorepLike
    from cuzk_mp.formats.zkey import read_zkey
    from cuzk_mp.groth16.keys import vk_from_zkey
    from cuzk_mp.groth16.prover import prove
    from cuzk_mp.groth16.synthesis import ConstraintEvaluator
    from cuzk_mp.groth16.verifier import verify
    from tests.helpers import LOG_N

    wmap_class = type(emu_gpu)._resident.__globals__["DeviceWitnessMap"]  # the emulated backend's
    of_rows = wmap_class.of_rows.__func__
    caller = threading.get_ident()
    made: list[tuple[Any, bool]] = []  # (the device rows, made on the caller's thread)

    def spy(cls: type, rows: Any, n: int, long: Any = None) -> Any:
        m = of_rows(cls, rows, n, long)
        made.append((m, threading.get_ident() == caller))
        return m

    monkeypatch.setattr(wmap_class, "of_rows", classmethod(spy))
    with read_zkey(test_key[0]) as zkey:
        ev = ConstraintEvaluator.from_zkey(zkey)
        w = PorepLike(LOG_N).witness(SEED, 0)
        key = emu_gpu.load_key(zkey, lasting=False, witness_rows=ev.data)
        try:
            assert [on_caller for _, on_caller in made] == [False]
            assert key.witness_map is not None and key.witness_map[0] is ev.data and key.witness_map[1] is made[0][0]
            emu_gpu.release(emu_gpu.stage_witness(key, ev.data, w))
            assert len(made) == 1 and key.witness_map[1] is made[0][0]  # the partition found them
        finally:
            key.close()
        assert made[0][0]._d == [] and emu_gpu.stats()["device_witness_map_bytes"] == 0

        proof, public = prove(emu_gpu, zkey, w, evaluator=ev)
        assert len(made) == 2 and not made[1][1] and made[1][0]._d == []  # made with the key, gone with it
        assert verify(vk_from_zkey(zkey), public, proof), f"seed={SEED}"

        def failing_plan(lg: int) -> Any:
            raise ResourceError(f"no room for the 2^{lg} NTT tables")

        before = list(emu_gpu._keys)
        with monkeypatch.context() as m:
            m.setattr(emu_gpu.ntt_engine, "plan", failing_plan)
            with pytest.raises(ResourceError, match="NTT tables"):
                emu_gpu.load_key(zkey, lasting=False, witness_rows=ev.data)
        assert len(made) == 3 and made[2][0]._d == [] and emu_gpu._keys == before

        def failing(cls: type, rows: Any, n: int, long: Any = None) -> Any:
            raise ResourceError("the device has no room for the witness map's coded rows")

        monkeypatch.setattr(wmap_class, "of_rows", classmethod(failing))
        with pytest.raises(ResourceError, match="witness map's coded rows"):
            emu_gpu.load_key(zkey, lasting=False, witness_rows=ev.data)
        assert emu_gpu._keys == before


@pytest.mark.slow
@pytest.mark.parametrize(("lasting", "dense"), [(False, True), (True, True), (False, False)],
                         ids=["one-proof-key", "lasting-key", "one-proof-key-split"])
def test_emulated_backend_batches_equal_cpu_backend(emu_gpu: object, test_key: tuple[Path, Path],
                                                    lasting: bool, dense: bool,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """prove_start_batch over three staged partitions of the porep-like 2^10 test key on the GPU
    backend's host code equals the CPU backend partition by partition, and so does the lone
    prove_start; the proofs verify. A small key's partitions have dense plans and their batch is
    one batched MSM per section; ``split``: the 0/1 split and one MSM per partition, as for keys
    above DENSE_KEY_ROWS. A one-proof key gets no precomputed multiples, a lasting one all five;
    the bounce buffers are sized to the partition, not 2 x 64 MiB; a bad vector in a batch is
    refused before anything is enqueued."""
    if not dense:
        _as_large_key(monkeypatch, type(emu_gpu))
    from cuzk_mp.backends.cpu import CpuBackend
    from cuzk_mp.circuits.synthetic import PorepLike
    from cuzk_mp.formats.zkey import read_zkey
    from cuzk_mp.groth16.keys import prepare_vk, vk_from_zkey
    from cuzk_mp.groth16.prover import prove_finalize, prove_start, prove_start_batch, public_signals
    from cuzk_mp.groth16.synthesis import ConstraintEvaluator
    from cuzk_mp.groth16.verifier import verify
    from tests.helpers import LOG_N

    cpu = CpuBackend(threads=2)
    with read_zkey(test_key[0]) as zkey:
        ev = ConstraintEvaluator.from_zkey(zkey)
        inputs = [ev.evaluate(PorepLike(LOG_N).witness(SEED + i, 0)) for i in range(3)]
        ckey = cpu.load_key(zkey)
        want = []
        for x in inputs:
            s = cpu.stage(ckey, x)
            want.append(prove_start(cpu, ckey, s, zkey.n_public))
            cpu.release(s)
        key = emu_gpu.load_key(zkey, lasting=lasting)
        try:
            assert set(key.multiples) == ({"a", "b1", "b2", "c", "h"} if lasting else set())
            staged = [emu_gpu.stage(key, x) for x in inputs]
            assert all((s.plan.other is None) == dense for s in staged)
            try:
                with pytest.raises(InputError, match="MSM a: 3 scalars"):
                    emu_gpu.msm_batch(key, "a", [staged[0].w, staged[1].w[:3]])
                assert all(not s.run.pending for s in staged)
                got = prove_start_batch(emu_gpu, key, staged, zkey.n_public)
            finally:
                for s in staged:
                    emu_gpu.release(s)
            lone_staged = emu_gpu.stage(key, inputs[0])
            try:
                lone = prove_start(emu_gpu, key, lone_staged, zkey.n_public)
            finally:
                emu_gpu.release(lone_staged)
            bad_w = inputs[0].w.copy()
            bad_w[5, 3] |= np.uint64(1 << 63)  # not a canonical Fr element: refused at staging or at the results
            with pytest.raises(InputError, match="bit 255"):
                bad = emu_gpu.stage(key, ProverInputs(inputs[0].a, inputs[0].b, inputs[0].c, bad_w))
                try:
                    prove_start(emu_gpu, key, bad, zkey.n_public)
                finally:
                    emu_gpu.release(bad)
        finally:
            key.close()
        pvk = prepare_vk(vk_from_zkey(zkey))
        for i, (g, c) in enumerate(zip(got, want)):
            for name in ("a", "b1", "b2", "c", "h"):
                assert getattr(g, name) == getattr(c, name), f"seed={SEED}: partition {i} MSM {name}"
            public = public_signals(inputs[i].w, zkey.n_public)
            assert verify(pvk, public, prove_finalize(zkey, g, public))
        assert all(getattr(lone, n) == getattr(want[0], n) for n in ("a", "b1", "b2", "c", "h"))
    assert set(emu_gpu.last_timings) >= {"h2d", "classify", "ntt_h", "msm_a", "msm_h", "total"}
    assert emu_gpu.stats()["host_pinned_bytes"] == 2 * (1 << 20)  # 2^10 partitions: two 1 MiB buffers
