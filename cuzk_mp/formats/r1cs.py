"""circom ``.r1cs`` files (version 1): the constraint system as three CSR matrices.

Layout (snarkjs-formats.md section 5.3; r1csfile ``readR1cs``):

* section 1 header: n8 u32 (= 32), prime (n8 bytes LE), nWires u32, nPubOut u32,
  nPubIn u32, nPrvIn u32, nLabels u64, nConstraints u32 (64 bytes);
* section 2 constraints: nConstraints x {A, B, C}, each linear combination
  nTerms u32 then nTerms x {wireId u32, coef n8 bytes LE, standard form};
* section 3 wire -> label map: nWires x u64.

Section 2 has variable-length records, so it is parsed by two numba kernels:
a sequential scan that finds each constraint's offset and term counts (pointer
hopping, three reads per constraint), then a parallel fill of the CSR arrays
that also validates wire ids, coefficients (< r) and duplicates, one matrix at a
time (:class:`R1csLayout` lets a reader decode one matrix, a range of rows at a time). The writer
encodes rows the same way, a bounded chunk at a time.

Decisions: custom-gate sections 4/5 (PLONK only) are rejected; a wire that
appears twice in one linear combination is rejected (r1csfile would keep the
last coefficient, a sum would be the other reading; circom never writes one);
terms keep their file order. ``wire_to_label`` is None when section 3 is
absent, and the writer then writes the identity map.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Self

import numpy as np

from ..algebra.field import FR, R_MOD
from ..algebra.sparse import CsrMatrix
from .binfile import BinFile, FieldReader, open_source, write_binfile

MAGIC = "r1cs"
VERSION = 1
N8 = 32
HEADER_BYTES = 4 + N8 + 4 * 4 + 8 + 4
MIN_CONSTRAINT_BYTES = 3 * 4  # A, B and C each at least their u32 term count
SECTION_LABELS = {1: "header", 2: "constraints", 3: "wire-to-label map", 4: "custom gates list", 5: "custom gates uses"}
_ENCODE_CHUNK_BYTES = 32 << 20


@dataclass
class R1CS:
    """A rank-1 constraint system over BLS12-381's Fr, circom's wire order.

    Constraint i is ``<a_i, w> * <b_i, w> = <c_i, w>``. ``a``, ``b``, ``c`` have
    one row per constraint and ``n_wires`` columns; coefficients are in
    STANDARD form. Wire 0 is the constant 1, then public outputs, public
    inputs, private inputs, internal wires.
    """

    prime: int
    n_wires: int
    n_pub_out: int
    n_pub_in: int
    n_prv_in: int
    n_labels: int
    n_constraints: int
    a: CsrMatrix
    b: CsrMatrix
    c: CsrMatrix
    wire_to_label: np.ndarray | None
    path: str | None

    @property
    def n_public(self) -> int:
        """snarkjs's nPublic: public outputs plus public inputs."""
        return self.n_pub_out + self.n_pub_in


def read_r1cs(path_or_bytes: str | os.PathLike[str] | bytes | bytearray | memoryview, *,
              name: str | None = None) -> R1CS:
    """Parse an .r1cs file (a path or its bytes); FormatError names file, section and field."""
    with open_source(path_or_bytes, name, MAGIC, (VERSION,), SECTION_LABELS) as bf:
        layout = _layout(bf)
        n = layout.head["n_constraints"]
        a, b, c = (layout.decode(m, 0, n) for m in range(3))
        labels = None
        if bf.has(3):
            labels = bf.section_array(3, "<u8", layout.head["n_wires"]).astype(np.uint64)
        path = None if isinstance(path_or_bytes, (bytes, bytearray, memoryview)) else os.fspath(path_or_bytes)
        return R1CS(prime=R_MOD, a=a, b=b, c=c, wire_to_label=labels, path=path, **layout.head)


@dataclass
class R1csLayout:
    """An .r1cs file mapped and framed but not decoded: its header, and where each constraint starts.

    For readers that need one matrix, or a bounded range of rows at a time (the C rows of a
    2^27 circuit decoded at once would take 7 GB): :meth:`decode` validates what it decodes
    exactly as :func:`read_r1cs` does.
    """

    bf: BinFile
    head: dict[str, int]
    raw: np.ndarray  # section 2, uint8 view over the mapping
    offsets: np.ndarray  # (n_constraints,) int64 byte offset of each constraint
    counts: np.ndarray  # (3, n_constraints) uint32 terms of its A, B, C

    def decode(self, m: int, lo: int, hi: int) -> CsrMatrix:
        """Matrix ``m`` (0 A, 1 B, 2 C) of constraints lo .. hi-1 as CSR (standard-form coefficients)."""
        indptr = np.zeros(hi - lo + 1, dtype=np.int64)
        np.cumsum(self.counts[m, lo:hi], out=indptr[1:])
        idx = np.empty(int(indptr[-1]), dtype=np.uint32)
        data = np.empty((int(indptr[-1]), 4), dtype=np.uint64)
        errors = np.zeros(hi - lo, dtype=np.int8)
        from .r1cs_kernels import fill_matrix  # numba (as the two below): loaded by the first decode

        fill_matrix(self.raw, self.offsets, self.counts, m, lo, indptr, idx, data, self.head["n_wires"], FR.limbs,
                    errors)
        bad = np.flatnonzero(errors)
        if bad.size:
            i = lo + int(bad[0])
            _raise_term_error(self.bf, self.raw, int(self.offsets[i]), i, int(errors[bad[0]]), self.head["n_wires"])
        return CsrMatrix(indptr, idx, data, self.head["n_wires"])

    def close(self) -> None:
        """Release the mapping."""
        self.bf.close()

    def __enter__(self) -> Self:
        """Context manager: :meth:`close` on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Release the mapping."""
        self.close()


