"""Messages between the engine and its child processes (msgpack frames over multiprocessing pipes).

Owns the wire types only. Every message is a tagged ``msgspec.Struct``; each
direction has one union and one typed decoder, so a malformed frame fails
loudly instead of becoming a ``KeyError`` later. Errors travel as data
(``TaskFailed.kind`` + message + traceback text, see :mod:`cuzk_mp.errors`),
never pickled. Bulk arrays never travel here: they go through the ring; the
small :class:`SegmentMeta` rides inside each segment.

Big integers (proof coordinates, public signals) travel as decimal strings:
msgpack integers stop at 64 bits. The proof is snarkjs ``proof.json`` as the
prover made it, and reaches the caller unchanged.

Timings: each child reports the stages it measured for a task (synthesis worker
in :class:`Published`, prover in :class:`ProofDone`); the engine merges them into
the task's record, so no stage is lost between processes.
"""

from __future__ import annotations

from typing import Union

import msgspec

from ..groth16.circuit_data_file import FileIdentity


class CircuitRef(msgspec.Struct, frozen=True):
    """Everything a child needs to find a circuit's files (paths as strings).

    ``key_source`` "device": a synthetic circuit whose INSECURE dev key has no file (``zkey`` is
    empty): each prover generates it from ``circuit_data`` and ``toxic`` (tau, alpha, beta, delta as
    decimal strings, the same for every prover), and synthesis maps ``circuit_data``.
    ``witness_map`` "device" (such a circuit on a backend that makes a, b, c where it keeps the
    partition, the GPU): synthesis writes w alone into the ring slot and the prover makes a = A w,
    b = B w, c = a o b on the device from ``circuit_data``; "host": synthesis writes a, b, c and w.

    ``zkey_id``: the identity of the key at the zkey path (:func:`cuzk_mp.pipeline.circuits.key_identity`:
    the file's size and a digest of its header section) when the engine accepted the job this reference
    travels with (None in the registered reference). A zkey replaced under the same path gives the
    next job another reference: synthesis maps the circuit data of that file, a prover loads that
    file in place of its resident key, and a file that is no longer the job's key fails the
    partition (:func:`cuzk_mp.pipeline.circuits.key_changed`) rather than prove with another key.
    """

    circuit_id: str
    zkey: str
    r1cs: str | None = None
    wasm: str | None = None
    synthetic: str | None = None
    log_n: int | None = None
    key_source: str = "file"
    circuit_data: str | None = None
    toxic: list[str] | None = None
    witness_map: str = "host"
    zkey_id: FileIdentity | None = None


# ---- engine -> synthesis worker / prover process
class SynthTask(msgspec.Struct, tag="synth_task"):
    """Synthesize one partition attempt and publish it into the ring."""

    task_id: int
    job_id: str
    job_seq: int
    partition: int
    priority: int
    attempt: int
    circuit: CircuitRef
    kind: str
    data: bytes
    seed: int
    # The job's submit and this attempt's dispatch on time.monotonic() (one clock for every process of
    # the box): the worker reports their difference as the queue wait, which a wall-clock step must not move
    t_submit: float
    t_dispatch: float


class CancelTasks(msgspec.Struct, tag="cancel"):
    """Drop these tasks at the next boundary (synthesis done, slot acquired, staged, proved)."""

    task_ids: list[int]


class LoadKey(msgspec.Struct, tag="load_key"):
    """Make a circuit's proving key resident in a prover process."""

    circuit: CircuitRef


class EvictKey(msgspec.Struct, tag="evict_key"):
    """Drop a circuit's resident key from a prover process."""

    circuit_id: str


class Stop(msgspec.Struct, tag="stop"):
    """Finish what is in hand, then exit."""


ToChild = Union[SynthTask, CancelTasks, LoadKey, EvictKey, Stop]


# ---- child -> engine
class Ready(msgspec.Struct, tag="ready"):
    """The child finished its start-up (imports, kernels compiled and warmed)."""

    pid: int
    name: str
    info: dict[str, str | int | float | None] = {}


class RingWait(msgspec.Struct, tag="ring_wait"):
    """A synthesis worker starts (``waiting``) or ends waiting for a free ring slot for a task.

    The wait is the ring's (every slot filled or waiting for a prover), not the worker's: the
    engine's hung-process timer does not count it."""

    task_id: int
    waiting: bool


class Published(msgspec.Struct, tag="published"):
    """A synthesis worker finished a task in its ring slot and published the slot (READY)."""

    task_id: int
    slot: int
    nbytes: int
    timings: dict[str, float]


class Taken(msgspec.Struct, tag="taken"):
    """A prover process took a task's slot (STAGING)."""

    task_id: int
    slot: int
    pid: int


class ProofDone(msgspec.Struct, tag="proof_done"):
    """A finished, (self-)verified proof: snarkjs proof.json and public signals (decimal strings)."""

    task_id: int
    proof: dict[str, object]
    public: list[str]
    timings: dict[str, float]
    stats: dict[str, float] = {}


class TaskFailed(msgspec.Struct, tag="task_failed"):
    """A task failed in a child that carries on; ``kind`` is an :func:`cuzk_mp.errors.error_kind`."""

    task_id: int
    kind: str
    message: str
    traceback_text: str = ""


class KeyState(msgspec.Struct, tag="key_state"):
    """A prover process loaded or evicted a key (tier "device" on a GPU, "host" on the CPU backend)."""

    circuit_id: str
    tier: str | None
    nbytes: int
    error: str | None = None
    vk: bytes | None = None  # snarkjs verification_key.json of a key generated in the prover (no file to read it from)
    load_s: float = 0.0  # seconds the load (or the generation) took
    error_kind: str = ""  # with ``error``: its :func:`cuzk_mp.errors.error_kind` (ResourceError: no room)


class Stats(msgspec.Struct, tag="stats"):
    """Periodic counters from a prover process (device memory, kernel-busy seconds)."""

    values: dict[str, float]


FromChild = Union[Ready, RingWait, Published, Taken, ProofDone, TaskFailed, KeyState, Stats]


class SegmentMeta(msgspec.Struct):
    """What a prover needs besides the arrays: rides in the header of each ring segment.

    ``timings`` are the synthesis worker's stages (also sent in :class:`Published`); the
    prover adds its own to what it reports in :class:`ProofDone`. ``witness_checked``: synthesis
    found the witness to satisfy the circuit's r1cs, so a proof failing its self-check can only
    be the key's fault, and the prover's error says so.
    """

    task_id: int
    job_id: str
    partition: int
    attempt: int
    circuit: CircuitRef
    n_public: int
    timings: dict[str, float]
    witness_checked: bool = False


_enc = msgspec.msgpack.Encoder()
_to_child = msgspec.msgpack.Decoder(ToChild)
_from_child = msgspec.msgpack.Decoder(FromChild)
_meta = msgspec.msgpack.Decoder(SegmentMeta)


def encode(msg: msgspec.Struct) -> bytes:
    """One message as a msgpack frame."""
    return _enc.encode(msg)


def decode_to_child(frame: bytes) -> ToChild:
    """Decode an engine -> child frame (raises ``msgspec.ValidationError`` if malformed)."""
    return _to_child.decode(frame)


def decode_from_child(frame: bytes) -> FromChild:
    """Decode a child -> engine frame (raises ``msgspec.ValidationError`` if malformed)."""
    return _from_child.decode(frame)


def decode_meta(raw: bytes) -> SegmentMeta:
    """Decode the :class:`SegmentMeta` of a ring segment."""
    return _meta.decode(raw)
