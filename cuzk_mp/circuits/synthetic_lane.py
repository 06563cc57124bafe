"""The pieces of the PoRep-shaped synthetic circuit, as gadget programs for :class:`LaneCS`.

Owns the circuit's shape and its fixed constants. A *lane* is the stand-in for one PoRep node
labelling: 128 fresh input bits (four 32-bit words; the other four words of a SHA-256-like state
are rotations of them), then ``UNITS_PER_LANE`` units, each

* one SHA-256-style round on bits (Sigma0/Sigma1 as 3-way XORs of rotations, Ch, Maj, the two
  additions mod 2^32 through 35-bit decompositions; message word = the partition index's bits
  in unit 0, 32 fresh bits after), then
* absorption of the new (a, e) words, packed into one 64-bit field element, into a width-3
  sponge followed by ``FIELD_ROUNDS`` full rounds of x^5 S-boxes with fixed 255-bit round
  constants and the small MDS matrix [[2,1,1],[1,2,1],[1,1,2]] (Poseidon-like, as in PoRep's
  column hashes).

The lane's output is the sponge's first element. Per lane: 934 rows, 930 wires, about 80% of
them bits (see the tests for the measured 0/1 fractions).
The prologue decomposes the public partition index into 32 bits (used by every lane).
"""

from __future__ import annotations

import hashlib

from ..algebra.field import R_MOD
from .synthetic_gadgets import ONE, Field, LaneCS, Word, global_ref, lc

# Two units keep a lane (934 rows) small enough that 2^10 rows hold one whole lane, while the
# state still chains through two rounds. Ten field rounds per unit put ~20% of the wires on
# full-size field elements (the rest are bits): the PoRep-like mix (a PoRep partition's witness is
# ~40 % zeros, ~40 % ones and ~20 % full field elements).
UNITS_PER_LANE = 2
FIELD_ROUNDS = 10
HEADER_WORDS = 4  # random input words a, b, e, f of a lane
RANDOM_WORDS = HEADER_WORDS + UNITS_PER_LANE - 1  # plus the message words of units 1..

# SHA-256 round constants K[0..3] (FIPS 180-4, 4.2.2), one per unit.
SHA256_K = (0x428A2F98, 0x71374491, 0xB5C0FBCF, 0xE9B5DBA5)
# Width-3 MDS matrix (circulant (2, 1, 1): every minor is non-zero).
MDS = ((2, 1, 1), (1, 2, 1), (1, 1, 2))


def _round_constant(r: int, i: int) -> int:
    """Fixed 255-bit S-box constant: SHA-256("cuzk-mp porep-like round r i") mod r_Fr."""
    digest = hashlib.sha256(f"cuzk-mp porep-like round {r} {i}".encode()).digest()
    return int.from_bytes(digest, "big") % R_MOD


ROUND_CONSTANTS = tuple(tuple(_round_constant(r, i) for i in range(3)) for r in range(FIELD_ROUNDS))


def synth_prologue(cs: LaneCS, partition: int, partition_wire: int) -> Word:
    """The partition index's 32 bits, tied to its public wire: (sum 2^i p_i) * 1 = partition."""
    bits = cs.bits(cs.constant_word(partition), 32)
    if cs.record:
        cs.enforce(lc(*bits.terms(1)), {ONE: 1}, {global_ref(partition_wire): 1})
    return bits


def sha_round(cs: LaneCS, state: list[Word], w: Word, k: int) -> list[Word]:
    """One SHA-256 compression round (FIPS 180-4, 6.2.2 step 3) on bit words; returns the new state."""
    a, b, c, d, e, f, g, h = state
    s1 = cs.xor(cs.xor(e.rotr(6), e.rotr(11)), e.rotr(25))
    ch = cs.ch(e, f, g)
    s0 = cs.xor(cs.xor(a.rotr(2), a.rotr(13)), a.rotr(22))
    mj = cs.maj(a, b, c)
    e_sum = cs.add_many([(d, 1), (h, 1), (s1, 1), (ch, 1), (w, 1)], k)  # d + T1
    a_sum = cs.add_many([(e_sum, 1), (d, -1), (s0, 1), (mj, 1)], 0)  # T1 + T2
    return [a_sum.low(32), a, b, c, e_sum.low(32), e, f, g]


def absorb_permute(cs: LaneCS, state: list[Field] | None, words: list[Word]) -> list[Field]:
    """Pack ``words`` into one element, add it to the sponge's first element, then permute."""
    return cs.permute(state, cs.pack(words), ROUND_CONSTANTS, MDS)


def synth_lane(cs: LaneCS, partition_bits: Word) -> Field:
    """One lane: fresh input bits, UNITS_PER_LANE (SHA round + sponge absorb) units; its output."""
    a, b, e, f = (cs.bits(cs.random_word(i), 32) for i in range(HEADER_WORDS))
    state = [a, b, a.rotr(7), b.rotr(7), e, f, e.rotr(7), f.rotr(7)]
    sponge = None
    for u in range(UNITS_PER_LANE):
        w = partition_bits if u == 0 else cs.bits(cs.random_word(HEADER_WORDS + u - 1), 32)
        state = sha_round(cs, state, w, SHA256_K[u])
        sponge = absorb_permute(cs, sponge, [state[0], state[4]])
    return sponge[0]  # type: ignore[index]
