"""Hostile clients on the wire, against an in-process daemon (the protocol tests' engine double):
every hostile frame gets a typed ErrorReply with the right id within bounded memory, stalled and
greedy connections are cut off, and with tokens each client sees and cancels only its own jobs.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
import tracemalloc
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from cuzk_mp.daemon import budget
from cuzk_mp.pipeline.memory import estimated_circuit_size
from cuzk_mp.daemon import protocol as P
from cuzk_mp.daemon.client import AsyncClient, Client, synthetic_partitions
from cuzk_mp.daemon.server import Daemon
from cuzk_mp.daemon.transport import frame
from cuzk_mp.errors import AuthError, ConfigError, InputError, Unavailable
from tests.hostile_corpus import INPUT_JSON_PROBES, FrameProbe, frame_probes
from tests.fake_engine import run_daemon
from tests.helpers import exchange, parse_prometheus, small_circom_key

MAX_FRAME = "4MiB"
ALICE, BOB, ADMIN = "alice-token-0000000001", "bob-token-00000000002", "admin-token-000000003"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


PROBES = frame_probes(4 * 2**20)


@pytest.mark.parametrize("probe", PROBES, ids=[f"{p.family}: {p.name}" for p in PROBES])
def test_every_hostile_frame_gets_a_typed_reply(tmp_path: Path, probe: FrameProbe) -> None:
    async def body(d: Daemon, addr: str) -> None:
        follow = frame(P.encode(P.GetMetrics(id=999)))
        replies, closed = await asyncio.to_thread(exchange, str(tmp_path / "d.sock"), probe.wire() + follow,
                                                  1 if probe.closes else 2)
        first = replies[0]
        assert isinstance(first, P.ErrorReply), first
        assert (first.kind, first.id) == (probe.kind, probe.reply_id), first
        assert probe.says in first.message, first.message
        if probe.closes:
            assert closed and len(replies) == 1
        else:
            assert isinstance(replies[1], P.MetricsReply) and replies[1].id == 999
        async with await AsyncClient.connect(addr) as c:  # the daemon serves on
            assert (await c.prove("syn", synthetic_partitions(1), timeout_s=10)).state == "done"

    run_daemon(tmp_path, body, max_frame_bytes=MAX_FRAME)


def test_a_frame_of_four_million_empty_maps_costs_little_memory(tmp_path: Path) -> None:
    many = 4 * 2**20 - 64
    data = (b"\x82\xa2id\x05\xa1x\xdd" + struct.pack(">I", many) + b"\x80" * many)
    wire = struct.pack(">I", len(data)) + data

    async def body(d: Daemon, addr: str) -> None:
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            replies, _ = await asyncio.to_thread(exchange, str(tmp_path / "d.sock"), wire, 1)
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        assert replies[0].kind == "InputError" and replies[0].id == 5
        # the frame is read (the stream's buffer and the frame's bytes: 2 x 4 MiB) and nothing is
        # built from it (a schema-less decode made ~70 x the frame's size)
        assert peak < 3 * len(data), f"{peak / 2**20:.1f} MiB for a {len(data) / 2**20:.1f} MiB frame"

    run_daemon(tmp_path, body, max_frame_bytes="5MiB")


def test_a_stalled_frame_is_cut_off_at_the_deadline(tmp_path: Path) -> None:
    async def body(d: Daemon, addr: str) -> None:
        path = str(tmp_path / "d.sock")
        for partial in (b"\x00\x00", struct.pack(">I", 1000) + b"\x82\xa4type"):
            t0 = time.monotonic()
            replies, closed = await asyncio.to_thread(exchange, path, partial, 1, 10.0)
            waited = time.monotonic() - t0
            assert closed and 0.4 <= waited < 5.0, waited
            assert replies[0].kind == "InputError" and "not complete within frame_timeout" in replies[0].message
        # a connection that says nothing holds a connection slot: its first frame has the same deadline
        t0 = time.monotonic()
        replies, closed = await asyncio.to_thread(exchange, path, b"", 1, 10.0)
        assert closed and 0.4 <= time.monotonic() - t0 < 5.0
        assert replies[0].kind == "InputError" and "sent no request within frame_timeout" in replies[0].message
        # once it has spoken, an idle connection is not a stalled frame: it may wait as long as it likes
        async with await AsyncClient.connect(addr) as c:
            assert (await c.status())["daemon"]["state"] == "running"
            await asyncio.sleep(1.2)
            assert (await c.prove("syn", synthetic_partitions(1), timeout_s=10)).state == "done"

    run_daemon(tmp_path, body, frame_timeout="0.5s")


def test_a_client_that_never_reads_is_disconnected(tmp_path: Path) -> None:
    async def body(d: Daemon, addr: str) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(str(tmp_path / "d.sock"))
        request = P.encode(P.GetStatus(id=1))
        s.sendall((struct.pack(">I", len(request)) + request) * 1000)  # ~1000 replies, never read
        t0 = time.monotonic()
        while d._comms and time.monotonic() - t0 < 15:
            await asyncio.sleep(0.1)
        assert not d._comms, "the daemon still holds the connection of a client that reads nothing"
        s.close()
        async with await AsyncClient.connect(addr) as c:
            assert (await c.status())["daemon"]["state"] == "running"

    run_daemon(tmp_path, body, frame_timeout="1s")


def test_connections_beyond_the_cap_are_refused_with_a_reply(tmp_path: Path) -> None:
    async def body(d: Daemon, addr: str) -> None:
        held = [await AsyncClient.connect(addr) for _ in range(3)]
        try:
            for c in held:
                await c.status()
            replies, closed = await asyncio.to_thread(exchange, str(tmp_path / "d.sock"), b"", 1)
            assert closed and replies[0].kind == "Unavailable" and "at most 3 connections" in replies[0].message
            with pytest.raises(Unavailable, match="max_connections"):
                async with await AsyncClient.connect(addr) as extra:
                    await extra.status()

            def refused_clients() -> list[str]:  # each hears the refusal, never a reset or broken pipe
                seen = []
                for _ in range(30):
                    try:
                        with Client(addr) as c:
                            c.status()
                        seen.append("served")
                    except Unavailable:
                        seen.append("refused")
                    except OSError as e:
                        seen.append(repr(e))
                return seen
            assert set(await asyncio.to_thread(refused_clients)) == {"refused"}
            seen = parse_prometheus(await held[0].metrics())  # an operator's alert sees the cap reached
            assert seen[("cuzk_connections_refused_total", ())] == 32
            assert seen[("cuzk_connections", ())] == seen[("cuzk_connections_max", ())] == 3
        finally:
            await held.pop().close()
        await asyncio.sleep(0.1)
        async with await AsyncClient.connect(addr) as c:  # a slot is free again
            assert (await c.status())["daemon"]["state"] == "running"
        for c in held:
            await c.close()

    run_daemon(tmp_path, body, max_connections=3)


@pytest.fixture
def circom_circuit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A circom circuit in the config (a small circuit's key and r1cs; the engine double reads neither)."""
    small_circom_key(tmp_path)
    (tmp_path / "c.wasm").write_bytes(b"x")
    monkeypatch.setattr(budget, "circuit_size", lambda spec, backend="cpu": estimated_circuit_size(1 << 10, 1 << 10))
    return {"zkey": str(tmp_path / "c.zkey"), "r1cs": str(tmp_path / "c.r1cs"), "wasm": str(tmp_path / "c.wasm")}


