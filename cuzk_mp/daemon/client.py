"""Clients of the proving daemon: asyncio (:class:`AsyncClient`) and blocking (:class:`Client`).

This module owns the client side of the protocol: connecting, numbering requests, matching
replies by ``id`` and turning an ``ErrorReply`` back into the exception it stands for
(:func:`cuzk_mp.errors.error_from_kind`), so callers catch InputError, ResourceError, ... as if
the daemon were a library. The asyncio client pipelines: any number of calls may be in flight
on one connection. The blocking client makes one call at a time.

Both offer the same methods: ``submit``, ``await_proof``, ``prove``, ``cancel``, ``status``,
``metrics``, ``preload``, ``evict``, ``verification_key``. Helpers turn input files into
partitions and write a finished job as snarkjs files (proof_<i>.json, public_<i>.json,
verification_key.json; a proof with its public signals or neither).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import re
import socket
from pathlib import Path
from typing import Any

import msgspec

from cuzk_mp.daemon import protocol as P
from cuzk_mp.daemon.blocking_comm import open_socket, recv_frame, send_frame
from cuzk_mp.daemon.transport import (
    DEFAULT_MAX_FRAME, Address, CommClosedError, NotTheProtocol, StreamComm, connect, parse_address,
)
from cuzk_mp.errors import InputError, error_from_kind

# A blocking call's socket deadline is the call's own timeout plus this margin (the daemon
# answers a timed-out AwaitProof itself; the margin only catches a hung daemon).
DEADLINE_MARGIN_S = 30.0


def _address(addr: str | Address) -> Address:
    return addr if isinstance(addr, Address) else parse_address(addr)


def _result(reply: P.Message) -> Any:
    if isinstance(reply, P.ErrorReply):
        raise error_from_kind(reply.kind, reply.message)
    return reply


class Calls:
    """The calls on one connection that a caller waits for, and what each gets when the daemon stops
    reading: one book for both clients, so that they agree on it.

    Calls are numbered as their frames go out, so the daemon reads them in id order. When it refuses
    a frame it cannot read whole (over its max_frame_bytes: :attr:`~.protocol.ErrorReply.closing`), it
    reads nothing after it: that call gets the refusal, the calls before it their own answers (the
    daemon answers them before it closes), and those after it, never read, a lost connection that
    says so (they took no job: safe to send again). A refusal with id 0 names no call (an older
    daemon, a frame whose id could not be read): once the connection ends, it is the word of the
    first call still waiting, or of every call where none waits (the connection cap: the daemon read
    nothing)."""

    def __init__(self) -> None:
        self.waiting: set[int] = set()
        self.word: P.ErrorReply | None = None  # the daemon's refusal after which it reads no more

    def send(self, call_id: int) -> None:
        """Before ``call_id``'s frame goes out: its error where the daemon reads no more."""
        if self.word is not None:
            raise self.lost(call_id, CommClosedError("connection to the daemon is closed"))
        self.waiting.add(call_id)

    def forget(self, call_id: int) -> None:
        """The caller of ``call_id`` waits no more (answered, or gone)."""
        self.waiting.discard(call_id)

    def take(self, reply: P.Reply) -> int | None:
        """The waiting call ``reply`` answers (None: no call that is waited for); a refusal after
        which the daemon reads no more is kept as the connection's last word."""
        if self.word is None and isinstance(reply, P.ErrorReply) and (reply.closing or reply.id == 0):
            self.word = reply
        if reply.id in self.waiting:
            self.waiting.discard(reply.id)
            return reply.id
        return None

    def waits(self, call_id: int) -> bool:
        """Whether ``call_id``, not answered yet, may still be: the daemon read it before it stopped
        reading (or, after a refusal that names no call, until the connection ends)."""
        return self.word is None or not self.word.id or call_id < self.word.id

    def lost(self, call_id: int, cause: BaseException) -> BaseException:
        """The error of ``call_id`` whose answer will not come (``cause``: how the connection ended)."""
        if self.word is None:
            return cause
        refused = self.word.id or min(self.waiting, default=0)
        if call_id < refused:
            return cause
        if call_id == refused or not refused:
            return error_from_kind(self.word.kind, self.word.message)
        return CommClosedError(f"connection to the daemon lost: request {call_id} was not read (the daemon "
                               f"refused request {refused} before it on this connection and reads "
                               f"nothing after it: {self.word.message}); it took no job: send it again on "
                               "a new connection")


