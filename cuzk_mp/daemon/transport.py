"""Framing and connections: the transport layer of the daemon (dask's ``comm``).

This module owns sockets and byte frames and nothing else; it never interprets a message. A
frame is a big-endian u32 length followed by that many bytes (msgspec's kv example), and the
length is checked against ``max_frame_bytes`` *before* the body is read, so a peer announcing a
4 GiB frame costs nothing (the kv example's missing check): only the first bytes that came with
the length are read, for the request's id (:attr:`FrameTooLarge.head`), and four bytes "HTTP" where a length
was expected are an HTTP server's answer (:class:`NotTheProtocol`: a client pointed at the daemon's
status port), not a frame of 1.2 GB; where a client expects a reply, a TLS record or a line of text (an SSH or
SMTP server's greeting) is named as such too (:func:`foreign_reply`). Addresses are
``unix:///abs/path.sock`` or ``host:port`` / ``tcp://host:port`` (``[::1]:9820`` for IPv6).

Slow or stuck peers are bounded too: once the first byte of a frame has arrived, the whole frame
must arrive within ``frame_timeout_s`` (else :class:`FrameTimeout`), and a frame written to a peer
that does not read it within that time closes the connection; :func:`listen` serves at most
``max_connections`` connections at once and answers any more with a given refusal frame (and
waits out a process with no file descriptor left to accept one with: :mod:`.accept`). So the
memory held by unfinished frames is at most ``max_connections x max_frame_bytes``, and never for
longer than ``frame_timeout_s``. An idle connection between frames has no deadline (a client
may wait hours for a proof); a TCP peer whose host vanished is found by keepalive probes
(:mod:`.tcp_keepalive`).

A :class:`Comm` reads and writes whole frames. :class:`StreamComm` wraps asyncio streams (unix
or TCP); :func:`inproc_pair` gives two connected in-process comms for tests. :func:`listen`
binds a server: a unix socket is created under a random temporary name, chmod-ed to the
configured mode (on that file, never through a link) and renamed into place, so it is never
reachable with looser permissions. Its folder must keep other users out (:func:`socket_place`:
a folder that another user owns, or that every user may write without the sticky bit, is refused,
one its group may write is warned about), else another local user could put a socket of their own
in its place and receive the clients' tokens and inputs. A stale socket file left by a dead daemon
of this user is replaced; a live one, another user's socket, or anything else at that name is an
error, never removed, and a stopping daemon removes its socket only if it is still its own. The blocking
helpers of the synchronous client are :mod:`.blocking_comm`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import secrets
import socket
import stat
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from cuzk_mp.daemon.accept import AcceptServer, bind_tcp
from cuzk_mp.daemon.tcp_keepalive import keep_alive
from cuzk_mp.errors import ConfigError, InputError

_LEN = struct.Struct(">I")
DEFAULT_MAX_FRAME = 128 * 2**20  # the largest frame a peer sends or takes unless configured ([daemon] max_frame_bytes)
log = logging.getLogger("cuzk_mp.daemon.transport")
REFUSAL_LOG_INTERVAL_S = 10.0
REFUSAL_DRAIN_S = 1.0
FRAME_HEAD_BYTES = 256  # what is read of a frame over the limit: enough for a request's type tag and id
HEAD_WAIT_S = 1.0  # how long that read waits for the frame's first bytes (a sender of only a length gets none)
SUN_PATH_BYTES = 107  # the longest path of a unix socket (Linux: sun_path is 108 bytes with its NUL)


def _bind_name(path: str) -> str:
    """The temporary name a unix socket is bound under before it is renamed to ``path`` (:func:`bind_unix`)."""
    return f"{path}.{secrets.token_hex(6)}.tmp"


# the longest path the daemon can listen on: its socket is bound first under _bind_name, that much longer
MAX_LISTEN_PATH_BYTES = SUN_PATH_BYTES - len(_bind_name(""))


class CommClosedError(ConnectionError):
    """The peer closed the connection (or it broke) before a whole frame arrived."""


class FrameTooLarge(InputError):
    """A frame's announced length exceeds ``max_frame_bytes``. ``head``: the first bytes of the frame
    that had arrived with its length (at most FRAME_HEAD_BYTES; none where the refusal is the sender's
    own), so that the layer above can name the request it refuses (its id comes first)."""

    head: bytes = b""


class FrameTimeout(InputError):
    """A frame that had started to arrive was not complete within ``frame_timeout_s``."""


class NotTheProtocol(CommClosedError):
    """What came back where a frame was expected is the start of an HTTP answer (the daemon's ``status_listen``
    port, likely), or, where a reply was expected, another server's words (:func:`foreign_reply`): the address
    is not the daemon's protocol socket."""


