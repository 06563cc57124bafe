"""The wire protocol: every request and reply of the daemon as a msgspec Struct.

This module owns the message types and their msgpack encoding, nothing else (no sockets, no
engine). Requests and replies are ``tag=True`` unions decoded by typed Decoders, so a frame that
is not one of them is rejected at the door (msgspec's kv example). Every message carries ``id``,
chosen by the client and echoed in the reply, so a client may pipeline many requests on one
connection and match replies by id; ``request_id`` on SubmitProof/Prove is something else, the
caller's idempotency key for the *job* (a repeat returns the existing job; cuzk ignored it).

The calls mirror cuzk's gRPC service (reference/cuzk.md section 1.1), all implemented for real:

=================  ==========================================  =========================
request            what it does                                reply
=================  ==========================================  =========================
SubmitProof        accept (journaled first) and queue a job    Submitted
AwaitProof         wait for a job, up to ``timeout_s``         JobReply (timed_out flag)
Prove              SubmitProof + AwaitProof                    JobReply
CancelProof        drop queued partitions, stop running ones   CancelReply
GetStatus          the /status document                        StatusReply
GetMetrics         Prometheus text                             MetricsReply
PreloadSRS         load a circuit's key into the provers       PreloadReply
EvictSRS           unload it (refused while a job uses it)     EvictReply
GetVerificationKey the circuit's snarkjs verification key      VkReply
=================  ==========================================  =========================

Any request may instead get ``ErrorReply{kind, message}``: errors are data, ``kind`` is the
class name from :mod:`cuzk_mp.errors` so the client re-raises the same type.

Large integers (proof coordinates, public signals) travel as decimal strings, exactly as in
snarkjs JSON, because msgpack integers stop at 64 bits.

Hostile frames. :func:`decode_request` first walks the frame's msgpack structure without
building anything (:func:`scan_frame`: at most ``MAX_REQUEST_DEPTH`` deep and ``MAX_REQUEST_ITEMS``
values, a bounded loop that also reads the top-level ``id`` so the ErrorReply reaches the right
call), then decodes it with the typed schema, whose fields carry their own limits (string
lengths, at most ``MAX_PARTITIONS`` partitions, timeouts in ``0..MAX_TIMEOUT_S``). Whatever it
refuses is a :class:`MalformedRequest` (an InputError) carrying that id; memory stays within a
small multiple of the frame, which the transport has already bounded. An ErrorReply with id 0
answers a frame whose id could not be read (the connection goes on serving). A frame the stream
cannot recover from (too large, or not complete within the deadline) is answered with
``closing`` set, and with the id its first bytes carry where they carry one (a frame over the
limit): the daemon answers the requests it read before it, then closes the connection, and the
client fails only that call with the refusal (the calls sent after it were never read).

Every request carries ``token``, the client's shared secret when the daemon requires one
(see :mod:`cuzk_mp.daemon.access`); it is never echoed back.

Job states: ``queued`` (accepted and journaled; no partition finished yet; GetStatus shows
``running`` as soon as the engine has started one), ``running`` (at least one partition
finished), then one of ``done``, ``failed``, ``cancelled``. Partition states in replies:
``pending``, ``done``, ``failed``, ``cancelled`` (GetStatus adds the engine's live ones:
synthesizing, ready, proving).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from cuzk_mp.errors import InputError
from cuzk_mp.pipeline.types import MAX_PARTITIONS, MAX_SEED

PriorityName = Literal["CRITICAL", "HIGH", "NORMAL", "LOW"]
JobState = Literal["queued", "running", "done", "failed", "cancelled"]
PartitionState = Literal["pending", "done", "failed", "cancelled"]

# What a finished job's JobReply needs at least: a done partition with its proof, one public
# signal and its timings encodes to ~1.3 KB (each further public signal adds ~80 B).
JOB_REPLY_BASE_BYTES = 1024
PARTITION_REPLY_BYTES = 1400
MAX_ID_CHARS = 128  # job_id and request_id
MAX_TOKEN_CHARS = 256
MAX_TIMEOUT_S = 1e7  # about 115 days: longer waits are a mistake, not a plan
MAX_REQUEST_DEPTH = 8  # the deepest request nests 3 (message, partitions, partition)
MAX_REQUEST_ITEMS = 65536  # values in one request (a 1024-partition submit has ~7200)

CircuitId = Annotated[str, msgspec.Meta(max_length=64)]
JobId = Annotated[str, msgspec.Meta(max_length=MAX_ID_CHARS)]
Timeout = Annotated[float, msgspec.Meta(ge=0, le=MAX_TIMEOUT_S)]


def job_reply_bytes(partitions: int) -> int:
    """The least a finished job of ``partitions`` partitions takes in its reply frame (its proofs)."""
    return JOB_REPLY_BASE_BYTES + partitions * PARTITION_REPLY_BYTES


def max_job_partitions(frame_bytes: int) -> int:
    """The most partitions a job may have for its reply to fit a frame of ``frame_bytes`` (0: none)."""
    return max((frame_bytes - JOB_REPLY_BASE_BYTES) // PARTITION_REPLY_BYTES, 0)


class PartitionIn(msgspec.Struct, forbid_unknown_fields=True):
    """One partition's input: ``json`` (circom input JSON bytes), ``wtns`` (.wtns bytes) or
    ``synthetic`` (a witness ``seed``)."""

    kind: Literal["json", "wtns", "synthetic"]
    data: bytes = b""
    seed: Annotated[int, msgspec.Meta(ge=0, le=MAX_SEED)] = 0


Partitions = Annotated[list[PartitionIn], msgspec.Meta(max_length=MAX_PARTITIONS)]


class Message(msgspec.Struct, tag=True, kw_only=True):
    """Base of every message: ``id`` pairs a reply with its request.

    Versions: a request is decoded strictly (an unknown field is a MalformedRequest: the daemon acts
    on nothing it does not understand), a reply leniently (fields a newer daemon adds, such as
    ``JobReply.key_digest``, are ignored by an older client; a job's stored reply is read by the
    boxes of a fleet whatever their version). Fields are only ever added, with defaults, and a reply
    that gained one leaves out the fields at their default (``omit_defaults``), so a client of a
    version that still refused unknown reply fields reads every such reply that does not need it."""

    id: int


class Call(Message, kw_only=True, forbid_unknown_fields=True):
    """Base of every request: ``token`` is the client's shared secret ("" when none is needed).

    Every request is ``kw_only``, so its ``id`` comes first in its encoding (after the type tag): a
    daemon names a request whose frame it refuses unread (over max_frame_bytes) from the first bytes."""

    token: Annotated[str, msgspec.Meta(max_length=MAX_TOKEN_CHARS)] = ""


class SubmitProof(Call, kw_only=True):
    """Accept a job; returns at once with its id (the job is journaled before the reply)."""

    circuit_id: CircuitId
    partitions: Partitions
    priority: PriorityName | None = None
    request_id: JobId = ""


class AwaitProof(Call, kw_only=True):
    """Wait for a job to finish; ``timeout_s`` None waits without limit."""

    job_id: JobId
    timeout_s: Timeout | None = None


class Prove(Call, kw_only=True):
    """Submit and wait in one call."""

    circuit_id: CircuitId
    partitions: Partitions
    priority: PriorityName | None = None
    request_id: JobId = ""
    timeout_s: Timeout | None = None


class CancelProof(Call, kw_only=True):
    """Cancel a job: queued partitions are dropped, running ones stop at the next boundary."""

    job_id: JobId


class GetStatus(Call, kw_only=True):
    """The daemon's status document (the same JSON as HTTP /status); ``detail`` adds paths and
    process ids (for an admin token only, when the daemon requires tokens)."""

    detail: bool = False


class GetMetrics(Call, kw_only=True):
    """Prometheus text (the same as HTTP /metrics)."""


class PreloadSRS(Call, kw_only=True):
    """Load a circuit's proving key into the prover processes now."""

    circuit_id: CircuitId


