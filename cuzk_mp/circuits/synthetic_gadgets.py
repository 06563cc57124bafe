"""Gadgets of the PoRep-shaped synthetic circuit, written once and run in two modes.

Owns the gadget library (booleans, XOR, AND, CH, MAJ, additions mod 2^32 through bits, word
packing, x^5 S-boxes) and :class:`LaneCS`, the constraint system that runs a circuit in one of
two modes, after bellman's ``ConstraintSystem`` / ``WitnessCS`` pair:

* record mode (``LaneCS(record=True)``) runs a circuit once, for ONE lane, and records every
  constraint as three linear combinations over lane-relative wire offsets: the lane template
  that :mod:`.synthetic_csr` tiles over all lanes;
* witness mode runs the same code vectorized over every lane at once: a word is one uint64 per
  lane, a field element one Montgomery ``(4,)`` row per lane, and each wire is written to the
  witness (through a :class:`LaneWriter`) as soon as it is allocated.

Both modes allocate wires through the same calls in the same order, so the template's wire
offsets and the witness layout agree by construction.

Wire references ("refs") in linear combinations: ``ref >= 0`` is an offset inside the lane,
``ref < 0`` is the absolute wire ``-1 - ref`` (so :data:`ONE` = -1 is wire 0, the constant 1).
Constraint encodings follow bellman's gadgets, so that, as in Filecoin's PoRep circuit, the B
side of most rows is a single term (often the constant one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..algebra import fr
from ..algebra.field import R_MOD
from .synthetic_kernels import mont_table, permute_lanes, small_table, write_lane_wires

ONE = -1  # ref of wire 0, the constant one
MASK32 = (1 << 32) - 1
_SHIFTS = np.arange(64, dtype=np.uint64)

LC = dict[int, int]  # ref -> coefficient (a Python int, reduced mod r when encoded)


def global_ref(wire: int) -> int:
    """The ref of an absolute wire index (negative, so it is never shifted by a lane base)."""
    return -1 - wire


def lc(*terms: tuple[int, int]) -> LC:
    """A linear combination from (ref, coef) terms, merging repeated refs and dropping zeros."""
    out: LC = {}
    for ref, coef in terms:
        out[ref] = out.get(ref, 0) + coef
    return {ref: coef for ref, coef in out.items() if coef % R_MOD}


@dataclass(frozen=True)
class Word:
    """Bit wires of an unsigned integer, least significant first, and its values (witness mode).

    ``value`` is one uint64 per lane (None in record mode); ``bound`` is an upper bound of the
    value (2^n - 1 for plain bits, more for the bits of a sum), used to size additions.
    """

    refs: tuple[int, ...]
    value: np.ndarray | None
    bound: int

    def rotr(self, n: int) -> Word:
        """This 32-bit word rotated right by n: free, a permutation of its wires."""
        refs = self.refs[n:] + self.refs[:n]
        if self.value is None:
            return Word(refs, None, self.bound)
        v = self.value
        return Word(refs, ((v >> np.uint64(n)) | (v << np.uint64(32 - n))) & np.uint64(MASK32), self.bound)

    def low(self, n: int) -> Word:
        """The n least significant bits (a sum modulo 2^n)."""
        value = None if self.value is None else self.value & np.uint64((1 << n) - 1)
        return Word(self.refs[:n], value, (1 << n) - 1)

    def terms(self, coef: int) -> list[tuple[int, int]]:
        """coef * (the word's value) as linear-combination terms: sum coef * 2^i * bit_i."""
        return [(ref, coef << i) for i, ref in enumerate(self.refs)]


@dataclass(frozen=True)
class Field:
    """One field-element wire and its values per lane (``(n_lanes, 4)`` Montgomery; None when recording)."""

    ref: int
    value: np.ndarray | None


class LaneWriter:
    """Writes lane wires into a witness: ``n_full`` whole lanes of ``width`` wires from ``base``,
    then (if ``partial_width``) one truncated lane that keeps only its first ``partial_width`` wires.

    Lane ``i < n_full`` owns wires ``base + i*width + off``; the truncated lane is lane ``n_full``.
    Bit words and single field wires are collected as the gadgets produce them (one value per
    lane each) and written by :meth:`flush` in one lane-parallel pass, each lane's wires in
    order (a lane's wires are contiguous: no strided writes across lanes); the sponge kernel
    writes its blocks of wires itself (:meth:`spec`). Every lane wire is written exactly once,
    all four limbs, so the region needs no clearing first.
    """

    def __init__(self, out: np.ndarray, base: int, width: int, n_full: int, partial_width: int = 0) -> None:
        self.out = out
        self.base = base
        self.width = width
        self.n_full = n_full
        self.partial_width = partial_width
        self._bits: list[tuple[int, int, np.ndarray]] = []
        self._fields: list[tuple[int, np.ndarray]] = []

    def put_bits(self, off: int, value: np.ndarray, nbits: int) -> None:
        """Wires off .. off+nbits-1 get the nbits low bits of ``value`` (one uint64 per lane)."""
        self._bits.append((off, nbits, value))

    def put_field(self, off: int, std: np.ndarray) -> None:
        """Wire ``off`` of every lane gets a standard-form field element (``(n_lanes, 4)``)."""
        self._fields.append((off, std))

    def spec(self, off: int) -> tuple[np.ndarray, int, int, int, int]:
        """(out, first wire of block ``off`` in lane 0, lane width, whole lanes, wires of the block the
        truncated lane keeps): where :func:`permute_lanes` writes a block of wires at offset ``off``."""
        return self.out, self.base + off, self.width, self.n_full, self.partial_width - off

    def flush(self) -> None:
        """Write every collected wire (on numba's current thread count)."""
        if not self._bits and not self._fields:
            return
        lanes = (self._bits[0][2] if self._bits else self._fields[0][1]).shape[0]
        offs = np.array([b[0] for b in self._bits], dtype=np.int64)
        nbits = np.array([b[1] for b in self._bits], dtype=np.int64)
        vals = np.stack([b[2] for b in self._bits]) if self._bits else np.zeros((0, lanes), np.uint64)
        f_offs = np.array([f[0] for f in self._fields], dtype=np.int64)
        f_vals = np.stack([f[1] for f in self._fields]) if self._fields else np.zeros((0, lanes, 4), np.uint64)
        write_lane_wires(self.out, self.base, self.width, self.n_full, self.partial_width, offs, nbits,
                         np.ascontiguousarray(vals, dtype=np.uint64), f_offs,
                         np.ascontiguousarray(f_vals, dtype=np.uint64))
        self._bits.clear()
        self._fields.clear()


class LaneCS:
    """Runs a lane circuit: records its constraints (``record=True``) or computes its witness.

    In witness mode ``n_lanes`` lanes are computed at once; ``rand`` holds the lanes' random
    input words (``(n_lanes, k)`` uint64, each < 2^32) and ``writer`` receives every wire (None:
    compute only, as for the public inputs).
    """

    def __init__(self, *, record: bool = False, n_lanes: int = 1, rand: np.ndarray | None = None,
                 writer: LaneWriter | None = None) -> None:
        self.record = record
        self.n_lanes = n_lanes
        self.rand = rand
        self.writer = writer
        self.n_wires = 0
        self.rows: list[tuple[LC, LC, LC]] = []

    # ---------------------------------------------------------------- allocation

    def _alloc(self, n: int) -> int:
        off = self.n_wires
        self.n_wires += n
        return off

    def _word(self, value: np.ndarray | None, nbits: int) -> Word:
        """Allocate nbits bit wires holding ``value`` (no constraint)."""
        off = self._alloc(nbits)
        if self.writer is not None and value is not None:
            self.writer.put_bits(off, value, nbits)
        return Word(tuple(range(off, off + nbits)), value, (1 << nbits) - 1)

    def _field(self, std: np.ndarray | None) -> Field:
        """Allocate one field wire holding ``std`` (standard form, kept as Montgomery; no constraint)."""
        off = self._alloc(1)
        if self.writer is not None and std is not None:
            self.writer.put_field(off, std)
        return Field(off, None if std is None else fr.to_mont(std))

    def enforce(self, a: LC, b: LC, c: LC) -> None:
        """Record the constraint <a, w> * <b, w> = <c, w> (record mode only)."""
        self.rows.append((a, b, c))

    def random_word(self, i: int) -> np.ndarray | None:
        """The i-th random input word of every lane (None when recording)."""
        return None if self.record else self.rand[:, i]  # type: ignore[index]

    def constant_word(self, x: int) -> np.ndarray | None:
        """A value equal to x in every lane (None when recording)."""
        return None if self.record else np.full(self.n_lanes, x, dtype=np.uint64)

    # ---------------------------------------------------------------- bit gadgets

    def bits(self, value: np.ndarray | None, nbits: int) -> Word:
        """Fresh bits, each made boolean by (1 - b) * b = 0 (bellman ``Boolean::alloc``)."""
        word = self._word(value, nbits)
        if self.record:
            for ref in word.refs:
                self.enforce(lc((ONE, 1), (ref, -1)), {ref: 1}, {})
        return word

    def xor(self, u: Word, v: Word) -> Word:
        """u XOR v bitwise: (2u) * v = u + v - x (one row per bit)."""
        x = self._word(None if self.record else u.value ^ v.value, len(u.refs))  # type: ignore[operator]
        if self.record:
            for ui, vi, xi in zip(u.refs, v.refs, x.refs, strict=True):
                self.enforce({ui: 2}, {vi: 1}, lc((ui, 1), (vi, 1), (xi, -1)))
        return x

    def and_(self, u: Word, v: Word) -> Word:
        """u AND v bitwise: u * v = x."""
        x = self._word(None if self.record else u.value & v.value, len(u.refs))  # type: ignore[operator]
        if self.record:
            for ui, vi, xi in zip(u.refs, v.refs, x.refs, strict=True):
                self.enforce({ui: 1}, {vi: 1}, {xi: 1})
        return x

    def ch(self, e: Word, f: Word, g: Word) -> Word:
        """SHA-256 Ch(e, f, g) = (e AND f) XOR (NOT e AND g): (f - g) * e = ch - g."""
        value = None if self.record else (e.value & f.value) | (~e.value & g.value)  # type: ignore[operator]
        x = self._word(value, 32)
        if self.record:
            for ei, fi, gi, xi in zip(e.refs, f.refs, g.refs, x.refs, strict=True):
                self.enforce(lc((fi, 1), (gi, -1)), {ei: 1}, lc((xi, 1), (gi, -1)))
        return x

    def maj(self, a: Word, b: Word, c: Word) -> Word:
        """SHA-256 Maj(a, b, c) in two rows per bit: t = b AND c; (b + c - 2t) * a = maj - t."""
        t = self.and_(b, c)
        value = None if self.record else (a.value & b.value) | (a.value & c.value) | t.value  # type: ignore[operator]
        m = self._word(value, 32)
        if self.record:
            for ai, bi, ci, ti, mi in zip(a.refs, b.refs, c.refs, t.refs, m.refs, strict=True):
                self.enforce(lc((bi, 1), (ci, 1), (ti, -2)), {ai: 1}, lc((mi, 1), (ti, -1)))
        return m

    def add_many(self, operands: list[tuple[Word, int]], const: int) -> Word:
        """sum(sign * word) + const decomposed into bits (bellman ``UInt32::addmany``).

        Signs are +-1 and the true sum must be non-negative. Returns all bits of the sum (take
        ``.low(32)`` for the sum mod 2^32): their booleanity rows, then one row
        (sum of operands + const) * 1 = sum of 2^i bit_i.
        """
        bound = sum(w.bound for w, sign in operands if sign > 0) + const
        value = None
        if not self.record:
            value = np.full(self.n_lanes, const, dtype=np.uint64)
            for w, sign in operands:
                value = value + w.value if sign > 0 else value - w.value  # exact: the sum is < 2^64
        out = self.bits(value, bound.bit_length())
        if self.record:
            a = lc(*(t for w, sign in operands for t in w.terms(sign)), (ONE, const))
            self.enforce(a, {ONE: 1}, lc(*out.terms(1)))
        return Word(out.refs, value, bound)

    def pack(self, words: list[Word]) -> Field:
        """One field wire p = sum_j word_j * 2^(32 j): (sum of 2^k bit_k) * 1 = p."""
        if 32 * len(words) > 64:
            raise ValueError("pack: the witness path packs at most 64 bits into one wire")
        std = None
        if not self.record:
            p = np.zeros(self.n_lanes, dtype=np.uint64)
            for j, w in enumerate(words):
                p |= w.value << np.uint64(32 * j)  # type: ignore[operator]
            std = np.zeros((self.n_lanes, 4), dtype=np.uint64)
            std[:, 0] = p
        out = self._field(std)
        if self.record:
            self.enforce(lc(*(t for j, w in enumerate(words) for t in w.terms(1 << (32 * j)))), {ONE: 1}, {out.ref: 1})
        return out

    # ---------------------------------------------------------------- field gadget

    def permute(self, state: list[Field] | None, p: Field, consts: Sequence[Sequence[int]],
                mds: Sequence[Sequence[int]]) -> list[Field]:
        """Absorb ``p`` into a width-3 sponge and run full rounds of x^5 S-boxes; the new state.

        Round r computes y_i = x_i^5 with x_i = sum_j mds[i][j] y_j (when there is a state) +
        mds[i][0] p (round 0 only) + consts[r][i], in three rows: x*x = t2, t2*t2 = t4, t4*x = y.
        ``consts`` ``(rounds, 3)`` and ``mds`` ``(3, 3)`` are Python-int tables; the witness
        side is one numba call over all lanes (:func:`.synthetic_kernels.permute_lanes`), whose
        wire order (t2, t4, y per S-box, S-boxes in order) matches the rows recorded here.
        """
        if self.record:
            for r, row in enumerate(consts):
                xs = []
                for i in range(3):
                    terms = [] if state is None else [(state[j].ref, mds[i][j]) for j in range(3)]
                    xs.append(lc(*terms, *([(p.ref, mds[i][0])] if r == 0 else []), (ONE, row[i])))
                state = [self._sbox_rows(x) for x in xs]
            return state  # type: ignore[return-value]
        off = self._alloc(9 * len(consts))
        prev = None if state is None else np.stack([f.value for f in state], axis=1)  # type: ignore[misc]
        new = permute_lanes(prev, p.value, mont_table(consts), small_table(mds),  # type: ignore[arg-type]
                            None if self.writer is None else self.writer.spec(off))
        last = off + 9 * (len(consts) - 1)
        return [Field(last + 3 * i + 2, np.ascontiguousarray(new[:, i])) for i in range(3)]

    def _sbox_rows(self, x: LC) -> Field:
        """Record y = x^5 for the linear combination x: x * x = t2, t2 * t2 = t4, t4 * x = y."""
        t2, t4, y = (self._field(None) for _ in range(3))
        self.enforce(x, x, {t2.ref: 1})
        self.enforce({t2.ref: 1}, {t2.ref: 1}, {t4.ref: 1})
        self.enforce({t4.ref: 1}, x, {y.ref: 1})
        return y
