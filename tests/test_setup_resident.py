"""Keys generated into a backend from the circuit's compact data, against the file-writing setup.

The same toxic waste must give the same key: the head points, IC and every point section of
:func:`setup_resident` (on the CPU backend, and on the GPU backend's host code over the kernel
emulator) equal :func:`setup`'s byte for byte, and the QAP columns from the coded matrices equal
those from the r1cs. A proof made with the generated key verifies with the verification key of
its head; the same proof fails against a head made with other toxic waste.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cuzk_mp.algebra import coded_sparse, fr
from cuzk_mp.backends.cpu import CpuBackend
from cuzk_mp.circuits.synthetic_kinds import synthetic_circuit
from cuzk_mp.errors import FormatError
from cuzk_mp.groth16 import setup as dev
from cuzk_mp.groth16.circuit_data import build_from_r1cs, open_or_build_from
from cuzk_mp.groth16.circuit_data_file import CircuitData, CircuitShape, FileIdentity, open_cache
from cuzk_mp.groth16.keys import prepare_vk, vk_from_zkey
from cuzk_mp.groth16.prover import prove
from cuzk_mp.groth16.setup_resident import qap_columns, setup_resident
from cuzk_mp.groth16.synthesis import ConstraintEvaluator
from cuzk_mp.groth16.verifier import verify

TOXIC = dev.ToxicWaste(tau=0x1234567890ABCDEF1234567, alpha=987654321987654321, beta=55555555555555555555,
                       delta=31415926535897932384626)
IDENTITY = FileIdentity(1, 0, b"resident-setup-t")


HEAD = ("alpha1", "beta1", "beta2", "gamma2", "delta1", "delta2")
POINTS = ("a", "b1", "b2", "c", "h")


def _sections(key: object) -> dict[str, np.ndarray]:
    return {name: np.concatenate(getattr(key, name)) if isinstance(getattr(key, name), list)
            else np.asarray(getattr(key, name)) for name in ("ic", *HEAD, *POINTS)}


@pytest.fixture(scope="module", params=["porep-like", "dense-random"])
def circuit(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[object, object, Path]:
    """(synthetic circuit, its r1cs, circuit data file) at 2^10 rows."""
    c = synthetic_circuit(request.param, 10)
    r1cs = c.r1cs()
    path = tmp_path_factory.mktemp("resident") / f"{request.param}.synth-abc"
    build_from_r1cs(r1cs, path, IDENTITY)
    return c, r1cs, path


@pytest.fixture(scope="module")
def want(circuit: tuple[object, object, Path]) -> dict[str, np.ndarray]:
    """The file setup's key (CPU backend, TOXIC), section by section: what every generated key must equal."""
    cpu = CpuBackend(threads=2)
    try:
        return _sections(dev.setup(circuit[1], cpu, toxic=TOXIC))  # type: ignore[arg-type]
    finally:
        cpu.close()


def _open(circuit: tuple[object, object, Path]) -> CircuitData:
    """The fixture's circuit data, opened as a prover opens it: checked against its identity and shape."""
    r1cs = circuit[1]
    shape = CircuitShape.of_circuit(r1cs.n_wires, r1cs.n_public, r1cs.n_constraints)  # type: ignore[attr-defined]
    return open_cache(circuit[2], IDENTITY, IDENTITY, shape)


def _assert_resident_points(made: object, want: dict[str, np.ndarray], to_host: object = np.asarray) -> None:
    """The GPU backend's resident sections and the head's IC equal the file setup's."""
    for name in POINTS:
        got = to_host(made.handle.msms[name].d_points)  # type: ignore[attr-defined, operator]
        assert np.array_equal(got, want[name]), name
    assert np.array_equal(made.head.ic, want["ic"])  # type: ignore[attr-defined]


