"""The development Groth16 setup: every zkey section against its definition, then prove/verify.

Oracles: Python-int Lagrange interpolation (products over the domain, not the
closed form setup.py uses) and arkworks scalar multiplication for the points;
the project's prover and verifier for the end-to-end check (including a wrong
public input that must not verify). The snarkjs interop of dev keys is in
tests/test_interop_snarkjs.py.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from py_arkworks_bls12381 import G1Point, G2Point, Scalar

from cuzk_mp.algebra import curve, fr
from cuzk_mp.algebra.field import FR, R_MOD, fr_root_of_unity
from cuzk_mp.algebra.sparse import from_coo
from cuzk_mp.backends.cpu import CpuBackend
from cuzk_mp.errors import InputError
from cuzk_mp.formats.r1cs import R1CS, write_r1cs
from cuzk_mp.formats.zkey import read_zkey, write_zkey
from cuzk_mp.groth16 import setup as dev
from cuzk_mp.groth16.keys import vk_from_zkey
from cuzk_mp.groth16.prover import prove
from cuzk_mp.groth16.verifier import verify

SEED = 3011
M1 = R_MOD - 1  # the coefficient -1, as circom writes it
# wires: 0 = 1, 1 = out (public output), 2 = x (public input), 3 = y, 4 = t, 5 = unused (private)
CONSTRAINTS = [
    ({2: 1}, {3: 1}, {4: 1}),  # x * y = t
    ({4: 1, 0: 3}, {2: 1}, {1: 1}),  # (t + 3) * x = out
    ({3: M1}, {2: 1}, {4: M1}),  # (-y) * x = -t
    ({1: 1}, {0: 1}, {1: 1}),  # out * 1 = out
]
N_WIRES, N_PUB_OUT, N_PUB_IN = 6, 1, 1


def _witness(x: int, y: int) -> list[int]:
    t = x * y % R_MOD
    return [1, (t + 3) * x % R_MOD, x, y, t, 0]


def _r1cs() -> R1CS:
    mats = []
    for m in range(3):
        entries = [(c, wire, coef) for c, row in enumerate(CONSTRAINTS) for wire, coef in row[m].items()]
        rows, cols, vals = zip(*entries)
        mats.append(from_coo(np.array(rows), np.array(cols), fr.from_ints(list(vals), mont=False),
                             len(CONSTRAINTS), N_WIRES))
    return R1CS(prime=R_MOD, n_wires=N_WIRES, n_pub_out=N_PUB_OUT, n_pub_in=N_PUB_IN, n_prv_in=1,
                n_labels=N_WIRES, n_constraints=len(CONSTRAINTS), a=mats[0], b=mats[1], c=mats[2],
                wire_to_label=None, path=None)


def _toxic() -> dev.ToxicWaste:
    rng = random.Random(SEED)
    print(f"seed={SEED}")
    return dev.ToxicWaste(*(rng.randrange(1, R_MOD) for _ in range(4)))


def _lagrange(tau: int, points: list[int], i: int) -> int:
    """L_i(tau) over ``points`` by the product formula (the oracle)."""
    num = den = 1
    for m, x in enumerate(points):
        if m != i:
            num = num * (tau - x) % R_MOD
            den = den * (points[i] - x) % R_MOD
    return num * pow(den, -1, R_MOD) % R_MOD


def _g1_row(k: int) -> np.ndarray:
    return curve.g1_ark_to_lem(G1Point() * Scalar(k % R_MOD))


def _g2_row(k: int) -> np.ndarray:
    return curve.g2_ark_to_lem(G2Point() * Scalar(k % R_MOD))


def _cat(section: list[np.ndarray] | np.ndarray) -> np.ndarray:
    return np.concatenate(section) if isinstance(section, list) else section


@pytest.fixture(scope="module")
def backend() -> CpuBackend:
    return CpuBackend()


@pytest.fixture(scope="module")
def key(backend: CpuBackend):  # type: ignore[no-untyped-def]
    return dev.setup(_r1cs(), backend, toxic=_toxic())


def test_domain_and_header(key) -> None:  # type: ignore[no-untyped-def]
    s = _toxic()
    assert (key.domain_size, key.n_vars, key.n_public) == (8, N_WIRES, N_PUB_OUT + N_PUB_IN)  # 4 + 2 + 1 rows -> 8
    assert np.array_equal(key.alpha1, _g1_row(s.alpha))
    assert np.array_equal(key.beta1, _g1_row(s.beta))
    assert np.array_equal(key.beta2, _g2_row(s.beta))
    assert np.array_equal(key.gamma2, _g2_row(1))
    assert np.array_equal(key.delta1, _g1_row(s.delta))
    assert np.array_equal(key.delta2, _g2_row(s.delta))


def test_point_sections_match_definitions(key) -> None:  # type: ignore[no-untyped-def]
    s = _toxic()
    n, n_pub, n_c = 8, N_PUB_OUT + N_PUB_IN, len(CONSTRAINTS)
    w = fr_root_of_unity(3)
    lag = [_lagrange(s.tau, [pow(w, i, R_MOD) for i in range(n)], c) for c in range(n)]
    cols = [[0] * N_WIRES for _ in range(3)]
    for c, row in enumerate(CONSTRAINTS):
        for m in range(3):
            for wire, coef in row[m].items():
                cols[m][wire] += coef * lag[c]
    for j in range(n_pub + 1):  # the extra rows: A[n_c + j, j] = 1
        cols[0][j] += lag[n_c + j]
    u, v, ww = ([x % R_MOD for x in col] for col in cols)
    k = [(s.beta * u[j] + s.alpha * v[j] + ww[j]) % R_MOD for j in range(N_WIRES)]
    dinv = pow(s.delta, -1, R_MOD)
    assert np.array_equal(_cat(key.a), np.stack([_g1_row(x) for x in u]))
    assert np.array_equal(_cat(key.b1), np.stack([_g1_row(x) for x in v]))
    assert np.array_equal(_cat(key.b2), np.stack([_g2_row(x) for x in v]))
    assert np.array_equal(_cat(key.ic), np.stack([_g1_row(x) for x in k[: n_pub + 1]]))
    assert np.array_equal(_cat(key.c), np.stack([_g1_row(x * dinv) for x in k[n_pub + 1 :]]))
    assert not _cat(key.c)[-1].any()  # wire 5 is in no constraint: its point is all zeros
    w2 = fr_root_of_unity(4)
    pts2 = [pow(w2, i, R_MOD) for i in range(2 * n)]
    h = [_lagrange(s.tau, pts2, 2 * j + 1) * dinv for j in range(n)]
    assert np.array_equal(_cat(key.h), np.stack([_g1_row(x) for x in h]))


def test_coefficients_in_snarkjs_order(key) -> None:  # type: ignore[no-untyped-def]
    want = []
    for c, (a, b, _) in enumerate(CONSTRAINTS):
        want += [(0, c, wire, coef) for wire, coef in a.items()] + [(1, c, wire, coef) for wire, coef in b.items()]
    want += [(0, len(CONSTRAINTS) + j, j, 1) for j in range(N_PUB_OUT + N_PUB_IN + 1)]
    got = [(int(e["matrix"]), int(e["constraint"]), int(e["signal"]),
            fr.to_ints(e["value"].reshape(1, 4), mont=False)[0])
           for e in key.coefs]
    assert got == [(m, c, wire, coef * FR.r2 % R_MOD) for m, c, wire, coef in want]


def test_prove_and_verify_with_dev_key(key, backend: CpuBackend, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    write_zkey(tmp_path / "k.zkey", key)
    with read_zkey(tmp_path / "k.zkey") as zkey:
        w = fr.from_ints(_witness(5, 7), mont=False)
        proof, public = prove(backend, zkey, w, r1cs=_r1cs())
        vk = vk_from_zkey(zkey)
        assert public == [190, 5]
        assert verify(vk, public, proof)
        assert not verify(vk, [190, 6], proof)
        assert not verify(vk, [191, 5], proof)


def test_random_toxic_waste_differs_and_verifies(backend: CpuBackend, tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    write_r1cs(tmp_path / "c.r1cs", _r1cs())
    seen: list[tuple[str, int, int]] = []
    with caplog.at_level(logging.WARNING, logger="cuzk_mp.groth16.setup"):
        dev.setup_file(tmp_path / "c.r1cs", tmp_path / "c.zkey", backend, progress=lambda *a: seen.append(a))
    assert "INSECURE" in caplog.text
    assert {label for label, _, _ in seen} == {"IC", "C", "A", "B1", "B2", "H"}
    assert ("H", 8, 8) in seen
    with read_zkey(tmp_path / "c.zkey") as zkey:
        assert not np.array_equal(zkey.delta1, _g1_row(_toxic().delta))
        proof, public = prove(backend, zkey, fr.from_ints(_witness(3, 11), mont=False))
        assert verify(vk_from_zkey(zkey), public, proof)


def test_toxic_waste_checks() -> None:
    w16 = fr_root_of_unity(4)
    with pytest.raises(ValueError, match="root of unity"):
        dev.ToxicWaste(tau=pow(w16, 3, R_MOD), alpha=1, beta=1, delta=1).check(3)
    with pytest.raises(ValueError, match="delta is 0"):
        dev.ToxicWaste(tau=2, alpha=1, beta=1, delta=R_MOD).check(3)
    fresh = dev.ToxicWaste.fresh(3)
    fresh.check(3)
    assert fresh != dev.ToxicWaste.fresh(3)


def test_domain_too_big_is_an_input_error() -> None:
    big = _r1cs()
    big.n_constraints = 1 << 31
    with pytest.raises(InputError, match="2\\^32 domain"):
        dev.setup(big, None)


def test_lagrange_values_closed_form() -> None:
    tau = _toxic().tau
    w = fr_root_of_unity(5)
    pts = [pow(w, i, R_MOD) for i in range(32)]
    got = fr.to_ints(dev.lagrange_values(tau, 32, fr.from_ints(pts)))
    assert got == [_lagrange(tau, pts, i) for i in range(32)]


def test_progress_moves_at_2_20_with_rate_and_eta(caplog: pytest.LogCaptureFixture) -> None:
    """The sections of a 2^20 key through ``_fixed_base`` with a clock advanced by each chunk's work
    (G2 rows G2_WEIGHT times slower): progress lines come every interval, their fraction grows to
    100%, the rate is the simulated one and the ETA counts down to zero."""
    n, n_vars, n_pub, rate = 1 << 20, (1 << 20) - 5, 2, 20_000.0  # G1 rows per second
    sections = {"IC": (n_pub + 1, 1), "C": (n_vars - n_pub - 1, 1), "A": (n_vars, 1), "B1": (n_vars, 1),
                "B2": (n_vars, dev.G2_WEIGHT), "H": (n, 1)}
    caplog.set_level(logging.INFO, logger="cuzk_mp.groth16.setup")
    now = [1000.0]
    progress = dev.ProgressLog("test.zkey", sections, clock=lambda: now[0])
    for label, (rows, weight) in sections.items():
        def fake_fixed_base(base: object, scalars: np.ndarray, weight: int = weight) -> np.ndarray:
            now[0] += scalars.shape[0] * weight / rate
            return np.zeros((scalars.shape[0], 12), np.uint64)

        chunks = dev._fixed_base(fake_fixed_base, None, np.zeros((rows, 4), np.uint64), label, progress)
        assert sum(c.shape[0] for c in chunks) == rows
    lines = [r.getMessage() for r in caplog.records if r.name == "cuzk_mp.groth16.setup"]
    assert len(lines) >= 20, lines  # chunks of 2^18 rows: several lines per 2^20 section
    parsed = [re.search(r": (\d+)% .*, (\d+) G1-rows/s, .* elapsed, ETA (\S+)$", line) for line in lines]
    assert all(parsed), lines
    percents = [int(m.group(1)) for m in parsed if m]
    assert percents == sorted(set(percents)) and percents[-1] == 100 and percents[0] < 10
    assert all(abs(int(m.group(2)) - rate) <= 1 for m in parsed if m)
    assert parsed[-1] and parsed[-1].group(3) == "0.0s"
    assert parsed[0] and re.fullmatch(r"\d+m\d\ds", parsed[0].group(3))  # minutes left at the start


def test_setup_file_logs_instead_of_printing(backend: CpuBackend, tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    write_r1cs(tmp_path / "c.r1cs", _r1cs())
    with caplog.at_level(logging.INFO, logger="cuzk_mp.groth16.setup"):
        dev.setup_file(tmp_path / "c.r1cs", tmp_path / "c.zkey", backend)
    out = capsys.readouterr()
    assert "[setup]" not in out.out + out.err
    messages = [r.getMessage() for r in caplog.records]
    assert any("written in" in m for m in messages) and any("100%" in m for m in messages), messages


def test_setup_cli_json_logs(tmp_path: Path) -> None:
    """``CUZK_MP_LOG_FORMAT=json cuzk-mp setup``: every stderr line is a JSON object."""
    write_r1cs(tmp_path / "c.r1cs", _r1cs())
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "CUZK_MP_LOG_FORMAT": "json",
           "PYTHONPATH": str(repo) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "cuzk_mp", "setup", "--backend", "cpu", str(tmp_path / "c.r1cs"),
                           str(tmp_path / "c.zkey")], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in proc.stderr.strip().splitlines()]
    assert [r["level"] for r in records][0] == "warning" and "INSECURE" in records[0]["msg"]
    assert any("100%" in r["msg"] for r in records) and "written in" in records[-1]["msg"]


def test_chunk_rows() -> None:
    """Sections of 2^20 rows and more move at least four times; big ones in the cheapest calls."""
    assert dev.chunk_rows(1000) == dev.MIN_CHUNK_ROWS
    assert dev.chunk_rows(1 << 20) == 1 << 18 and dev.chunk_rows((1 << 20) - 5) == 1 << 18
    assert dev.chunk_rows(1 << 21) == 1 << 19
    assert dev.chunk_rows(1 << 22) == dev.chunk_rows(1 << 27) == dev.CHUNK_ROWS
    for n in (1 << 20, (1 << 20) + 7, 3 << 20, 1 << 24):
        assert -(-n // dev.chunk_rows(n)) >= 4


def test_a_wire_count_beyond_the_machine_is_refused_before_any_work(tmp_path: Path) -> None:
    """An r1cs without its (optional) label map has nothing but its header to bound its wire count: 2^32 - 1
    wires in a 0.5 KB file would be a 512 GiB setup and a 2 TB key. Refused naming the file and the sizes
    (ResourceError, exit 4), no key file made; a count the machine holds is set up as usual."""
    import struct

    from cuzk_mp.errors import ResourceError

    data = (Path(__file__).parent / "data_formats" / "mul.r1cs").read_bytes()
    sections, pos = [], 12
    for _ in range(struct.unpack_from("<I", data, 8)[0]):
        sid, size = struct.unpack_from("<IQ", data, pos)
        sections.append((sid, bytearray(data[pos + 12: pos + 12 + size])))
        pos += 12 + size
    kept = [(sid, body) for sid, body in sections if sid != 3]
    for sid, body in kept:
        if sid == 1:
            struct.pack_into("<I", body, 36, 0xFFFFFFFF)
    huge = tmp_path / "huge.r1cs"
    huge.write_bytes(struct.pack("<4sII", b"r1cs", 1, len(kept))
                     + b"".join(struct.pack("<IQ", sid, len(body)) + bytes(body) for sid, body in kept))
    with pytest.raises(ResourceError, match=r"huge\.r1cs: 4294967295 wires need ~512\.00 GiB of memory in the setup"):
        dev.setup_file(huge, tmp_path / "huge.zkey", CpuBackend())
    assert not (tmp_path / "huge.zkey").exists()
    dev.setup_file(Path(__file__).parent / "data_formats" / "mul.r1cs", tmp_path / "mul.zkey", CpuBackend())
    assert read_zkey(tmp_path / "mul.zkey").n_vars == 7  # the circuit's own wire count


def test_a_key_bigger_than_the_free_disk_is_refused_naming_both_sizes(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A small key on a nearly full disk is refused with sizes a reader can compare (KiB here, not
    "~0.0 GiB; 0.0 GiB are free"), exit 4, and no key file is left."""
    import shutil

    from cuzk_mp.errors import ResourceError

    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=2048))
    with pytest.raises(ResourceError, match=r"mul\.zkey: the key of 7 wires takes ~\d+ KiB; 2 KiB are free on its "
                                            r"file system$"):
        dev.setup_file(Path(__file__).parent / "data_formats" / "mul.r1cs", tmp_path / "mul.zkey", CpuBackend())
    assert not (tmp_path / "mul.zkey").exists()


@pytest.mark.parametrize("where", ["missing/k.zkey", "a-folder", "a-file/k.zkey"])
def test_a_key_path_that_cannot_be_written_is_refused_before_any_work(where: str, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The key's place is taken first: a path that cannot be written (a missing folder, a folder in
    the way, a file where a folder should be) is refused naming it before the r1cs is read or any
    key material made (at 2^27 those took minutes, then the write failed), and nothing is left."""
    from cuzk_mp.errors import OutputError

    (tmp_path / "a-folder").mkdir()
    (tmp_path / "a-file").write_text("")
    read: list[object] = []
    monkeypatch.setattr(dev, "read_r1cs", lambda path: read.append(path))
    with pytest.raises(OutputError, match=f"{re.escape(str(tmp_path / where))}: cannot write it"):
        dev.setup_file(Path(__file__).parent / "data_formats" / "mul.r1cs", tmp_path / where, CpuBackend())
    assert read == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "a-folder"] and not list(
        (tmp_path / "a-folder").iterdir())