class EvictSRS(Call, kw_only=True):
    """Unload a circuit's proving key (refused while a queued or running job uses it)."""

    circuit_id: CircuitId


class GetVerificationKey(Call, kw_only=True):
    """The circuit's verification key as snarkjs JSON."""

    circuit_id: CircuitId


Request = (SubmitProof | AwaitProof | Prove | CancelProof | GetStatus | GetMetrics | PreloadSRS
           | EvictSRS | GetVerificationKey)


class PartitionOut(msgspec.Struct):
    """One partition of a job: its proof (snarkjs JSON) and public signals once done."""

    index: int
    state: PartitionState
    proof: dict[str, Any] | None = None
    public: list[str] = []
    timings: dict[str, float] = {}
    device: int | None = None
    attempts: int = 0
    error: str | None = None
    error_kind: str | None = None


class Submitted(Message):
    """A job was accepted (``duplicate``: the request_id was known and this is that job)."""

    job_id: str
    state: JobState
    duplicate: bool = False


class JobReply(Message, omit_defaults=True):
    """A job's state and, once finished, its partitions in order.

    ``key_digest`` names the key a done job's proofs were made with (the hex digest of its zkey's
    header; None for a generated key, or a job that did not end done): a vk verifies them where its
    VkReply has the same ``key_digest``. The two differ only where the circuit's key file was
    replaced after the job was proved.

    ``timed_out`` is true when AwaitProof's timeout passed first: the job goes on, and
    ``state`` says where it is.

    ``failed_on`` names, for a job of a fleet, the boxes where a run of it failed or stopped renewing
    its claim, first first (empty for a job that never failed, and on a daemon alone; left out then).
    """

    job_id: str
    circuit_id: str
    state: JobState
    priority: PriorityName
    partitions: list[PartitionOut]
    submitted_at: float
    started_at: float | None = None
    finished_at: float | None = None
    error: str | None = None
    error_kind: str | None = None
    timed_out: bool = False
    key_digest: str | None = None  # the key file the proofs were made with (see above)
    failed_on: list[str] = []  # a fleet job's boxes its failed runs ran on (see above)