HTTP_ANSWER = b"HTTP"  # how an HTTP response begins ("HTTP/1.1 400 ..."): a 1.2 GB "length" as a frame
_TLS_RECORDS = (0x14, 0x15, 0x16, 0x17)  # a TLS record's content types (its version's major byte, 3, follows)
FOREIGN_LINE_CHARS = 80  # how much of another server's text line an error shows
HEADER_BYTES = _LEN.size


@dataclass(frozen=True)
class Address:
    """A listen/connect address: ``kind`` is ``"unix"`` (``path``) or ``"tcp"`` (``host``, ``port``)."""

    kind: str
    path: str = ""
    host: str = ""
    port: int = 0

    def __str__(self) -> str:
        if self.kind == "unix":
            return f"unix://{self.path}"
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def loopback(self) -> bool:
        """Whether only this host can reach the address (a unix socket, or TCP on a loopback
        address; a host name counts as reachable from elsewhere, whatever it resolves to now)."""
        if self.kind == "unix" or self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def parse_address(text: str) -> Address:
    """Parse ``unix:///path``, ``tcp://host:port`` or ``host:port`` (ConfigError if malformed)."""
    if text.startswith("unix://"):
        path = text[len("unix://"):]
        if not path.startswith("/"):
            raise ConfigError(f"{text!r}: a unix socket address needs an absolute path "
                              "(unix:///run/cuzk-mp/cuzk.sock)")
        if len(path.encode()) > SUN_PATH_BYTES:
            raise ConfigError(f"{text!r}: unix socket path longer than {SUN_PATH_BYTES} bytes")
        return Address("unix", path=path)
    rest = text[len("tcp://"):] if text.startswith("tcp://") else text
    host, sep, port_text = rest.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(f"{text!r}: expected unix:///path or host:port with a port in 1..65535")
    return Address("tcp", host=host, port=int(port_text))


def frame_length(header: bytes, max_frame_bytes: int) -> int:
    """The length a frame's 4-byte ``header`` announces: FrameTooLarge above ``max_frame_bytes``,
    NotTheProtocol where the bytes are an HTTP answer's."""
    if header == HTTP_ANSWER:
        raise NotTheProtocol("it answers HTTP, not the daemon's protocol: likely its status_listen port "
                             "(connect to its listen address)")
    (n,) = _LEN.unpack(header)
    if n > max_frame_bytes:
        raise FrameTooLarge(f"frame of {n} bytes exceeds max_frame_bytes ({max_frame_bytes})")
    return n


def foreign_reply(header: bytes, head: bytes) -> NotTheProtocol | None:
    """What to say where a reply's 4-byte length ``header`` over the limit, and the ``head`` that came with it,
    are another server's words: a TLS record, or a line of text (an SSH, SMTP or Redis server's greeting or
    answer). None where they may be a daemon's length: a reply over this side's max_frame_bytes. A daemon's
    length whose four bytes all read as text would announce over 500 MB, which no reply of the protocol is."""
    if header[0] in _TLS_RECORDS and header[1] == 3:
        return NotTheProtocol("it answers TLS, not the daemon's protocol (the daemon's listen address speaks plain "
                              "frames): another service's port")
    if all(32 <= b < 127 or b in b"\t\r\n" for b in header):
        line = (header + head).split(b"\n", 1)[0].rstrip(b"\r")[:FOREIGN_LINE_CHARS]
        return NotTheProtocol(f"it is not a cuzk-mp daemon: it sent {line.decode('ascii', 'replace')!r} where a "
                              "reply was expected (another service's port?)")
    return None