def scan_r1cs(path: str | os.PathLike[str], *, name: str | None = None) -> R1csLayout:
    """Map an .r1cs file and frame its constraints (header and section-2 framing validated)."""
    bf = open_source(path, name, MAGIC, (VERSION,), SECTION_LABELS)
    try:
        return _layout(bf)
    except BaseException:
        bf.close()
        raise


def read_r1cs_header(path: str | os.PathLike[str], *, name: str | None = None) -> dict[str, int]:
    """An .r1cs file's header alone (n_wires, n_pub_out, n_pub_in, n_prv_in, n_labels, n_constraints),
    validated as :func:`read_r1cs` validates it, without reading the constraints."""
    bf = open_source(path, name, MAGIC, (VERSION,), SECTION_LABELS)
    try:
        return _read_header(bf)
    finally:
        bf.close()


def _layout(bf: BinFile) -> R1csLayout:
    for sid in (4, 5):
        if bf.has(sid):
            raise bf.error(sid, "custom gates are PLONK-only; Groth16 circuits cannot use them")
    head = _read_header(bf)
    n_constraints = head["n_constraints"]
    raw = np.frombuffer(bf.section(2), dtype=np.uint8)
    if n_constraints * MIN_CONSTRAINT_BYTES > raw.size:  # before the per-constraint arrays are made
        raise bf.error(2, f"{n_constraints} constraints declared, but the section's {raw.size} bytes hold at most "
                       f"{raw.size // MIN_CONSTRAINT_BYTES} (each takes at least {MIN_CONSTRAINT_BYTES})")
    offsets = np.empty(n_constraints, dtype=np.int64)
    counts = np.empty((3, n_constraints), dtype=np.uint32)  # a count is a u32 in the file
    from .r1cs_kernels import scan_constraints

    status = scan_constraints(raw, N8, offsets, counts)
    if status[0] != 0:
        _raise_scan_error(bf, raw, status, n_constraints)
    return R1csLayout(bf, head, raw, offsets, counts)


def _read_header(bf: BinFile) -> dict[str, int]:
    rd = FieldReader(bf, 1)
    n8 = rd.u32("n8")
    if n8 != N8:
        raise bf.error(1, f"n8 is {n8}, expected {N8}: not a BLS12-381 circuit")
    prime = rd.bigint(n8, "prime")
    if prime != R_MOD:
        raise bf.error(1, f"not a BLS12-381 circuit: prime is {prime:#x}, expected r = {R_MOD:#x}")
    head = {k: rd.u32(k) for k in ("n_wires", "n_pub_out", "n_pub_in", "n_prv_in")}
    head["n_labels"] = rd.u64("n_labels")
    head["n_constraints"] = rd.u32("n_constraints")
    rd.end()
    # Only the public signals must be wires: circom counts a private input it removed as unused in
    # nPrvIn but gives it no wire (snarkjs sets such circuits up and proves them).
    n_pub = head["n_pub_out"] + head["n_pub_in"]
    if n_pub + 1 > head["n_wires"]:
        raise bf.error(1, f"nWires {head['n_wires']} < 1 + nPubOut + nPubIn = {n_pub + 1}")
    return head


def _raise_scan_error(bf: BinFile, raw: np.ndarray, status: np.ndarray, n_constraints: int) -> None:
    from .r1cs_kernels import ERR_TRUNCATED, LC_NAMES  # loaded already: the status is a kernel's

    code, i, m, pos = (int(x) for x in status)
    if code == ERR_TRUNCATED:
        raise bf.error(2, f"truncated in constraint {i} of {n_constraints}, matrix {LC_NAMES[m]} at byte {pos} "
                       f"(section is {raw.size} bytes)")
    raise bf.error(2, f"{raw.size - pos} extra bytes after the last of {n_constraints} constraints")


