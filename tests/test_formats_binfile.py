"""Tests for cuzk_mp.formats.binfile: the iden3 container, its reader and streaming writer.

The oracle is a plain ``struct``-based encoder written here, independent of
the module under test.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest

from cuzk_mp.errors import FormatError, InputError
from cuzk_mp.formats.binfile import BinFile, read_sections, write_binfile

SEED = 20261130


def encode(magic: bytes, version: int, sections: list[tuple[int, bytes]]) -> bytes:
    """Reference encoding of a binfile."""
    out = magic + struct.pack("<II", version, len(sections))
    for sid, payload in sections:
        out += struct.pack("<IQ", sid, len(payload)) + payload
    return out


def sample_sections() -> list[tuple[int, bytes]]:
    rng = np.random.default_rng(SEED)
    return [(1, rng.bytes(4)), (2, rng.bytes(100)), (3, b""), (7, rng.bytes(8 * 30))]


def test_writer_matches_reference_for_every_payload_kind(tmp_path: Path) -> None:
    print("seed", SEED)
    rng = np.random.default_rng(SEED)
    arr = rng.integers(0, 2**64, (10, 12), dtype=np.uint64)
    strided = arr[:, ::2]  # not contiguous: written row-chunk by row-chunk
    structured = np.zeros(3, dtype=[("a", "<u4"), ("b", "<u8", (4,))])
    structured["a"] = [1, 2, 3]
    structured["b"] = rng.integers(0, 2**64, (3, 4), dtype=np.uint64)
    big_endian = arr[:2].astype(">u8")
    payloads = [
        (1, b"abcd"),
        (2, memoryview(b"xyz")),
        (3, arr),
        (4, [arr[:3], b"--", memoryview(arr[3:].tobytes())]),
        (5, (chunk for chunk in (b"gen", b"erator"))),
        (6, strided),
        (7, structured),
        (8, big_endian),
        (9, []),
    ]
    path = tmp_path / "x.bin"
    write_binfile(path, "test", 3, payloads)
    expected = encode(b"test", 3, [
        (1, b"abcd"), (2, b"xyz"), (3, arr.tobytes()), (4, arr[:3].tobytes() + b"--" + arr[3:].tobytes()),
        (5, b"generator"), (6, np.ascontiguousarray(strided).tobytes()), (7, structured.tobytes()),
        (8, arr[:2].tobytes()), (9, b""),
    ])
    assert path.read_bytes() == expected
    assert not list(tmp_path.glob(".cuzk-mp-*"))  # no temporary left


def test_read_back_any_section_order(tmp_path: Path) -> None:
    sections = sample_sections()
    for order in ([0, 1, 2, 3], [3, 1, 0, 2], [2, 3, 1, 0]):
        data = encode(b"zkey", 1, [sections[i] for i in order])
        path = tmp_path / "f.zkey"
        path.write_bytes(data)
        for bf in (BinFile.open(path, "zkey", (1,)), BinFile.from_bytes(data, "mem.zkey", "zkey", (1,))):
            with bf:
                assert bf.version == 1
                assert bf.section_ids == tuple(sections[i][0] for i in order)
                for sid, payload in sections:
                    assert bf.has(sid)
                    assert bytes(bf.section(sid)) == payload
                    assert bf.section_size(sid) == len(payload)
                assert not bf.has(4)
                arr = bf.section_array(7, "<u8", (30,))
                assert arr.tobytes() == sections[3][1]
                assert not arr.flags.writeable and not arr.flags.owndata


def test_views_are_read_only_and_zero_copy() -> None:
    data = bytearray(encode(b"wtns", 2, [(1, bytes(range(16)))]))
    bf = BinFile.from_bytes(data, "mem", "wtns", (2,))
    arr = bf.section_array(1, "<u8", (2,))
    view = bf.section(1)
    assert view.readonly and not arr.flags.writeable
    with pytest.raises(ValueError):
        arr[0] = 1
    data[24] = 0xFF  # the payload's first byte: views see the same memory
    assert arr[0] & 0xFF == 0xFF and view[0] == 0xFF


def test_views_survive_close(tmp_path: Path) -> None:
    path = tmp_path / "f.zkey"
    path.write_bytes(encode(b"zkey", 1, sample_sections()))
    bf = BinFile.open(path, "zkey", (1,))
    arr = bf.section_array(7, "<u8", (30,))
    expected = sample_sections()[3][1]
    bf.close()
    assert arr.tobytes() == expected
    with BinFile.open(path, "zkey", (1,)) as bf2:
        assert bf2.has(2)


def test_section_array_offset_and_size_mismatch() -> None:
    bf = BinFile.from_bytes(encode(b"zkey", 1, [(4, bytes(4 + 16))]), "k.zkey", "zkey", (1,), labels={4: "coefs"})
    assert bf.section_array(4, "<u8", (2,), offset=4).shape == (2,)
    with pytest.raises(FormatError, match=r"k\.zkey, section 4 \(coefs\): size is 20 bytes, expected 28"):
        bf.section_array(4, "<u8", (3,), offset=4)


def expect_error(data: bytes, pattern: str, versions: tuple[int, ...] = (1,)) -> None:
    with pytest.raises(FormatError, match=pattern):
        BinFile.from_bytes(data, "bad.zkey", "zkey", versions)


def test_header_errors() -> None:
    good = encode(b"zkey", 1, sample_sections())
    for cut in range(12):
        expect_error(good[:cut], rf"bad\.zkey: truncated header: file is {cut} bytes")
    expect_error(b"ptau" + good[4:], r"bad\.zkey: wrong magic b'ptau': not a \.zkey file")
    expect_error(good, r"version 1 not supported \(expected 2 or 3\)", versions=(2, 3))


def test_every_truncation_is_an_error() -> None:
    sections = sample_sections()
    good = encode(b"zkey", 1, sections)
    BinFile.from_bytes(good, "ok", "zkey", (1,))
    boundaries, pos = [], 12
    for _, payload in sections:
        boundaries.append(pos)
        pos += 12 + len(payload)
    for cut in range(12, len(good)):
        with pytest.raises(FormatError, match=r"bad\.zkey.*truncated") as info:
            BinFile.from_bytes(good[:cut], "bad.zkey", "zkey", (1,))
        if cut in boundaries:  # a whole section table entry is missing
            assert "section table" in str(info.value)


def test_truncated_section_names_the_section() -> None:
    good = encode(b"zkey", 1, [(1, b"abcd"), (9, bytes(40))])
    expect_error(good[:-1], r"bad\.zkey, section 9: truncated: 40 bytes declared at byte \d+, only 39 left")


def test_size_past_eof_trailing_garbage_duplicates() -> None:
    huge = b"zkey" + struct.pack("<II", 1, 1) + struct.pack("<IQ", 2, 2**63) + b"abc"
    expect_error(huge, r"section 2: truncated")
    expect_error(encode(b"zkey", 1, sample_sections()) + b"\0", r"bad\.zkey: 1 bytes of trailing garbage")
    expect_error(encode(b"zkey", 1, [(2, b"a"), (3, b""), (2, b"b")]), r"bad\.zkey, section 2: duplicated")
    many = b"zkey" + struct.pack("<II", 1, 2**32 - 1)
    expect_error(many, r"entry 1 of 4294967295 of the section table")


def test_missing_section() -> None:
    bf = BinFile.from_bytes(encode(b"r1cs", 1, [(1, b"")]), "c.r1cs", "r1cs", (1,), labels={2: "constraints"})
    with pytest.raises(FormatError, match=r"c\.r1cs, section 2 \(constraints\): missing"):
        bf.section(2)


def test_unreadable_path_is_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="nope.zkey: cannot read"):
        BinFile.open(tmp_path / "nope.zkey", "zkey", (1,))
    empty = tmp_path / "empty.zkey"
    empty.write_bytes(b"")
    with pytest.raises(FormatError, match="empty.zkey: truncated header: file is 0 bytes"):
        BinFile.open(empty, "zkey", (1,))


def test_failed_write_leaves_nothing(tmp_path: Path) -> None:
    def broken():  # type: ignore[no-untyped-def]
        yield b"first"
        raise RuntimeError("producer failed")

    path = tmp_path / "out.zkey"
    with pytest.raises(RuntimeError, match="producer failed"):
        write_binfile(path, "zkey", 1, [(1, b"x"), (2, broken())])
    assert list(tmp_path.iterdir()) == []


def test_read_sections_reads_without_a_mapping_and_checks_as_open(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "k.zkey"
    path.write_bytes(encode(b"zkey", 1, sample_sections()))
    got = read_sections(path, "zkey", (1,), [7, 2])
    assert got == {7: dict(sample_sections())[7], 2: dict(sample_sections())[2]}
    with pytest.raises(FormatError, match=r"k\.zkey, section 9 \(nine\): missing"):
        read_sections(path, "zkey", (1,), [9], labels={9: "nine"})
    path.write_bytes(encode(b"zkey", 1, sample_sections())[:-1])
    with pytest.raises(FormatError, match=r"k\.zkey, section 7: truncated"):
        read_sections(path, "zkey", (1,), [2])
    with pytest.raises(InputError, match="nope.zkey: cannot read"):
        read_sections(tmp_path / "nope.zkey", "zkey", (1,), [2])
    # a file that shrinks after its size was read: the short read is a truncation, never a crash
    path.write_bytes(encode(b"zkey", 1, sample_sections()))
    real_fstat, whole = os.fstat, path.stat().st_size

    def shrinking_fstat(fd: int) -> os.stat_result:
        st = real_fstat(fd)
        os.truncate(path, 40)
        return os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, st.st_uid, st.st_gid, whole,
                               st.st_atime, st.st_mtime, st.st_ctime))

    monkeypatch.setattr(os, "fstat", shrinking_fstat)
    with pytest.raises(FormatError, match=r"k\.zkey.*truncated while read"):
        read_sections(path, "zkey", (1,), [7])


KEY_TRUNCATED_UNDER_A_MAPPING = """
import mmap, os, sys
from cuzk_mp.groth16.circuit_data_file import zkey_identity
path = sys.argv[1]
real = mmap.mmap
def mapped_then_truncated(*args, **kwargs):
    m = real(*args, **kwargs)
    os.truncate(path, 4096)  # the key is copied over in place right after it was mapped
    return m