def test_hostile_input_json_is_refused_at_submit(tmp_path: Path, circom_circuit: dict[str, Any]) -> None:
    async def body(d: Daemon, addr: str) -> None:
        async with await AsyncClient.connect(addr) as c:
            for name, _, data, says in INPUT_JSON_PROBES:
                good = P.PartitionIn("json", b'{"a": 1}')
                with pytest.raises(InputError, match="partitions\\[1\\].data") as info:
                    await c.submit("circ", [good, P.PartitionIn("json", data)])
                assert says in str(info.value), (name, str(info.value))
            assert d.engine.submitted == []  # nothing reached a worker, nothing was journaled
            assert d.journal is not None and d.journal.load() == []
            ok = await c.submit("circ", [P.PartitionIn("json", b'{"a": [1, "2"], "b": "0x03"}')])
            assert d.engine.submitted == [ok.job_id]

    run_daemon(tmp_path, body, circuits={"circ": circom_circuit}, max_frame_bytes=MAX_FRAME)


def test_error_texts_quoting_lone_surrogates_still_reach_the_client() -> None:
    reply = P.error_reply(3, "InputError", "signal \ud800 is odd", "tb \udcff")
    back = P.decode_reply(P.encode(reply))
    assert isinstance(back, P.ErrorReply) and "\\ud800" in back.message and back.id == 3