class CancelReply(Message):
    """``cancelled``: the engine dropped or is stopping the job; false if it had already ended."""

    job_id: str
    cancelled: bool
    state: JobState


class StatusReply(Message):
    """The status document (JSON-able)."""

    status: dict[str, Any]


class MetricsReply(Message):
    """Prometheus text exposition format."""

    text: str


class PreloadReply(Message):
    """The key is resident; ``seconds`` is how long the call took."""

    circuit_id: str
    seconds: float


class EvictReply(Message):
    """``evicted`` false means a queued or running job still uses the key (nothing was done)."""

    circuit_id: str
    evicted: bool
    reason: str = ""


class VkReply(Message, omit_defaults=True):
    """The verification key as snarkjs writes it (``verification_key.json``); ``key_digest``: the key
    file it was read from (JobReply's), None for a generated key."""

    circuit_id: str
    vk: dict[str, Any]
    key_digest: str | None = None


class ErrorReply(Message, omit_defaults=True):
    """A request failed; ``kind`` is the error class name (cuzk_mp.errors) or InternalError.

    ``closing``: the daemon reads nothing more on this connection (the refused frame was not read
    whole, so where the next one starts is unknown). It answers the requests it read before, then
    closes; a client fails the calls it sent after this one at once: the daemon never saw them."""

    kind: str
    message: str
    traceback_text: str = ""
    closing: bool = False


Reply = (Submitted | JobReply | CancelReply | StatusReply | MetricsReply | PreloadReply
         | EvictReply | VkReply | ErrorReply)

_encoder = msgspec.msgpack.Encoder()
_request_decoder = msgspec.msgpack.Decoder(Request)
_reply_decoder = msgspec.msgpack.Decoder(Reply)

MAX_ERROR_TEXT = 4000


class MalformedRequest(InputError):
    """A frame that is not a valid request; ``request_id`` is its readable ``id`` (else 0)."""

    def __init__(self, message: str, request_id: int) -> None:
        super().__init__(message)
        self.request_id = request_id


def encode(msg: Message) -> bytes:
    """The msgpack bytes of a message."""
    return _encoder.encode(msg)


_stored_reply_decoder = msgspec.msgpack.Decoder(JobReply)


def stored_reply(reply: JobReply) -> tuple[bytes, str | None]:
    """A finished job's reply as the journal and the fleet's database keep it: the msgpack of the
    reply without ``key_digest``, and the ``key_digest`` apart (a column of its own).

    Why apart: the releases before ``key_digest`` decode a stored reply strictly, so one stored with
    it is unreadable to them: a daemon rolled back to such a release quarantined every done job of
    its journal, and such a box of a fleet could not answer for a job a newer box proved. Stored
    apart, every release reads the reply, and :func:`reply_from_store` puts the digest back."""
    return _encoder.encode(msgspec.structs.replace(reply, key_digest=None)), reply.key_digest


def reply_from_store(data: bytes, key_digest: str | None) -> JobReply:
    """The reply :func:`stored_reply` kept (also one stored whole, with its ``key_digest`` inside,
    as releases before the column did); msgspec's errors for bytes that are not one."""
    reply = _stored_reply_decoder.decode(data)
    return reply if key_digest is None else msgspec.structs.replace(reply, key_digest=key_digest)


def decode_request(data: bytes) -> Request:
    """Decode a request frame within the limits above (MalformedRequest if it is not one)."""
    request_id, problem = scan_frame(data, MAX_REQUEST_DEPTH, MAX_REQUEST_ITEMS)
    if problem is not None:
        raise MalformedRequest(f"malformed request: {problem}", request_id)
    try:
        return _request_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise MalformedRequest(f"malformed request: {e}", request_id) from None


def decode_reply(data: bytes) -> Reply:
    """Decode a reply frame (msgspec errors, or RecursionError for a hostile nesting)."""
    return _reply_decoder.decode(data)


