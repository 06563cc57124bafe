"""Hostile-input probe of a live proving daemon (CPU backend), with the counts for the record.

Starts ``cuzk-mp daemon`` (synthetic porep-like 2^10 and, when the node tools are installed, the
circom ``multiplier`` test circuit with its wasm) on a unix socket with a status port and the
default shm prefix, keeps a light legitimate load running (a job every ~1.5 s), and tries, each
on its own connection or process:

* every hostile frame of tests/hostile_corpus.py (depth, size, numbers, encodings, schema,
  truncation) and every hostile input JSON (refused at submit);
* slowloris: connections each holding an unfinished 4 MiB frame; a connection flood past
  ``max_connections``; a client that pipelines requests and never reads;
* the CLI: absurd ``client await --timeout`` values, ``groth16 verify`` and ``wtns calculate``
  of hostile files; a twin daemon with the same config; daemons started on damaged journals;
* at the end a SIGKILL of the whole process tree mid-load and a restart.

A probe *survived* when the daemon answered it as it must (a typed error with the right id, a
documented exit code) and still served a GetStatus afterwards. *Jobs lost*: legitimate jobs
acknowledged by the daemon that did not end done with proofs that verify (across the kill and
restart too). *Entries leaked*: /dev/shm entries of the killed tree that survived the restart,
plus any left after the final SIGTERM. Writes ``perf/results/hostile-probe.json``::

    .venv/bin/python perf/hostile_probe.py [--json perf/results/hostile-probe.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cuzk_mp.daemon import protocol as P  # noqa: E402
from cuzk_mp.daemon.client import Client, synthetic_partitions  # noqa: E402
from cuzk_mp.daemon.config import default_shm_prefix  # noqa: E402
from cuzk_mp.daemon.transport import frame  # noqa: E402
from cuzk_mp.errors import InputError  # noqa: E402
from cuzk_mp.formats.snarkjs_json import proof_from_json, public_from_json, vk_from_json  # noqa: E402
from cuzk_mp.groth16.verifier import verify  # noqa: E402
from cuzk_mp.pipeline.benchreport import machine_info  # noqa: E402
from tests.hostile_corpus import INPUT_JSON_PROBES, frame_probes  # noqa: E402
from tests.helpers import (  # noqa: E402
    ENV, PY, DaemonProcess, config_text, ended_unreaped, exchange, frozen_tree, shm_inodes)

MAX_FRAME = 8 * 2**20
FRAME_TIMEOUT_S = 3.0
MAX_CONNECTIONS = 64


def probe_config(work: Path, port: int | None, extra: str = "") -> str:
    """The daemon's config: the test suite's small CPU config, with the default shm prefix, an
    8 MiB frame limit, a 3 s frame deadline and a 64-connection cap."""
    return config_text(work, work / "keys", prefix="", status_port=port, extra=extra).replace(
        'max_frame_bytes = "4MiB"\n',
        f'max_frame_bytes = {MAX_FRAME}\nframe_timeout = "{FRAME_TIMEOUT_S}s"\nmax_connections = {MAX_CONNECTIONS}\n')


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serving(d: DaemonProcess) -> bool:
    """Whether the daemon is alive and answers GetStatus as running."""
    if d.proc.poll() is not None:
        return False
    try:
        with Client(d.addr, connect_timeout=10) as c:
            return bool(c.status()["daemon"]["state"] == "running")
    except Exception:  # noqa: BLE001 - any failure means "not serving"
        return False


def rss(d: DaemonProcess) -> int:
    """The daemon process's resident set (the frames it reads live there)."""
    try:
        return int(psutil.Process(d.proc.pid).memory_info().rss)
    except psutil.NoSuchProcess:
        return 0


