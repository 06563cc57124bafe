"""The PoRep-shaped synthetic circuit: Filecoin's partition circuit stand-in for benchmarks.

Owns :class:`PorepLike` (the circuit at 2^log_n rows: its R1CS, built once and cached, and its
deterministic witness for (seed, partition)); ``cuzk-mp circuit porep-like`` writes it through
:func:`~cuzk_mp.circuits.synthetic_kinds.write_synthetic`. The gadgets are in
:mod:`.synthetic_gadgets`, the lane's shape and constants in :mod:`.synthetic_lane`, the tiling into
CSR matrices in :mod:`.synthetic_csr`.

Layout, in circom's wire order (wire 0 = 1, public outputs, public inputs, private):

* public outputs (``n_public - 1``): the digest (sum of every whole lane's output), then the
  outputs of lanes 0, 1, ... (modulo the lane count); public input: the partition index;
* the prologue: the partition index's 32 bits (33 rows);
* ``n_lanes`` whole lanes of 934 rows, then one lane truncated to the rows left over (a prefix
  of a lane is itself a satisfiable circuit), so that the constraint count is exactly
  ``2^log_n - n_public - 1`` and snarkjs's domain is exactly 2^log_n, with no empty rows;
* the epilogue: one row per public output, ``(lane outputs) * 1 = output``.

Lane inputs (128 bits per lane and one message word per later unit) come from a PCG64 stream
seeded with (seed, partition); the message word of each lane's first unit is the partition
index, so both public inputs and outputs are functions of (seed, partition).

Size (measured): 5.36 entries per row (A 2.47, B 1.38, C 1.51; Filecoin's PoRep circuit has
2.4 / 1.0 / 2.2), so the three matrices take 3.4 GiB at 2^24 (32-byte coefficients dominate);
80.4% of witness values are 0 or 1 (42% zeros, 38% ones), the rest mostly full 255-bit field
elements. Witness (``witness_into``, lanes in parallel on ``threads`` cores): 0.016 core-s at
2^20 and 0.063 at 2^22 on one core of the 2-core CI machine (perf/results/synthesis-cpu.json),
about half of it the sponge's S-boxes; R1CS: ~16 s at 2^24.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property

import numpy as np

from ..algebra import fr
from ..algebra.field import R_MOD, ints_to_limbs
from ..algebra.threads import numba_threads
from ..errors import ConfigError, InputError
from ..formats.r1cs import R1CS
from .synthetic_csr import Block, CoefTable, Template, assemble
from .synthetic_gadgets import ONE, LaneCS, LaneWriter, Word, global_ref, lc
from .synthetic_shape import check_shape
from .synthetic_lane import RANDOM_WORDS, synth_lane, synth_prologue

PARTITION_BITS = 32


class PorepLike:
    """The PoRep-shaped synthetic circuit with 2^log_n rows and ``n_public`` public signals."""

    def __init__(self, log_n: int, n_public: int = 4) -> None:
        check_shape("porep-like", log_n, n_public)
        self.log_n = log_n
        self.domain_size = 1 << log_n
        self.n_public = n_public
        self.n_constraints = self.domain_size - n_public - 1
        self.n_pub_out = n_public - 1
        self.partition_wire = n_public  # the one public input, after the outputs
        self._table = CoefTable()
        self.prologue_base = 1 + n_public
        self._prologue = self._record(lambda cs: synth_prologue(cs, 0, self.partition_wire))
        self.lane_base = self.prologue_base + self._prologue.n_wires
        partition_bits = Word(tuple(global_ref(self.prologue_base + i) for i in range(PARTITION_BITS)), None,
                              (1 << PARTITION_BITS) - 1)
        lane_out: list[int] = []
        self._lane = self._record(lambda cs: lane_out.append(synth_lane(cs, partition_bits).ref))
        self.lane_out_offset = lane_out[0]  # the output wire's offset inside a lane
        self._size_lanes()

    def _record(self, circuit: Callable[[LaneCS], object]) -> Template:
        cs = LaneCS(record=True)
        circuit(cs)
        return Template.from_rows(cs.rows, cs.n_wires, self._table)

    def _size_lanes(self) -> None:
        room = self.n_constraints - self._prologue.n_rows - self.n_pub_out
        self.n_lanes, self.partial_rows = divmod(room, self._lane.n_rows)
        if self.n_lanes < 1:
            raise ConfigError(f"porep-like: 2^{self.log_n} rows do not hold one lane ({self._lane.n_rows} rows) "
                              f"plus {self.n_public} public signals; use a larger log_n")
        self.lane_width = self._lane.n_wires
        self.partial_width = self._lane.prefix_wires(self.partial_rows)
        self.n_wires = self.lane_base + self.n_lanes * self.lane_width + self.partial_width

    @property
    def lanes_computed(self) -> int:
        """Lanes the witness computes: the whole ones plus the truncated one, if any."""
        return self.n_lanes + (1 if self.partial_rows else 0)

    # ------------------------------------------------------------------ constraint system

    def r1cs(self) -> R1CS:
        """The circuit's R1CS (standard-form coefficients), built on first use and cached."""
        return self._r1cs

    @cached_property
    def _r1cs(self) -> R1CS:
        bases = (self.lane_base + np.arange(self.lanes_computed, dtype=np.int64) * self.lane_width).astype(np.uint32)
        blocks = [Block(self._prologue, np.array([self.prologue_base], dtype=np.uint32), self._prologue.n_rows),
                  Block(self._lane, bases[: self.n_lanes], self._lane.n_rows)]
        if self.partial_rows:
            blocks.append(Block(self._lane, bases[self.n_lanes :], self.partial_rows))
        blocks.append(Block(self._epilogue(bases), np.zeros(1, dtype=np.uint32), self.n_pub_out))
        m = assemble(blocks, self._table, self.n_wires)
        return R1CS(prime=R_MOD, n_wires=self.n_wires, n_pub_out=self.n_pub_out, n_pub_in=1, n_prv_in=0,
                    n_labels=self.n_wires, n_constraints=self.n_constraints, a=m["a"], b=m["b"], c=m["c"],
                    wire_to_label=None, path=None)  # None: the identity map (write_r1cs writes it)

    def _epilogue(self, bases: np.ndarray) -> Template:
        """Rows binding the public outputs: digest = sum of lane outputs, then single lane outputs."""
        outs = [int(b) + self.lane_out_offset for b in bases[: self.n_lanes]]
        rows = []
        for j in range(self.n_pub_out):
            lanes = outs if j == 0 else [outs[(j - 1) % self.n_lanes]]
            rows.append((lc(*((global_ref(w), 1) for w in lanes)), {ONE: 1}, {global_ref(1 + j): 1}))
        return Template.from_rows(rows, 0, self._table)

    # ------------------------------------------------------------------ witness

    def witness(self, seed: int, partition: int) -> np.ndarray:
        """The witness for (seed, partition): ``(n_wires, 4)`` uint64, standard form."""
        out = np.empty((self.n_wires, 4), dtype=np.uint64)
        self.witness_into(seed, partition, out)
        return out

    def witness_into(self, seed: int, partition: int, out: np.ndarray, threads: int = 1) -> None:
        """Write the witness for (seed, partition) into ``out`` (``(n_wires, 4)`` uint64, e.g. a shm view).

        Uses ``threads`` cores (lanes in parallel); the bytes are the same for any count.
        Temporaries are O(lanes) words per gadget, not O(n_wires).
        """
        if not isinstance(out, np.ndarray) or out.dtype != np.uint64 or out.shape != (self.n_wires, 4):
            got = f"{out.dtype} {out.shape}" if isinstance(out, np.ndarray) else type(out).__name__
            raise InputError(f"porep-like 2^{self.log_n}: witness_into needs a ({self.n_wires}, 4) uint64 array, "
                             f"got {got}")
        partition = self._check_partition(partition)
        with numba_threads(threads):
            out[: self.prologue_base] = 0
            out[0, 0] = 1
            pro_writer = LaneWriter(out, self.prologue_base, self._prologue.n_wires, 1)
            synth_prologue(LaneCS(n_lanes=1, writer=pro_writer), partition, self.partition_wire)
            pro_writer.flush()
            lane_writer = LaneWriter(out, self.lane_base, self.lane_width, self.n_lanes, self.partial_width)
            out[1 : 1 + self.n_public] = ints_to_limbs(self._lanes(seed, partition, lane_writer), 4)

    def public_inputs(self, seed: int, partition: int) -> list[int]:
        """The public signals w[1..n_public] (outputs, then the partition index), as snarkjs lists them."""
        return self._lanes(seed, partition, None)

    def _lanes(self, seed: int, partition: int, writer: LaneWriter | None) -> list[int]:
        """Compute every lane (writing its wires if ``writer``); returns the public signals."""
        partition = self._check_partition(partition)
        rand = self.lane_inputs(seed, partition)
        n = self.lanes_computed
        cs = LaneCS(n_lanes=n, rand=rand, writer=writer)
        part = Word((), np.full(n, partition, dtype=np.uint64), (1 << PARTITION_BITS) - 1)
        outs = fr.to_ints(fr.from_mont(synth_lane(cs, part).value[: self.n_lanes]), mont=False)  # type: ignore[index]
        if writer is not None:
            writer.flush()
        public = [sum(outs) % R_MOD] + [outs[(j - 1) % self.n_lanes] for j in range(1, self.n_pub_out)]
        return public[: self.n_pub_out] + [partition]

    def lane_inputs(self, seed: int, partition: int) -> np.ndarray:
        """The lanes' random input words, ``(lanes_computed, RANDOM_WORDS)`` uint64 < 2^32."""
        if seed < 0:
            raise InputError(f"porep-like: seed must be >= 0, got {seed}")
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, partition])))
        return rng.integers(0, 1 << 32, size=(self.lanes_computed, RANDOM_WORDS), dtype=np.uint64)

    def _check_partition(self, partition: int) -> int:
        if not 0 <= partition < 1 << PARTITION_BITS:
            raise InputError(f"porep-like: partition index must be in [0, 2^{PARTITION_BITS}), got {partition}")
        return int(partition)

