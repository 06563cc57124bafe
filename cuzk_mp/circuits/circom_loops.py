"""The witness generator's per-value loops, run inside wasm: setting the inputs and reading the witness.

Every call from Python into the generator goes through wasmtime-py, which costs ~26 us a call for
``setInputSignal`` and ~50 us for ``getWitness``; snarkjs makes one such call (plus ``n32`` calls of
``writeSharedRWMemory``) per input value and per wire. :data:`HELPER_WAT`, a small module linked to
the generator's own exports in the same store, makes those calls wasm to wasm instead (a few ns
each), and Python makes one call per ``CHUNK_VALUES`` input values, or one for the whole witness:

- ``setInputs``: for each value of a chunk that Python wrote into the helper's own memory
  (``values``), copy its ``n8`` little-endian bytes to the generator's shared read/write memory
  (what snarkjs's ``writeSharedRWMemory(j, word)`` for j < n32 stores there, word by word) and call
  ``setInputSignal(hi, lo, i)``; the values are never in the generator's memory but where snarkjs
  puts them. 2^20 values took 31 s one call at a time, now see perf/results/circom-inputs-cpu.json.
- ``dumpWitness``: ``getWitness(i)`` for every wire, each value copied into one block that Python
  reads at once (a 30k-wire SHA-256 witness went from 1.75 s to 0.2 s). It runs only after the
  circuit has been computed, into generator memory grown past everything the generator ever used.

The helper is compiled in the generator's engine, so its loops carry the same epoch checks: a run
is stopped inside them as anywhere in the generator. :func:`encode_values` gives the bytes of one
chunk: ``BigInt(v) mod r`` of each value, as snarkjs computes it before writing it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cuzk_mp.algebra.field import FR_BYTES, FR_LIMBS, R_MOD
from cuzk_mp.circuits.circom_values import js_bigint
from cuzk_mp.errors import InputError

CHUNK_BYTES = 1 << 20  # the helper's ``values`` memory: one chunk of input values at a time
CHUNK_VALUES = CHUNK_BYTES // FR_BYTES
WASM_PAGE = 65536

HELPER_WAT = f"""
(module
  (import "circom" "memory" (memory $circom 0))
  (import "circom" "getWitness" (func $get_witness (param i32)))
  (import "circom" "setInputSignal" (func $set_input (param i32 i32 i32)))
  (memory $values (export "values") {CHUNK_BYTES // WASM_PAGE})
  (func (export "setInputs")
        (param $hi i32) (param $lo i32) (param $first i32) (param $count i32) (param $shared i32)
        (param $n8 i32)
    (local $i i32)
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $i) (local.get $count)))
        (memory.copy $circom $values (local.get $shared) (i32.mul (local.get $i) (local.get $n8))
                     (local.get $n8))
        (call $set_input (local.get $hi) (local.get $lo) (i32.add (local.get $first) (local.get $i)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next))))
  (func (export "dumpWitness")
        (param $dst i32) (param $count i32) (param $shared i32) (param $n8 i32)
    (local $i i32)
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $i) (local.get $count)))
        (call $get_witness (local.get $i))
        (memory.copy $circom $circom
                     (i32.add (local.get $dst) (i32.mul (local.get $i) (local.get $n8)))
                     (local.get $shared) (local.get $n8))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next))))
)
"""

_R_LIMBS = [(R_MOD >> (64 * k)) & ((1 << 64) - 1) for k in range(FR_LIMBS)]


def _int_limbs(a: np.ndarray) -> np.ndarray:
    """``a`` (any numpy integer dtype) mod r as (n, 4) little-endian uint64 limbs, computed in numpy:
    every such value is above -2^63 and below 2^64 < r, so v or r - |v|."""
    out = np.zeros((len(a), FR_LIMBS), dtype="<u8")
    if a.dtype.kind == "u":
        out[:, 0] = a
        return out
    a = a.astype(np.int64, copy=False)
    neg = a < 0
    out[:, 0] = np.where(neg, 0, a).astype(np.uint64)
    if neg.any():
        mag = (~a[neg]).view(np.uint64) + np.uint64(1)  # |v|, 2^63 included, without an int64 overflow
        low = np.uint64(_R_LIMBS[0]) - mag  # wraps where |v| > r's low limb: borrow one from the next
        out[neg, 0] = low
        out[neg, 1] = np.uint64(_R_LIMBS[1]) - (mag > np.uint64(_R_LIMBS[0])).astype(np.uint64)
        out[neg, 2] = _R_LIMBS[2]  # (r's second limb is not 0: the borrow stops there)
        out[neg, 3] = _R_LIMBS[3]
    return out


def encode_values(values: Any, start: int, stop: int, name: str, size: int) -> tuple[bytes, InputError | None]:
    """The values ``start``..``stop`` of input signal ``name`` (of ``size`` values), each ``BigInt(v) mod r``
    in ``FR_BYTES`` little-endian bytes, as snarkjs writes them. ``values`` is a list of JSON values,
    a 1-D numpy array, or the (n, 4) limbs of PackedValues (already reduced). Where a value is refused,
    the bytes of those before it and the refusal (raised once they are set, as one value at a time
    would be)."""
    if isinstance(values, np.ndarray) and values.ndim == 2:  # PackedValues' limbs
        return values[start:stop].astype("<u8", copy=False).tobytes(), None
    if isinstance(values, np.ndarray) and values.dtype.kind in "iu":
        return _int_limbs(values[start:stop]).tobytes(), None
    out = []
    for i in range(start, stop):
        where = f"signal {name}" + (f" value {i} (flattened)" if size > 1 else "")
        try:
            out.append((js_bigint(values[i], where) % R_MOD).to_bytes(FR_BYTES, "little"))
        except InputError as exc:
            return b"".join(out), exc
    return b"".join(out), None