class Record:
    """Counts per family, the failures, and the daemon's health after each probe."""

    def __init__(self, daemon: DaemonProcess) -> None:
        self.daemon = daemon
        self.families: dict[str, dict[str, int]] = {}
        self.failures: list[dict[str, str]] = []

    def probe(self, family: str, name: str, fn: Callable[[], bool | str], needs_daemon: bool = True) -> None:
        t0 = time.monotonic()
        try:
            result = fn()
        except Exception as e:  # noqa: BLE001 - a probe that raises did not get its answer
            result = f"{type(e).__name__}: {e}"
        ok = result is True
        alive = serving(self.daemon) if needs_daemon else True
        fam = self.families.setdefault(family, {"tried": 0, "as_expected": 0, "survived": 0})
        fam["tried"] += 1
        fam["as_expected"] += ok
        fam["survived"] += ok and alive
        if not (ok and alive):
            self.failures.append({"family": family, "probe": name, "result": str(result)[:500],
                                  "daemon_serving": str(alive)})
            log(f"  FAIL {family}: {name}: {str(result)[:200]} (serving: {alive})")
        elif time.monotonic() - t0 > 5:
            log(f"  ok {family}: {name} ({time.monotonic() - t0:.1f} s)")


class Load:
    """Legitimate jobs in the background: one every ``period`` seconds; ids of acknowledged ones."""

    def __init__(self, addr: str, period: float = 1.5) -> None:
        self.addr, self.period = addr, period
        self.jobs: list[str] = []
        self.refused: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._seed = 10_000

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def submit_one(self) -> None:
        self._seed += 2
        try:
            with Client(self.addr) as c:
                self.jobs.append(c.submit("syn", synthetic_partitions(2, self._seed)).job_id)
        except Exception as e:  # noqa: BLE001 - a refused legit submit is recorded, not fatal
            self.refused.append(f"{type(e).__name__}: {e}")

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.submit_one()


def verified(addr: str, job_ids: list[str], timeout: float) -> tuple[int, list[str]]:
    """How many of ``job_ids`` are done with proofs that verify; the others with their state."""
    ok, bad = 0, []
    with Client(addr) as c:
        vk = vk_from_json(c.verification_key("syn"))
        for job in job_ids:
            try:
                r = c.await_proof(job, timeout_s=timeout)
            except InputError as e:
                bad.append(f"{job}: {e}")
                continue
            good = r.state == "done" and all(
                verify(vk, public_from_json(p.public), proof_from_json(p.proof)) for p in r.partitions)
            if good:
                ok += 1
            else:
                bad.append(f"{job}: {r.state} {r.error}")
    return ok, bad


def frame_family(rec: Record, path: str) -> None:
    follow = frame(P.encode(P.GetMetrics(id=999)))
    for p in frame_probes(MAX_FRAME):
        def run(p: Any = p) -> bool | str:
            replies, closed = exchange(path, p.wire() + follow, 1 if p.closes else 2)
            if not replies or not isinstance(replies[0], P.ErrorReply):
                return f"no error reply: {replies}"
            r = replies[0]
            if (r.kind, r.id) != (p.kind, p.reply_id) or p.says not in r.message:
                return f"got {r.kind} id {r.id}: {r.message[:200]}"
            if p.closes:
                return closed or "connection left open"
            return isinstance(replies[1], P.MetricsReply) or f"then {replies[1:]}"
        rec.probe(f"frame/{p.family}", p.name, run)


def json_family(rec: Record, addr: str) -> None:
    for name, family, data, says in INPUT_JSON_PROBES:
        def run(data: bytes = data, says: str = says) -> bool | str:
            with Client(addr) as c:
                try:
                    c.submit("mul", [P.PartitionIn("json", data)])
                except InputError as e:
                    return (says in str(e) and "partitions[0].data" in str(e)) or str(e)
            return "accepted"
        rec.probe(f"input-json/{family}", name, run)


def slowloris(rec: Record, path: str, daemon: DaemonProcess, n: int = 20) -> dict[str, Any]:
    """``n`` connections each announce a 4 MiB frame, send 1 MiB of it and stall."""
    base = rss(daemon)
    socks, peak = [], base
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        s.sendall(struct.pack(">I", 4 * 2**20) + b"\x80" * 2**20)
        socks.append(s)
    t0 = time.monotonic()
    answered = 0
    for s in socks:
        s.settimeout(FRAME_TIMEOUT_S + 20)
        peak = max(peak, rss(daemon))
        try:
            data = s.recv(1 << 16)
            n_body = struct.unpack(">I", data[:4])[0]
            r = P.decode_reply(data[4:4 + n_body])
            answered += isinstance(r, P.ErrorReply) and "frame_timeout" in r.message
        except (OSError, struct.error):
            pass
        s.close()
    cut_s = time.monotonic() - t0
    for i in range(n):
        def cut_off(i: int = i) -> bool | str:
            return i < answered or "not cut off"
        rec.probe("slowloris", f"stalled 4 MiB frame #{i}", cut_off)
    return {"connections": n, "answered_and_closed": answered, "all_cut_within_s": round(cut_s, 2),
            "daemon_rss_before_bytes": base, "daemon_rss_peak_bytes": peak}