def test_client_refuses_absurd_timeouts_before_sending(tmp_path: Path) -> None:
    async def body(d: Daemon, addr: str) -> None:
        def sync() -> None:
            with Client(addr) as c:
                for bad in (float("inf"), float("nan"), 1e300, -1.0, P.MAX_TIMEOUT_S * 2):
                    with pytest.raises(InputError, match="timeout_s"):
                        c.await_proof("x", bad)
                    with pytest.raises(InputError, match="timeout_s"):
                        c.prove("syn", synthetic_partitions(1), timeout_s=bad)
                assert c.status()["daemon"]["state"] == "running"  # the connection is intact
        await asyncio.to_thread(sync)

    run_daemon(tmp_path, body)


# -- tokens and isolation -------------------------------------------------------------------


def test_a_tenant_sees_no_daemon_paths_in_errors(tmp_path: Path) -> None:
    """A caller without an admin token gets error texts with the daemon's paths cut to their last
    component (as its status shows them) and no traceback; an admin sees them whole."""
    async def body(d: Daemon, addr: str) -> None:
        d.engine.fail_with = "/srv/keys/mult/multiplier.wasm: not all inputs have been set"
        async with await AsyncClient.connect(addr, token=ALICE) as alice, \
                await AsyncClient.connect(addr, token=ADMIN) as admin:
            mine = await alice.prove("syn", synthetic_partitions(1), timeout_s=10)
            assert mine.state == "failed"
            assert mine.partitions[0].error == "multiplier.wasm: not all inputs have been set"
            whole = await admin.await_proof(mine.job_id, 10)
            assert whole.partitions[0].error == "/srv/keys/mult/multiplier.wasm: not all inputs have been set"

    run_daemon(tmp_path, body, tokens=[ALICE], admin_tokens=[ADMIN])


def test_tokens_isolate_clients_and_admins_see_all(tmp_path: Path) -> None:
    port = _free_port()

    def http(path: str, token: str | None = None) -> tuple[int, Any]:
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    async def body(d: Daemon, addr: str) -> None:
        d.engine.gate.clear()
        anon = await AsyncClient.connect(addr, token="")
        alice = await AsyncClient.connect(addr, token=ALICE)
        bob = await AsyncClient.connect(addr, token=BOB)
        admin = await AsyncClient.connect(addr, token=ADMIN)
        wrong = await AsyncClient.connect(addr, token="x" * 20)
        try:
            with pytest.raises(AuthError, match="requires a token"):
                await anon.status()
            with pytest.raises(AuthError, match="not one this daemon knows"):
                await wrong.submit("syn", synthetic_partitions(1))
            a_job = (await alice.submit("syn", synthetic_partitions(1), request_id="a-1")).job_id
            b_job = (await bob.submit("syn", synthetic_partitions(1))).job_id
            for call in (bob.await_proof(a_job, 0.1), bob.cancel(a_job)):
                with pytest.raises(InputError, match="unknown job"):
                    await call
            with pytest.raises(InputError, match="already in use"):
                await bob.submit("syn", synthetic_partitions(1), request_id="a-1")
            assert (await alice.submit("syn", synthetic_partitions(1), request_id="a-1")).duplicate
            a_status, b_status, all_status = await alice.status(), await bob.status(), await admin.status()
            assert [j["job_id"] for j in a_status["jobs"]] == [a_job]
            assert [j["job_id"] for j in b_status["jobs"]] == [b_job]
            assert {j["job_id"] for j in all_status["jobs"]} == {a_job, b_job}
            # each tenant counts its own jobs; the admin all of them
            assert sum(a_status["job_counts"].values()) == sum(b_status["job_counts"].values()) == 1
            assert sum(all_status["job_counts"].values()) == 2
            assert all(s["ring"]["slots"][1].get("job") in (None, a_job) for s in (a_status,))
            for call in (alice.status(detail=True), alice.preload("syn"), alice.evict("syn")):
                with pytest.raises(AuthError, match="admin token"):
                    await call
            detail = await admin.status(detail=True)
            assert detail["daemon"]["pid"] and detail["daemon"]["journal"] == str(tmp_path / "journal.sqlite")
            assert a_status["daemon"]["pid"] is None and a_status["daemon"]["journal"] == "journal.sqlite"
            assert (await admin.cancel(a_job)).cancelled  # an admin cancels anyone's job
            d.engine.gate.set()
            assert (await bob.await_proof(b_job, 10)).state == "done"
            code, doc = await asyncio.to_thread(http, "/status")
            assert code == 401
            code, doc = await asyncio.to_thread(http, "/status", BOB)
            assert code == 200 and [j["job_id"] for j in doc["jobs"]] == [b_job] and doc["daemon"]["pid"] is None
            assert (await asyncio.to_thread(http, "/status?detail=1", BOB))[0] == 403
            code, doc = await asyncio.to_thread(http, "/status?detail=1", ADMIN)
            assert code == 200 and doc["daemon"]["pid"] and len(doc["jobs"]) == 2
            assert (await asyncio.to_thread(http, "/status", "y" * 20))[0] == 403
        finally:
            for c in (anon, alice, bob, admin, wrong):
                await c.close()

    run_daemon(tmp_path, body, tokens=[ALICE, BOB], admin_tokens=[ADMIN], status_listen=f"127.0.0.1:{port}",
               journal=str(tmp_path / "journal.sqlite"))

    async def after_restart(d: Daemon, addr: str) -> None:  # the owners were journaled
        async with await AsyncClient.connect(addr, token=BOB) as bob:
            assert [j["job_id"] for j in (await bob.status())["jobs"]] != []
            assert all(j["job_id"] != "a-1" for j in (await bob.status())["jobs"])
            with pytest.raises(InputError, match="unknown job"):
                await bob.await_proof("a-1", 0)
        async with await AsyncClient.connect(addr, token=ALICE) as alice:
            assert (await alice.await_proof("a-1", 0)).state == "cancelled"

    run_daemon(tmp_path, after_restart, tokens=[ALICE, BOB], admin_tokens=[ADMIN],
               journal=str(tmp_path / "journal.sqlite"))


