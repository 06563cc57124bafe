"""Hostile inputs for the daemon (no tests here): wire frames and input JSON documents, in
families (depth, size, numbers, encodings, schema, truncation), each with the reply it must get,
``exchange`` and ``shm_inodes`` (tests/helpers.py) send them and watch /dev/shm.

Used by tests/test_daemon_hostile_wire.py against an in-process daemon and by
perf/hostile_probe.py against a live one, so both try the same things.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import msgspec

enc = msgspec.msgpack.encode


@dataclass(frozen=True)
class FrameProbe:
    """One hostile frame: ``body`` is sent framed (length prefix) unless ``raw``.

    The daemon must answer with an ErrorReply of ``kind`` carrying ``reply_id`` (0: it could not
    read one) and go on serving the connection, or, when ``closes``, close it (the rest of the
    stream cannot be trusted).
    """

    name: str
    family: str
    body: bytes
    kind: str = "InputError"
    reply_id: int = 0
    raw: bool = False
    closes: bool = False
    says: str = ""

    def wire(self) -> bytes:
        """The bytes to send."""
        return self.body if self.raw else struct.pack(">I", len(self.body)) + self.body


def _map(*pairs: tuple[object, object]) -> bytes:
    """A msgpack map built by hand, so its entries can be anything (even invalid msgpack)."""
    out = bytearray(b"\xdf" + struct.pack(">I", len(pairs)))
    for key, value in pairs:
        out += key if isinstance(key, bytes) else enc(key)
        out += value if isinstance(value, bytes) else enc(value)
    return bytes(out)


def _submit(**fields: object) -> dict[str, object]:
    base: dict[str, object] = {"type": "SubmitProof", "id": 11, "circuit_id": "syn",
                               "partitions": [{"kind": "synthetic", "seed": 1}]}
    base.update(fields)
    return base


def frame_probes(max_frame_bytes: int) -> list[FrameProbe]:
    """Every hostile frame, sized for a daemon with ``max_frame_bytes`` (>= 64 KiB)."""
    deep = b"\x91" * 100_000 + b"\xc0"
    budget = max_frame_bytes - 64
    many = budget - 16
    probes = [
        # depth
        FrameProbe("100k nested arrays, id first", "depth", _map(("id", 7), ("x", deep)), reply_id=7,
                   says="nested deeper"),
        FrameProbe("100k nested arrays before the id", "depth", _map(("x", deep), ("id", 8)),
                   says="nested deeper"),  # the id lies beyond the walk's budget: reply id 0
        FrameProbe("9-deep nesting before the id", "depth", _map(("x", b"\x91" * 9 + b"\xc0"), ("id", 6)),
                   reply_id=6, says="nested deeper"),
        FrameProbe("100k nested maps", "depth", _map(("id", 9), ("x", b"\x81\xa1k" * 100_000 + b"\xc0")),
                   reply_id=9, says="nested deeper"),
        FrameProbe("100k nested arrays at the top", "depth", deep, says="nested deeper"),
        FrameProbe("nesting inside a partition", "depth",
                   _map(("type", "SubmitProof"), ("id", 10), ("circuit_id", "syn"),
                        ("partitions", b"\x91" * 9 + b"\xc0")), reply_id=10, says="nested deeper"),
        # size
        FrameProbe("empty maps filling the frame", "size", _map(("id", 12), ("x", b"\xdd" + struct.pack(">I", many)
                                                                              + b"\x80" * many)),
                   reply_id=12, says="values in one request"),
        FrameProbe("empty arrays filling the frame", "size", _map(("id", 13), ("x", b"\xdd" + struct.pack(">I", many)
                                                                                + b"\x90" * many)),
                   reply_id=13, says="values in one request"),
        FrameProbe("an array claiming 2^32-1 items", "size", _map(("id", 14), ("x", b"\xdd\xff\xff\xff\xff")),
                   reply_id=14, says="truncated"),
        FrameProbe("a map claiming 2^32-1 entries", "size", b"\xdf\xff\xff\xff\xff", says="truncated"),
        FrameProbe("a string claiming 4 GiB", "size", _map(("id", 15), ("x", b"\xdb\xff\xff\xff\xff")),
                   reply_id=15, says="truncated"),
        FrameProbe("a bin claiming 4 GiB", "size", _map(("id", 16), ("x", b"\xc6\xff\xff\xff\xff")),
                   reply_id=16, says="truncated"),
        FrameProbe("1025 partitions", "size", enc(_submit(id=17, partitions=[{"kind": "synthetic"}] * 1025)),
                   reply_id=17, says="length <= 1024"),
        FrameProbe("a circuit id of 64 KiB", "size", enc(_submit(id=18, circuit_id="c" * 65536)), reply_id=18,
                   says="length <= 64"),
        FrameProbe("a job id of 1 MiB", "size", enc({"type": "AwaitProof", "id": 19, "job_id": "j" * min(
            2**20, budget - 100)}), reply_id=19, says="length <= 128"),
        FrameProbe("a token of 64 KiB", "size", enc({"type": "GetStatus", "id": 20, "token": "t" * 65536}),
                   reply_id=20, says="length <= 256"),
        FrameProbe("announced 4 GiB frame", "size", b"\xff\xff\xff\xffxx", raw=True, closes=True,
                   says="max_frame_bytes"),
        FrameProbe("announced one byte over the limit", "size", struct.pack(">I", max_frame_bytes + 1) + b"x",
                   raw=True, closes=True, says="max_frame_bytes"),
        # numbers
        FrameProbe("seed 2^64-1", "numbers", enc(_submit(id=21, partitions=[{"kind": "synthetic",
                                                                                "seed": 2**64 - 1}])),
                   reply_id=21, says="seed"),
        FrameProbe("seed -1", "numbers", enc(_submit(id=22, partitions=[{"kind": "synthetic", "seed": -1}])),
                   reply_id=22, says="seed"),
        FrameProbe("timeout NaN", "numbers", enc({"type": "AwaitProof", "id": 23, "job_id": "x",
                                                  "timeout_s": float("nan")}), reply_id=23, says="timeout_s"),
        FrameProbe("timeout +inf", "numbers", enc({"type": "AwaitProof", "id": 24, "job_id": "x",
                                                   "timeout_s": float("inf")}), reply_id=24, says="timeout_s"),
        FrameProbe("timeout 1e300", "numbers", enc({"type": "Prove", "id": 25, "circuit_id": "syn",
                                                    "partitions": [{"kind": "synthetic"}], "timeout_s": 1e300}),
                   reply_id=25, says="timeout_s"),
        FrameProbe("timeout -1", "numbers", enc({"type": "AwaitProof", "id": 26, "job_id": "x", "timeout_s": -1.0}),
                   reply_id=26, says="timeout_s"),
        FrameProbe("id 2^64-1", "numbers", enc({"type": "GetStatus", "id": 2**64 - 1, "detail": "yes"}),
                   reply_id=0, says="detail"),
        FrameProbe("id negative", "numbers", enc({"type": "GetStatus", "id": -5, "detail": 3}), says="detail"),
        FrameProbe("id a float", "numbers", enc({"type": "GetStatus", "id": 1.5}), says="id"),
        FrameProbe("id a string", "numbers", enc({"type": "GetStatus", "id": "27"}), says="id"),
        FrameProbe("priority 99", "numbers", enc(_submit(id=28, priority=99)), reply_id=28, says="priority"),
        FrameProbe("float64 NaN where a string goes", "numbers", enc(_submit(id=29, circuit_id=float("nan"))),
                   reply_id=29, says="circuit_id"),
        # encodings
        FrameProbe("invalid UTF-8 in a string", "encodings",
                   _map(("type", "CancelProof"), ("id", 30), ("job_id", b"\xa4\xff\xfe\xfd\xfc")),
                   reply_id=30, says="UTF-8"),
        FrameProbe("a lone surrogate (CESU) in a string", "encodings",
                   _map(("type", "CancelProof"), ("id", 31), ("job_id", b"\xa3\xed\xa0\x80")),
                   reply_id=31, says="UTF-8"),
        FrameProbe("the never-used type byte 0xc1", "encodings", _map(("id", 32), ("x", b"\xc1")), reply_id=32,
                   says="0xc1"),
        FrameProbe("an ext value", "encodings", _map(("type", "GetStatus"), ("id", 33), ("detail", b"\xd4\x05\x00")),
                   reply_id=33, says="detail"),
        FrameProbe("a timestamp ext", "encodings",
                   _map(("type", "GetStatus"), ("id", 34), ("detail", b"\xd6\xff\x00\x00\x00\x01")),
                   reply_id=34, says="detail"),
        FrameProbe("bytes where the type tag goes", "encodings", _map(("type", b"\xc4\x03abc"), ("id", 35)),
                   reply_id=35),
        FrameProbe("an unknown request type", "encodings", enc({"type": "Shutdown", "id": 36}), reply_id=36,
                   says="Shutdown"),
        FrameProbe("an empty frame", "encodings", b"", says="truncated"),
        FrameProbe("JSON instead of msgpack", "encodings", b'{"type": "GetStatus", "id": 1}'),
        FrameProbe("bytes after the message", "encodings", enc({"type": "GetStatus", "id": 37}) + b"\x00",
                   reply_id=37, says="after the message"),
        # schema
        FrameProbe("missing required fields", "schema", enc({"type": "SubmitProof", "id": 38}), reply_id=38,
                   says="circuit_id"),
        FrameProbe("an unknown field", "schema", enc({"type": "GetStatus", "id": 39, "admin": True}), reply_id=39,
                   says="admin"),
        FrameProbe("a partition of an unknown kind", "schema",
                   enc(_submit(id=40, partitions=[{"kind": "exec", "data": b"rm -rf /"}])), reply_id=40,
                   says="kind"),
        FrameProbe("partitions a map", "schema", enc(_submit(id=41, partitions={"a": 1})), reply_id=41,
                   says="partitions"),
        FrameProbe("a map key that is not a string", "schema", _map((5, 6), ("id", 42)), reply_id=42),
        # truncation
        FrameProbe("msgpack cut mid-map", "truncation", enc(_submit(id=43))[:-5], reply_id=43, says="truncated"),
        FrameProbe("msgpack cut mid-string", "truncation", enc({"type": "GetStatus", "id": 44})[:-3],
                   says="truncated"),
    ]
    return probes


# Input JSON documents (a json partition's data) the daemon must refuse at submit with an
# InputError naming the partition: (name, family, data, what the message says).
INPUT_JSON_PROBES: list[tuple[str, str, bytes, str]] = [
    ("5000-digit integer", "numbers", b'{"a": ' + b"9" * 5000 + b"}", "number of 5000 characters"),
    ("5000-digit string", "numbers", b'{"a": "' + b"9" * 5000 + b'"}', "5000 characters"),
    ("1e400", "numbers", b'{"a": 1e400}', "range of a JavaScript number"),
    ("NaN", "numbers", b'{"a": NaN}', "NaN"),
    ("-Infinity", "numbers", b'{"a": [-Infinity]}', "Infinity"),
    ("2^70 unquoted", "numbers", b'{"a": 1180591620717411303425}', "write it as a decimal string"),
    ("nesting 100,000 deep", "depth", b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested 100001 deep"),
    ("objects nesting 50,000 deep", "depth", b'{"a": ' + b'{"b": ' * 50_000 + b"1" + b"}" * 50_001,
     "nested 50001 deep"),
    ("invalid UTF-8", "encodings", b'{"a": "\xff\xfe"}', "not UTF-8"),
    ("UTF-16", "encodings", '{"a": 1}'.encode("utf-16"), "not UTF-8"),
    ("lone surrogate in a name", "encodings", b'{"\\ud800": 1}', "not valid Unicode"),
    ("null value", "schema", b'{"a": null}', "not null"),
    ("object value", "schema", b'{"a": {"b": 1}}', "not an object"),
    ("array at top level", "schema", b"[1, 2]", "JSON object"),
    ("truncated", "truncation", b'{"a": [1, 2', "not valid JSON"),
    ("empty", "truncation", b"", "not valid JSON"),
]

