"""What ``cuzk-mp client`` leaves a shell script to read in each outcome: its exit code (README's table),
its result on stdout and, where it fails, one last line on stderr. Against the in-process daemon of
tests/fake_engine.py, the verbs run through :func:`cuzk_mp.cli.main` as the console script runs them;
and the blocking client they are built on, as a script's Python polls with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from cuzk_mp import cli
from cuzk_mp.daemon.client import AsyncClient, synthetic_partitions
from cuzk_mp.daemon.server import Daemon
from cuzk_mp.exit_codes import EXIT_FAILED, EXIT_INPUT, EXIT_TIMEOUT, EXIT_UNREACHABLE
from tests.fake_engine import run_daemon


def _client(*argv: str) -> list[str]:
    return ["client", argv[0], *argv[1:]]


def test_a_stdout_that_cannot_take_the_result_is_an_output_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """``client status > /dev/full``: the result was not written, an output that cannot be written (exit 2,
    the line naming stdout), as the one-shot verbs answer it; not exit 1, a failed job's code. A stdout
    the command was started without (``>&-``) takes nothing, as print() and the one-shot verbs have it:
    no internal error."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    codes: list[int] = []

    async def body(d: Daemon, addr: str) -> None:
        full = open("/dev/full", "w")
        monkeypatch.setattr(sys, "stdout", full)
        codes.append(await asyncio.to_thread(cli.main, _client("status", "--connect", addr)))
        codes.append(await asyncio.to_thread(cli.main, _client("prove", "--connect", addr, "--circuit", "syn",
                                                               "--partitions", "1", "--out", str(tmp_path / "o"))))
        with contextlib.suppress(OSError):  # what it still holds cannot go out either
            full.close()
        monkeypatch.setattr(sys, "stdout", None)
        codes.append(await asyncio.to_thread(cli.main, _client("metrics", "--connect", addr)))

    run_daemon(tmp_path, body)
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("cuzk-mp")]  # not log lines
    assert codes == [EXIT_INPUT, EXIT_INPUT, 0], err
    assert err[0] == "cuzk-mp: error: stdout: cannot write it: No space left on device", err
    assert err[1].startswith(err[0] + "; the daemon took the job") and len(err) == 2, err  # its summary lost
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == [
        "proof_0.json", "public_0.json", "verification_key.json"]  # written before the summary's turn