def frame(payload: bytes) -> bytes:
    """The frame for ``payload``: u32 big-endian length, then the bytes."""
    return _LEN.pack(len(payload)) + payload


class Comm:
    """A connection that carries whole frames (abstract; dask ``Comm``)."""

    max_frame_bytes: int

    async def read(self) -> bytes:
        """The next frame; CommClosedError at EOF, FrameTooLarge if announced too long."""
        raise NotImplementedError

    async def write(self, payload: bytes) -> None:
        """Send one frame (FrameTooLarge if it exceeds the limit)."""
        raise NotImplementedError

    async def discard(self) -> None:
        """Read and drop whatever the peer sends until it closes: a connection whose stream cannot
        be read as frames any more still tells when its peer has gone."""
        raise NotImplementedError

    def close(self) -> None:
        """Close the connection (idempotent)."""
        raise NotImplementedError

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called or the peer went away."""
        raise NotImplementedError

    def _check(self, n: int) -> None:
        if n > self.max_frame_bytes:
            raise FrameTooLarge(f"frame of {n} bytes exceeds max_frame_bytes "
                                f"({self.max_frame_bytes})")


class StreamComm(Comm):
    """A Comm over an asyncio StreamReader/StreamWriter pair (unix or TCP).

    ``frame_timeout_s`` (None: no deadline) bounds how long one frame may take to arrive once
    its first byte has, how long a new connection may wait before its first frame starts (a peer
    that connects and says nothing would hold a connection slot for ever), and how long a written
    frame may wait for the peer to take it. Between two frames a connection may idle.
    """

    replies = False  # whether it reads a daemon's replies (a client's): another server's words are named so

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 max_frame_bytes: int, frame_timeout_s: float | None = None) -> None:
        self.reader, self.writer = reader, writer
        self.max_frame_bytes = max_frame_bytes
        self.frame_timeout_s = frame_timeout_s
        self.peer = str(writer.get_extra_info("peername") or "local")
        self._frames = 0

    async def read(self) -> bytes:
        """The next frame (length checked before the body is read; FrameTimeout if it stalls)."""
        try:
            if self._frames:
                first = await self.reader.readexactly(1)  # idle between frames: no deadline
            else:
                try:
                    async with asyncio.timeout(self.frame_timeout_s):
                        first = await self.reader.readexactly(1)
                except TimeoutError:
                    raise FrameTimeout(f"{self.peer} sent no request within frame_timeout = "
                                       f"{self.frame_timeout_s:g} s of connecting") from None
            self._frames += 1
            try:
                async with asyncio.timeout(self.frame_timeout_s):
                    header = first + await self.reader.readexactly(_LEN.size - 1)
                    try:
                        n = frame_length(header, self.max_frame_bytes)
                    except FrameTooLarge as e:
                        e.head = await self._head()
                        if self.replies and (foreign := foreign_reply(header, e.head)) is not None:
                            raise foreign from None
                        raise
                    return await self.reader.readexactly(n)
            except TimeoutError:
                raise FrameTimeout(f"a frame from {self.peer} was not complete within "
                                   f"frame_timeout = {self.frame_timeout_s:g} s") from None
        except NotTheProtocol:
            raise
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            raise CommClosedError(f"connection from {self.peer} closed mid-frame"
                                  if getattr(e, "partial", b"") else
                                  f"connection from {self.peer} closed") from None

    async def _head(self) -> bytes:
        """What has arrived of a frame over the limit, up to FRAME_HEAD_BYTES (the rest stays unread)."""
        with contextlib.suppress(TimeoutError, ConnectionError):
            async with asyncio.timeout(HEAD_WAIT_S):
                return await self.reader.read(FRAME_HEAD_BYTES)
        return b""

    async def discard(self) -> None:
        """Read and drop what the peer sends until it closes (never more than a chunk held)."""
        with contextlib.suppress(ConnectionError):
            while await self.reader.read(1 << 16):
                pass

    async def write(self, payload: bytes) -> None:
        """Send one frame and wait until the kernel buffer accepts it (a peer that does not
        take it within ``frame_timeout_s`` loses the connection)."""
        self._check(len(payload))
        if self.writer.is_closing():
            raise CommClosedError(f"connection to {self.peer} is closed")
        self.writer.write(frame(payload))
        try:
            async with asyncio.timeout(self.frame_timeout_s):
                await self.writer.drain()
        except TimeoutError:
            self.writer.transport.abort()  # close() would wait for the unread bytes forever
            raise CommClosedError(f"{self.peer} did not read a {len(payload)}-byte frame within "
                                  f"frame_timeout = {self.frame_timeout_s:g} s; connection closed") from None
        except ConnectionError as e:
            raise CommClosedError(f"connection to {self.peer} broke: {e}") from None

    def close(self) -> None:
        """Close the writer (the reader sees EOF)."""
        self.writer.close()

    @property
    def closed(self) -> bool:
        """True once closing started."""
        return self.writer.is_closing()


class InProcComm(Comm):
    """One end of an in-process connection; frames travel through asyncio queues."""

    def __init__(self, inbox: asyncio.Queue[bytes | None], outbox: asyncio.Queue[bytes | None],
                 max_frame_bytes: int) -> None:
        self._in, self._out = inbox, outbox
        self.max_frame_bytes = max_frame_bytes
        self._closed = False
        self.peer = "inproc"

    async def read(self) -> bytes:
        """The next frame put by the other end; CommClosedError once it closed."""
        item = None if self._closed else await self._in.get()
        if item is None:
            self._closed = True
            raise CommClosedError("in-process connection closed")
        try:
            self._check(len(item))
        except FrameTooLarge as e:
            e.head = item[:FRAME_HEAD_BYTES]
            raise
        return item

    async def discard(self) -> None:
        """Drop the frames the other end puts until it closes."""
        while not self._closed and await self._in.get() is not None:
            pass
        self._closed = True

    async def write(self, payload: bytes) -> None:
        """Queue one frame for the other end."""
        self._check(len(payload))
        if self._closed:
            raise CommClosedError("in-process connection closed")
        await self._out.put(bytes(payload))

    def close(self) -> None:
        """Close both directions."""
        if not self._closed:
            self._closed = True
            self._out.put_nowait(None)
            self._in.put_nowait(None)

    @property
    def closed(self) -> bool:
        """True once either end closed."""
        return self._closed


def inproc_pair(max_frame_bytes: int = 1 << 20) -> tuple[InProcComm, InProcComm]:
    """Two connected in-process comms (for tests of the server without sockets)."""
    a: asyncio.Queue[bytes | None] = asyncio.Queue()
    b: asyncio.Queue[bytes | None] = asyncio.Queue()
    return InProcComm(a, b, max_frame_bytes), InProcComm(b, a, max_frame_bytes)


async def connect(addr: Address, max_frame_bytes: int) -> StreamComm:
    """Open a connection to a daemon at ``addr``."""
    if addr.kind == "unix":
        reader, writer = await asyncio.open_unix_connection(addr.path)
    else:
        reader, writer = await asyncio.open_connection(addr.host, addr.port)
        keep_alive(writer.get_extra_info("socket"))
    comm = StreamComm(reader, writer, max_frame_bytes)
    comm.replies = True
    return comm


def _not_own_socket(path: str, st: os.stat_result) -> str | None:
    """Why the file ``st`` at ``path`` is no socket this daemon may remove or replace (None: it may):
    only a socket of this user is; anything else is another program's, or put there by another user."""
    if not stat.S_ISSOCK(st.st_mode):
        return f"{path}: exists and is not a socket"
    if st.st_uid != os.geteuid():
        return f"{path}: is a socket of another user (uid {st.st_uid}), not of this daemon's (uid {os.geteuid()})"
    return None