def flood(rec: Record, path: str) -> None:
    held = []
    for _ in range(MAX_CONNECTIONS):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        held.append(s)
    time.sleep(0.5)
    for i in range(10):
        def run() -> bool | str:
            replies, closed = exchange(path, b"", 1, 10)
            return (closed and replies and replies[0].kind == "ResourceError") or f"{replies} closed={closed}"
        rec.probe("connection-flood", f"connection {MAX_CONNECTIONS + i + 1}", run, needs_daemon=False)
    for s in held:
        s.close()
    time.sleep(0.5)
    rec.probe("connection-flood", "served again once they close", lambda: True)


def never_reads(rec: Record, path: str) -> None:
    def run() -> bool | str:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(path)
        req = frame(P.encode(P.GetStatus(id=1)))
        s.sendall(req * 1000)
        time.sleep(FRAME_TIMEOUT_S + 3)
        s.settimeout(5)
        got = 0
        try:
            while chunk := s.recv(1 << 16):
                got += len(chunk)
        except OSError:
            pass
        s.close()
        return got < 1000 * 1000 or f"got {got} bytes: the daemon never gave up on it"
    rec.probe("never-reads", "1000 pipelined GetStatus, nothing read", run)


def cli_family(rec: Record, work: Path, addr: str) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*PY, *args], env=ENV, capture_output=True, text=True, timeout=120, check=False)

    for t in ("1e300", "inf", "nan", "-1"):
        def timeout_arg(t: str = t) -> bool | str:
            p = cli("client", "await", "x", "--connect", addr, f"--timeout={t}")
            return (p.returncode == 2 and "Traceback" not in p.stderr) or f"exit {p.returncode}: {p.stderr[-300:]}"
        rec.probe("cli/timeout", t, timeout_arg)
    data = REPO / "tests" / "data_formats"
    deep = "[" * 100_000 + "]" * 100_000
    for which, content in (("public", "[" + "1" * 5000 + "]"), ("proof", deep), ("vk", '{"nPublic": NaN}')):
        def verify_file(which: str = which, content: str = content) -> bool | str:
            files = {"vk": data / "verification_key.json", "public": data / "public.json", "proof": data / "proof.json"}
            bad = work / f"bad-{which}.json"
            bad.write_text(content)
            files[which] = bad
            p = cli("groth16", "verify", str(files["vk"]), str(files["public"]), str(files["proof"]))
            return (p.returncode == 2 and str(bad) in p.stderr and "Traceback" not in p.stderr
                    and "OK!" not in p.stdout) or f"exit {p.returncode}: {p.stderr[-300:]}"
        rec.probe("cli/groth16-verify", f"hostile {which}", verify_file)
    for name, raw in (("5000 digits", b'{"a": ' + b"9" * 5000 + b"}"), ("deep", b'{"a": ' + deep.encode() + b"}")):
        def wtns_input(raw: bytes = raw) -> bool | str:
            (work / "in.json").write_bytes(raw)
            p = cli("wtns", "calculate", str(work / "none.wasm"), str(work / "in.json"), str(work / "w.wtns"))
            return (p.returncode == 2 and "Traceback" not in p.stderr) or f"exit {p.returncode}: {p.stderr[-300:]}"
        rec.probe("cli/wtns-calculate", name, wtns_input)


def twin(rec: Record, config: Path, prefix: str) -> None:
    def run() -> bool | str:
        before = shm_inodes(prefix)
        p = subprocess.run([*PY, "daemon", "--config", str(config)], env=ENV, capture_output=True, text=True,
                           timeout=120, check=False)
        after = shm_inodes(prefix)
        kept = all(after.get(k) == v for k, v in before.items() if k.endswith(("-ctl", "-free", "-ready")))
        return (p.returncode == 75 and kept and "Traceback" not in p.stderr) or \
            f"exit {p.returncode}, ring kept: {kept}: {p.stderr[-300:]}"
    rec.probe("twin", "same config, status port taken", run)