def test_coded_transpose_equals_the_csr_one(circuit: tuple[object, object, Path]) -> None:
    _, r1cs, path = circuit
    data = _open(circuit)
    rng = np.random.default_rng(7)
    x = fr.from_ints([int(v) for v in rng.integers(0, 2**62, size=data.c.n_rows)])  # Montgomery form
    for tasks in (1, 3):
        got = coded_sparse.rmatvec(data.c, data.table_mont, x, data.counts.n_vars, tasks=tasks)
        assert np.array_equal(got, r1cs.c.rmatvec(x))
    with pytest.raises(ValueError, match="rows"):
        coded_sparse.rmatvec(data.c, data.table_mont, x[:1], data.counts.n_vars)


def test_qap_from_circuit_data_equals_the_r1cs_one(circuit: tuple[object, object, Path]) -> None:
    _, r1cs, path = circuit
    data = _open(circuit)
    log_n = dev._domain_log(r1cs)
    for got, want in zip(qap_columns(data, TOXIC), dev._qap_columns(r1cs, TOXIC, log_n)):
        assert np.array_equal(got, want)


def test_cpu_resident_key_is_the_setup_key_and_proves(circuit: tuple[object, object, Path],
                                                      want: dict[str, np.ndarray],
                                                      caplog: pytest.LogCaptureFixture) -> None:
    c, _, path = circuit
    backend = CpuBackend(threads=2)
    try:
        data = _open(circuit)
        made = setup_resident(data, backend, TOXIC, name="test key")
        # its toxic waste is kept (every prover makes the same key): the warning must not say discarded
        warned = [r.getMessage() for r in caplog.records if "INSECURE" in r.getMessage()]
        assert warned and all("kept" in m and "discarded" not in m for m in warned), warned
        head = made.head
        got = _sections(made.handle.zkey)
        for name, arr in want.items():
            assert np.array_equal(got[name], arr), name
        assert head.coefs is None and head.a.shape[0] == 0  # the head holds no section
        w = c.witness(seed=3, partition=0)
        proof, public = prove(backend, head, w, key=made.handle, evaluator=ConstraintEvaluator(data, "test"))
        assert verify(prepare_vk(vk_from_zkey(head)), public, proof)
        other = setup_resident(data, backend, dev.ToxicWaste(TOXIC.tau + 1, TOXIC.alpha, TOXIC.beta, TOXIC.delta))
        assert not verify(prepare_vk(vk_from_zkey(other.head)), public, proof)
    finally:
        backend.close()


def test_open_or_build_from_builds_once_and_rebuilds_for_another_identity(tmp_path: Path) -> None:
    c = synthetic_circuit("porep-like", 10)
    calls: list[int] = []

    def make() -> object:
        calls.append(1)
        return c.r1cs()

    path = tmp_path / "p.synth-abc"
    shape = CircuitShape.of_circuit(c.n_wires, c.n_public, c.n_constraints)
    first = open_or_build_from(path, IDENTITY, shape, make)  # type: ignore[arg-type]
    again = open_or_build_from(path, IDENTITY, shape, make)  # type: ignore[arg-type]
    assert len(calls) == 1 and first.counts == again.counts
    other = FileIdentity(2, 0, b"another-generatr")
    open_or_build_from(path, other, shape, make)  # type: ignore[arg-type]
    assert len(calls) == 2
    with pytest.raises(FormatError, match="another key"):
        open_cache(path, IDENTITY, IDENTITY, shape)


def test_emulated_gpu_generates_the_same_points(circuit: tuple[object, object, Path], want: dict[str, np.ndarray],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU backend's generate_key (fixed-base kernels on the emulator, the device plan, the
    resident MSM objects) against the CPU backend's points."""
    from tests import gpu_emu

    if not gpu_emu.available():
        pytest.skip("no host C++ compiler for the kernel emulator")
    from tests.gpu_emu.backend import load_backend

    data = _open(circuit)
    monkeypatch.setenv("CUZK_GPU_MSM_MULTIPLES", "none")  # the points alone (multiples have their own tests)
    backend = load_backend().GpuBackend(0)
    try:
        made = setup_resident(data, backend, TOXIC)
        _assert_resident_points(made, want)
        made.handle.close()
    finally:
        backend.close()