def _folder_problem(folder: str, st: os.stat_result) -> tuple[str | None, str | None]:
    """(refusal, warning) for a folder on the way to a unix socket: one that another user owns, or may
    write without the sticky bit, lets that user replace the socket (clients then talk to whoever did,
    tokens and inputs included) or remove it."""
    me = os.geteuid()
    if st.st_uid not in (0, me):
        return f"{folder} belongs to another user (uid {st.st_uid}), who may replace the socket", None
    if stat.S_ISLNK(st.st_mode) or st.st_mode & stat.S_ISVTX:
        return None, None
    if st.st_mode & stat.S_IWOTH:
        return (f"{folder} is writable by every user (mode {stat.S_IMODE(st.st_mode):04o}, no sticky bit), so "
                "any local user may replace or remove the socket"), None
    if st.st_mode & stat.S_IWGRP and st.st_gid != os.getegid():
        return None, (f"{folder} is writable by group {st.st_gid} (mode {stat.S_IMODE(st.st_mode):04o}, no "
                      "sticky bit): its members may replace or remove the socket")
    return None, None


def socket_place(path: str) -> tuple[str | None, str | None]:
    """(refusal, warning) for a unix socket at ``path``: the first folder on its way, as written and
    as resolved, that lets another user replace the socket (:func:`_folder_problem`), or a link on
    the way that another user owns. Folders not made yet are judged by the nearest existing one. A path
    too long to bind (over MAX_LISTEN_PATH_BYTES) is refused too."""
    n = len(os.fsencode(path))
    if n > MAX_LISTEN_PATH_BYTES:
        return (f"a path of {n} bytes, more than the {MAX_LISTEN_PATH_BYTES} the daemon can listen on (a unix "
                f"socket's path holds {SUN_PATH_BYTES}, and the socket is bound first under a temporary name "
                f"{SUN_PATH_BYTES - MAX_LISTEN_PATH_BYTES} bytes longer): name a shorter path"), None
    refusal = warning = None
    written = Path(path).parent
    real = written.resolve()
    for folder in [*reversed([written, *written.parents]), *reversed([real, *real.parents])]:
        try:
            st = os.lstat(folder)
        except OSError:
            continue
        bad, weak = _folder_problem(str(folder), st)
        refusal, warning = refusal or bad, warning or weak
    if refusal is not None:
        refusal += "; put the socket in a folder only this user (or root) may write, e.g. /run/cuzk-mp"
    return refusal, warning