def test_a_client_token_cannot_ask_a_priority_above_the_cap(tmp_path: Path) -> None:
    """``max_client_priority = "NORMAL"``: a client token's submit or prove asking HIGH or CRITICAL is
    refused (AuthError naming the key), nothing queued or journaled, and is not run at another
    priority; it may ask NORMAL or LOW, and its circuit's own priority (CRITICAL for "crit", what it
    gets asking none); an admin token asks any."""
    async def body(d: Daemon, addr: str) -> None:
        d.engine.gate.clear()  # jobs stay queued: their recorded priority is read below
        async with await AsyncClient.connect(addr, token=ALICE) as alice, \
                await AsyncClient.connect(addr, token=ADMIN) as admin:
            for asked in ("CRITICAL", "HIGH"):
                with pytest.raises(AuthError, match=f'priority {asked} is more urgent than a client of this daemon '
                                                    r'may ask: at most NORMAL \(\[daemon\] max_client_priority = '
                                                    '"NORMAL"\\); ask NORMAL or less'):
                    await alice.submit("syn", synthetic_partitions(1), priority=asked, request_id=f"x-{asked}")
                with pytest.raises(AuthError, match="max_client_priority"):
                    await alice.prove("syn", synthetic_partitions(1), priority=asked, timeout_s=5)
            assert d.jobs is not None and d.jobs.jobs == {} and d.engine.jobs == {}
            mine = {asked: (await alice.submit("syn", synthetic_partitions(1), priority=asked)).job_id
                    for asked in ("NORMAL", "LOW")}
            for asked in (None, "CRITICAL", "HIGH"):  # the circuit's own is CRITICAL
                mine[f"crit {asked}"] = (await alice.submit("crit", synthetic_partitions(1), priority=asked)).job_id
            mine["admin"] = (await admin.submit("syn", synthetic_partitions(1), priority="CRITICAL")).job_id
            got = {k: d.jobs.jobs[j].priority.name for k, j in mine.items()}
            assert got == {"NORMAL": "NORMAL", "LOW": "LOW", "crit None": "CRITICAL", "crit CRITICAL": "CRITICAL",
                           "crit HIGH": "HIGH", "admin": "CRITICAL"}
            d.engine.gate.set()

    run_daemon(tmp_path, body, tokens=[ALICE], admin_tokens=[ADMIN], max_client_priority="NORMAL")