def journals(rec: Record, work: Path) -> None:
    """Daemons started on damaged journals exit 65 with a message (before touching the engine)."""
    import asyncio

    from cuzk_mp.daemon.journal import Journal, JournalEntry

    def start_on(d: Path) -> bool | str:
        cfg = d / "cuzk.toml"
        cfg.write_text(probe_config(d, free_port()))
        p = subprocess.run([*PY, "daemon", "--config", str(cfg)], env=ENV, capture_output=True, text=True,
                           timeout=120, check=False)
        return (p.returncode == 65 and "refusing to start" in p.stderr and not (d / "keys").exists()) or \
            f"exit {p.returncode}: {p.stderr[-300:]}"

    def make(d: Path) -> Journal:
        d.mkdir()
        j = Journal.open(d / "journal.sqlite")

        async def fill() -> None:
            for i in range(20):
                await j.add(JournalEntry(job_id=f"j{i}", request_id="", circuit_id="syn", priority=2,
                                         digest="d", partitions=synthetic_partitions(1, i), submitted_at=1.0))
        asyncio.run(fill())
        return j

    cases: dict[str, Callable[[Path], object]] = {
        "truncated to 0 bytes": lambda p: p.write_bytes(b""),
        "deleted": lambda p: p.unlink(),
        "garbage": lambda p: p.write_bytes(os.urandom(40960)),
    }
    for name, damage in cases.items():
        def run(name: str = name, damage: Callable[[Path], object] = damage) -> bool | str:
            d = work / f"journal-{name.replace(' ', '-')}"
            make(d).close()
            damage(d / "journal.sqlite")
            return start_on(d)
        rec.probe("journal", name, run, needs_daemon=False)

    def damaged_wal() -> bool | str:
        d = work / "journal-wal"
        live = make(d)  # still open: its WAL holds the 20 jobs, as after a SIGKILL
        crash = work / "journal-wal-crash"
        crash.mkdir()
        for suffix in ("", "-wal", ".id"):
            shutil.copy(f"{d / 'journal.sqlite'}{suffix}", f"{crash / 'journal.sqlite'}{suffix}")
        live.close()
        wal = bytearray(Path(f"{crash / 'journal.sqlite'}-wal").read_bytes())
        wal[32 + 2 * (24 + 4096) + 500] ^= 0xFF
        Path(f"{crash / 'journal.sqlite'}-wal").write_bytes(wal)
        return start_on(crash)
    rec.probe("journal", "damaged WAL", damaged_wal, needs_daemon=False)


