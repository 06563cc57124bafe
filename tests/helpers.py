"""Helpers shared by the pipeline and daemon tests (imported by them; fixtures built on these live in
conftest.py): a result collector, the synthetic test key and an independent proof checker, a daemon
subprocess and its config, a strict Prometheus text parser, /dev/shm accounting, and proof checking
against two verifiers: cuzk-mp's own pairing check and, when the node tools are installed, snarkjs.

The synthetic circuit's dev key lives in ``.cache/pipeline-test-keys`` (git-ignored) and is rebuilt
by :func:`ensure_synthetic_key` only when the generator changes.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil
import pytest

from cuzk_mp.daemon import protocol as P
from cuzk_mp.daemon.client import Client
from cuzk_mp.formats.snarkjs_json import proof_from_json, public_from_json, vk_from_json
from cuzk_mp.groth16.verifier import verify
from cuzk_mp.pipeline.types import JobResult, PartitionResult

REPO = Path(__file__).resolve().parents[1]
PY = [sys.executable, "-m", "cuzk_mp.cli"]
ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
       "CUZK_MP": f"{sys.executable} -m cuzk_mp.cli"}
KEY_CACHE = REPO / ".cache" / "pipeline-test-keys"
# The fields of a JobReply that releases before JobReply.key_digest know: they decode a stored reply
# (a journal row, a fleet job's result) strictly, refusing any other (the "type" tag included here).
REPLY_FIELDS_BEFORE_KEY_DIGEST = frozenset({
    "type", "id", "job_id", "circuit_id", "state", "priority", "partitions", "submitted_at", "started_at",
    "finished_at", "error", "error_kind", "timed_out"})
SNARKJS_FILES = REPO / "tests" / "data_formats"  # a small circom circuit's files, made by circom and snarkjs


def load_script(path: Path, name: str | None = None) -> ModuleType:
    """A script of scripts/ or perf/ imported as a module (under ``name``, default its file's stem),
    so a test can call its functions without running it."""
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def small_circom_key(folder: Path, name: str = "c") -> tuple[Path, Path]:
    """``NAME.zkey`` and ``NAME.r1cs`` in ``folder``: copies of a small circom circuit's key and r1cs (a
    daemon's config check reads both headers; what the engine double proves never reads them)."""
    import shutil

    zkey, r1cs = folder / f"{name}.zkey", folder / f"{name}.r1cs"
    shutil.copyfile(SNARKJS_FILES / "mul.zkey", zkey)
    shutil.copyfile(SNARKJS_FILES / "mul.r1cs", r1cs)
    return zkey, r1cs


_R_BYTES = "".join(f"\\{b:02x}" for b in (0x73EDA753299D7D483339D80809A1D80553BDA402FFFE5BFEFFFFFFFF00000001)
                   .to_bytes(32, "little"))


def circom_generator(folder: Path, name: str, version: str = "(i32.const 2)", start: str = "",
                     witness_size: str = "", init: str = "(param i32)",
                     imports: str = "", message_char: str = "(result i32) (i32.const 0)", more: str = "",
                     inputs: int = 0, set_input: str = "") -> Path:
    """``NAME.wasm`` in ``folder``: a minimal circom-2-shaped witness generator with one part replaced: a
    function's signature and body, ``imports`` of the runtime's functions, ``more`` module fields
    (globals, data), ``set_input`` code run first in ``setInputSignal`` (its index is local 2). Its witness
    is 1 and then its ``inputs`` input values as they were set (every name an input signal of that many
    values): what the calculator wrote, read back."""
    import wasmtime

    one = "\\01" + "\\00" * 31
    witness_size = witness_size or f"(result i32) (i32.const {inputs + 1})"
    wat = f"""(module
      {imports}
      (memory (export "memory") {1 + (2048 + 32 * (inputs + 1)) // 65536})
      (data (i32.const 0) "{_R_BYTES}")
      (data (i32.const 2048) "{one}")
      {more}
      (func $start {start})
      (start $start)
      (func (export "getVersion") (result i32) {version})
      (func (export "getFieldNumLen32") (result i32) (i32.const 8))
      (func (export "getRawPrime") (memory.copy (i32.const 1024) (i32.const 0) (i32.const 32)))
      (func (export "getWitnessSize") {witness_size})
      (func (export "getInputSize") (result i32) (i32.const {inputs}))
      (func (export "getSharedRWMemoryStart") (result i32) (i32.const 1024))
      (func (export "getMessageChar") {message_char})
      (func (export "init") {init})
      (func (export "getInputSignalSize") (param i32 i32) (result i32) (i32.const {inputs}))
      (func (export "setInputSignal") (param i32 i32 i32)
        {set_input}
        (memory.copy (i32.add (i32.const 2080) (i32.shl (local.get 2) (i32.const 5))) (i32.const 1024) (i32.const 32)))
      (func (export "getWitness") (param i32)
        (memory.copy (i32.const 1024) (i32.add (i32.const 2048) (i32.shl (local.get 0) (i32.const 5)))
                     (i32.const 32))))"""
    path = folder / f"{name}.wasm"
    path.write_bytes(wasmtime.wat2wasm(wat))
    return path


LOG_N = 10  # the smallest porep-like circuit: fast on the 2-core CI machine
# Prepended to a ``python -c`` program: any import of numpy, numba or the arkworks curve arithmetic
# then fails (what a client process must do without: ~0.3 s of imports a process).
REFUSE_NUMPY = r"""
import importlib.abc, sys

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("numpy", "numba", "py_arkworks_bls12381"):
            raise ImportError(f"{name} imported by a client process")
        return None

sys.meta_path.insert(0, Refuse())
"""


def on_small_tmpfs(folder: Path, room: int, script: str, *, env: dict[str, str] | None = None,
                   timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``sh -c script`` in a private mount namespace where the folder ``folder`` is a tmpfs of ``room``
    bytes: a file system that fills up, seen by that process alone (run as root, or as a mapped root
    in a user namespace). The test is skipped, saying so, where no mount namespace can be made."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1): cannot make a private mount namespace for a small tmpfs")
    prefix = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    proc = subprocess.run(["unshare", *prefix, "--mount", "sh", "-c",
                           f"mount -t tmpfs -o size={room} none {folder} || exit 99; {script}"],
                          env=ENV if env is None else env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if proc.returncode == 99 or "unshare:" in proc.stderr:
        pytest.skip(f"no private mount namespace here: {proc.stderr.strip()[-200:]}")
    return proc


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prefix_for(tag: str) -> str:
    """A per-run shm prefix (so concurrent test runs on one machine never collide)."""
    return f"cuzk-t{tag}-{os.getpid()}"


class Collector:
    """Collects engine callbacks; :meth:`wait` blocks until a job is reported."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.jobs: dict[str, JobResult] = {}
        self.partitions: list[tuple[str, PartitionResult]] = []
        self.threads: set[str] = set()

    def job(self, result: JobResult) -> None:
        """on_job_done."""
        with self.cond:
            self.threads.add(threading.current_thread().name)
            self.jobs[result.job_id] = result
            self.cond.notify_all()

    def partition(self, job_id: str, result: PartitionResult) -> None:
        """on_partition_done."""
        with self.cond:
            self.threads.add(threading.current_thread().name)
            self.partitions.append((job_id, result))

    def wait(self, job_id: str, timeout: float = 180.0) -> JobResult:
        """The job's result, once reported (AssertionError after ``timeout``)."""
        with self.cond:
            assert self.cond.wait_for(lambda: job_id in self.jobs, timeout), f"job {job_id} not done in {timeout} s"
            return self.jobs[job_id]


def synthetic_key() -> tuple[Path, Path]:
    """(zkey, r1cs) of porep-like 2^LOG_N in the test key cache, keyed by snarkjs when it can be.

    With the node tools installed, the zkey comes from snarkjs ``groth16 setup`` on
    the oracle's 2^10 ptau (plus one contribution): a key made outside cuzk-mp. It
    is put into the cache under the names :func:`ensure_synthetic_key` uses, next
    to the generator's r1cs, so the engine's own lookup finds it (the r1cs bytes
    match) and runs no setup. Without the tools, ensure_synthetic_key makes the
    key with cuzk-mp's dev setup, so the pipeline tests still run.
    """
    from cuzk_mp.circuits.synthetic import PorepLike
    from cuzk_mp.formats.r1cs import write_r1cs
    from cuzk_mp.pipeline.keys import ensure_synthetic_key, synthetic_key_paths

    from tests.oracle import _ORACLE, groth16_setup, tools_missing

    if tools_missing() is not None:
        return ensure_synthetic_key("porep-like", LOG_N, KEY_CACHE, "cpu")
    zkey, r1cs = synthetic_key_paths("porep-like", LOG_N, KEY_CACHE)
    KEY_CACHE.mkdir(parents=True, exist_ok=True)
    with open(KEY_CACHE / f"porep-like-{LOG_N}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with tempfile.TemporaryDirectory(dir=KEY_CACHE) as tmp:
            fresh = Path(tmp) / "c.r1cs"
            write_r1cs(fresh, PorepLike(LOG_N).r1cs())
            if not (zkey.exists() and r1cs.exists() and fresh.read_bytes() == r1cs.read_bytes()):
                made = groth16_setup(fresh, _ORACLE.ptau(), Path(tmp) / "k.zkey")
                os.replace(fresh, r1cs)
                os.replace(made, zkey)
    return ensure_synthetic_key("porep-like", LOG_N, KEY_CACHE, "cpu")


class ProofChecker:
    """Independent checks of pipeline output for the synthetic circuit."""

    def __init__(self, zkey_path: Path, log_n: int = LOG_N) -> None:
        from cuzk_mp.circuits.synthetic import PorepLike
        from cuzk_mp.formats.zkey import read_zkey
        from cuzk_mp.groth16.keys import prepare_vk, vk_from_zkey

        with read_zkey(zkey_path) as zkey:
            self.pvk = prepare_vk(vk_from_zkey(zkey))
            self.n_public = zkey.n_public
        self.circuit = PorepLike(log_n)

    def expected_public(self, seed: int, partition: int) -> list[int]:
        """w[1..n_public] of the generator's own witness."""
        from cuzk_mp.algebra.field import limbs_to_ints

        w = self.circuit.witness(seed, partition)
        return limbs_to_ints(w[1 : self.n_public + 1])

    def verifies(self, public: list[int], proof: dict[str, Any] | None) -> bool:
        """The pairing check of a snarkjs proof.json with the zkey's verification key."""
        return proof is not None and bool(verify(self.pvk, public, proof_from_json(proof)))


def wait_until(predicate: Any, timeout: float = 120.0, interval: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy; returns it (AssertionError on timeout)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")


_SAMPLE = re.compile(
    r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*\})? '
    r'(-?[0-9.e+-]+|\+Inf|-Inf|NaN)$')


DEFAULT_CIRCUITS = """[circuits.syn]
synthetic = "porep-like"
log_n = 10
partitions = 2
[circuits.crit]
synthetic = "porep-like"
log_n = 10
priority = "CRITICAL"
"""


def config_text(workdir: Path, cache: Path, *, prefix: str, status_port: int | None = None,
                grace: str = "30s", devices: str = "[0]", extra: str = "", daemon: str = "", srs: str = "",
                circuits: str = DEFAULT_CIRCUITS) -> str:
    """A small CPU-backend daemon config on a unix socket in ``workdir``; ``daemon`` and ``srs`` are
    more lines of those sections, ``circuits`` the circuit tables, ``extra`` more sections."""
    return f"""
[daemon]
listen = "unix://{workdir}/cuzk.sock"
status_listen = "{f'127.0.0.1:{status_port}' if status_port else ''}"
journal = "{workdir}/journal.sqlite"
shutdown_grace = "{grace}"
max_frame_bytes = "4MiB"
{daemon}
[srs]
param_cache = "{cache}"
{srs}
[memory]
total_budget = "16GiB"
safety_margin = "1GiB"
[synthesis]
partition_workers = 1
[pipeline]
ring_slots = 2
shm_prefix = "{prefix}"
[gpus]
backend = "cpu"
devices = {devices}
gpu_workers_per_device = 1
[logging]
level = "info"
format = "json"
{circuits}{extra}
"""


class DaemonProcess:
    """``cuzk-mp daemon --config`` as a subprocess, logging to ``workdir/daemon.log``."""

    def __init__(self, config: Path, workdir: Path, env: dict[str, str] | None = None) -> None:
        self.config, self.workdir = config, workdir
        self.addr = f"unix://{workdir}/cuzk.sock"
        self.log_path = workdir / "daemon.log"
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([*PY, "daemon", "--config", str(config)], cwd=REPO,
                                     env={**ENV, **(env or {})}, stdout=self._log,
                                     stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 300.0) -> None:
        """Poll until the daemon answers GetStatus as running."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited {self.proc.returncode}:\n{self.log()}")
            try:
                with Client(self.addr) as c:
                    if c.status()["daemon"]["state"] == "running":
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"daemon not ready after {timeout} s:\n{self.log()}")

    def client(self) -> Client:
        """A blocking client connected to this daemon."""
        return Client(self.addr)

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM, then wait for the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.close()

    def kill(self) -> None:
        """Stop a daemon a failed test left running: SIGTERM (the drain cleans its IPC
        objects), SIGKILL only if that hangs."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()

    def sigkill(self) -> None:
        """A crash: SIGKILL, no drain."""
        self.proc.kill()
        self.proc.wait(10)
        self._log.close()

    def log(self) -> str:
        """The daemon's log so far."""
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")[-20000:]


def parse_prometheus(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Parse the text exposition format strictly: every line is HELP, TYPE or a sample, each
    family has one TYPE, and every sample belongs to a declared family."""
    types: dict[str, str] = {}
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    assert text.endswith("\n")
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            assert name not in types, f"duplicate TYPE for {name}"
            assert kind in ("counter", "gauge", "histogram", "summary", "untyped"), line
            types[name] = kind
            continue
        m = _SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, labels = m.group(1), tuple(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"',
                                                    m.group(2) or ""))
        family = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in types or (family in types and types[family] == "histogram"), line
        key = (name, tuple(sorted(labels)))
        assert key not in samples, f"duplicate sample {line!r}"
        samples[key] = float(m.group(3))
    return samples


def shm_leftovers(prefix: str) -> list[str]:
    """Entries of /dev/shm (segments and ``sem.`` semaphores) named with ``prefix``."""
    return sorted(n for n in os.listdir("/dev/shm")
                  if n.startswith(prefix) or n.startswith(f"sem.{prefix}"))


def check_proofs(vk: dict[str, Any], reply: Any) -> None:
    """Every partition of a done job verifies; a changed public input does not."""
    key = vk_from_json(vk)
    cases = []
    for p in reply.partitions:
        assert p.state == "done", p
        proof = proof_from_json(p.proof)
        public = public_from_json(p.public)
        assert verify(key, public, proof), f"partition {p.index} does not verify"
        wrong = [(public[0] + 1) % 2**250, *public[1:]]
        assert not verify(key, wrong, proof), "a wrong public input verified"
        cases.append((p.public, p.proof))
    snarkjs_verify(vk, cases)


def snarkjs_verify(vk: dict[str, Any], cases: list[tuple[Any, Any]]) -> None:
    """snarkjs agrees (the outside oracle), when the node tools are installed here; without them a
    warning in the test summary says that these proofs were checked by our verifier alone (``make
    test`` installs the tools, so its runs always ask snarkjs)."""
    import json
    import tempfile
    import warnings

    from tests.oracle import groth16_verify_many, tools_missing
    if not cases:
        return
    missing = tools_missing()
    if missing is not None:
        warnings.warn(f"{len(cases)} proof(s) not checked by snarkjs: {missing}", stacklevel=2)
        return
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(vk, f)
        f.flush()
        assert groth16_verify_many(Path(f.name), cases) == [True] * len(cases)


def raw_roundtrip(path: str, payloads: list[bytes], timeout: float = 30.0) -> list[Any]:
    """Send raw frames on a fresh unix-socket connection; the decoded replies until EOF or timeout."""
    # One write: the frames are small enough to sit in the socket buffer at once, so a server
    # that answers an oversized frame and closes cannot break the pipe mid-send.
    return exchange(path, b"".join(payloads), len(payloads), timeout, see_close=False)[0]


def exchange(path: str, data: bytes, n_replies: int, timeout: float = 20.0,
             see_close: bool = True) -> tuple[list[Any], bool]:
    """Send raw bytes on a fresh unix-socket connection; (the replies read, up to ``n_replies``,
    and whether the daemon closed the connection: with ``see_close``, also after the last reply,
    waiting 0.2 s for the close)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(path)
    try:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the daemon closed early; what it answered is still readable
        out: list[Any] = []
        buf, closed = b"", False
        while len(out) < n_replies:
            try:
                chunk = s.recv(1 << 16)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                closed = True
                break
            buf += chunk
            while len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">I", buf[:4])[0]:
                n = struct.unpack(">I", buf[:4])[0]
                out.append(P.decode_reply(buf[4:4 + n]))
                buf = buf[4 + n:]
        if not closed and see_close:
            s.settimeout(0.2)
            try:
                closed = s.recv(1) == b""
            except (TimeoutError, ConnectionResetError):
                closed = False
        return out, closed
    finally:
        s.close()


def shm_inodes(prefix: str) -> dict[str, int]:
    """/dev/shm entries named with ``prefix`` and their inodes (an entry re-created under the
    same name has a new inode, so a restart's cleanup shows even when the names come back)."""
    out = {}
    for name in shm_leftovers(prefix):
        try:
            out[name] = os.stat(f"/dev/shm/{name}").st_ino
        except FileNotFoundError:
            continue
    return out


def frozen_tree(root_pid: int) -> list[psutil.Process]:
    """The process tree under ``root_pid``, every member stopped (SIGSTOP) until none is added.

    Signals sent one process after another are not "at once": a child that outlives the engine
    by a moment sees it die and unlinks the ring itself, as it should, which is not the case
    under test. Stopped processes run nothing, so the SIGKILLs that follow land on a tree that
    could not react, as a cgroup kill's do.
    """
    root = psutil.Process(root_pid)
    root.send_signal(signal.SIGSTOP)  # first: a stopped engine starts no more children
    tree = {root.pid: root}
    gone: set[int] = set()  # ended between the listing and the signal: nothing left to kill
    while True:
        added = [c for c in root.children(recursive=True) if c.pid not in tree and c.pid not in gone]
        if not added:
            return list(tree.values())
        for c in added:
            try:
                c.send_signal(signal.SIGSTOP)
            except psutil.NoSuchProcess:
                gone.add(c.pid)
                continue
            tree[c.pid] = c


def ended_unreaped(procs: list[psutil.Process], timeout_s: float = 30.0) -> None:
    """Wait until every process is gone or a zombie, reaping none: a killed engine that is this
    process's child stays a zombie, whose pid still runs with its start time, so an engine starting
    meanwhile leaves its ring alone (a new ring removes those whose maker is gone:
    ``shm_names.remove_abandoned``) until the caller reaps it."""
    deadline = time.monotonic() + timeout_s
    for p in procs:
        while True:
            try:
                if p.status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"process {p.pid} outlived its SIGKILL")
            time.sleep(0.01)


def status_of(engine: Any) -> dict[str, Any]:
    """A running engine's typed status as JSON-able data (what the daemon serves)."""
    import msgspec

    return msgspec.to_builtins(engine.status())


def rewrite_cache(path: Path, counts_change: dict[str, int] | None = None,
                  body_change: tuple[str, int, int] | None = None) -> None:
    """Rewrite a circuit-data cache file as a hand-made one: counts (``counts_change``) and/or one entry
    of a body array (``body_change``: array name, index, value; in the layout of the changed counts)
    changed, with a valid header checksum and body hash, so that only the checks of what the numbers
    mean can tell. The file keeps its size (changed counts must keep the layout's)."""
    import dataclasses

    import numpy as np

    from cuzk_mp.groth16.circuit_data_file import HEADER_BYTES, _pack_header, _unpack_header, body_hash

    raw = bytearray(path.read_bytes())
    counts, size, _, zid, rid = _unpack_header(bytes(raw[:HEADER_BYTES]))
    if counts_change:
        counts = dataclasses.replace(counts, **counts_change)
    if body_change is not None:
        name, index, value = body_change
        off, dt, shape = counts.layout()[0][name]
        arr = np.frombuffer(raw, dtype=dt, count=int(np.prod(shape)), offset=off)
        arr[index] = value
    body = body_hash(np.frombuffer(raw, dtype=np.uint8)[HEADER_BYTES:])
    raw[:HEADER_BYTES] = _pack_header(counts, size, body, zid, rid)
    path.write_bytes(bytes(raw))