mmap.mmap = mapped_then_truncated
try:
    zkey_identity(path)
except Exception as exc:
    print(type(exc).__name__, exc)
"""


def test_a_key_identity_survives_the_key_truncated_under_it(tmp_path: Path) -> None:
    """A daemon takes a key's identity for every job: a key copied over in place meanwhile must give
    an error (or the new file's identity), never SIGBUS, which would take the daemon down."""
    import subprocess
    import sys

    from tests.helpers import REPO

    key = tmp_path / "k.zkey"  # the header section's entry lies in the page past the one the truncation leaves
    key.write_bytes(encode(b"zkey", 1, [(1, bytes(5000)), (2, bytes(64)), (3, bytes(64))]))
    proc = subprocess.run([sys.executable, "-c", KEY_TRUNCATED_UNDER_A_MAPPING, str(key)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"died with {proc.returncode}: {proc.stderr[-500:]}"


def test_a_file_of_another_kind_is_named_for_what_it_is() -> None:
    good = encode(b"zkey", 1, sample_sections())
    expect_error(b"wtns" + good[4:], r"bad\.zkey: wrong magic b'wtns': not a \.zkey file but a \.wtns file")
    expect_error(b"\0asm" + good[4:], r"not a \.zkey file but a \.wasm file")
    expect_error(b'{"pi_a": ["1", "2"]}', r"not a \.zkey file but JSON text")