# msgpack type bytes -> (bytes of a length or value field, what follows): "int" a value of that
# many bytes, "raw" that many payload bytes, "ext" payload plus a type byte, "array"/"map" items.
_HEADS: dict[int, tuple[int, str]] = {
    0xC4: (1, "raw"), 0xC5: (2, "raw"), 0xC6: (4, "raw"),
    0xC7: (1, "ext"), 0xC8: (2, "ext"), 0xC9: (4, "ext"),
    0xCA: (4, "skip"), 0xCB: (8, "skip"),
    0xCC: (1, "uint"), 0xCD: (2, "uint"), 0xCE: (4, "uint"), 0xCF: (8, "uint"),
    0xD0: (1, "sint"), 0xD1: (2, "sint"), 0xD2: (4, "sint"), 0xD3: (8, "sint"),
    0xD4: (2, "skip"), 0xD5: (3, "skip"), 0xD6: (5, "skip"), 0xD7: (9, "skip"), 0xD8: (17, "skip"),
    0xD9: (1, "str"), 0xDA: (2, "str"), 0xDB: (4, "str"),
    0xDC: (2, "array"), 0xDD: (4, "array"), 0xDE: (2, "map"), 0xDF: (4, "map"),
}


def scan_frame(data: bytes, max_depth: int, max_items: int) -> tuple[int, str | None]:
    """Walk a msgpack frame's structure without decoding it: (id, problem).

    ``id`` is the top-level map's integer ``id`` (0 if it has none readable); ``problem`` says
    why the frame is refused (nesting deeper than ``max_depth``, more than ``max_items`` values,
    truncated, an invalid type byte, bytes after the message), None if the structure is
    acceptable. The walk goes on past a nesting too deep, to find an ``id`` that follows it. The
    loop runs at most ``max_items`` times, copies nothing and holds one counter per open
    container, so its cost is bounded whatever the frame claims.
    """
    n, pos, items = len(data), 0, 0
    left: list[int] = []  # values still to read in each open container
    request_id, key_is_id, top_index = 0, False, 0
    too_deep: str | None = None
    while True:
        if pos >= n:
            return request_id, too_deep or "truncated msgpack"
        items += 1
        if items > max_items:
            return request_id, too_deep or f"more than {max_items} values in one request"
        b = data[pos]
        pos += 1
        number: int | None = None
        text_at, text_len = -1, 0
        children = -1  # >= 0: a container with that many values
        if b <= 0x7F or b >= 0xE0:
            number = b if b <= 0x7F else b - 0x100
        elif b <= 0x8F:
            children = 2 * (b & 0x0F)
        elif b <= 0x9F:
            children = b & 0x0F
        elif b <= 0xBF:
            text_at, text_len = pos, b & 0x1F
            pos += text_len
        elif b in _HEADS:
            size, what = _HEADS[b]
            if pos + size > n:
                return request_id, "truncated msgpack"
            if what == "skip":
                pos += size
            else:
                field = int.from_bytes(data[pos:pos + size], "big", signed=what == "sint")
                pos += size
                if what in ("uint", "sint"):
                    number = field
                elif what == "str":
                    text_at, text_len = pos, field
                    pos += field
                elif what in ("raw", "ext"):
                    pos += field + (what == "ext")
                else:
                    children = field * (2 if what == "map" else 1)
        elif b not in (0xC0, 0xC2, 0xC3):
            return request_id, too_deep or f"invalid msgpack type byte 0x{b:02x}"
        if pos > n:
            return request_id, too_deep or "truncated msgpack"
        if len(left) == 1:  # an entry of the top-level map: remember the value of key "id"
            if top_index % 2 == 0:
                key_is_id = text_len == 2 and data[text_at:text_at + 2] == b"id"
            elif key_is_id and number is not None and 0 <= number < 2**63:
                request_id = number
            top_index += 1
        if left:
            left[-1] -= 1
        if children >= 0:
            if len(left) >= max_depth:
                too_deep = too_deep or f"nested deeper than {max_depth}"
            left.append(children)
        while left and left[-1] == 0:
            left.pop()
        if not left:
            return request_id, too_deep or (f"{n - pos} bytes after the message" if pos < n else None)


def encodable_text(s: str) -> str:
    """``s`` as text UTF-8 can carry, for msgpack or a database (lone surrogates escaped)."""
    return s if s.isascii() else s.encode("utf-8", "backslashreplace").decode("utf-8")


def error_reply(id: int, kind: str, message: str, traceback_text: str = "", *, closing: bool = False) -> ErrorReply:
    """An ErrorReply with its texts truncated to a bounded size (dask error_message) and made
    encodable whatever they quote."""
    return ErrorReply(id=id, kind=kind, message=encodable_text(message[:MAX_ERROR_TEXT]),
                      traceback_text=encodable_text(traceback_text[-MAX_ERROR_TEXT:]), closing=closing)
