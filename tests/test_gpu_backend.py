"""GpuBackend and the GPU plumbing: source assembly, compilation, memory checks, H, MSM sums.

CPU-only tests check the source assembler and, when ``nvcc`` is installed,
that every shipped translation unit compiles for sm_90 (catches kernel errors
before device time is spent). GPU tests (marker ``gpu``) compare the backend's
primitives and a whole ``prove_msms`` with the CPU backend on random inputs.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from cuzk_mp.algebra import curve, fr
from cuzk_mp.backends.base import ProverInputs
from cuzk_mp.backends.gpu.source import assemble, read_kernel_file
from cuzk_mp.errors import ConfigError, InputError, ResourceError

SEED = int(os.environ.get("CUZK_TEST_SEED", random.randrange(1 << 30)))
UNITS = ["ntt/ntt.cu", "h/h.cu", "ff/check.cu", "ff/bench.cu"]


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


@pytest.mark.slow
@pytest.mark.parametrize("unit", UNITS)
def test_unit_compiles_with_nvcc(unit: str, tmp_path: Path) -> None:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not installed")
    cu = tmp_path / "unit.cu"
    cu.write_text(assemble(unit))
    res = subprocess.run([nvcc, "-arch=sm_90", "-std=c++17", "-cubin", "-o", str(tmp_path / "u.cubin"), str(cu)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]


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
    t = threading.Thread(target=lambda: seen.append(gpu.stream()))
    t.start()
    t.join()
    assert seen[0] is not gpu.stream()
    assert gpu.stream() is gpu.stream()


def _random_points(n: int, g2: bool, rng: random.Random) -> np.ndarray:
    from py_arkworks_bls12381 import G1Point, G2Point, Scalar

    gen = G2Point() if g2 else G1Point()
    rows = []
    for _ in range(n):
        p = gen * Scalar.from_le_bytes(rng.randrange(1, fr.R_MOD).to_bytes(32, "little"))
        rows.append(curve.g2_ark_to_lem(p) if g2 else curve.g1_ark_to_lem(p))
    return np.stack(rows)


def _fake_zkey(log_n: int, n_vars: int, n_public: int, rng: random.Random) -> SimpleNamespace:
    """The fields of a ZKey that load_key/stage/prove_msms read, with random points."""
    pts = _random_points(64, False, rng)
    g2 = _random_points(16, True, rng)
    pick = lambda m, src: src[np.array([rng.randrange(len(src)) for _ in range(m)])]  # noqa: E731
    return SimpleNamespace(
        path="random-test-key", domain_size=1 << log_n, n_vars=n_vars, n_public=n_public,
        a=pick(n_vars, pts), b1=pick(n_vars, pts), b2=pick(n_vars, g2),
        c=pick(n_vars - n_public - 1, pts), h=pick(1 << log_n, pts))


@pytest.mark.gpu
def test_prove_msms_matches_cpu_backend(gpu: object) -> None:
    pytest.importorskip("cuzk_mp.backends.gpu.msm", reason="helper B's GPU MSM is not in this checkout")
    from cuzk_mp.backends.cpu import CpuBackend

    rng = random.Random(SEED)
    zkey = _fake_zkey(10, 700, 3, rng)
    w = fr.from_ints([rng.choice([0, 1, rng.randrange(fr.R_MOD)]) for _ in range(700)], mont=False)
    inputs = ProverInputs(*(_random_mont(1 << 10, rng) for _ in range(3)), w)
    cpu = CpuBackend(threads=2)
    want = cpu.prove_msms(cpu.load_key(zkey), cpu.stage(cpu.load_key(zkey), inputs))
    key = gpu.load_key(zkey)
    staged = gpu.stage(key, inputs)
    try:
        got = gpu.prove_msms(key, staged)
    finally:
        gpu.release(staged)
        key.close()
    for name in ("a", "b1", "b2", "c", "h"):
        assert getattr(got, name) == getattr(want, name), f"seed={SEED}: MSM {name} differs"
    assert set(gpu.last_timings) >= {"h2d", "ntt_h", "msm_a", "msm_b1", "msm_b2", "msm_c", "msm_h", "total"}
    assert gpu.busy_seconds > 0


@pytest.mark.gpu
def test_stage_rejects_wrong_shapes(gpu: object) -> None:
    zkey = SimpleNamespace(domain_size=16, n_vars=10, n_public=1)
    key = SimpleNamespace(zkey=zkey, msms={})
    good = np.zeros((16, 4), dtype=np.uint64)
    with pytest.raises(InputError, match="vector w"):
        gpu.stage(key, ProverInputs(good, good, good, np.zeros((9, 4), dtype=np.uint64)))


def _prove_synthetic(backend: object, tmp_path: Path, log_n: int = 10, kind: str = "porep-like") -> None:
    """Dev key (CPU setup) for the 2^log_n synthetic circuit, a proof on ``backend``, checks."""
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
        proof, public = prove(backend, zkey, w, r1cs=r1cs)  # self-verifies before returning
        vk = vk_from_zkey(zkey)
        assert verify(vk, public, proof), f"seed={SEED}"
        assert not verify(vk, [public[0] + 1, *public[1:]], proof)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["porep-like", "dense-random"])
def test_whole_proof_on_gpu_verifies(gpu: object, tmp_path: Path, kind: str) -> None:
    """Both witness shapes: mostly 0/1 (the MSMs' 0/1 split) and every value full-width."""
    pytest.importorskip("cuzk_mp.backends.gpu.msm", reason="helper B's GPU MSM is not in this checkout")
    _prove_synthetic(gpu, tmp_path, kind=kind)
