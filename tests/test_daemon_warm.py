"""Warm daemons (:mod:`cuzk_mp.daemon.warm`): their private directory, their ids, their config.

The end-to-end path (``groth16 prove --keep-warm``: a daemon started, reused, gone when idle) is in
tests/test_cli.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cuzk_mp.daemon import config as C
from cuzk_mp.daemon import warm
from cuzk_mp.errors import ConfigError, InputError
from tests.helpers import ENV, REPO, wait_until

DATA = Path(__file__).parent / "data_formats"


@pytest.fixture
def runtime(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh $XDG_RUNTIME_DIR with a short path (the warm daemons' sockets live in it)."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short_tmp))
    return short_tmp


def test_the_directory_is_private_and_must_be_ours(runtime: Path) -> None:
    d = warm.warm_dir()
    assert d == runtime / "cuzk-mp" and (d.stat().st_mode & 0o777) == 0o700
    d.chmod(0o755)  # readable by others: refused, not used
    with pytest.raises(ConfigError, match="mode 0700"):
        warm.warm_dir()
    d.rmdir()
    d.symlink_to(runtime)  # a link planted in its place: refused too
    with pytest.raises(ConfigError, match="must be a directory"):
        warm.warm_dir()


def test_a_socket_path_too_long_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(deep))
    with pytest.raises(ConfigError, match="too long for a unix socket"):
        warm.ensure(warm.WarmSpec(DATA / "mul.zkey"))


def test_ids_follow_the_key_file_and_the_options(tmp_path: Path) -> None:
    key = tmp_path / "k.zkey"
    shutil.copyfile(DATA / "mul.zkey", key)
    spec = warm.WarmSpec(key)
    first = warm.warm_id(spec)
    assert len(first) == 16 and first == warm.warm_id(warm.WarmSpec(tmp_path / "." / "k.zkey"))
    (tmp_path / "link.zkey").symlink_to(key)
    assert warm.warm_id(warm.WarmSpec(tmp_path / "link.zkey")) == first  # the same file
    others = {warm.warm_id(warm.WarmSpec(key, backend="cpu")), warm.warm_id(warm.WarmSpec(key, verify=False)),
              warm.warm_id(warm.WarmSpec(key, r1cs=DATA / "mul.r1cs")), warm.warm_id(warm.WarmSpec(DATA / "mul.zkey"))}
    assert first not in others and len(others) == 4
    st = key.stat()
    os.utime(key, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a key rewritten in place: a new daemon
    second = warm.warm_id(spec)
    assert second != first
    # another key copied over it with its size and mtime kept (`cp -p`): the ctime still moves
    st = key.stat()
    time.sleep(0.01)
    with open(key, "r+b") as f:
        f.write(b"\0")  # a byte of another key, the same size
    os.utime(key, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (key.stat().st_size, key.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert warm.warm_id(spec) not in (first, second)
    with pytest.raises(InputError, match="absent.zkey"):
        warm.warm_id(warm.WarmSpec(tmp_path / "absent.zkey"))
    with pytest.raises(InputError, match="not a file"):
        warm.warm_id(warm.WarmSpec(tmp_path))


def _earlier_release_id(spec: warm.WarmSpec) -> str:
    """The id the releases before the protocol's digest gave a daemon (the key and the options alone)."""
    import hashlib
    parts = [warm.CIRCUIT_ID, spec.backend, str(spec.verify)]
    for path in (spec.zkey, spec.r1cs, spec.wasm):
        if path is None:
            parts.append("-")
            continue
        st = os.stat(path)
        parts += [os.path.realpath(path), str(st.st_dev), str(st.st_ino), str(st.st_size), str(st.st_mtime_ns),
                  str(st.st_ctime_ns)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def test_a_client_of_another_release_never_finds_this_releases_daemon(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A warm daemon outlives the package it was started from: after a rollback, a client of the earlier
    release that found the later release's daemon could not read its replies (a field it does not know:
    exit 3 on every call until that daemon idled out). Its id names the protocol the client speaks, so each
    release's clients find only their own release's daemon."""
    key = tmp_path / "k.zkey"
    shutil.copyfile(DATA / "mul.zkey", key)
    spec = warm.WarmSpec(key, backend="cpu")
    first = warm.warm_id(spec)
    assert first != _earlier_release_id(spec)
    monkeypatch.setattr(warm, "protocol_digest", lambda: "another protocol")
    assert warm.warm_id(spec) not in (first, _earlier_release_id(spec))


def test_the_config_is_a_valid_daemon_config(tmp_path: Path) -> None:
    spec = warm.WarmSpec(DATA / "mul.zkey", backend="cpu", r1cs=DATA / "mul.r1cs", verify=False, idle_s=42.5)
    text = warm.config_text(spec, tmp_path / "w.sock", tmp_path / "w.journal")
    (tmp_path / "w.toml").write_text(text)
    cfg = C.load_config(tmp_path / "w.toml")
    assert cfg.exit_when_idle_s == 42.5 and cfg.preload == (warm.CIRCUIT_ID,)
    assert str(cfg.listen) == f"unix://{tmp_path / 'w.sock'}" and cfg.socket_mode == 0o600
    assert cfg.journal_path == tmp_path / "w.journal" and not cfg.tokens
    assert cfg.engine.backend == "cpu" and not cfg.engine.verify_proofs and cfg.engine.partition_workers == 1
    spec_c = cfg.circuits[warm.CIRCUIT_ID].spec
    assert Path(spec_c.zkey) == (DATA / "mul.zkey").resolve() and Path(spec_c.r1cs) == (DATA / "mul.r1cs").resolve()
    assert not cfg.warnings
    for verify, says in ((True, "checked only by the proof's self-verification"), (False, "returned as done")):
        text = warm.config_text(warm.WarmSpec(DATA / "mul.zkey", verify=verify), tmp_path / "w.sock",
                                tmp_path / "w.journal")
        (tmp_path / "w.toml").write_text(text)  # no r1cs: accepted, and said so
        assert [w for w in C.load_config(tmp_path / "w.toml").warnings if "has no r1cs" in w and says in w]


def test_keep_warm_starts_one_daemon_reuses_it_and_it_retires(runtime: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``groth16 prove --keep-warm``: two first calls at once start ONE daemon (the second daemon finds
    the first one's lock and leaves), later calls reuse it without importing numpy, a bad witness fails
    its call alone, every proof verifies, and after the idle time the daemon drains and its socket goes;
    every file it left is one :func:`warm.remove_gone` removes once it is gone."""
    from cuzk_mp.cli import main
    from tests.helpers import ENV, REFUSE_NUMPY

    key = tmp_path / "mul.zkey"  # a copy: the circuit-data cache is written beside the key
    shutil.copyfile(DATA / "mul.zkey", key)
    bad = tmp_path / "bad.wtns"
    bad.write_bytes((DATA / "mul.wtns").read_bytes()[:-40])
    env = {**ENV, "XDG_RUNTIME_DIR": str(runtime)}

    def prove(i: int, wtns: Path = DATA / "mul.wtns", *, no_numpy: bool = False) -> subprocess.CompletedProcess[str]:
        """A --keep-warm call; the numpy-free one takes the idle time from $CUZK_MP_KEEP_WARM instead."""
        head = ["-c", REFUSE_NUMPY + "from cuzk_mp.cli import main\nsys.exit(main(sys.argv[1:]))\n"] if no_numpy \
            else ["-m", "cuzk_mp"]
        return subprocess.run([sys.executable, *head, "--log-level", "INFO", "groth16", "prove",
                               *([] if no_numpy else ["--keep-warm", "5"]), "--backend", "cpu", str(key), str(wtns),
                               str(tmp_path / f"proof{i}.json"), str(tmp_path / f"public{i}.json")],
                              capture_output=True, text=True, timeout=600,
                              env={**env, "CUZK_MP_KEEP_WARM": "5"} if no_numpy else env)

    with ThreadPoolExecutor(2) as pool:
        first = list(pool.map(prove, (1, 2)))
    assert all(r.returncode == 0 for r in first), [r.stderr[-2000:] for r in first]
    res = prove(3, bad)
    assert res.returncode == 2 and "bad.wtns" in res.stderr and "truncated" in res.stderr, res.stderr[-2000:]
    wrong = tmp_path / "wrong.wtns"  # well formed, but not a solution: with no r1cs, self-verification fails it
    raw = bytearray((DATA / "mul.wtns").read_bytes())
    raw[-32] ^= 1
    wrong.write_bytes(bytes(raw))
    res = prove(5, wrong)
    assert res.returncode == 1 and "verif" in res.stderr, res.stderr[-2000:]
    assert not (tmp_path / "proof5.json").exists()
    res = prove(4, no_numpy=True)  # a warm call is a client process: no numpy, no curve arithmetic
    assert res.returncode == 0 and "starting a warm daemon" not in res.stderr, res.stderr[-2000:]
    wid = warm.warm_id(warm.WarmSpec(key, backend="cpu"))
    d = runtime / "cuzk-mp"
    daemon_log = (d / f"{wid}.log").read_text()
    assert daemon_log.count("serving on unix://") == 1, daemon_log[-3000:]
    assert main(["zkey", "export", "verificationkey", str(key), str(tmp_path / "vk.json")]) == 0
    for i in (1, 2, 4):
        assert main(["groth16", "verify", str(tmp_path / "vk.json"), str(tmp_path / f"public{i}.json"),
                     str(tmp_path / f"proof{i}.json")]) == 0
        assert json.loads((tmp_path / f"public{i}.json").read_text()) == json.loads((DATA / "public.json").read_text())
    deadline = time.monotonic() + 120
    while (d / f"{wid}.sock").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not (d / f"{wid}.sock").exists()
    assert "idle for 5 s (exit_when_idle)" in (d / f"{wid}.log").read_text()
    left = sorted(p.name for p in d.iterdir())
    assert {n[:16] for n in left} == {wid} and {n[16:] for n in left} <= set(warm.FILE_SUFFIXES), left
    monkeypatch.setattr(warm, "GONE_GRACE_S", 0.0)
    assert wait_until(lambda: warm.remove_gone(d), timeout=60) == [wid]  # once its process has exited
    assert not list(d.iterdir())


def test_keep_warm_from_the_environment_is_checked_and_connect_overrides_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from cuzk_mp.cli import main

    files = [str(DATA / "mul.zkey"), str(DATA / "mul.wtns"), str(tmp_path / "p.json"), str(tmp_path / "q.json")]
    monkeypatch.setenv("CUZK_MP_KEEP_WARM", "soon")
    assert main(["groth16", "prove", *files]) == 2
    assert "$CUZK_MP_KEEP_WARM='soon': a number of seconds" in capsys.readouterr().err
    for bad in ("-1", "1e300", "inf", "nan"):
        assert main(["groth16", "prove", "--keep-warm", bad, *files]) == 2
        assert "a number of seconds in (0, 604800]" in capsys.readouterr().err
    monkeypatch.setenv("CUZK_MP_KEEP_WARM", "60")  # --connect wins over the environment: no daemon is started
    assert main(["groth16", "prove", "--connect", f"unix://{tmp_path}/none.sock", *files]) == 3
    assert "cannot reach the daemon" in capsys.readouterr().err


def test_the_journal_lock_holder_is_read_never_locked(tmp_path: Path) -> None:
    """A call whose daemon lost the start race (exit 75) waits while the winner lives: the winner's
    pid comes from the lock file's text (taking the lock, even for an instant, could make a starting
    daemon exit 75), and a pid that now names another program does not count."""
    journal = tmp_path / "w.journal"
    lock = tmp_path / "w.journal.lock"
    assert not warm._holder_alive(journal)  # no lock file
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "cuzk_mp-daemon-stand-in"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # the parent sees exec happen (close-on-exec) before the kernel sets the child's new argv:
        # wait until /proc shows it, or a loaded machine reads the old command line
        wait_until(lambda: b"stand-in" in Path(f"/proc/{holder.pid}/cmdline").read_bytes(), timeout=30)
        wait_until(lambda: b"sleep" in Path(f"/proc/{other.pid}/cmdline").read_bytes(), timeout=30)
        lock.write_text(f"{holder.pid}\n")
        assert warm._holder_alive(journal)
        lock.write_text(f"{other.pid}\n")  # alive, but not a cuzk-mp process: a reused pid
        assert not warm._holder_alive(journal)
        lock.write_text("")
        assert not warm._holder_alive(journal)
        lock.write_text(f"{holder.pid}\n")
    finally:
        holder.kill()
        other.kill()
        holder.wait()
        other.wait()
    assert not warm._holder_alive(journal)


def test_a_truncated_key_through_keep_warm_is_the_input_error_it_is_one_shot(runtime: Path, tmp_path: Path) -> None:
    """The warm daemon of a truncated key cannot start: the call exits 2 (as a one-shot prove of the
    same file), naming the file, not 4 (resources)."""
    from tests.helpers import ENV

    key = tmp_path / "cut.zkey"
    key.write_bytes((DATA / "mul.zkey").read_bytes()[:3000])
    proc = subprocess.run([sys.executable, "-m", "cuzk_mp", "groth16", "prove", "--keep-warm", "5", str(key),
                           str(DATA / "mul.wtns"), str(tmp_path / "p.json"), str(tmp_path / "q.json")],
                          env={**ENV, "XDG_RUNTIME_DIR": str(runtime)}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "exited (code 2)" in proc.stderr and "cut.zkey" in proc.stderr


def test_an_input_too_large_for_a_daemon_is_refused_by_name_before_one_starts(runtime: Path,
                                                                             tmp_path: Path) -> None:
    """One request to a daemon carries at most its max_frame_bytes (128 MiB); a one-shot fullprove reads
    up to 256 MiB of input JSON, so a larger input through --keep-warm is refused naming the file, the
    limit and the way out, before it is read whole and before a daemon is started for it."""
    from cuzk_mp.daemon.transport import DEFAULT_MAX_FRAME
    from tests.helpers import ENV, circom_generator

    wasm = circom_generator(tmp_path, "c")
    big = tmp_path / "input.json"
    with open(big, "wb") as f:
        f.truncate(DEFAULT_MAX_FRAME + 1)  # sparse: no disk, and read whole it would be 128 MiB of memory
    proc = subprocess.run([sys.executable, "-m", "cuzk_mp", "groth16", "fullprove", "--keep-warm", "5", str(big),
                           str(wasm), str(DATA / "mul.zkey"), str(tmp_path / "p.json"),
                           str(tmp_path / "q.json")],
                          env={**ENV, "XDG_RUNTIME_DIR": str(runtime)}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert (f"{big}: more than {DEFAULT_MAX_FRAME} bytes, the most one request to a daemon carries "
            "(max_frame_bytes); prove it without --connect or --keep-warm") in proc.stderr
    assert not list(runtime.rglob("*.sock"))


def test_a_request_over_the_frame_limit_is_named_as_the_files_size(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A file just under the limit whose request (the file and its envelope) is over it is refused as
    the file's size too, not as a transport frame."""
    from cuzk_mp.daemon import prove_files
    from cuzk_mp.daemon.transport import FrameTooLarge

    class Client:
        max_frame_bytes = 1000

        def __init__(self, addr: str, token: str = "") -> None:
            pass

        def __enter__(self) -> Client:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def prove(self, *args: object, **kwargs: object) -> None:
            raise FrameTooLarge("frame of 1090 bytes exceeds max_frame_bytes (1000)")

    monkeypatch.setattr(prove_files, "Client", Client)
    source = tmp_path / "input.json"
    source.write_bytes(b" " * 990)
    part = prove_files.input_partition(source, max_bytes=1000)
    with pytest.raises(InputError) as info:
        prove_files.prove_to_files("unix:///nowhere", "", "key", tmp_path / "c.zkey", source, part,
                                   tmp_path / "p.json", tmp_path / "q.json")
    assert str(info.value) == (f"{source}: 990 bytes and the request's envelope, more than the 1000 bytes one "
                               "request to a daemon carries (max_frame_bytes); prove it without --connect or "
                               "--keep-warm")


def test_a_lost_warm_daemon_is_asked_again_under_the_same_request_id(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A warm daemon killed mid-proof, or one that answers it is shutting down, is started again and
    asked again with the same request id, so the restarted daemon (its journal holds the job)
    re-attaches instead of proving a second time."""
    import argparse

    from cuzk_mp.errors import Unavailable

    from cuzk_mp import cli_verbs
    from cuzk_mp.daemon import prove_files

    key, wtns = tmp_path / "k.zkey", tmp_path / "w.wtns"
    key.write_bytes(b"zkey")
    wtns.write_bytes(b"wtns")
    asked: list[str] = []

    def prove(addr: str, token: str, circuit: str | None, zkey: Path, source: Path, part: object,
              proof: Path, public: Path, request_id: str = "") -> tuple[str, str]:
        asked.append(request_id)
        if len(asked) == 1:
            raise prove_files.Unreachable("lost the daemon: Broken pipe")
        if len(asked) == 2:  # it idled out as the call came: draining, its listener not yet closed
            raise Unavailable("the daemon is shutting down")
        return "key", request_id

    monkeypatch.setattr(prove_files, "prove_to_files", prove)
    monkeypatch.setattr(warm, "ensure", lambda spec: "unix:///nowhere.sock")
    monkeypatch.setattr(cli_verbs.time, "sleep", lambda s: None)
    args = argparse.Namespace(keep_warm=30.0, zkey=key, wtns=wtns, backend="cpu", r1cs=None, no_verify=False,
                              proof=tmp_path / "p.json", public=tmp_path / "s.json")
    assert cli_verbs._prove_warm(args) == 0
    assert len(asked) == 3 and len(set(asked)) == 1 and asked[0], asked


class _FakeDaemon:
    """A started warm daemon as :func:`warm.ensure` polls it: its exit code, or None while it runs."""

    def __init__(self, code: int | None) -> None:
        self.code = code

    def poll(self) -> int | None:
        return self.code


def _fake_starts(monkeypatch: pytest.MonkeyPatch, codes: list[int | None]) -> list[int | None]:
    """Each start of a warm daemon takes the next exit code of ``codes`` (the last one repeats); a
    start of code None comes up and answers. No starting daemon's holder is alive. Returns the codes
    of the starts made so far (clear it to count afresh)."""
    started: list[int | None] = []
    ready = {"now": False}

    def spawn(cfg: Path, log_path: Path) -> _FakeDaemon:
        code = codes[min(len(started), len(codes) - 1)]
        started.append(code)
        ready["now"] = code is None
        return _FakeDaemon(code)

    monkeypatch.setattr(warm, "_spawn", spawn)
    monkeypatch.setattr(warm, "_holder_alive", lambda journal: False)
    monkeypatch.setattr(warm, "_answers", lambda sock: ready["now"])
    return started


def test_a_warm_daemon_that_died_while_another_call_waited_is_started_again(
        runtime: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls that race to start a key's warm daemon: the losers exit 75 and wait for the winner; if the
    winner dies before it is ready, a waiter starts one again (at most MAX_RESTARTS times) rather than
    failing every call with exit 4."""
    from cuzk_mp.errors import ResourceError
    from cuzk_mp.exit_codes import EXIT_ALREADY_RUNNING

    key = tmp_path / "k.zkey"
    key.write_bytes(b"zkey")
    spec = warm.WarmSpec(key, "cpu", None, True, 30.0, None)
    # lost the race twice to a daemon that then died before it was ready; the third start comes up
    started = _fake_starts(monkeypatch, [EXIT_ALREADY_RUNNING, EXIT_ALREADY_RUNNING, None])
    assert warm.ensure(spec, timeout_s=10).startswith("unix://")
    assert len(started) == 1 + warm.MAX_RESTARTS
    started = _fake_starts(monkeypatch, [EXIT_ALREADY_RUNNING, EXIT_ALREADY_RUNNING, None])
    monkeypatch.setattr(warm, "MAX_RESTARTS", 1)  # one restart only: the next loss is the error it was
    with pytest.raises(ResourceError, match="exited \\(code 75\\) before it was ready"):
        warm.ensure(spec, timeout_s=10)


@pytest.mark.parametrize("code", [-9, -15, 1])
def test_a_warm_daemon_this_call_started_that_died_is_started_again(
        runtime: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    """The call's own daemon killed (SIGKILL, SIGTERM) or ending 1 (a process of it died before READY)
    before it was ready: started again, as a lost race's is, not the call's exit 4; an input error
    (exit 2) is not retried: the same input fails the same way."""
    from cuzk_mp.errors import InputError

    key = tmp_path / "k.zkey"
    key.write_bytes(b"zkey")
    spec = warm.WarmSpec(key, "cpu", None, True, 30.0, None)
    started = _fake_starts(monkeypatch, [code, None])
    assert warm.ensure(spec, timeout_s=10).startswith("unix://") and started == [code, None]
    started = _fake_starts(monkeypatch, [2])
    with pytest.raises(InputError, match="exited \\(code 2\\) before it was ready"):
        warm.ensure(spec, timeout_s=10)
    assert started == [2]


def test_a_failed_start_quotes_only_its_own_daemons_log_lines(tmp_path: Path) -> None:
    """The key's log keeps earlier daemons' lines: a start that fails quotes what was written after it
    began, not an older daemon's last words."""
    log_path = tmp_path / "w.log"
    log_path.write_text("old daemon: all fine\nold daemon: idle, exiting\n")
    since = warm._size(log_path)
    with open(log_path, "a") as f:
        f.write("new daemon: WorkerDied: cuzk-prover-0 died before READY\n")
    assert warm._tail(log_path, since) == "new daemon: WorkerDied: cuzk-prover-0 died before READY"
    assert warm._tail(log_path, warm._size(log_path)) == "(nothing written)"
    assert warm._tail(tmp_path / "absent.log") == "(no log)" and warm._size(tmp_path / "absent.log") == 0


def test_a_refusal_at_a_cap_is_asked_again_and_never_said_to_start_a_daemon(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A warm daemon at its connection cap refuses the job (Unavailable): the call asks the same
    daemon again after a wait, and its log says so; it says nothing of starting one (only
    :func:`warm.ensure` starts one, and says so, where none answers). Refused every time: exit 3
    with the daemon's own reason."""
    import argparse
    import logging

    from cuzk_mp import cli_verbs
    from cuzk_mp.daemon import prove_files
    from cuzk_mp.errors import Unavailable
    from cuzk_mp.exit_codes import EXIT_UNREACHABLE

    key, wtns = tmp_path / "k.zkey", tmp_path / "w.wtns"
    key.write_bytes(b"zkey")
    wtns.write_bytes(b"wtns")
    cap = "the daemon serves at most 256 connections at once ([daemon] max_connections); try again later"
    refusals = {"left": 1}
    asked: list[str] = []

    def prove(addr: str, token: str, circuit: str | None, zkey: Path, source: Path, part: object,
              proof: Path, public: Path, request_id: str = "") -> tuple[str, str]:
        asked.append(addr)
        if refusals["left"]:
            refusals["left"] -= 1
            raise Unavailable(cap)
        return "key", request_id

    monkeypatch.setattr(prove_files, "prove_to_files", prove)
    monkeypatch.setattr(warm, "ensure", lambda spec: "unix:///warm.sock")  # it answers: nothing is started
    waits: list[float] = []
    monkeypatch.setattr(cli_verbs.time, "sleep", waits.append)
    args = argparse.Namespace(keep_warm=30.0, zkey=key, wtns=wtns, backend="cpu", r1cs=None, no_verify=False,
                              proof=tmp_path / "p.json", public=tmp_path / "s.json")
    with caplog.at_level(logging.INFO, logger="cuzk_mp.cli"):
        assert cli_verbs._prove_warm(args) == 0
    assert asked == ["unix:///warm.sock"] * 2 and waits == [1.0]
    assert f"the warm daemon at unix:///warm.sock refused the job: {cap}; asking again in 1.0 s" in caplog.text
    assert "starting it again" not in caplog.text
    refusals["left"] = 3
    asked.clear()
    assert cli_verbs._prove_warm(args) == EXIT_UNREACHABLE
    assert len(asked) == cli_verbs.WARM_ATTEMPTS


_DAEMON_FILES = (".toml", ".sock", ".sock.lock", ".journal", ".journal.lock", ".journal-wal", ".journal-shm",
                 ".journal.id", ".log", ".log.1")


def _daemon_files(d: Path, wid: str, age_s: float) -> list[Path]:
    """Every file a warm daemon ``wid`` leaves in ``d`` (its socket a real one, no longer served), last
    written ``age_s`` ago."""
    import socket

    paths = [d / f"{wid}{suffix}" for suffix in _DAEMON_FILES]
    for p in paths:
        if p.suffix == ".sock":
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.bind(str(p))  # closed unserved: the socket file stays, as a killed daemon's does
        else:
            p.write_text("x\n")
        t = time.time() - age_s
        os.utime(p, (t, t), follow_symlinks=False)
    return paths


def _spawn_that_serves(started: list[Path]) -> object:
    """A stand-in for :func:`warm._spawn`: the "daemon" is a listening socket of this process at the
    config's socket path (so the call's own daemon answers, through the real probe)."""
    import socket

    def spawn(cfg: Path, log_path: Path) -> _FakeDaemon:
        started.append(cfg)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(cfg.with_suffix(".sock")))
        s.listen(8)
        servers.append(s)
        return _FakeDaemon(None)

    servers: list[socket.socket] = []
    spawn.servers = servers  # type: ignore[attr-defined]
    return spawn


def test_starting_a_warm_daemon_removes_the_files_of_daemons_that_are_gone(
        runtime: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each replaced key leaves a daemon's files behind: the call that starts a daemon removes those of
    every daemon that is gone (no process holds its journal lock, its socket does not answer, nothing
    of it written for GONE_GRACE_S), and nothing else: not a live daemon's (its lock held by a real
    process), not those of one starting now (fresh), not a file of another name, a link or a file of
    another user. A call that finds its daemon answering removes nothing."""
    import socket

    from tests.helpers import ENV

    d = warm.warm_dir()
    old = warm.GONE_GRACE_S + 60
    gone = _daemon_files(d, "00000000000000aa", old)
    gone_too = [d / "00000000000000ab.journal.lock"]  # only its journal's lock file is left
    for p in _daemon_files(d, "00000000000000ab", old):
        if p not in gone_too:
            p.unlink()
    live = _daemon_files(d, "00000000000000bb", old)  # its lock held below
    answering = _daemon_files(d, "00000000000000ba", old)  # its lock free, but its socket answers
    answering[1].unlink()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(answering[1]))
    server.listen(8)
    os.utime(answering[1], (time.time() - old,) * 2)
    starting = _daemon_files(d, "00000000000000cc", old)  # an earlier daemon's files...
    os.utime(starting[0])  # ...and its config just written: a daemon starting, its lock not yet taken
    target = tmp_path / "target.log"
    target.write_text("not ours to remove\n")
    (d / "00000000000000dd.log").symlink_to(target)
    os.utime(d / "00000000000000dd.log", (time.time() - old,) * 2, follow_symlinks=False)
    others = [d / n for n in ("notes.txt", "00000000000000EE.log", "00000000000000ee.txt", "0000000000000ee.log",
                              "00000000000000ee.log.2", ".cuzk-mp-1-ab.tmp")]
    for p in others:
        p.write_text("x\n")
        os.utime(p, (time.time() - old,) * 2)
    (d / "00000000000000ef.journal").mkdir()
    others.append(d / "00000000000000ef.journal")
    if os.getuid() == 0:  # a file another user owns (only root can make one): its id is left whole
        foreign = _daemon_files(d, "00000000000000ff", old)
        os.chown(foreign[0], 4242, 4242)
        others += foreign
    holder = subprocess.Popen([sys.executable, "-c", (
        "import time; from pathlib import Path; from cuzk_mp.daemon.instance_lock import InstanceLock, lock_paths; "
        f"InstanceLock(lock_paths(Path({str(d / '00000000000000bb.journal')!r}), [])).acquire(); "
        "print('held', flush=True); time.sleep(120)")], stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        os.utime(d / "00000000000000bb.journal.lock", (time.time() - old,) * 2)  # taken long ago (a long --keep-warm)
        key = tmp_path / "k.zkey"
        key.write_bytes(b"zkey")
        started: list[Path] = []
        spawn = _spawn_that_serves(started)
        monkeypatch.setattr(warm, "_spawn", spawn)
        try:
            assert warm.ensure(warm.WarmSpec(key, "cpu"), timeout_s=10).startswith("unix://")
            assert len(started) == 1
            assert not [p for p in gone + gone_too if os.path.lexists(p)]
            kept = live + answering + starting + others
            assert all(os.path.lexists(p) for p in kept), [p for p in kept if not os.path.lexists(p)]
            assert (d / "00000000000000dd.log").is_symlink() and target.read_text() == "not ours to remove\n"
            assert all(p.exists() for p in started[0].parent.glob(started[0].stem + ".*"))  # its own, kept
            again = _daemon_files(d, "00000000000000ac", old)
            assert warm.ensure(warm.WarmSpec(key, "cpu"), timeout_s=10).startswith("unix://")
            assert len(started) == 1 and all(p.exists() for p in again)  # it answered: nothing started or removed
        finally:
            for s in spawn.servers:  # type: ignore[attr-defined]
                s.close()
    finally:
        server.close()
        holder.kill()
        holder.wait()


def test_a_config_removed_before_its_daemon_read_it_is_written_again(
        runtime: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another call's cleanup can remove a key's old config in the instant this call writes it again:
    the daemon that found no config (exit 2) is started again on a config written anew, not reported
    as the input's error; every start has its config."""
    key = tmp_path / "k.zkey"
    key.write_bytes(b"zkey")
    spec = warm.WarmSpec(key, "cpu", None, True, 30.0, None)
    started = _fake_starts(monkeypatch, [2, None])
    seen: list[bool] = []
    fake = warm._spawn

    def spawn(cfg: Path, log_path: Path) -> _FakeDaemon:
        seen.append(cfg.exists())
        if not started:
            cfg.unlink()  # removed before the first daemon read it
        return fake(cfg, log_path)  # type: ignore[return-value]

    monkeypatch.setattr(warm, "_spawn", spawn)
    assert warm.ensure(spec, timeout_s=10).startswith("unix://")
    assert started == [2, None] and seen == [True, True]


def test_a_lock_file_unlinked_by_its_holder_is_opened_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A gone daemon's lock file is removed by a process holding its lock: a daemon that opened the file
    before it was unlinked and locks it after takes the lock of the file now at that name, so two
    daemons never each hold a lock of their own file of one name."""
    import fcntl

    from cuzk_mp.daemon import instance_lock

    path = tmp_path / "w.journal.lock"
    real = fcntl.flock
    calls = {"n": 0}

    def flock(fd: int, op: int) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            path.unlink()  # the holder removed it between this locker's open and its lock
        real(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    lock = instance_lock.InstanceLock([path])
    lock.acquire()
    try:
        assert calls["n"] == 2 and path.exists() and path.read_text().strip() == str(os.getpid())
        assert instance_lock.try_lock(path) is None  # the file at the name is the one held
    finally:
        lock.release()
    fd = instance_lock.try_lock(path)
    assert fd is not None
    os.close(fd)
    assert path.read_text().strip() == str(os.getpid())  # a bare lock writes no pid


_READ_ONE = """
import sys
from pathlib import Path
from cuzk_mp.daemon.client import partition_from_file
from cuzk_mp.errors import InputError
try:
    part = partition_from_file(Path(sys.argv[1]), max_bytes=1000)
except InputError as e:
    print(e)
    sys.exit(2)
print(part.kind, len(part.data))
"""


@pytest.mark.parametrize("kind", ["fifo", "device", "device without a suffix", "large json", "large wtns"])
def test_a_client_input_file_is_read_no_further_than_one_request_carries(kind: str, tmp_path: Path) -> None:
    """``client submit|prove`` and ``--connect`` read each input file whole before they send it: a FIFO or a
    device given as a .wtns is refused for what it is, as the one-shot commands refuse such a binary input;
    a file of another suffix before any read; a file larger than one request carries after ``max_bytes``
    + 1 of it. Read to its end, a FIFO that no process writes held the client for ever, /dev/zero was read
    until the client's memory ran out, and a large file was held whole in memory only to be refused."""
    import resource

    src, expected = tmp_path / "in.wtns", ""
    if kind == "fifo":
        os.mkfifo(src)
        expected = f"{src}: cannot read it in place: a FIFO (a named pipe), not a regular file (give the file itself)"
    elif kind == "device":
        src.symlink_to("/dev/zero")
        expected = f"{src}: cannot read it in place: a character device, not a regular file (give the file itself)"
    elif kind == "device without a suffix":
        src = Path("/dev/zero")
        expected = "/dev/zero: expected an input .json or a .wtns file"
    else:
        src = tmp_path / ("in.json" if kind == "large json" else "in.wtns")
        src.write_bytes(b" " * 1001)
        expected = (f"{src}: more than 1000 bytes, the most one request to a daemon carries (max_frame_bytes)")

    def small() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    try:
        proc = subprocess.run([sys.executable, "-c", _READ_ONE, str(src)], capture_output=True, text=True,
                              timeout=30, preexec_fn=small, env=ENV, cwd=REPO)
    except subprocess.TimeoutExpired:
        pytest.fail(f"a {kind} as a client's input was read for ever")
    assert (proc.returncode, proc.stdout.strip()) == (2, expected), proc.stderr[-2000:]
