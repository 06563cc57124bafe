"""Witness files (``.wtns``, version 2): the full assignment, standard form.

Layout (snarkjs-formats.md section 5.5; snarkjs ``wtns_utils.js``):

* section 1 header: n8 u32 (= 32), prime r (n8 bytes LE), nWitness u32 (40 bytes);
* section 2: nWitness x n8 bytes, little-endian, standard form.

w[0] = 1, w[1..nPublic] are the public signals, then the rest in r1cs wire
order. The reader reads the file into memory of its own (``pread``, never a mapping: the file is
closed on return), so a witness file may be rewritten while its values are in use, and one cut
short while it is read is a FormatError.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence

import numpy as np

from ..algebra.field import FR, R_MOD, as_limb_array, first_not_below
from .binfile import FieldReader, open_source, write_binfile, write_sections

MAGIC = "wtns"
VERSION = 2
N8 = 32
SECTION_LABELS = {1: "header", 2: "witness"}


def read_wtns(path_or_bytes: str | os.PathLike[str] | bytes | bytearray | memoryview, *,
              name: str | None = None) -> np.ndarray:
    """The witness of a .wtns file as an ``(n, 4) uint64`` standard-form array.

    FormatError (naming file and section) unless n8 == 32, the prime is
    BLS12-381's r, section 2 holds exactly n * 32 bytes and every value is < r.
    """
    # read, not mapped: the values are copied anyway, and a witness cut short in place while it is
    # read (rewritten by its generator) is then a FormatError, not a SIGBUS
    with open_source(path_or_bytes, name, MAGIC, (VERSION,), SECTION_LABELS, read=True) as bf:
        rd = FieldReader(bf, 1)
        n8 = rd.u32("n8")
        if n8 != N8:
            raise bf.error(1, f"n8 is {n8}, expected {N8}: not a BLS12-381 witness")
        prime = rd.bigint(n8, "prime")
        if prime != R_MOD:
            raise bf.error(1, f"not a BLS12-381 witness: prime is {prime:#x}, expected r = {R_MOD:#x}")
        n = rd.u32("nWitness")
        rd.end()
        values = bf.own_array(2, "<u8", (n, 4))
    bad = first_not_below(values, FR.limbs)
    if bad >= 0:
        raise bf.error(2, f"value {bad} is >= r (not reduced)")
    return values


def _sections(values: np.ndarray | Sequence[int]) -> list[tuple[int, bytes | np.ndarray]]:
    arr = as_limb_array(values, 4)
    bad = first_not_below(arr, FR.limbs)
    if bad >= 0:
        raise ValueError(f"witness value {bad} is >= r")
    header = N8.to_bytes(4, "little") + R_MOD.to_bytes(N8, "little") + arr.shape[0].to_bytes(4, "little")
    return [(1, header), (2, np.asarray(arr, dtype="<u8"))]


def write_wtns(path: str | os.PathLike[str], values: np.ndarray | Sequence[int]) -> None:
    """Write a version-2 .wtns: ``values`` is ``(n, 4) uint64`` standard form (or ints), each < r."""
    write_binfile(path, MAGIC, VERSION, _sections(values))


def wtns_bytes(values: np.ndarray | Sequence[int]) -> bytes:
    """The bytes :func:`write_wtns` would write (same layout as snarkjs ``wtns calculate``)."""
    out = io.BytesIO()
    write_sections(out, MAGIC, VERSION, _sections(values))
    return out.getvalue()
