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

Job states: ``queued`` (accepted and journaled; no partition finished yet; GetStatus shows
``running`` as soon as the engine has started one), ``running`` (at least one partition
finished), then one of ``done``, ``failed``, ``cancelled``. Partition states in replies:
``pending``, ``done``, ``failed``, ``cancelled`` (GetStatus adds the engine's live ones:
synthesizing, ready, proving).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

PriorityName = Literal["CRITICAL", "HIGH", "NORMAL", "LOW"]
JobState = Literal["queued", "running", "done", "failed", "cancelled"]
PartitionState = Literal["pending", "done", "failed", "cancelled"]


class PartitionIn(msgspec.Struct, forbid_unknown_fields=True):
    """One partition's input: ``json`` (circom input JSON bytes), ``wtns`` (.wtns bytes) or
    ``synthetic`` (a witness ``seed``)."""

    kind: Literal["json", "wtns", "synthetic"]
    data: bytes = b""
    seed: int = 0


class Message(msgspec.Struct, tag=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every message: ``id`` pairs a reply with its request."""

    id: int


class SubmitProof(Message):
    """Accept a job; returns at once with its id (the job is journaled before the reply)."""

    circuit_id: str
    partitions: list[PartitionIn]
    priority: PriorityName | None = None
    request_id: str = ""


class AwaitProof(Message):
    """Wait for a job to finish; ``timeout_s`` None waits without limit."""

    job_id: str
    timeout_s: float | None = None


class Prove(Message):
    """Submit and wait in one call."""

    circuit_id: str
    partitions: list[PartitionIn]
    priority: PriorityName | None = None
    request_id: str = ""
    timeout_s: float | None = None


class CancelProof(Message):
    """Cancel a job: queued partitions are dropped, running ones stop at the next boundary."""

    job_id: str


class GetStatus(Message):
    """The daemon's status document (the same JSON as HTTP /status)."""


class GetMetrics(Message):
    """Prometheus text (the same as HTTP /metrics)."""


class PreloadSRS(Message):
    """Load a circuit's proving key into the prover processes now."""

    circuit_id: str


class EvictSRS(Message):
    """Unload a circuit's proving key (refused while a queued or running job uses it)."""

    circuit_id: str


class GetVerificationKey(Message):
    """The circuit's verification key as snarkjs JSON."""

    circuit_id: str


Request = (SubmitProof | AwaitProof | Prove | CancelProof | GetStatus | GetMetrics | PreloadSRS
           | EvictSRS | GetVerificationKey)


class PartitionOut(msgspec.Struct, forbid_unknown_fields=True):
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


class JobReply(Message):
    """A job's state and, once finished, its partitions in order.

    ``timed_out`` is true when AwaitProof's timeout passed first: the job goes on, and
    ``state`` says where it is.
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


class VkReply(Message):
    """The verification key as snarkjs writes it (``verification_key.json``)."""

    circuit_id: str
    vk: dict[str, Any]


class ErrorReply(Message):
    """A request failed; ``kind`` is the error class name (cuzk_mp.errors) or InternalError."""

    kind: str
    message: str
    traceback_text: str = ""


Reply = (Submitted | JobReply | CancelReply | StatusReply | MetricsReply | PreloadReply
         | EvictReply | VkReply | ErrorReply)

_encoder = msgspec.msgpack.Encoder()
_request_decoder = msgspec.msgpack.Decoder(Request)
_reply_decoder = msgspec.msgpack.Decoder(Reply)

MAX_ERROR_TEXT = 4000


def encode(msg: Message) -> bytes:
    """The msgpack bytes of a message."""
    return _encoder.encode(msg)


def decode_request(data: bytes) -> Request:
    """Decode a request frame (msgspec.DecodeError / ValidationError if it is not one)."""
    return _request_decoder.decode(data)


def decode_reply(data: bytes) -> Reply:
    """Decode a reply frame."""
    return _reply_decoder.decode(data)


def salvage_id(data: bytes) -> int:
    """The ``id`` of a frame that failed to decode, if it has a readable one, else 0.

    Lets a pipelining client match the ErrorReply of a malformed request to its call.
    """
    try:
        obj = msgspec.msgpack.decode(data)
    except msgspec.DecodeError:
        return 0
    if isinstance(obj, dict) and isinstance(obj.get("id"), int) and 0 <= obj["id"] < 2**63:
        return int(obj["id"])
    return 0


def error_reply(id: int, kind: str, message: str, traceback_text: str = "") -> ErrorReply:
    """An ErrorReply with its texts truncated to a bounded size (dask error_message)."""
    return ErrorReply(id=id, kind=kind, message=message[:MAX_ERROR_TEXT],
                      traceback_text=traceback_text[-MAX_ERROR_TEXT:])