def _raise_term_error(bf: BinFile, raw: np.ndarray, pos: int, i: int, code: int, n_wires: int) -> None:
    """Decode constraint ``i`` again in Python to name the bad term exactly."""
    from .r1cs_kernels import ERR_COEF, ERR_DUPLICATE, ERR_WIRE, LC_NAMES  # loaded already, as above

    seen: set[int] = set()
    for m in range(3):
        k = int.from_bytes(raw[pos : pos + 4].tobytes(), "little")
        pos += 4
        seen.clear()
        for t in range(k):
            wire = int.from_bytes(raw[pos : pos + 4].tobytes(), "little")
            coef = int.from_bytes(raw[pos + 4 : pos + 4 + N8].tobytes(), "little")
            pos += 4 + N8
            at = f"constraint {i}, matrix {LC_NAMES[m]}, term {t}"
            if code == ERR_WIRE and wire >= n_wires:
                raise bf.error(2, f"{at}: wire id {wire} >= nWires {n_wires}")
            if code == ERR_COEF and coef >= R_MOD:
                raise bf.error(2, f"{at}: coefficient {coef:#x} >= r (not reduced)")
            if code == ERR_DUPLICATE and wire in seen:
                raise bf.error(2, f"{at}: wire {wire} appears twice in one linear combination")
            seen.add(wire)
    raise bf.error(2, f"constraint {i}: invalid term (error code {code})")


def write_r1cs(path: str | os.PathLike[str], r1cs: R1CS) -> None:
    """Write ``r1cs`` as a version-1 .r1cs (sections 1, 2, 3), streaming section 2.

    Rows are encoded in parallel a bounded chunk at a time (about 32 MiB), so
    memory stays flat whatever the size. Coefficients must be reduced
    (< r) and wire ids < n_wires: ValueError otherwise.
    """
    _check_shapes(r1cs)
    labels = np.arange(r1cs.n_wires, dtype="<u8") if r1cs.wire_to_label is None else np.asarray(r1cs.wire_to_label)
    if labels.shape != (r1cs.n_wires,):
        raise ValueError(f"wire_to_label has shape {labels.shape}, expected ({r1cs.n_wires},)")
    write_binfile(path, MAGIC, VERSION, [
        (1, header_bytes(r1cs)),
        (2, _constraint_chunks(r1cs)),
        (3, np.asarray(labels, dtype="<u8")),
    ])


def header_bytes(r1cs: R1CS) -> bytes:
    """Section 1 of ``r1cs`` (64 bytes)."""
    if r1cs.prime != R_MOD:
        raise ValueError(f"prime is {r1cs.prime:#x}, only BLS12-381's r is supported")
    u32 = lambda v: int(v).to_bytes(4, "little")  # noqa: E731
    return b"".join([
        u32(N8), R_MOD.to_bytes(N8, "little"), u32(r1cs.n_wires), u32(r1cs.n_pub_out), u32(r1cs.n_pub_in),
        u32(r1cs.n_prv_in), int(r1cs.n_labels).to_bytes(8, "little"), u32(r1cs.n_constraints),
    ])


def _check_shapes(r1cs: R1CS) -> None:
    for label, mat in (("a", r1cs.a), ("b", r1cs.b), ("c", r1cs.c)):
        if mat.n_rows != r1cs.n_constraints:
            raise ValueError(f"r1cs.{label} has {mat.n_rows} rows, n_constraints is {r1cs.n_constraints}")
        if mat.data.shape != (mat.nnz, 4) or mat.data.dtype != np.uint64:
            raise ValueError(f"r1cs.{label}.data must be ({mat.nnz}, 4) uint64, got {mat.data.dtype} {mat.data.shape}")


def _row_bytes(r1cs: R1CS) -> np.ndarray:
    terms = np.diff(r1cs.a.indptr) + np.diff(r1cs.b.indptr) + np.diff(r1cs.c.indptr)
    return 12 + (4 + N8) * terms


def _constraint_chunks(r1cs: R1CS) -> Iterator[memoryview]:
    """Section 2 as a stream of encoded row ranges (one reused buffer)."""
    ends = np.cumsum(_row_bytes(r1cs))
    mats = [(np.ascontiguousarray(m.indptr, dtype=np.int64), np.ascontiguousarray(m.indices, dtype=np.uint32),
             np.ascontiguousarray(m.data)) for m in (r1cs.a, r1cs.b, r1cs.c)]
    buf = np.empty(0, dtype=np.uint8)
    lo, done = 0, 0
    while lo < r1cs.n_constraints:
        hi = max(lo + 1, int(np.searchsorted(ends, done + _ENCODE_CHUNK_BYTES, side="right")))
        size = int(ends[hi - 1]) - done
        if buf.size < size:
            buf = np.empty(size, dtype=np.uint8)
        starts = np.empty(hi - lo, dtype=np.int64)
        starts[0] = 0
        starts[1:] = ends[lo : hi - 1] - done
        from .r1cs_kernels import ERR_WIRE, LC_NAMES, encode_rows

        status = encode_rows(*mats[0], *mats[1], *mats[2], lo, starts, r1cs.n_wires, FR.limbs, buf)
        if status[0] != 0:
            raise ValueError(f"constraint {status[1]}, matrix {LC_NAMES[status[2]]}: "
                             f"{'wire id >= n_wires' if status[0] == ERR_WIRE else 'coefficient >= r'}")
        yield buf[:size].data
        lo, done = hi, int(ends[hi - 1])