def foreign_file(path: str) -> str | None:
    """Why the file at ``path`` may not be removed or replaced by this daemon (another user's socket,
    or no socket: :func:`_not_own_socket`); None where there is none or it is this user's socket."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return _not_own_socket(path, st)


def socket_in_use(path: str) -> bool:
    """Whether a process may listen on the unix socket at ``path`` now: False only where a connect
    is refused (a stale socket) or finds nothing; any other failure (no permission) counts as in
    use, so a live socket is never taken for a stale one."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return True
    finally:
        probe.close()
    return True


def _clear_stale_socket(path: str) -> None:
    """Remove a socket file left by a dead daemon of this user; refuse a live one, another user's
    or a non-socket (never removed: in a shared folder it may be anyone's)."""
    problem = foreign_file(path)
    if problem is not None:
        raise ConfigError(f"{problem}; refusing to replace it (remove it, or name another path)")
    if socket_in_use(path):
        raise ConfigError(f"{path}: another process is already listening on this socket")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _chmod_socket(path: str, mode: int) -> None:
    """chmod the socket just bound at ``path``, never through a link: the file is opened without
    following one and must be this user's socket, and the mode is set on that very file (through
    /proc/self/fd), so a name swapped for a link in between cannot give ``mode`` to another file."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        problem = _not_own_socket(path, os.fstat(fd))
        if problem is not None:
            raise ConfigError(f"{problem}: it was replaced while the daemon bound it; refusing to use it")
        os.chmod(f"/proc/self/fd/{fd}", mode)
    finally:
        os.close(fd)


def bind_unix(path: str, mode: int) -> socket.socket:
    """A bound unix socket at ``path`` with permissions ``mode`` from the first moment it exists
    (ConfigError for a place another user could take it from: :func:`socket_place`)."""
    refusal, _ = socket_place(path)
    if refusal is None:
        Path(path).parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        refusal, _ = socket_place(path)  # and the folders just made
    if refusal is not None:
        raise ConfigError(f"unix socket {path}: {refusal}")
    _clear_stale_socket(path)
    tmp = _bind_name(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(tmp)  # bound, not yet listening: a connect is refused whatever the mode until it is
        _chmod_socket(tmp, mode)
        os.rename(tmp, path)  # atomic: the final name only ever has the final mode
    except BaseException:
        sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return sock


def remove_socket(path: str) -> None:
    """Remove the socket file a stopping daemon leaves at ``path``, if it is still a socket of this
    user (one daemon per socket: the instance lock); anything else now there is left alone."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    problem = _not_own_socket(path, st)
    if problem is not None:
        log.warning("%s; left in place, not removed", problem)
        return
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class Listener:
    """A listening server (:class:`~.accept.AcceptServer`: it outlives a shortage of file descriptors);
    :meth:`close` stops accepting and removes a unix socket file."""

    def __init__(self, server: AcceptServer, addr: Address) -> None:
        self.server, self.addr = server, addr

    @property
    def bound(self) -> Address:
        """The address actually bound (the real port when 0 was asked for)."""
        if self.addr.kind == "unix":
            return self.addr
        host, port = self.server.sockets[0].getsockname()[:2]
        return Address("tcp", host=host, port=port)

    async def close(self) -> None:
        """Stop accepting; existing connections stay open until their handlers end."""
        self.server.close()
        if self.addr.kind == "unix":
            remove_socket(self.addr.path)