def test_next_sections_scalars_are_made_while_this_one_is_generated(circuit: tuple[object, object, Path],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU backend asks for a section's scalars while the section before it is turned into points
    (the host's QAP beside the device's kernels), in the order given, each once."""
    import threading
    import time

    from tests import gpu_emu

    if not gpu_emu.available():
        pytest.skip("no host C++ compiler for the kernel emulator")
    from cuzk_mp.backends.gpu.plan import KeyShape
    from tests.gpu_emu.backend import load_backend

    data = _open(circuit)
    cpu = CpuBackend(threads=1)
    try:
        head = setup_resident(data, cpu, TOXIC).head
    finally:
        cpu.close()
    rows = KeyShape.of(head).rows()
    emu = load_backend()
    events: list[tuple[str, str]] = []
    lock = threading.Lock()
    real = emu.key_generate._fixed_base_rows

    def slow_rows(s: object, name: str, *args: object) -> object:
        with lock:
            events.append(("points", name))
        time.sleep(0.3)  # a section's kernels take a while
        out = real(s, name, *args)
        with lock:
            events.append(("done", name))
        return out

    def scalars(name: str) -> object:
        def make() -> np.ndarray:
            with lock:
                events.append(("scalars", name))
            return np.zeros((rows[name], 4), np.uint64)
        return make

    monkeypatch.setattr(emu.key_generate, "_fixed_base_rows", slow_rows)
    monkeypatch.setenv("CUZK_GPU_MSM_MULTIPLES", "none")
    backend = emu.GpuBackend(0)
    order = ["h", "a", "b1", "b2", "c"]
    try:
        key = backend.generate_key(head, [(n, "g2" if n == "b2" else "g1", scalars(n)) for n in order])
        key.close()
    finally:
        backend.close()
    assert [n for e, n in events if e == "scalars"] == order
    for before, name in zip(order, order[1:]):  # asked for before the previous section's points were done
        assert events.index(("scalars", name)) < events.index(("done", before)), events


def test_emulated_gpu_generated_key_equals_the_cpu_one(circuit: tuple[object, object, Path],
                                                      want: dict[str, np.ndarray]) -> None:
    """The GPU backend's generate_key on the kernel emulator (its helper thread making the sections'
    scalars ahead of the kernels, IC's fixed-base products on that thread): the same points as the
    CPU file setup."""
    from tests import gpu_emu

    if not gpu_emu.available():
        pytest.skip("no host C++ compiler for the kernel emulator")
    from tests.gpu_emu.backend import load_backend

    backend = load_backend().GpuBackend(0)
    try:
        made = setup_resident(_open(circuit), backend, TOXIC)
        _assert_resident_points(made, want)
        made.handle.close()
    finally:
        backend.close()


@pytest.mark.gpu
def test_gpu_generated_key_equals_the_cpu_one_and_proves(circuit: tuple[object, object, Path],
                                                         want: dict[str, np.ndarray]) -> None:
    """On the device: the same points as the CPU setup, and a proof from the resident key verifies
    (against the head's verification key; not against another toxic waste's)."""
    pytest.importorskip("cupy")
    from cuzk_mp.backends.gpu.backend import GpuBackend

    import cupy

    c, _, path = circuit
    data = _open(circuit)
    backend = GpuBackend(0)
    try:
        made = setup_resident(data, backend, TOXIC)
        _assert_resident_points(made, want, cupy.asnumpy)
        w = c.witness(seed=5, partition=1)
        proof, public = prove(backend, made.head, w, key=made.handle, evaluator=ConstraintEvaluator(data, "t"))
        assert verify(prepare_vk(vk_from_zkey(made.head)), public, proof)
        made.handle.close()
    finally:
        backend.close()


def test_a_key_that_does_not_fit_is_refused_before_any_point_is_made(circuit: tuple[object, object, Path],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """generate_key plans the device memory first: too little free memory is a DeviceMemoryError naming
    the need, and no section's scalars were even asked for; sections other than the five are refused."""
    from tests import gpu_emu

    if not gpu_emu.available():
        pytest.skip("no host C++ compiler for the kernel emulator")
    from cuzk_mp.backends.gpu.plan import KeyShape, plan_device
    from cuzk_mp.errors import DeviceMemoryError, InputError
    from tests.gpu_emu.backend import load_backend

    data = _open(circuit)
    emu = load_backend()
    c = data.counts
    need = plan_device(KeyShape(c.domain_size, c.n_vars, c.n_public), 10**15, workers=1).total
    monkeypatch.setattr(emu.memory.cupy.cuda.runtime, "memGetInfo", lambda: (need - 1, 2 * need))
    backend = emu.GpuBackend(0)
    asked: list[str] = []

    def scalars(name: str) -> object:
        return lambda: asked.append(name) or np.zeros((1, 4), np.uint64)

    cpu = CpuBackend(threads=1)  # the key's head (and its sizes), made on the CPU
    try:
        head = setup_resident(data, cpu, TOXIC).head
    finally:
        cpu.close()
    try:
        with pytest.raises(DeviceMemoryError, match="device memory"):
            backend.generate_key(head, [(n, "g2" if n == "b2" else "g1", scalars(n)) for n in POINTS])
        assert asked == []
        with pytest.raises(InputError, match="expected each of"):
            backend.generate_key(head, [("a", "g1", scalars("a"))])
        # room for the key and one partition, but not for the device witness map's rows beside them
        monkeypatch.setattr(emu.memory.cupy.cuda.runtime, "memGetInfo", lambda: (need, 2 * need))
        with pytest.raises(DeviceMemoryError, match="witness map"):
            backend.generate_key(head, [(n, "g2" if n == "b2" else "g1", scalars(n)) for n in POINTS],
                                 witness_rows=data)
        assert asked == []
    finally:
        backend.close()


def test_zero_scalars_stay_at_infinity_without_a_kernel_lane(monkeypatch: pytest.MonkeyPatch) -> None:
    """generate_key's fixed-base pass runs the nonzero scalars alone (a B section's zero rows are most
    of a PoRep-like key's); the zero rows come out as the point at infinity (all-zero words) and the
    others equal the same scalars run whole, in G1 and G2, across chunk boundaries."""
    from tests import gpu_emu

    if not gpu_emu.available():
        pytest.skip("no host C++ compiler for the kernel emulator")
    from tests.gpu_emu.backend import load_backend

    emu = load_backend()
    monkeypatch.setattr(emu.key_generate, "GEN_CHUNK_ROWS", 16)
    seen: list[int] = []
    real = emu.fixed_base.FixedBase.run_device

    def counting(self: object, d_scalars: np.ndarray, d_out: object = None) -> object:
        seen.append(int(d_scalars.shape[0]))
        return real(self, d_scalars, d_out)

    rng = np.random.default_rng(7)
    n = 40  # chunks of 16, 16, 8: one all zero, one mixed, one dense
    scalars = fr.from_ints([int(x) for x in rng.integers(1, 1 << 62, n)], mont=False)
    scalars[:16] = 0
    scalars[[17, 20, 21, 30]] = 0
    nonzero = scalars.any(axis=1)
    for group, name in (("g1", "b1"), ("g2", "b2")):
        whole = real(emu.fixed_base.FixedBase(emu.G2Point() if group == "g2" else emu.G1Point()), scalars)
        seen.clear()
        monkeypatch.setattr(emu.fixed_base.FixedBase, "run_device", counting)
        got = np.asarray(emu.key_generate._fixed_base_rows(emu.cupy.cuda.get_current_stream(), name, group, scalars, n))
        monkeypatch.setattr(emu.fixed_base.FixedBase, "run_device", real)
        assert seen == [12, 8], (group, seen)  # chunk 0 skipped, chunk 1 its 12 nonzero rows, chunk 2 whole
        assert not got[~nonzero].any(), group
        assert np.array_equal(got[nonzero], np.asarray(whole)[nonzero]), group
        assert np.asarray(whole)[nonzero].any(axis=1).all(), group


def test_emulated_gpu_makes_sparse_b_sections_packed(circuit: tuple[object, object, Path],
                                                     want: dict[str, np.ndarray],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Above DENSE_KEY_ROWS the generated key's sparse B sections come packed from the fixed-base
    pass itself (their rows with a nonzero scalar, no whole section gathered from): B1 and B2 share
    the support of the file setup's points and hold exactly those points in order; no section's
    support is read back from its points; a dense B side (the dense-random circuit) stays whole."""
    from tests import gpu_emu

    if not gpu_emu.available():
        pytest.skip("no host C++ compiler for the kernel emulator")
    from tests.gpu_emu.backend import load_backend

    emu = load_backend()
    for part in (emu.key_load, emu.key_generate, emu.staging):  # every module of the backend that reads it
        monkeypatch.setattr(part, "DENSE_KEY_ROWS", 0)
    monkeypatch.setenv("CUZK_GPU_MSM_MULTIPLES", "none")
    reads: list[int] = []
    real = emu.key_load.msm_plan.support_rows
    monkeypatch.setattr(emu.key_load.msm_plan, "support_rows", lambda d: reads.append(int(d.shape[0])) or real(d))
    rows = np.flatnonzero(want["b1"].any(axis=1))
    sparse = rows.size <= emu.key_load.SUPPORT_MAX_FRACTION * want["b1"].shape[0]
    backend = emu.GpuBackend(0)
    try:
        made = setup_resident(_open(circuit), backend, TOXIC)
        key = made.handle
        for name in ("a", "c", "h"):
            assert np.array_equal(np.asarray(key.msms[name].d_points), want[name]), name
        if sparse:
            assert key.supports == {"b2": "b2", "b1": "b2"}, key.supports
            assert np.array_equal(np.asarray(key.support_rows["b2"]), rows)
            assert key.plan.shape.packed == (("b2", rows.size), ("b1", rows.size))
        else:
            assert key.supports == {}
            rows = np.arange(want["b1"].shape[0])
        for name in ("b1", "b2"):
            assert np.array_equal(np.asarray(key.msms[name].d_points), want[name][rows]), name
        assert reads == []  # every support section's rows came from its scalars
        key.close()
    finally:
        backend.close()


def test_a_section_made_packed_off_the_support_is_made_whole_again() -> None:
    """_pack with sections made packed whose rows differ: the first is the support, the other goes
    back to its whole rows, the point at infinity (zeros) on the rows it did not keep."""
    from tests import gpu_emu

    if not gpu_emu.available():
        pytest.skip("no host C++ compiler for the kernel emulator")
    from tests.gpu_emu.backend import load_backend

    emu = load_backend()
    n = 10
    rows2, rows1 = np.array([1, 4, 7], np.int32), np.array([0, 4], np.int32)
    dev = {"b2": np.arange(3 * 24, dtype=np.uint64).reshape(3, 24) + 1,
           "b1": np.arange(2 * 12, dtype=np.uint64).reshape(2, 12) + 1}
    b1 = dev["b1"].copy()
    supports, kept = emu.GpuBackend._pack(dev, 1 << 20, "t", {"b2": n, "b1": n}, {"b2": rows2, "b1": rows1})
    assert supports == {"b2": "b2"} and np.array_equal(kept["b2"], rows2)
    assert dev["b2"].shape == (3, 24) and dev["b1"].shape == (n, 12)
    assert np.array_equal(dev["b1"][rows1], b1) and not np.delete(dev["b1"], rows1, axis=0).any()
