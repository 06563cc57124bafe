"""The circuit-data cache and the evaluator over it (cuzk_mp.groth16.circuit_data, .circuit_data_file, .synthesis).

Oracles: the replaced 32-byte CSR path (``coef_matrices`` + ``fr.csr_matvec`` + ``fr.mul``) for
a, b, c; the r1cs checked row by row for the failing constraint; pairing verification of a
whole proof. The cache: built once by concurrent openers (counted from their logs), rebuilt
when the key changes, moved aside and rebuilt when it is truncated, damaged or made by hand
(a FormatError naming the file and the defect, never a wrong result or a read outside an
array), mapped read-only, and placed in the fallback directory when the key's own place cannot
take it.
"""

from __future__ import annotations

import dataclasses
import logging
import mmap
import multiprocessing as mp
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from cuzk_mp.algebra import fr
from cuzk_mp.backends.cpu import CpuBackend
from cuzk_mp.circuits.synthetic import PorepLike
from cuzk_mp.errors import InputError, UnsatisfiedWitness
from cuzk_mp.formats.r1cs import read_r1cs, write_r1cs
from cuzk_mp.formats.wtns import read_wtns
from cuzk_mp.formats.zkey import coef_matrices, read_zkey
from cuzk_mp.groth16.circuit_data import cache_candidates
from cuzk_mp.groth16.keys import vk_from_zkey
from cuzk_mp.groth16.prover import prove
from cuzk_mp.groth16.synthesis import ConstraintEvaluator
from cuzk_mp.groth16.synthesis_key import write_synthesis_only_zkey
from cuzk_mp.groth16.verifier import verify
from tests.helpers import on_small_tmpfs, rewrite_cache

DATA = Path(__file__).parent / "data_formats"
LOG_N = 12


@pytest.fixture(scope="module")
def circuit() -> PorepLike:
    return PorepLike(LOG_N)


@pytest.fixture
def files(tmp_path: Path, circuit: PorepLike) -> tuple[Path, Path]:
    """A synthesis-only key and the r1cs of the porep-like circuit, in a fresh directory."""
    zkey, r1cs = tmp_path / "keys" / "p.zkey", tmp_path / "keys" / "p.r1cs"
    zkey.parent.mkdir()
    write_r1cs(r1cs, circuit.r1cs())
    write_synthesis_only_zkey(circuit.r1cs(), zkey)
    return zkey, r1cs