def test_a_job_that_did_not_end_done_ends_with_a_line_saying_so(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A failed, cancelled or timed-out job: its summary on stdout, and, as every failing command ends,
    one line on stderr that says what became of which job (where a script logs stderr alone)."""
    codes: dict[str, int] = {}

    async def body(d: Daemon, addr: str) -> None:
        d.engine.gate.clear()  # nothing is proved until the gate opens
        async with await AsyncClient.connect(addr) as c:
            await c.submit("syn", synthetic_partitions(1), request_id="waits")
            await c.submit("syn", synthetic_partitions(1), request_id="stopped")
            await c.cancel("stopped")
        codes["timed out"] = await asyncio.to_thread(cli.main, _client("await", "waits", "--connect", addr,
                                                                       "--timeout", "0.1"))
        codes["cancelled"] = await asyncio.to_thread(cli.main, _client("await", "stopped", "--connect", addr))
        d.engine.fail_with = "a bad witness"
        d.engine.gate.set()
        codes["failed"] = await asyncio.to_thread(cli.main, _client("prove", "--connect", addr, "--circuit", "syn",
                                                                    "--partitions", "1", "--request-id", "bad",
                                                                    "--out", str(tmp_path / "o")))

    run_daemon(tmp_path, body)
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("cuzk-mp")]
    assert codes == {"timed out": EXIT_TIMEOUT, "cancelled": EXIT_FAILED, "failed": EXIT_INPUT}, err
    assert len(err) == 3, err
    assert err[0].startswith("cuzk-mp client: job waits is still queued after 0.1 s"), err
    assert "it goes on in the daemon: `cuzk-mp client await waits`" in err[0], err
    assert err[1].startswith("cuzk-mp client: job stopped was cancelled"), err
    assert err[2].startswith("cuzk-mp client: job bad failed: ") and "a bad witness" in err[2], err


def test_an_eviction_refused_ends_with_a_line_saying_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``client evict`` of a key a queued job needs: exit 1 with its answer on stdout, and the line a failing
    command ends with on stderr, naming the circuit and the daemon's reason."""
    codes: list[int] = []

    async def body(d: Daemon, addr: str) -> None:
        d.engine.gate.clear()
        async with await AsyncClient.connect(addr) as c:
            await c.submit("syn", synthetic_partitions(1))
        codes.append(await asyncio.to_thread(cli.main, _client("evict", "syn", "--connect", addr)))
        d.engine.gate.set()

    run_daemon(tmp_path, body)
    captured = capsys.readouterr()
    err = [line for line in captured.err.splitlines() if line.startswith("cuzk-mp")]
    assert codes == [EXIT_FAILED] and '"evicted": false' in captured.out, captured
    assert err == ["cuzk-mp client: circuit syn was not evicted: a queued or running job uses this circuit"], err


def test_the_daemons_address_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """``$CUZK_MP_CONNECT`` set but empty is unset, as scripts/batch-prove.sh and wait-ready.sh read it
    (``${CUZK_MP_CONNECT:-127.0.0.1:9820}``): the default address, not a usage error; a malformed value
    is a usage error that names the variable, which the command line never showed; ``--connect`` wins."""
    codes: list[int] = []

    async def body(d: Daemon, addr: str) -> None:
        monkeypatch.setenv("CUZK_MP_CONNECT", addr)
        codes.append(await asyncio.to_thread(cli.main, _client("status")))
        monkeypatch.setenv("CUZK_MP_CONNECT", "/run/no-scheme.sock")
        codes.append(await asyncio.to_thread(cli.main, _client("status")))
        codes.append(await asyncio.to_thread(cli.main, _client("status", "--connect", addr)))
        monkeypatch.setenv("CUZK_MP_CONNECT", "")
        codes.append(await asyncio.to_thread(cli.main, _client("status", "--connect", "localhost:1")))

    run_daemon(tmp_path, body)
    monkeypatch.setenv("CUZK_MP_CONNECT", "")
    monkeypatch.setattr("cuzk_mp.daemon.cli.DEFAULT_CONNECT", f"unix://{tmp_path}/default.sock")
    codes.append(cli.main(_client("status")))
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("cuzk-mp")]
    assert codes == [0, EXIT_INPUT, 0, EXIT_UNREACHABLE, EXIT_UNREACHABLE], err
    assert err[0] == ("cuzk-mp: error: $CUZK_MP_CONNECT: '/run/no-scheme.sock': expected unix:///path or host:port "
                      "with a port in 1..65535"), err
    assert err[1].startswith("cuzk-mp client: cannot reach the daemon at localhost:1: "), err
    assert err[2].startswith(f"cuzk-mp client: cannot reach the daemon at unix://{tmp_path}/default.sock: "), err


def test_a_connect_that_fails_leaves_no_socket_open(tmp_path: Path) -> None:
    """A script polling ``Client(addr)`` until the daemon is up (as wait-ready.sh polls ``client ready``)
    gets each failed connect's OSError and no socket left behind for the collector to find open."""
    from cuzk_mp.daemon.client import Client

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for addr in (f"unix://{tmp_path}/none.sock", f"unix://{tmp_path}"):
            with pytest.raises(OSError):
                Client(addr)
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)], [str(w.message) for w in caught]