class MalformedReply(CommClosedError):
    """The daemon sent a frame that is not a reply; the connection is no longer usable."""


def _decode_reply(data: bytes) -> P.Reply:
    """A reply frame, or MalformedReply."""
    try:
        return P.decode_reply(data)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as e:
        raise MalformedReply(f"the daemon sent a malformed reply: {e}") from None


def check_timeout(timeout_s: float | None) -> float | None:
    """``timeout_s`` if it is None or a number of seconds in 0..MAX_TIMEOUT_S, else InputError
    (NaN, infinities, negatives and absurd values never reach a socket or the daemon)."""
    if timeout_s is None:
        return None
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
            or not math.isfinite(timeout_s) or not 0 <= timeout_s <= P.MAX_TIMEOUT_S:
        raise InputError(f"timeout_s: {timeout_s!r} is not a number of seconds in "
                         f"0..{P.MAX_TIMEOUT_S:g} (leave it out to wait without limit)")
    return float(timeout_s)


def default_token() -> str:
    """The token from ``$CUZK_MP_TOKEN`` ("" if unset)."""
    return os.environ.get("CUZK_MP_TOKEN", "")


class AsyncClient:
    """A pipelining asyncio client; create with ``await AsyncClient.connect(addr)``."""

    def __init__(self, comm: StreamComm, token: str = "") -> None:
        self._comm = comm
        self.token = token
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[P.Message]] = {}
        self._calls = Calls()
        self._why_ended: BaseException | None = None  # what ended the read loop
        self._reader = asyncio.ensure_future(self._read_loop())

    @classmethod
    async def connect(cls, addr: str | Address, *, max_frame_bytes: int = DEFAULT_MAX_FRAME,
                      token: str | None = None) -> AsyncClient:
        """Connect to the daemon at ``addr`` (``unix:///path`` or ``host:port``); ``token``
        (default ``$CUZK_MP_TOKEN``) goes with every request."""
        return cls(await connect(_address(addr), max_frame_bytes),
                   default_token() if token is None else token)

    async def _read_loop(self) -> None:
        cause: BaseException = CommClosedError("connection to the daemon lost: it closed the connection")
        try:
            while True:
                reply = _decode_reply(await self._comm.read())
                fut = self._pending.get(self._calls.take(reply) or 0)
                if fut is not None and not fut.done():
                    fut.set_result(reply)
                if self._calls.word is not None:  # a refusal that ends the reading: the calls it leaves unread
                    self._settle(cause)
        except (CommClosedError, Exception) as e:
            cause = cause if isinstance(e, CommClosedError) and not isinstance(e, (MalformedReply, NotTheProtocol)) \
                else e
            self._comm.close()
        finally:
            self._why_ended = cause
            self._settle(cause, ended=True)
            self._pending.clear()

    def _settle(self, cause: BaseException, ended: bool = False) -> None:
        """Fail the calls whose answers will not come (:class:`Calls`): ``ended``, every one left."""
        for call_id, fut in self._pending.items():
            if not fut.done() and (ended or not self._calls.waits(call_id)):
                fut.set_exception(self._calls.lost(call_id, cause))

    async def request(self, msg: P.Call) -> Any:
        """Send ``msg`` (its ``id`` and token are set here) and return the reply, or raise its
        error.

        Its pending entry goes however the call ends (a frame too large to send, a caller that
        stops waiting): a connection kept open for months must not hold one per abandoned request;
        a reply that arrives after the caller left is dropped."""
        msg.id = next(self._ids)
        msg.token = self.token
        self._calls.send(msg.id)
        if self._reader.done():
            self._calls.forget(msg.id)
            why = self._why_ended
            if isinstance(why, (MalformedReply, NotTheProtocol)):  # the peer's first words (a greeting) said it is
                raise type(why)(str(why))  # no daemon, or the daemon spoke nonsense: each later call says so too
            raise CommClosedError("connection to the daemon is closed")
        fut: asyncio.Future[P.Message] = asyncio.get_running_loop().create_future()
        self._pending[msg.id] = fut
        try:
            try:
                await self._comm.write(P.encode(msg))
            except CommClosedError as lost:
                # What the daemon sent before it closed comes through the read loop, which settles every
                # call as the connection ends: this one gets the daemon's refusal of it, or a lost connection.
                await asyncio.wait([self._reader], timeout=DEADLINE_MARGIN_S)
                if not fut.done():
                    raise lost from None
            return _result(await fut)
        finally:
            self._pending.pop(msg.id, None)
            self._calls.forget(msg.id)

    async def submit(self, circuit_id: str, partitions: list[P.PartitionIn], *,
                     priority: str | None = None, request_id: str = "") -> P.Submitted:
        """Queue a job; returns its id once it is journaled."""
        return await self.request(P.SubmitProof(id=0, circuit_id=circuit_id,
                                                partitions=partitions, priority=priority,
                                                request_id=request_id))

    async def await_proof(self, job_id: str, timeout_s: float | None = None) -> P.JobReply:
        """Wait for a job (``timed_out`` set on the reply if ``timeout_s`` passed first)."""
        return await self.request(P.AwaitProof(id=0, job_id=job_id, timeout_s=check_timeout(timeout_s)))

    async def prove(self, circuit_id: str, partitions: list[P.PartitionIn], *,
                    priority: str | None = None, request_id: str = "",
                    timeout_s: float | None = None) -> P.JobReply:
        """Submit and wait in one call."""
        return await self.request(P.Prove(id=0, circuit_id=circuit_id, partitions=partitions,
                                          priority=priority, request_id=request_id,
                                          timeout_s=check_timeout(timeout_s)))

    async def cancel(self, job_id: str) -> P.CancelReply:
        """Cancel a job."""
        return await self.request(P.CancelProof(id=0, job_id=job_id))

    async def status(self, detail: bool = False) -> dict[str, Any]:
        """The status document (``detail``: with paths and process ids)."""
        return (await self.request(P.GetStatus(id=0, detail=detail))).status

    async def metrics(self) -> str:
        """Prometheus text."""
        return (await self.request(P.GetMetrics(id=0))).text

    async def preload(self, circuit_id: str) -> P.PreloadReply:
        """Load a circuit's key now."""
        return await self.request(P.PreloadSRS(id=0, circuit_id=circuit_id))

    async def evict(self, circuit_id: str) -> P.EvictReply:
        """Unload a circuit's key (refused while in use)."""
        return await self.request(P.EvictSRS(id=0, circuit_id=circuit_id))

    async def verification_key(self, circuit_id: str) -> dict[str, Any]:
        """The circuit's snarkjs verification key JSON."""
        return (await self.vk_reply(circuit_id)).vk

    async def vk_reply(self, circuit_id: str) -> P.VkReply:
        """The circuit's verification key with the digest of the key file it was read from."""
        return await self.request(P.GetVerificationKey(id=0, circuit_id=circuit_id))

    async def close(self) -> None:
        """Close the connection."""
        self._comm.close()
        await asyncio.gather(self._reader, return_exceptions=True)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Client:
    """A blocking client (one call at a time); a context manager."""

    def __init__(self, addr: str | Address, *, max_frame_bytes: int = DEFAULT_MAX_FRAME,
                 connect_timeout: float = 10.0, token: str | None = None) -> None:
        self.addr = _address(addr)
        self.max_frame_bytes = max_frame_bytes
        self.token = default_token() if token is None else token
        self._sock: socket.socket | None = open_socket(self.addr, connect_timeout)
        self._ids = itertools.count(1)
        self._calls = Calls()

    def request(self, msg: P.Call, deadline_s: float | None = None) -> Any:
        """Send ``msg`` and wait (up to ``deadline_s``, None = forever) for its reply."""
        if self._sock is None:
            raise CommClosedError("client is closed")
        msg.id = next(self._ids)
        msg.token = self.token
        self._calls.send(msg.id)
        try:
            self._sock.settimeout(deadline_s)
            try:
                send_frame(self._sock, P.encode(msg), self.max_frame_bytes)
            except (BrokenPipeError, ConnectionResetError) as lost:
                return self._reply(self._sock, msg.id, lost)  # the daemon's refusal of it may wait in the socket
            return self._reply(self._sock, msg.id, None)
        finally:
            self._calls.forget(msg.id)

    def _reply(self, sock: socket.socket, call_id: int, lost: OSError | None) -> Any:
        """Read replies up to ``call_id``'s and return its result (:class:`Calls` says which call a
        refusal answers). ``lost``: the send failed, so the daemon closed; what it sent before is read,
        and without an answer the call ends with the send's error."""
        while True:
            try:
                reply = _decode_reply(recv_frame(sock, self.max_frame_bytes))
            except (MalformedReply, NotTheProtocol):
                raise
            except (CommClosedError, ConnectionResetError) as e:
                raise self._calls.lost(call_id, lost or e) from None
            except OSError:
                if lost is None:
                    raise  # the call's deadline passed
                raise self._calls.lost(call_id, lost) from None
            if self._calls.take(reply) == call_id:
                return _result(reply)
            if not self._calls.waits(call_id):
                raise self._calls.lost(call_id, lost or CommClosedError("connection to the daemon lost"))

    @staticmethod
    def _deadline(timeout_s: float | None) -> float | None:
        return None if timeout_s is None else timeout_s + DEADLINE_MARGIN_S

    def submit(self, circuit_id: str, partitions: list[P.PartitionIn], *,
               priority: str | None = None, request_id: str = "") -> P.Submitted:
        """Queue a job; returns its id once it is journaled."""
        return self.request(P.SubmitProof(id=0, circuit_id=circuit_id, partitions=partitions,
                                          priority=priority, request_id=request_id),
                            DEADLINE_MARGIN_S)

    def await_proof(self, job_id: str, timeout_s: float | None = None) -> P.JobReply:
        """Wait for a job (``timed_out`` set on the reply if ``timeout_s`` passed first)."""
        timeout_s = check_timeout(timeout_s)
        return self.request(P.AwaitProof(id=0, job_id=job_id, timeout_s=timeout_s),
                            self._deadline(timeout_s))

    def prove(self, circuit_id: str, partitions: list[P.PartitionIn], *,
              priority: str | None = None, request_id: str = "",
              timeout_s: float | None = None) -> P.JobReply:
        """Submit and wait in one call."""
        timeout_s = check_timeout(timeout_s)
        return self.request(P.Prove(id=0, circuit_id=circuit_id, partitions=partitions,
                                    priority=priority, request_id=request_id,
                                    timeout_s=timeout_s), self._deadline(timeout_s))

    def cancel(self, job_id: str) -> P.CancelReply:
        """Cancel a job."""
        return self.request(P.CancelProof(id=0, job_id=job_id), DEADLINE_MARGIN_S)

    def status(self, detail: bool = False) -> dict[str, Any]:
        """The status document (``detail``: with paths and process ids)."""
        return self.request(P.GetStatus(id=0, detail=detail), DEADLINE_MARGIN_S).status

    def metrics(self) -> str:
        """Prometheus text."""
        return self.request(P.GetMetrics(id=0), DEADLINE_MARGIN_S).text

    def preload(self, circuit_id: str) -> P.PreloadReply:
        """Load a circuit's key now (may take long for a big key: no deadline)."""
        return self.request(P.PreloadSRS(id=0, circuit_id=circuit_id), None)

    def evict(self, circuit_id: str) -> P.EvictReply:
        """Unload a circuit's key (refused while in use)."""
        return self.request(P.EvictSRS(id=0, circuit_id=circuit_id), None)

    def verification_key(self, circuit_id: str) -> dict[str, Any]:
        """The circuit's snarkjs verification key JSON."""
        return self.vk_reply(circuit_id).vk

    def vk_reply(self, circuit_id: str) -> P.VkReply:
        """The circuit's verification key with the digest of the key file it was read from."""
        return self.request(P.GetVerificationKey(id=0, circuit_id=circuit_id), None)

    def close(self) -> None:
        """Close the connection (idempotent)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


REQUEST_CARRIES = "one request to a daemon carries (max_frame_bytes)"


def read_request_file(path: Path, max_bytes: int, *, binary: bool, way_out: str = "") -> bytes:
    """The bytes of an input file a request carries, read no further than ``max_bytes`` + 1 (InputError
    naming the file past that, or where it cannot be read). A ``binary`` one (a .wtns) must be a regular
    file, as the one-shot commands take it (:func:`~cuzk_mp.formats.atomic.open_regular`): a FIFO that no
    process writes would hold the client for ever, /dev/zero would be read until its memory ran out. An
    input JSON may come through a pipe, as the one-shot commands read it, bounded the same way.
    ``way_out`` ends the message of a file over ``max_bytes``."""
    from cuzk_mp.formats.atomic import open_regular, read_at_most  # no numpy: a client sends what it read

    try:
        if binary:
            fd, _ = open_regular(path, str(path))
            os.set_blocking(fd, True)
            f = os.fdopen(fd, "rb")
        else:
            f = open(path, "rb")  # closed by the with below
        with f:
            data = read_at_most(f, max_bytes)
    except OSError as e:
        raise InputError(f"{path}: {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise InputError(f"{path}: more than {max_bytes} bytes, the most {REQUEST_CARRIES}{way_out}")
    return data


PARTITION_FIELD = re.compile(r"^job \S+ partitions\[(\d+)\](?:\.data)?: ")  # how a refusal names a partition


def name_input_file(message: str, files: list[Path]) -> str | None:
    """A refusal of a job's partition (the daemon knows it only as ``job X partitions[i].data``) with
    the input file it was read from in place of that field, or None where it names no such partition:
    the user gave files, not partition numbers."""
    m = PARTITION_FIELD.match(message)
    if m is None or int(m.group(1)) >= len(files):
        return None
    return f"{files[int(m.group(1))]}: {message[m.end():]}"


def partition_from_file(path: Path, max_bytes: int = DEFAULT_MAX_FRAME) -> P.PartitionIn:
    """A partition from ``*.json`` (input for the circuit's wasm) or ``*.wtns``; its suffix is looked at
    before any read, and the file read as :func:`read_request_file` reads it (``max_bytes``: the client's
    frame limit, the most one request carries)."""
    path = Path(path)
    if path.suffix == ".json":
        return P.PartitionIn(kind="json", data=read_request_file(path, max_bytes, binary=False))
    if path.suffix == ".wtns":
        return P.PartitionIn(kind="wtns", data=read_request_file(path, max_bytes, binary=True))
    raise InputError(f"{path}: expected an input .json or a .wtns file")


def synthetic_partitions(count: int, first_seed: int = 0) -> list[P.PartitionIn]:
    """``count`` synthetic partitions with seeds first_seed, first_seed+1, ..."""
    return [P.PartitionIn(kind="synthetic", seed=first_seed + i) for i in range(count)]


def check_out_folder(out_dir: Path) -> None:
    """OutputError naming ``out_dir`` where it cannot be a folder this process writes into (a file in
    the way, a symlink that leads nowhere, a read-only place: :func:`~cuzk_mp.paths.folder_problem`).
    Called before a job is asked for as well as before its files are written: a job proved in full
    whose files then have nowhere to go is work lost, and mkdir's "File exists" does not say that the
    thing in the way is a file or a dangling symlink."""
    from cuzk_mp.errors import OutputError
    from cuzk_mp.paths import folder_problem

    problem = folder_problem(out_dir)
    if problem is not None:
        raise OutputError(out_dir, problem)


def write_outputs(reply: P.JobReply, out_dir: Path, vk: P.VkReply | None) -> list[Path]:
    """Write the vk and, per proved partition, proof_<i>.json with public_<i>.json: each file whole
    (atomic.write_json), and each proof with its public signals or neither (atomic.write_json_files),
    as ``groth16 prove`` writes its two files. A file that cannot be written (a full disk) is an
    OutputError naming it; the pairs before it stay written.

    A vk of another key than the proofs' (the circuit's key file replaced after the job was proved:
    the digests differ, :class:`~cuzk_mp.daemon.protocol.JobReply`) is not written: the proofs are,
    then an OutputError says why verification_key.json is not there."""
    from cuzk_mp.errors import OutputError
    from cuzk_mp.formats.atomic import write_json, write_json_files  # no numpy: a client writes what it received

    other_key = (vk is not None and None not in (reply.key_digest, vk.key_digest)
                 and vk.key_digest != reply.key_digest)

    check_out_folder(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(out_dir, e.strerror or str(e)) from e
    written = []
    if vk is not None and not other_key:
        write_json(out_dir / "verification_key.json", vk.vk)
        written.append(out_dir / "verification_key.json")
    for p in reply.partitions:
        if p.proof is not None:
            pair: list[tuple[Path, Any]] = [(out_dir / f"proof_{p.index}.json", p.proof),
                                            (out_dir / f"public_{p.index}.json", p.public)]
            write_json_files(pair)
            written += [path for path, _ in pair]
    if other_key:
        assert vk is not None
        raise OutputError(out_dir / "verification_key.json",
                          f"the circuit's key file was replaced after job {reply.job_id} was proved (its proofs were "
                          f"made with the key of header digest {reply.key_digest}, the daemon's key now has "
                          f"{vk.key_digest}): its proofs are written; verify them with the earlier key's "
                          "verification_key.json")
    return written