def test_without_tokens_the_status_still_hides_paths_and_pids_unless_asked(tmp_path: Path) -> None:
    async def body(d: Daemon, addr: str) -> None:
        async with await AsyncClient.connect(addr) as c:
            plain, detail = await c.status(), await c.status(detail=True)
        assert plain["daemon"]["pid"] is None and plain["processes"][0]["pid"] is None
        assert plain["daemon"]["listen"] == "unix://d.sock" and not plain["detail"]
        assert str(tmp_path) not in json.dumps(plain)
        assert detail["daemon"]["pid"] > 0 and detail["daemon"]["listen"] == f"unix://{tmp_path}/d.sock"
        assert detail["detail"]

    run_daemon(tmp_path, body)


def test_a_taken_status_port_is_a_message_and_starts_nothing(tmp_path: Path) -> None:
    from tests.fake_engine import FakeEngine, make_config

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = make_config(tmp_path, status_listen=f"127.0.0.1:{port}")
        started: list[Any] = []

        def factory(*a: Any) -> FakeEngine:
            started.append(a)
            return FakeEngine(*a)

        async def main() -> None:
            d = Daemon(cfg, engine_factory=factory)
            with pytest.raises(ConfigError, match=f"daemon.status_listen = '127.0.0.1:{port}': cannot listen"):
                await d.start()
            assert d.state.value == "failed"
        asyncio.run(main())
    assert started == [] and not (tmp_path / "d.sock").exists()
    assert not (tmp_path / "cache" / "journal.sqlite").exists()  # not even the journal was opened


def test_a_request_without_a_valid_token_ends_its_connection(tmp_path: Path) -> None:
    """Where tokens are required, a peer without one is answered (AuthError) and disconnected: it holds
    no connection slot (max_connections) for as long as it likes; a caller with a token is served."""
    async def body(d: Daemon, addr: str) -> None:
        path = str(tmp_path / "d.sock")
        two = frame(P.encode(P.GetStatus(id=1))) + frame(P.encode(P.GetStatus(id=2, token="wrong-token-1234567")))
        replies, closed = await asyncio.to_thread(exchange, path, two, 2, 10.0)
        assert closed and [r.kind for r in replies] == ["AuthError"], replies
        async with await AsyncClient.connect(addr, token=ALICE) as c:
            assert (await c.status())["daemon"]["state"] == "running"

    run_daemon(tmp_path, body, tokens=[ALICE], admin_tokens=[ADMIN])


def test_a_peer_without_a_token_cannot_hold_its_connection_with_malformed_frames(tmp_path: Path) -> None:
    """Where tokens are required, a frame that is no request (it carries no token the daemon could read)
    from a connection that never showed a valid token ends that connection after its InputError: the
    peer holds no slot by sending such frames, or one and then nothing, while a caller that showed its
    token keeps its connection across a malformed frame."""
    async def body(d: Daemon, addr: str) -> None:
        path = str(tmp_path / "d.sock")
        for junk in (frame(b"hello"), frame(b"\x93\x01\x02")):
            replies, closed = await asyncio.to_thread(exchange, path, junk + junk, 2, 10.0)
            assert closed and [r.kind for r in replies] == ["InputError"], replies
        tokened = frame(P.encode(P.GetStatus(id=1, token=ALICE))) + frame(b"hello")
        replies, closed = await asyncio.to_thread(exchange, path, tokened, 2, 10.0)
        assert not closed and sorted(type(r).__name__ for r in replies) == ["ErrorReply", "StatusReply"], replies

    run_daemon(tmp_path, body, tokens=[ALICE], admin_tokens=[ADMIN])


def test_the_status_port_serves_a_bounded_number_of_connections(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Peers that connect to the status port and say nothing hold at most MAX_CONNECTIONS connections
    (each for the head's deadline at most); one more is closed unanswered, and once they go the port
    answers again."""
    from cuzk_mp.daemon import status_http

    monkeypatch.setattr(status_http, "MAX_CONNECTIONS", 3)
    port = _free_port()

    async def body(d: Daemon, addr: str) -> None:
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        await asyncio.sleep(0.3)
        extra = socket.create_connection(("127.0.0.1", port))
        extra.settimeout(5)
        try:
            extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = await asyncio.to_thread(extra.recv, 100)
        except ConnectionResetError:
            answer = b""
        assert answer == b""  # closed, unanswered
        extra.close()
        for s in idle:
            s.close()
        await asyncio.sleep(0.3)

        def health() -> int:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
                return int(r.status)

        assert await asyncio.to_thread(health) == 200

    run_daemon(tmp_path, body, status_listen=f"127.0.0.1:{port}")