def build_circom(work: Path) -> str:
    """The multiplier circuit's [circuits.mul] table, or "" without the node tools."""
    from tests.oracle import Oracle, tools_missing
    if tools_missing() is not None:
        log(f"node tools missing ({tools_missing()}): no circom circuit, input-JSON probes skipped")
        return ""
    from cuzk_mp.backends import get_backend
    from cuzk_mp.groth16.setup import setup_file
    files = Oracle().circuit("multiplier")
    setup_file(files.r1cs, work / "mul.zkey", get_backend("cpu"))
    return f'[circuits.mul]\nzkey = "{work / "mul.zkey"}"\nr1cs = "{files.r1cs}"\nwasm = "{files.wasm}"\n'


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, default=REPO / "perf" / "results" / "hostile-probe.json")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cuzk-hostile-"))
    t_start = time.monotonic()
    extra = build_circom(work)
    port = free_port()
    config = work / "cuzk.toml"
    config.write_text(probe_config(work, port, extra))
    prefix = default_shm_prefix(work / "journal.sqlite")
    path = str(work / "cuzk.sock")
    daemon = DaemonProcess(config, work)
    daemon.wait_ready(600)
    log(f"daemon pid {daemon.proc.pid} ready; shm prefix {prefix}")
    rec = Record(daemon)
    load = Load(daemon.addr)
    load.start()
    memory: dict[str, Any] = {"daemon_rss_at_start_bytes": rss(daemon)}

    log("frames")
    frame_family(rec, path)
    if extra:
        log("input JSON")
        json_family(rec, daemon.addr)
        with Client(daemon.addr) as c:  # the JSON path itself works
            r = c.prove("mul", [P.PartitionIn("json", b'{"a": "3", "b": 11}')], timeout_s=300)
            rec.probe("input-json/legit", "a valid input proves", lambda: r.state == "done" or str(r.error))
    log("slowloris")
    memory["slowloris"] = slowloris(rec, path, daemon)
    log("connection flood")
    flood(rec, path)
    log("client that never reads")
    never_reads(rec, path)
    log("CLI")
    cli_family(rec, work, daemon.addr)
    log("twin daemon")
    twin(rec, config, prefix)
    log("damaged journals")
    journals(rec, work)
    memory["daemon_rss_after_probes_bytes"] = rss(daemon)

    log("whole-tree SIGKILL mid-load, then restart")
    for _ in range(4):
        load.submit_one()
    with Client(daemon.addr) as c:  # a long job, so that ring slots are live when the tree dies
        big = c.submit("syn", synthetic_partitions(30, 50_000)).job_id
        load.jobs.append(big)
        deadline = time.monotonic() + 300
        while not any(p.state == "done" for p in c.await_proof(big, 0.2).partitions) and time.monotonic() < deadline:
            pass
    before_kill = shm_inodes(prefix)
    tree = frozen_tree(daemon.proc.pid)  # stopped first, so that no child outlives the engine and cleans up
    for p in tree:
        p.send_signal(signal.SIGKILL)
    ended_unreaped(tree)
    left_by_kill = shm_inodes(prefix)  # before the engine is reaped: no other engine's start removes its ring
    daemon.proc.wait()
    load.stop()
    daemon = DaemonProcess(config, work)
    daemon.wait_ready(600)
    rec.daemon = daemon
    kept_after_restart = [k for k, ino in left_by_kill.items() if shm_inodes(prefix).get(k) == ino]
    log(f"killed tree left {len(left_by_kill)} entries; {len(kept_after_restart)} survived the restart")
    done, not_done = verified(daemon.addr, load.jobs, timeout=600)
    daemon.proc.send_signal(signal.SIGTERM)
    exit_code = daemon.proc.wait(120)
    left_at_stop = shm_inodes(prefix)

    tried = sum(f["tried"] for f in rec.families.values())
    survived = sum(f["survived"] for f in rec.families.values())
    leaked = len(kept_after_restart) + len(left_at_stop)
    result: dict[str, Any] = {
        "what": "hostile probes against a live CPU-backend cuzk-mp daemon (porep-like 2^10 and the circom "
                "multiplier circuit) under a light legitimate load, then a whole-tree SIGKILL mid-load and a restart",
        "command": "python perf/hostile_probe.py",
        "machine": {**machine_info([]), "kernel": platform.release()},
        "counts": {"inputs_tried": tried, "survived": survived, "jobs_lost": len(not_done),
                   "entries_leaked": leaked},
        "families": rec.families,
        "failures": rec.failures,
        "legit_jobs": {"acknowledged": len(load.jobs), "done_and_verified": done, "not_done": not_done,
                       "submits_refused": load.refused},
        "shm": {"prefix_entries_before_kill": len(before_kill), "left_by_the_killed_tree": len(left_by_kill),
                "kept_after_restart": kept_after_restart, "left_after_sigterm": sorted(left_at_stop)},
        "final_sigterm_exit_code": exit_code,
        "memory": memory,
        "config": {"max_frame_bytes": MAX_FRAME, "frame_timeout_s": FRAME_TIMEOUT_S,
                   "max_connections": MAX_CONNECTIONS},
        "wall_s": round(time.monotonic() - t_start, 1),
        "date": time.strftime("%Y-%m-%d"),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    log(f"{tried} tried, {survived} survived, {len(not_done)} jobs lost, "
        f"{leaked} entries leaked -> {args.json}")
    shutil.rmtree(work, ignore_errors=True)
    return 0 if survived == tried and not not_done and not leaked else 1


if __name__ == "__main__":
    sys.exit(main())
