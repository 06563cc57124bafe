"""Tests for cuzk_mp.formats.wtns against a plain-Python encoding of the spec (snarkjs-formats.md 5.5)."""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cuzk_mp.algebra.field import R_MOD, ints_to_limbs, limbs_to_ints
from cuzk_mp.errors import FormatError
from cuzk_mp.formats.wtns import read_wtns, write_wtns, wtns_bytes

SEED = 77


def encode(values: list[int], *, prime: int = R_MOD, n8: int = 32, count: int | None = None,
           order: tuple[int, ...] = (1, 2), body: bytes | None = None) -> bytes:
    sec = {
        1: struct.pack("<I", n8) + prime.to_bytes(n8, "little") + struct.pack("<I", len(values) if count is None else count),
        2: body if body is not None else b"".join(v.to_bytes(n8, "little") for v in values),
    }
    out = b"wtns" + struct.pack("<II", 2, len(order))
    for sid in order:
        out += struct.pack("<IQ", sid, len(sec[sid])) + sec[sid]
    return out


def sample(n: int, seed: int = SEED) -> list[int]:
    rng = random.Random(seed)
    return [1] + [rng.choice([0, 1, R_MOD - 1, rng.randrange(R_MOD)]) for _ in range(n - 1)]


def test_roundtrip_and_reference_bytes(tmp_path: Path) -> None:
    print("seed", SEED)
    vals = sample(100)
    arr = ints_to_limbs(vals, 4)
    path = tmp_path / "w.wtns"
    write_wtns(path, arr)
    assert path.read_bytes() == encode(vals) == wtns_bytes(arr) == wtns_bytes(vals)
    for got in (read_wtns(path), read_wtns(encode(vals)), read_wtns(encode(vals, order=(2, 1)))):
        assert got.dtype == np.uint64 and got.shape == (100, 4) and got.flags.writeable
        assert limbs_to_ints(got) == vals


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, R_MOD - 1), max_size=20))
def test_roundtrip_hypothesis(vals: list[int]) -> None:
    data = wtns_bytes(vals)
    assert data == encode(vals)
    assert limbs_to_ints(read_wtns(data)) == vals if vals else read_wtns(data).shape == (0, 4)


def bad(data: bytes, pattern: str) -> None:
    with pytest.raises(FormatError, match=pattern):
        read_wtns(data, name="bad.wtns")


def test_errors() -> None:
    vals = sample(8)
    bad(encode(vals, prime=R_MOD - 2), r"bad\.wtns, section 1 \(header\): not a BLS12-381 witness: prime is 0x")
    bad(encode(vals, n8=48, prime=R_MOD), r"section 1 \(header\): n8 is 48, expected 32")
    bad(encode(vals, count=9), r"section 2 \(witness\): size is 256 bytes, expected 288")
    bad(encode(vals, body=encode(vals)[-256:] + b"\0"), r"section 2 \(witness\): size is 257 bytes, expected 256")
    bad(encode(vals[:3] + [R_MOD] + vals[4:]), r"section 2 \(witness\): value 3 is >= r")
    bad(encode(vals[:7] + [2**256 - 1]), r"section 2 \(witness\): value 7 is >= r")
    bad(encode(vals, order=(2,)), r"section 1 \(header\): missing")
    bad(encode(vals, order=(1,)), r"section 2 \(witness\): missing")
    bad(encode(vals).replace(b"wtns", b"zkey", 1), r"bad\.wtns: wrong magic")
    with pytest.raises(FormatError, match=r"version 1 not supported"):
        read_wtns(b"wtns" + struct.pack("<II", 1, 0), name="v1.wtns")
    data = encode(vals)
    for cut in range(len(data)):
        with pytest.raises(FormatError, match=r"^cut\.wtns"):
            read_wtns(data[:cut], name="cut.wtns")


def test_writer_rejects_unreduced(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="witness value 1 is >= r"):
        write_wtns(tmp_path / "x.wtns", [1, R_MOD])
    with pytest.raises(ValueError, match=r"expected an \(n, 4\) uint64 array"):
        wtns_bytes(np.zeros((3, 6), dtype=np.uint64))
    assert not list(tmp_path.iterdir())


def test_a_witness_file_is_read_not_mapped_and_one_cut_short_while_read_is_a_format_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A .wtns is copied into memory of its own whatever the reader: it is read (``pread``), never
    mapped, so a witness cut short in place while it is read (rewritten by its generator) is a
    FormatError naming it, where a mapping's page past the new end killed the prover with SIGBUS.
    The array is the read bytes themselves (writable, no second copy), aligned as a copy would be
    (the values start at byte 76 of the file; numba and the device copies want them aligned)."""
    import mmap

    from cuzk_mp.formats import binfile

    path = tmp_path / "w.wtns"
    write_wtns(path, [1, 2, 3, 4])

    def no_mapping(*args: object, **kwargs: object) -> None:
        raise AssertionError("the witness file was mapped")

    monkeypatch.setattr(mmap, "mmap", no_mapping)
    values = read_wtns(path)
    assert limbs_to_ints(values) == [1, 2, 3, 4] and values.flags.writeable
    assert values.flags.aligned and values.ctypes.data % 64 == 0
    real_open = binfile.open_regular

    def cut_after_open(p: object, shown: str) -> tuple[int, int]:
        fd, size = real_open(p, shown)  # type: ignore[arg-type]
        os.truncate(path, size - 40)  # the file shrinks between its size and its read
        return fd, size

    monkeypatch.setattr(binfile, "open_regular", cut_after_open)
    with pytest.raises(FormatError, match=r"w\.wtns: .*truncated while read"):
        read_wtns(path)