async def listen(addr: Address, on_comm: Callable[[StreamComm], Awaitable[None]], *,
                 max_frame_bytes: int, socket_mode: int = 0o600,
                 frame_timeout_s: float | None = None, max_connections: int | None = None,
                 refusal: bytes = b"", on_refused: Callable[[], None] | None = None) -> Listener:
    """Serve ``addr``, calling ``on_comm`` with a StreamComm for each connection.

    Beyond ``max_connections`` open connections a new one is sent the ``refusal`` frame (if
    any) and closed, and ``on_refused()`` called (the daemon counts them: the log says so once in
    ten seconds at most).
    """
    open_comms = 0
    last_log = [0.0]

    async def refuse(comm: StreamComm) -> None:
        if on_refused is not None:
            on_refused()
        now = time.monotonic()
        if now - last_log[0] >= REFUSAL_LOG_INTERVAL_S:
            last_log[0] = now
            log.warning("connection from %s refused: %d connections open (max_connections)",
                        comm.peer, open_comms)
        with contextlib.suppress(CommClosedError, FrameTooLarge):
            if refusal:
                await comm.write(refusal)
        # Closing with the peer's request unread would reset the connection and lose the refusal:
        # end our side, then discard what the peer sends for a moment (bounded in time and size).
        with contextlib.suppress(OSError, RuntimeError, TimeoutError, asyncio.IncompleteReadError):
            if comm.writer.can_write_eof():
                comm.writer.write_eof()
            async with asyncio.timeout(REFUSAL_DRAIN_S):
                while await comm.reader.read(1 << 16):
                    pass

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal open_comms
        keep_alive(writer.get_extra_info("socket"))
        comm = StreamComm(reader, writer, max_frame_bytes, frame_timeout_s)
        try:
            if max_connections is not None and open_comms >= max_connections:
                await refuse(comm)
                return
            open_comms += 1
            try:
                await on_comm(comm)
            finally:
                open_comms -= 1
        finally:
            comm.close()

    sockets = [bind_unix(addr.path, socket_mode)] if addr.kind == "unix" else await bind_tcp(addr.host, addr.port)
    return Listener(AcceptServer(sockets, accept, f"listener {addr}"), addr)