def reference(zkey_path: Path, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    with read_zkey(zkey_path) as z:
        a, b = coef_matrices(z)
        ra, rb = a.with_rows(z.domain_size).matvec(w), b.with_rows(z.domain_size).matvec(w)
    return ra, rb, fr.mul(ra, rb)


def test_results_equal_the_csr_path_and_into_shm(files: tuple[Path, Path], circuit: PorepLike) -> None:
    zkey, r1cs = files
    ev = ConstraintEvaluator.from_files(str(zkey), str(r1cs))
    assert (ev.n_vars, ev.n_public, ev.domain_size, ev.n_constraints) == (
        circuit.n_wires, circuit.n_public, 1 << LOG_N, circuit.n_constraints)
    assert ev.slot_bytes == (3 * ev.domain_size + ev.n_vars) * 32
    w = circuit.witness(3, 9)
    ra, rb, rc = reference(zkey, w)
    got = ev.evaluate(w)
    assert np.array_equal(got.a, ra) and np.array_equal(got.b, rb) and np.array_equal(got.c, rc)
    # into one shared-memory segment, as a ring slot: w, a, b, c; garbage first
    with mmap.mmap(-1, ev.slot_bytes) as mm:
        buf = np.frombuffer(mm, dtype=np.uint64)
        buf[:] = 0xDEAD
        sw = buf[: 4 * ev.n_vars].reshape(-1, 4)
        a, b, c = buf[4 * ev.n_vars :].reshape(3, ev.domain_size, 4)
        circuit.witness_into(3, 9, sw, threads=2)
        for threads in (1, 2):
            ev.evaluate_into(sw, a, b, c, threads=threads)
            assert np.array_equal(a, ra) and np.array_equal(b, rb) and np.array_equal(c, rc)
        del sw, a, b, c, buf
    ev.close()


def test_data_is_a_read_only_mapping(files: tuple[Path, Path]) -> None:
    ev = ConstraintEvaluator.from_files(str(files[0]), str(files[1]))
    d = ev.data
    assert d.path == str(cache_candidates(files[0], True)[0])
    for arr in (d.a.cols, d.a.codes, d.b.indptr, d.c.cols, d.table_mont):  # type: ignore[union-attr]
        assert not arr.flags.writeable
        with pytest.raises(ValueError):
            arr[0] = 0
    assert d.nbytes < 0.25 * (36 * (d.a.nnz + d.b.nnz + d.c.nnz))  # type: ignore[union-attr]  (32-byte CSR form)


def _open_in_child(zkey: str, r1cs: str, q: mp.Queue) -> None:  # type: ignore[type-arg]
    builds = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("built "):
                builds.append(record.getMessage())

    logger = logging.getLogger("cuzk_mp.groth16.circuit_data")
    logger.addHandler(Catch())
    logger.setLevel(logging.INFO)
    ev = ConstraintEvaluator.from_files(zkey, r1cs)
    q.put((len(builds), os.stat(ev.data.path).st_ino, int(ev.data.counts.a_nnz)))  # type: ignore[arg-type]


def test_concurrent_openers_build_once(files: tuple[Path, Path]) -> None:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_open_in_child, args=(str(files[0]), str(files[1]), q)) for _ in range(3)]
    for p in procs:
        p.start()
    got = [q.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert sum(g[0] for g in got) == 1, got
    assert len({g[1:] for g in got}) == 1


def test_rebuilt_when_the_key_changes(files: tuple[Path, Path], circuit: PorepLike,
                                      caplog: pytest.LogCaptureFixture) -> None:
    zkey, r1cs = files
    ev = ConstraintEvaluator.from_files(str(zkey), str(r1cs))
    first = os.stat(ev.data.path).st_ino  # type: ignore[arg-type]
    caplog.clear()  # the first build's records (a level set elsewhere may have let them through)
    with caplog.at_level(logging.INFO, logger="cuzk_mp.groth16.circuit_data"):
        ConstraintEvaluator.from_files(str(zkey), str(r1cs))
        assert not [r for r in caplog.records if r.getMessage().startswith("built ")]  # reused
        st = os.stat(zkey)
        os.utime(zkey, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        again = ConstraintEvaluator.from_files(str(zkey), str(r1cs))
        assert "made from another key" in caplog.text
    assert os.stat(again.data.path).st_ino != first  # type: ignore[arg-type]
    # the old mapping stays valid for whoever holds it
    w = circuit.witness(1, 2)
    assert np.array_equal(ev.evaluate(w).c, again.evaluate(w).c)


@pytest.mark.parametrize("version", [2, 4])
def test_a_cache_of_another_format_version_is_replaced_not_moved_aside(
        files: tuple[Path, Path], circuit: PorepLike, version: int, caplog: pytest.LogCaptureFixture) -> None:
    """An upgrade (or a rollback) of cuzk-mp across a change of the file's format finds caches of the
    other version beside every key: sound files of another release, not damage. Each is made again in
    place, with a line naming both versions, not kept as ``<cache>.damaged`` (the size of the cache
    again, left on disk for good, and a warning that calls it damaged). The header as every version
    writes it begins with the magic and the version (little-endian u32 at byte 8)."""
    import struct

    from cuzk_mp.groth16.circuit_data_file import VERSION
    zkey, r1cs = files
    path = Path(ConstraintEvaluator.from_files(str(zkey), str(r1cs)).data.path)  # type: ignore[arg-type]
    raw = bytearray(path.read_bytes())
    struct.pack_into("<I", raw, 8, version)
    path.write_bytes(bytes(raw))
    with caplog.at_level(logging.INFO, logger="cuzk_mp.groth16.circuit_data"):
        ev = ConstraintEvaluator.from_files(str(zkey), str(r1cs))
    assert f"format version {version}, this release reads {VERSION}" in caplog.text, caplog.text
    assert "damaged" not in caplog.text and not path.with_name(path.name + ".damaged").exists()
    w = circuit.witness(5, 5)
    assert np.array_equal(ev.evaluate(w).c, reference(zkey, w)[2])


@pytest.mark.parametrize("damage", ["truncate", "flip-body", "flip-header", "empty"])
def test_damaged_cache_is_detected_and_rebuilt(files: tuple[Path, Path], circuit: PorepLike, damage: str,
                                              caplog: pytest.LogCaptureFixture) -> None:
    zkey, r1cs = files
    path = Path(ConstraintEvaluator.from_files(str(zkey), str(r1cs)).data.path)  # type: ignore[arg-type]
    raw = bytearray(path.read_bytes())
    if damage == "truncate":
        raw = raw[: len(raw) - 64]
    elif damage == "flip-body":
        raw[len(raw) // 2] ^= 0x10  # inside the coded rows
    elif damage == "flip-header":
        raw[100] ^= 1
    else:
        raw = bytearray()
    path.write_bytes(bytes(raw))
    stale = path.with_name(f".{path.name}.dead1234.tmp")  # what a builder killed mid-build leaves
    stale.write_bytes(b"half a cache")
    with caplog.at_level(logging.WARNING, logger="cuzk_mp.groth16.circuit_data"):
        ev = ConstraintEvaluator.from_files(str(zkey), str(r1cs))
    assert "moved to p.zkey.synth-abc.damaged and made again" in caplog.text
    assert path.with_name(path.name + ".damaged").read_bytes() == bytes(raw)
    assert not stale.exists()
    w = circuit.witness(5, 5)
    assert np.array_equal(ev.evaluate(w).c, reference(zkey, w)[2])


def test_fallback_directory_when_the_key_place_is_unusable(files: tuple[Path, Path], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch, circuit: PorepLike) -> None:
    zkey, r1cs = files
    beside = cache_candidates(zkey, True)[0]
    beside.mkdir()  # something in the way that is not a cache file (as root, a read-only directory is not enough)
    monkeypatch.setenv("CUZK_MP_CACHE", str(tmp_path / "fallback"))
    ev = ConstraintEvaluator.from_files(str(zkey), str(r1cs))
    assert Path(ev.data.path).parent == tmp_path / "fallback" / "circuit-data"  # type: ignore[arg-type]
    assert Path(ev.data.path) == cache_candidates(zkey, True)[1]  # type: ignore[arg-type]
    w = circuit.witness(2, 2)
    assert np.array_equal(ev.evaluate(w).a, reference(zkey, w)[0])
    # an explicit directory is used alone
    ev2 = ConstraintEvaluator.from_files(str(zkey), None, cache_dir=str(tmp_path / "mine"))
    assert Path(ev2.data.path).parent == tmp_path / "mine" and ev2.n_constraints is None  # type: ignore[arg-type]


def test_a_full_disk_at_the_key_place_falls_back(files: tuple[Path, Path], tmp_path: Path) -> None:
    """The key on a file system with room for it but not for its cache: the cache goes to the
    fallback directory, and the process is not killed (SIGBUS) writing pages the disk cannot back.
    Runs in a private mount namespace (a 16 KiB-spare tmpfs there); skipped, saying so, where
    none can be made."""
    zkey = files[0]
    small, fallback = tmp_path / "small", tmp_path / "fallback"
    small.mkdir()
    size = (zkey.stat().st_size + 4095) // 4096 * 4096 + 16384
    code = ("import sys; from cuzk_mp.groth16.synthesis import ConstraintEvaluator; "
            "ev = ConstraintEvaluator.from_files(sys.argv[1], None); print(ev.data.path)")
    res = on_small_tmpfs(small, size, f'cp {zkey} {small}/p.zkey; exec {sys.executable} -c "{code}" {small}/p.zkey',
                         env={**os.environ, "CUZK_MP_CACHE": str(fallback)})
    assert res.returncode == 0, res.stderr[-2000:]
    assert Path(res.stdout.strip().splitlines()[-1]).parent == fallback / "circuit-data"
    assert "No space left on device" in res.stderr  # the warning that says why the key's place was passed over


@pytest.mark.parametrize("matrix", ["a", "b"])
def test_an_r1cs_of_another_circuit_with_the_same_counts_is_refused(tmp_path: Path, matrix: str) -> None:
    """mul.r1cs with one A (or B) coefficient doubled: same wires, publics and entry counts, another
    circuit. Its C rows must not be checked against the key's A, B: refused, from the files (the
    cache's build) and in memory; the key's own r1cs passes."""
    r1cs = read_r1cs(DATA / "mul.r1cs")
    m = getattr(r1cs, matrix)
    data = m.data.copy()
    data[0] = fr.from_ints([2 * fr.to_ints(data[:1], mont=False)[0]], mont=False)[0]
    other = dataclasses.replace(r1cs, **{matrix: dataclasses.replace(m, data=data)}, path=None)
    path = tmp_path / "mul2.r1cs"
    write_r1cs(path, other)
    zkey = tmp_path / "mul.zkey"
    shutil.copy(DATA / "mul.zkey", zkey)
    name = matrix.upper()
    refused = rf"mul2\.r1cs does not match .*mul\.zkey: constraint \d+: the r1cs's {name} row"
    with pytest.raises(InputError, match=refused):
        ConstraintEvaluator.from_files(str(zkey), str(path))
    assert not list(tmp_path.glob(".*.tmp"))  # the half-built cache is gone
    with read_zkey(zkey) as z, pytest.raises(InputError, match=f"the r1cs's {name} row is not the key's"):
        ConstraintEvaluator.from_zkey(z, other)
    ev = ConstraintEvaluator.from_files(str(zkey), str(DATA / "mul.r1cs"))
    assert ev.n_constraints == r1cs.n_constraints


def test_unsatisfied_witness_names_the_first_failing_constraint(files: tuple[Path, Path], circuit: PorepLike) -> None:
    zkey, r1cs = files
    checked = ConstraintEvaluator.from_files(str(zkey), str(r1cs))
    unchecked = ConstraintEvaluator.from_files(str(zkey), None)
    w = circuit.witness(4, 4)
    bad = w.copy()
    bad[circuit.lane_base + 200, 0] ^= 1  # a bit of lane 0: boolean still, but the gadgets reading it fail
    rc = read_r1cs(r1cs)
    wm = fr.to_mont(bad)
    lhs = fr.mul(*(fr.csr_matvec(m.indptr, m.indices, fr.to_mont(m.data), wm) for m in (rc.a, rc.b)))
    rhs = fr.csr_matvec(rc.c.indptr, rc.c.indices, fr.to_mont(rc.c.data), wm)
    failing = np.flatnonzero((lhs != rhs).any(axis=1))
    assert failing.size > 0
    with pytest.raises(UnsatisfiedWitness, match=rf"does not satisfy constraint {failing[0]} of {rc.n_constraints} "
                                                  rf"\({failing.size} constraint\(s\) fail in all\)") as info:
        checked.evaluate(bad)
    assert info.value.constraint == failing[0]
    assert np.array_equal(unchecked.evaluate(bad).a, reference(zkey, bad)[0])  # no r1cs: no check


def test_bad_inputs(files: tuple[Path, Path], circuit: PorepLike, tmp_path: Path) -> None:
    zkey, r1cs = files
    ev = ConstraintEvaluator.from_files(str(zkey), str(r1cs))
    w = circuit.witness(0, 0)
    a, b, c = (np.zeros((ev.domain_size, 4), np.uint64) for _ in range(3))
    with pytest.raises(InputError, match=r"b must be a \(4096, 4\) uint64"):
        ev.evaluate_into(w, a, b[:-1], c, threads=1)
    with pytest.raises(InputError, match="wires"):
        ev.evaluate_into(w[:-1], a, b, c, threads=1)
    w2 = w.copy()
    w2[7] = np.uint64(2**64 - 1)
    with pytest.raises(InputError, match="value 7 is not a field element"):
        ev.evaluate_into(w2, a, b, c, threads=1)
    other = tmp_path / "other.r1cs"
    write_r1cs(other, PorepLike(LOG_N, 3).r1cs())
    with pytest.raises(InputError, match="does not match"):
        ConstraintEvaluator.from_files(str(zkey), str(other))
    with pytest.raises(InputError, match="cannot read"):
        ConstraintEvaluator.from_files(str(tmp_path / "missing.zkey"), None)


def test_whole_proof_with_the_file_evaluator_verifies(tmp_path: Path) -> None:
    """snarkjs's own key and witness (tests/data_formats): our proof through the cached evaluator verifies."""
    for name in ("mul.zkey", "mul.r1cs"):
        shutil.copy(DATA / name, tmp_path / name)
    zkey = read_zkey(tmp_path / "mul.zkey")
    ev = ConstraintEvaluator.from_files(str(tmp_path / "mul.zkey"), str(tmp_path / "mul.r1cs"))
    w = read_wtns(DATA / "mul.wtns")
    proof, public = prove(CpuBackend(), zkey, w, evaluator=ev)
    assert verify(vk_from_zkey(zkey), public, proof)
    assert not verify(vk_from_zkey(zkey), [public[0] + 1] + public[1:], proof)


@pytest.mark.parametrize("where", ["body_hash", "_pack_header"])
def test_an_interrupt_while_the_cache_is_finished_stays_an_interrupt(files: tuple[Path, Path], where: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C (or SIGTERM, which the CLI raises the same way) while the built cache is hashed or its header
    written: the interrupt comes out (exit 130/143), not a BufferError from closing a mapping that views
    still held (exit 70), and no temporary file is left."""
    from cuzk_mp.groth16 import circuit_data

    zkey, r1cs = files

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(circuit_data, where, interrupted)  # where the cache is written looks it up
    with pytest.raises(KeyboardInterrupt):
        ConstraintEvaluator.from_files(str(zkey), str(r1cs))
    assert not [p for p in zkey.parent.iterdir() if p.name.endswith(".tmp")]
    monkeypatch.undo()
    assert ConstraintEvaluator.from_files(str(zkey), str(r1cs)).data is not None  # the next run builds it


def test_an_error_raised_while_handling_another_is_what_the_build_reports(files: tuple[Path, Path],
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A build step that fails while handling another error (the first one's frames, held by the
    second's context, keep views of the mapping): the caller gets that error, not a BufferError from
    closing the mapping under them, and no temporary file is left."""
    from cuzk_mp.groth16 import circuit_data

    zkey, r1cs = files

    def failing(body: np.ndarray) -> int:
        view = body[:8]  # noqa: F841 - held by the first error's frame
        try:
            raise KeyError("the first")
        except KeyError:
            raise ValueError("the build step's own error") from None

    monkeypatch.setattr(circuit_data, "body_hash", failing)
    with pytest.raises(ValueError, match="the build step's own error"):
        ConstraintEvaluator.from_files(str(zkey), str(r1cs))
    assert not [p for p in zkey.parent.iterdir() if p.name.endswith(".tmp")]


def test_views_left_in_garbage_cycles_do_not_fail_the_build(files: tuple[Path, Path],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A build step that leaves a view of the mapping in a reference cycle (what numba's first
    compile of a kernel for new argument types leaves: frames holding its arguments, freed at the
    next garbage collection) does not fail the build with a BufferError from closing the mapping:
    the cache is written whole and opens (its body hash checked), however late the collector runs."""
    import gc

    from cuzk_mp.groth16 import circuit_data

    zkey, r1cs = files
    real = circuit_data.body_hash

    def leaving_a_cycle(body: np.ndarray) -> int:
        cycle: list[object] = [body[:8]]
        cycle.append(cycle)
        return real(body)

    monkeypatch.setattr(circuit_data, "body_hash", leaving_a_cycle)
    gc.disable()
    try:
        data = ConstraintEvaluator.from_files(str(zkey), str(r1cs)).data
    finally:
        gc.enable()
    assert data is not None and data.path is not None
    assert not [p for p in zkey.parent.iterdir() if p.name.endswith(".tmp")]
    built = os.stat(data.path).st_mtime_ns
    monkeypatch.setattr(circuit_data, "body_hash", real)
    again = ConstraintEvaluator.from_files(str(zkey), str(r1cs)).data  # its body hash checked as it opens
    assert again is not None and again.path == data.path and os.stat(again.path).st_mtime_ns == built


HAND_MADE = {
    # what a kernel would index out of bounds with, each with a valid checksum and body hash
    "column past the wires": ({}, ("a_col", 3, 1 << 30),
                              r"A columns: entry 3 is 1073741824, not below \d+ \(the wires\)"),
    "code past the table": ({}, ("b_code", 0, 60000), r"B codes: entry 0 is 60000, not below \d+"),
    "row pointer past the entries": ({}, ("a_ptr", -1, 1 << 31), r"A row pointers: they run from 0 to 2147483648"),
    "row pointers going down": ({}, ("c_ptr", 100, 0), r"C row pointers: row 99 ends at 0, before it starts \(\d+\)"),
    "table value not a field element": ({}, ("table_r2", 11, 2**64 - 1), r"table \(v R\^2\): value 2 is not a field"),
    # counts whose layout would overflow 64 bits, or that do not fit the kernels
    "huge counts": ({"a_nnz": 2**62}, None, r"A has 4611686018427387904 entries"),
    "huge table": ({"n_codes": 2**62, "code_bytes": 4}, None, r"4611686018427387904 distinct coefficients"),
    "rows past the domain": ({"b_rows": 1 << 40}, None, r"B has 1099511627776 rows, more than the domain"),
    "domain not a power of two": ({"domain_size": 3 << 10}, None, r"domain size 3072 is not a power of two"),
}


@pytest.mark.parametrize("case", sorted(HAND_MADE))
def test_a_hand_made_cache_is_a_format_error_naming_it_and_is_moved_aside(
        files: tuple[Path, Path], circuit: PorepLike, case: str, caplog: pytest.LogCaptureFixture) -> None:
    """A cache file with a valid checksum and body hash whose numbers would make the witness map read
    outside its arrays (or whose layout does not add up) is refused before any kernel sees it, as a
    FormatError naming the file and the defect; opened through the evaluator it is moved aside to
    ``.damaged`` and made again, and the results are right."""
    from cuzk_mp.errors import FormatError
    from cuzk_mp.groth16.circuit_data_file import circuit_shape, open_cache, r1cs_identity, zkey_identity

    zkey, r1cs = files
    path = Path(ConstraintEvaluator.from_files(str(zkey), str(r1cs)).data.path)  # type: ignore[arg-type]
    counts_change, body_change, message = HAND_MADE[case]
    rewrite_cache(path, counts_change, body_change)
    with pytest.raises(FormatError, match=message) as e:
        open_cache(path, zkey_identity(zkey), r1cs_identity(r1cs), circuit_shape(zkey, r1cs))
    assert str(e.value).startswith(f"{path}, section ")
    crafted = path.read_bytes()
    with caplog.at_level(logging.WARNING, logger="cuzk_mp.groth16.circuit_data"):
        ev = ConstraintEvaluator.from_files(str(zkey), str(r1cs))
    damaged = path.with_name(path.name + ".damaged")
    assert damaged.read_bytes() == crafted, "the hand-made file was not moved aside"
    assert f"moved to {damaged.name} and made again" in caplog.text and str(path) in caplog.text
    w = circuit.witness(5, 5)
    assert np.array_equal(ev.evaluate(w).c, reference(zkey, w)[2])


@pytest.mark.parametrize("damage", ["short", "wrong-magic", "extended", "body-hash"])
def test_a_damaged_cache_is_a_format_error_naming_it(files: tuple[Path, Path], damage: str, tmp_path: Path) -> None:
    """Truncated below its header, another file, a size its header does not say, a body that does not
    hash to its header's value: FormatError naming the file (read_counts too), never a ValueError."""
    from cuzk_mp.errors import FormatError
    from cuzk_mp.groth16.circuit_data_file import circuit_shape, open_cache, r1cs_identity, read_counts, zkey_identity

    zkey, r1cs = files
    path = Path(ConstraintEvaluator.from_files(str(zkey), str(r1cs)).data.path)  # type: ignore[arg-type]
    raw = bytearray(path.read_bytes())
    if damage == "short":
        raw = raw[:100]
    elif damage == "wrong-magic":
        raw[:8] = b"NOTSYNTH"
    elif damage == "extended":
        raw += bytes(64)
    else:
        raw[-1] ^= 1
    path.write_bytes(bytes(raw))
    message = {"short": "shorter than the 4096-byte header", "wrong-magic": "wrong magic",
               "extended": "truncated or extended", "body-hash": "body hash mismatch"}[damage]
    with pytest.raises(FormatError, match=message) as e:
        open_cache(path, zkey_identity(zkey), r1cs_identity(r1cs), circuit_shape(zkey, r1cs))
    assert str(e.value).startswith(str(path))
    if damage in ("short", "wrong-magic"):
        with pytest.raises(FormatError, match=message):
            read_counts(path)


@pytest.mark.parametrize("claim", ["more wires", "more public signals", "a larger domain", "one more constraint"])
def test_a_cache_that_copies_the_keys_identity_with_other_counts_is_moved_aside(
        files: tuple[Path, Path], circuit: PorepLike, claim: str, caplog: pytest.LogCaptureFixture) -> None:
    """A hand-made cache with the key's and the r1cs's identity (size, mtime, header digest), a valid
    checksum and body hash and indices within its own counts, but counts that are not the key's: a
    worker would size a partition's segment other than the key's prover expects. It is a FormatError
    naming the file and both values, moved aside and made again; the evaluator's sizes are the key's."""
    from cuzk_mp.groth16.circuit_data_file import read_counts

    zkey, r1cs = files
    path = Path(ConstraintEvaluator.from_files(str(zkey), str(r1cs)).data.path)  # type: ignore[arg-type]
    c = read_counts(path)
    change, body, message = {
        "more wires": ({"n_vars": c.n_vars + 8}, None, f"{c.n_vars + 8} wires, the key has {c.n_vars}"),
        "more public signals": ({"n_public": c.n_public + 1}, None,
                                f"{c.n_public + 1} public signals, the key has {c.n_public}"),
        "a larger domain": ({"domain_size": 2 * c.domain_size}, None,
                            f"a domain of {2 * c.domain_size}, the key has {c.domain_size}"),
        # a row of C more, empty (its row pointer is the entry count): the layout keeps its size
        "one more constraint": ({"n_constraints": c.n_constraints + 1, "c_rows": c.c_rows + 1},
                                ("c_ptr", c.c_rows + 1, c.c_nnz),
                                f"{c.n_constraints + 1} constraints, the r1cs has {c.n_constraints}"),
    }[claim]
    rewrite_cache(path, change, body)
    crafted = path.read_bytes()
    with caplog.at_level(logging.WARNING, logger="cuzk_mp.groth16.circuit_data"):
        ev = ConstraintEvaluator.from_files(str(zkey), str(r1cs))
    assert f"{path}, section header: not the circuit of its key: {message}" in caplog.text
    damaged = path.with_name(path.name + ".damaged")
    assert damaged.read_bytes() == crafted, "the hand-made file was not moved aside"
    assert (ev.n_vars, ev.n_public, ev.domain_size, ev.n_constraints) == (
        circuit.n_wires, circuit.n_public, 1 << LOG_N, circuit.n_constraints)
    w = circuit.witness(5, 5)
    assert np.array_equal(ev.evaluate(w).c, reference(zkey, w)[2])