def test_an_address_that_is_no_socket_is_named_as_such(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--connect unix:///run/cuzk-mp`` (the socket's folder, not the socket) or a regular file there:
    the connect is refused as by a daemon that is down, but the line says what is at the path (exit 3
    still: the daemon was not reached), where "Connection refused" sent the reader to restart it."""
    (tmp_path / "file.sock").write_text("")
    codes = [cli.main(_client("status", "--connect", f"unix://{path}")) for path in (tmp_path, tmp_path / "file.sock")]
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("cuzk-mp")]
    assert codes == [EXIT_UNREACHABLE, EXIT_UNREACHABLE], err
    assert err == [f"cuzk-mp client: cannot reach the daemon at unix://{tmp_path}: {tmp_path} is a folder, not a "
                   "socket: name the daemon's socket ([daemon] listen)",
                   f"cuzk-mp client: cannot reach the daemon at unix://{tmp_path}/file.sock: {tmp_path}/file.sock "
                   "is a regular file, not a socket: name the daemon's socket ([daemon] listen)"], err


def test_files_and_summary_both_unwritten_still_say_how_to_get_the_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``client prove --out /full/dir > /full/dir/summary.json``: neither a proof nor the summary can be
    written. The last line still names the file that failed and the job that holds the proofs
    (``cuzk-mp client await JOB --out DIR``): that id, a fresh one, was in the summary alone."""
    from contextlib import contextmanager

    from cuzk_mp.formats import atomic

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    real = atomic.atomic_output
    out = tmp_path / "o"

    class FullDisk:
        def write(self, data: bytes) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    @contextmanager
    def full_in_out(path: Any, mode: str = "wb") -> Any:
        with real(path, mode) as f:
            yield FullDisk() if Path(path).parent == out else f

    monkeypatch.setattr(atomic, "atomic_output", full_in_out)
    codes: list[int] = []

    async def body(d: Daemon, addr: str) -> None:
        stdout = open("/dev/full", "w")
        monkeypatch.setattr(sys, "stdout", stdout)
        codes.append(await asyncio.to_thread(cli.main, _client("prove", "--connect", addr, "--circuit", "syn",
                                                               "--partitions", "1", "--request-id", "lost-id",
                                                               "--out", str(out))))
        with contextlib.suppress(OSError):
            stdout.close()

    run_daemon(tmp_path, body)
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("cuzk-mp")]
    assert codes == [EXIT_INPUT], err
    [line] = err
    assert f"{out / 'verification_key.json'}: cannot write it: No space left on device" in line, line
    assert "`cuzk-mp client await lost-id --out DIR`" in line and "stdout" in line, line


def test_a_submit_whose_answer_cannot_be_printed_names_its_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """``client submit > /full/job.json``: the job is taken, its id (a fresh one) was to be printed there
    alone; the last line names it, so that the job can be awaited rather than sent again."""
    import re

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    codes: list[int] = []
    states: list[str] = []

    async def body(d: Daemon, addr: str) -> None:
        stdout = open("/dev/full", "w")
        monkeypatch.setattr(sys, "stdout", stdout)
        codes.append(await asyncio.to_thread(cli.main, _client("submit", "--connect", addr, "--circuit", "syn",
                                                               "--partitions", "1")))
        with contextlib.suppress(OSError):
            stdout.close()
        [line] = [x for x in capsys.readouterr().err.splitlines() if x.startswith("cuzk-mp")]
        assert line.startswith("cuzk-mp: error: stdout: cannot write it: No space left on device"), line
        m = re.search(r"`cuzk-mp client await (\w+)`", line)
        assert m, line
        async with await AsyncClient.connect(addr) as c:
            states.append((await c.await_proof(m.group(1), timeout_s=30)).state)

    run_daemon(tmp_path, body)
    assert codes == [EXIT_INPUT] and states == ["done"]


def test_a_done_job_whose_circuit_has_no_key_now_still_gets_its_proofs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``client await JOB --out DIR`` for a job proved before its circuit left the daemon's config (a restart
    with another config keeps done jobs' results): the daemon has no verification key of it now. The job's
    proofs and its summary are still written, and the last line names the verification key that is not
    (exit 2), rather than the daemon's "unknown circuit" alone with nothing written."""
    from cuzk_mp.daemon.client import Client
    from cuzk_mp.errors import InputError

    def no_key(self: Client, circuit_id: str) -> Any:
        raise InputError(f"unknown circuit {circuit_id!r}")

    out = tmp_path / "o"
    codes: list[int] = []

    async def body(d: Daemon, addr: str) -> None:
        async with await AsyncClient.connect(addr) as c:
            ref = await c.submit("syn", synthetic_partitions(2), request_id="early")
            await c.await_proof(ref.job_id)
        monkeypatch.setattr(Client, "vk_reply", no_key)
        codes.append(await asyncio.to_thread(cli.main, _client("await", "early", "--connect", addr, "--out", str(out))))

    run_daemon(tmp_path, body)
    captured = capsys.readouterr()
    err = [line for line in captured.err.splitlines() if line.startswith("cuzk-mp")]
    assert codes == [EXIT_INPUT], err
    assert sorted(p.name for p in out.iterdir()) == ["proof_0.json", "proof_1.json", "public_0.json",
                                                     "public_1.json"]
    assert '"state": "done"' in captured.out
    assert len(err) == 1 and "verification_key.json" in err[0] and "unknown circuit 'syn'" in err[0], err
