"""What an operator runs around the command: the Makefile's GPU-extra choice, the venv install's
fallback, the systemd unit, scripts/batch-prove.sh and the daemon's start-up notifications.

The GPU detection runs against fake ``nvidia-smi`` programs and driver version files; the venv
install against a fake python whose pip refuses the GPU extra; batch-prove against a fake
``cuzk-mp`` that records the request ids it is given (the real daemon run is in
tests/test_daemon_e2e.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cuzk_mp.daemon import notify
from cuzk_mp.daemon.client import Client
from tests.helpers import config_text

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"
UNIT = REPO / "config" / "cuzk-mp.service"
SMI_HEADER = """Tue Dec  1 10:00:00 2026
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI {driver}              Driver Version: {driver}      CUDA Version: {cuda}     |
|-----------------------------------------+------------------------+----------------------+
"""


def _path_without_nvidia_smi() -> str:
    return os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep)
                           if d and not (Path(d) / "nvidia-smi").exists())


def _fake_bin(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(0o755)
    return folder


def print_extras(tmp_path: Path, *, smi: str | None = None, proc_file: str | None = None,
                 extras: str | None = None) -> subprocess.CompletedProcess[str]:
    """``make -s print-extras`` with a fake nvidia-smi (its output, or None for none on PATH)."""
    path = _path_without_nvidia_smi()
    if smi is not None:
        fake = _fake_bin(tmp_path / "bin", "nvidia-smi", f"cat <<'EOF'\n{smi}EOF\n")
        path = f"{fake}{os.pathsep}{path}"
    proc = tmp_path / "nvidia-version"
    if proc_file is not None:
        proc.write_text(proc_file)
    env = {**os.environ, "PATH": path, "CUZK_MP_NVIDIA_PROC": str(proc)}
    env.pop("EXTRAS", None)
    args = ["make", "-s", "--no-print-directory", "print-extras"] + ([f"EXTRAS={extras}"] if extras else [])
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


def _extras(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("extras: "), proc.stdout
    return lines[0].removeprefix("extras: ")


# --- the Makefile's GPU extra ------------------------------------------------------------------

@pytest.mark.parametrize(("cuda", "extras"), [("12.8", "test,fleet,gpu"), ("12.0", "test,fleet,gpu"),
                                              ("13.0", "test,fleet,gpu-cuda13"), ("14.1", "test,fleet,gpu-cuda13"),
                                              ("11.8", "test,fleet")])
def test_print_extras_follows_nvidia_smi(tmp_path: Path, cuda: str, extras: str) -> None:
    proc = print_extras(tmp_path, smi=SMI_HEADER.format(driver="570.86.15", cuda=cuda))
    assert _extras(proc) == extras
    assert f"CUDA {cuda.split('.')[0]}" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_print_extras_without_gpu(tmp_path: Path) -> None:
    proc = print_extras(tmp_path)
    assert _extras(proc) == "test,fleet"
    assert "no NVIDIA driver" in proc.stderr


def test_print_extras_when_nvidia_smi_fails(tmp_path: Path) -> None:
    fake = _fake_bin(tmp_path / "bin", "nvidia-smi", "echo 'NVIDIA-SMI has failed because it could not "
                     "communicate with the NVIDIA driver.'\nexit 9\n")
    env = {**os.environ, "PATH": f"{fake}{os.pathsep}{_path_without_nvidia_smi()}",
           "CUZK_MP_NVIDIA_PROC": str(tmp_path / "none")}
    proc = subprocess.run(["make", "-s", "--no-print-directory", "print-extras"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert _extras(proc) == "test,fleet"
    assert "nvidia-smi failed (NVIDIA-SMI has failed" in proc.stderr


@pytest.mark.parametrize(("driver", "extras"), [("580.65.06", "test,fleet,gpu-cuda13"),
                                                ("535.104.05", "test,fleet,gpu"), ("470.82.01", "test,fleet")])
def test_print_extras_from_the_driver_version_without_nvidia_smi(tmp_path: Path, driver: str, extras: str) -> None:
    line = f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver}  Sun Jul 27 06:54:38 UTC 2025\n"
    assert _extras(print_extras(tmp_path, proc_file=line)) == extras


def test_extras_given_are_used_as_given(tmp_path: Path) -> None:
    proc = print_extras(tmp_path, smi=SMI_HEADER.format(driver="570.86.15", cuda="12.8"), extras="test,plot")
    assert _extras(proc) == "test,plot" and proc.stderr == ""


# --- the venv install's fallback -------------------------------------------------------------

FAKE_PYTHON = r"""
# A stand-in venv python: pip refuses cupy, CuPy's probe fails when asked to, the rest succeeds.
echo "$*" >> "$(dirname "$0")/calls.log"
case "$*" in
  *"pip install -q -e .[test,fleet,gpu]"* | *"pip install -q -e .[test,gpu]"*)
    echo "ERROR: Could not find a version that satisfies the requirement cupy-cuda12x>=13" >&2; exit 1 ;;
  *"import cupy"*)
    if [[ -f "$(dirname "$0")/no-device" ]]; then
      echo "cupy_backends.cuda.api.runtime.CUDARuntimeError: cudaErrorNoDevice: no CUDA-capable device" >&2
      exit 1
    fi
    echo "1 CUDA device(s)" ;;
esac
exit 0
"""


def _install(tmp_path: Path, *extra_args: str, cuda: str = "12.8") -> subprocess.CompletedProcess[str]:
    venv = tmp_path / "venv"
    _fake_bin(venv / "bin", "python", FAKE_PYTHON)
    smi = SMI_HEADER.format(driver="580.65.06", cuda=cuda)
    fake = _fake_bin(tmp_path / "bin", "nvidia-smi", f"cat <<'EOF'\n{smi}EOF\n")
    env = {**os.environ, "PATH": f"{fake}{os.pathsep}{_path_without_nvidia_smi()}"}
    return subprocess.run([str(SCRIPTS / "install-venv.sh"), "python3", str(venv), *extra_args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


def _calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "venv" / "bin" / "calls.log").read_text().splitlines()


def test_gpu_extra_that_cannot_install_falls_back_with_one_line(tmp_path: Path) -> None:
    proc = _install(tmp_path)
    assert proc.returncode == 0, proc.stderr
    calls = _calls(tmp_path)
    assert "-m pip install -q -e .[test,fleet,gpu]" in calls and calls[-2] == "-m pip install -q -e .[test,fleet]"
    assert calls[-1] == "scripts/warm_caches.py"  # the numba caches are warmed after the install
    said = [line for line in proc.stderr.splitlines() if "could not install" in line]
    assert len(said) == 1 and "cupy-cuda12x>=13" in said[0] and "CPU backend" in said[0], proc.stderr


def test_cupy_that_sees_no_device_is_said(tmp_path: Path) -> None:
    proc = _install(tmp_path, cuda="13.0")
    assert proc.returncode == 0 and "CuPy ('gpu-cuda13' extra) sees 1 CUDA device(s)" in proc.stderr, proc.stderr
    (tmp_path / "venv" / "bin" / "no-device").touch()
    proc = _install(tmp_path, cuda="13.0")
    said = [line for line in proc.stderr.splitlines() if "cannot use the GPU" in line]
    assert len(said) == 1 and "cudaErrorNoDevice" in said[0] and "CPU backend" in said[0], proc.stderr


def test_extras_given_explicitly_are_never_dropped(tmp_path: Path) -> None:
    proc = _install(tmp_path, "test,gpu")
    assert proc.returncode == 1 and "cupy-cuda12x" in proc.stderr
    assert not any(c.startswith("-m pip install -q -e .[test") and "gpu" not in c for c in _calls(tmp_path))


# --- the systemd unit --------------------------------------------------------------------------

def _unit_settings() -> dict[str, str]:
    settings: dict[str, str] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            settings[key] = value
    return settings


def test_unit_settings() -> None:
    s = _unit_settings()
    assert s["RemoveIPC"] == "yes" and s["Type"] == "notify" and s["User"] == "cuzk-mp"
    assert s["ProtectSystem"] == "strict" and s["CapabilityBoundingSet"] == "" and s["UMask"] == "0027"
    for key in ("ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs", "ProtectControlGroups",
                "LockPersonality", "RestrictRealtime", "RestrictNamespaces", "NoNewPrivileges"):
        assert s[key] == "yes", key
    assert "AF_UNIX" in s["RestrictAddressFamilies"] and "AF_INET" in s["RestrictAddressFamilies"]
    for key in ("PrivateDevices", "MemoryDenyWriteExecute", "ProtectClock", "DevicePolicy", "DeviceAllow"):
        assert key not in s, f"{key} shuts out the GPU or the JIT"
    assert "CUZK_MP_CACHE" not in UNIT.read_text()  # the daemon reads [srs] param_cache from its config


def test_unit_starts_where_a_group_is_missing_and_says_how_to_add_one() -> None:
    """A SupplementaryGroups= group the box lacks stops the start (status 216/GROUP: Debian 12 has no
    "render"), and NVIDIA's device nodes are world read-write by default: the unit names no group, and
    its comments show the drop-in for a box whose driver limits the nodes to one."""
    assert "SupplementaryGroups" not in _unit_settings()
    comments = [line for line in UNIT.read_text().splitlines() if line.startswith("#")]
    assert "#   SupplementaryGroups=video" in comments and any("216/GROUP" in line for line in comments)


def test_unit_documentation_is_installed_by_the_install_steps() -> None:
    """Every file the unit's Documentation= names is put there by the README's install steps and by
    the unit's own install comment."""
    readme = (REPO / "README.md").read_text()
    install = readme[readme.index("### Running the daemon under systemd"):]
    install = install[:install.index("```", install.index("```sh") + 5)]
    header = "".join(line for line in UNIT.read_text().splitlines(keepends=True) if line.startswith("#"))
    docs = _unit_settings()["Documentation"].split()
    assert docs
    for doc in docs:
        assert doc.startswith("file:///"), f"{doc}: a file the install steps put in place"
        path = doc[len("file://"):]
        for text in (install, header):
            step = re.search(rf"install -D -m 0644 (\S+) {re.escape(path)}\s", text)
            assert step and (REPO / step.group(1)).is_file(), (path, text)


def _unit_copy(tmp_path: Path) -> Path:
    """The unit with its binary path pointing at an executable stub (verify checks it exists)."""
    stub = _fake_bin(tmp_path, "cuzk-mp", "exit 0\n") / "cuzk-mp"
    unit = tmp_path / "cuzk-mp.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/cuzk-mp", str(stub)))
    return unit


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    proc = subprocess.run(["systemd-analyze", "verify", str(_unit_copy(tmp_path))], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr.strip() == "", proc.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_unit_security_exposure_below_5(tmp_path: Path) -> None:
    proc = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--no-pager", str(_unit_copy(tmp_path))],
                          capture_output=True, text=True, timeout=120)
    if "--offline" in proc.stderr and "unrecognized" in proc.stderr:
        pytest.skip(f"this systemd-analyze cannot judge a unit offline: {proc.stderr.strip()}")
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", proc.stdout + proc.stderr)
    assert m, proc.stdout + proc.stderr
    assert float(m.group(1)) < 5.0, proc.stdout


# --- scripts/batch-prove.sh --------------------------------------------------------------------

FAKE_CUZK = r"""
# A stand-in cuzk-mp: `client prove` records its request id and writes a job summary.
log="$BP_TEST_LOG"
if [[ "$1 $2" == "client await" ]]; then  # the daemon's word on a job: done, or BP_TEST_AWAIT_STATE
  printf '{\n "job_id": "%s",\n "state": "%s",\n "timed_out": false\n}\n' "$3" "${BP_TEST_AWAIT_STATE:-done}"
  exit 0
fi
[[ "$1 $2" == "client prove" ]] || { echo "unexpected: $*" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case "$1" in --request-id) echo "$2" >> "$log"; shift 2 ;; *) shift ;; esac
done
if [[ -n "${BP_TEST_WAIT:-}" ]]; then sleep "$BP_TEST_WAIT"; fi  # a job that takes its time
if [[ -n "${BP_TEST_EXIT:-}" ]]; then exit "$BP_TEST_EXIT"; fi
# the job is done, its files not written (a full disk: the client's OutputError, exit 2), nor, with
# BP_TEST_UNWRITTEN=all, its summary on stdout and its last line on stderr (the same full disk)
if [[ "${BP_TEST_UNWRITTEN:-}" == all ]]; then exit 2; fi
echo '{"job_id": "j1",'; echo ' "state": "done"}'
if [[ -n "${BP_TEST_UNWRITTEN:-}" ]]; then echo "cuzk-mp: error: out: cannot write it" >&2; exit 2; fi
"""


def batch(tmp_path: Path, *args: str, client_exit: int | None = None, unwritten: str = "",
          await_state: str = "done") -> subprocess.CompletedProcess[str]:
    fake = _fake_bin(tmp_path / "fakebin", "cuzk-mp", FAKE_CUZK) / "cuzk-mp"
    env = {**os.environ, "CUZK_MP": str(fake), "BP_TEST_LOG": str(tmp_path / "ids.log")}
    if client_exit is not None:
        env["BP_TEST_EXIT"] = str(client_exit)
    if unwritten:
        env["BP_TEST_UNWRITTEN"] = unwritten
    env["BP_TEST_AWAIT_STATE"] = await_state
    return subprocess.run([str(SCRIPTS / "batch-prove.sh"), *args], env=env, capture_output=True, text=True,
                          timeout=120)


def _ids(tmp_path: Path) -> list[str]:
    log = tmp_path / "ids.log"
    return log.read_text().split() if log.exists() else []


def test_batch_ids_of_long_names_sharing_a_prefix_differ(tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    prefix = "sector-" + "0123456789abcdef" * 6  # 103 characters in common
    (inputs / f"{prefix}-a.json").write_text('{"x": "1"}')
    (inputs / f"{prefix}-b.json").write_text('{"x": "1"}')  # the same content, too
    proc = batch(tmp_path, str(inputs), "--out", str(tmp_path / "out"), "--circuit=c", "-j2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ids = _ids(tmp_path)
    assert len(ids) == 2 and len(set(ids)) == 2, ids
    for rid in ids:
        assert len(rid) <= 128 and rid.isprintable() and rid.endswith("-1"), rid
    assert "2 of 2 jobs done" in proc.stdout


def test_batch_resume_and_changed_input(tmp_path: Path) -> None:
    inputs, out = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    (inputs / "a.json").write_text('{"x": "1"}')
    job = inputs / "multi"
    job.mkdir()
    (job / "p0.json").write_text('{"x": "2"}')
    (job / "p1.json").write_text('{"x": "3"}')
    args = ["--circuit", "c", "--out", str(out), str(inputs)]
    assert batch(tmp_path, *args).returncode == 0
    first = _ids(tmp_path)
    assert len(first) == 2
    again = batch(tmp_path, *args)
    assert again.stdout.count("[skip]") == 2 and _ids(tmp_path) == first  # resumed: nothing resubmitted
    (out / "a" / ".done").unlink()
    assert batch(tmp_path, *args).returncode == 0
    assert _ids(tmp_path)[-1] in first  # interrupted before .done: the same id re-attaches
    (out / "a" / ".done").unlink()
    (inputs / "a.json").write_text('{"x": "4"}')
    assert batch(tmp_path, *args).returncode == 0
    assert _ids(tmp_path)[-1] not in first  # a changed input is a new job
    (out / "multi" / ".done").unlink()
    (job / "p1.json").write_text('{"x": "5"}')
    assert batch(tmp_path, *args).returncode == 0
    assert _ids(tmp_path)[-1] not in first  # so is a changed partition of a folder job


def test_batch_rerun_reattaches_unless_the_job_failed(tmp_path: Path) -> None:
    """A job not waited for to its end (timeout 124, daemon unreachable 3, interrupted 130/143) keeps its
    request id: the rerun re-attaches and nothing is proved twice; a failed one (1, 2) gets a new attempt."""
    inputs, out = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    (inputs / "a.json").write_text('{"x": "1"}')
    args = ["--circuit", "c", "--out", str(out), str(inputs)]
    for code in (124, 3, 130, 143):
        proc = batch(tmp_path, *args, client_exit=code)
        assert proc.returncode == 1 and "[pending] a" in proc.stdout and "not done: a" in proc.stdout, proc.stdout
    ids = _ids(tmp_path)
    assert len(ids) == 4 and len(set(ids)) == 1 and ids[0].endswith("-1"), ids  # one job, re-attached each time
    assert batch(tmp_path, *args, client_exit=1).returncode == 1 and _ids(tmp_path)[-1] == ids[0]
    proc = batch(tmp_path, *args, client_exit=2, await_state="failed")  # a new attempt, failed on its input
    assert proc.returncode == 1 and "[FAILED] a" in proc.stdout and _ids(tmp_path)[-1].endswith("-2"), proc.stdout
    assert batch(tmp_path, *args).returncode == 0  # the failed job's entry: a new attempt
    assert _ids(tmp_path)[-1].endswith("-3") and (out / "a" / ".done").exists()


@pytest.mark.parametrize("unwritten", ["files", "all"])
def test_batch_rerun_writes_a_done_jobs_files_without_proving_it_again(tmp_path: Path, unwritten: str) -> None:
    """The client's exit 2 for a job that is done but whose files could not be written (a full disk)
    is no failure of the job: the rerun re-attaches with the same request id and writes them. Where
    the same full disk took result.json and client.log too ("all"), the daemon is asked what became
    of the job, rather than the entry given a new attempt that proves it again."""
    inputs, out = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    (inputs / "a.json").write_text('{"x": "1"}')
    args = ["--circuit", "c", "--out", str(out), str(inputs)]
    proc = batch(tmp_path, *args, unwritten=unwritten)
    assert proc.returncode == 1 and "[pending] a (proved, its files not written" in proc.stdout, proc.stdout
    assert batch(tmp_path, *args).returncode == 0
    ids = _ids(tmp_path)
    assert len(ids) == 2 and ids[0] == ids[1] and ids[0].endswith("-1"), ids
    assert (out / "a" / ".done").exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_batch_sigterm_stops_the_waits_in_flight_and_starts_no_more(tmp_path: Path, sig: signal.Signals) -> None:
    """SIGTERM to the script alone (``kill PID``: a supervisor's stop, a CI step's; not a terminal's
    Ctrl-C, which reaches every process of its group) is passed on to the clients in flight, which stop
    waiting (their jobs go on in the daemon) and are marked pending, and no further entry is started: exit
    130 with the summary, where the script waited for every entry, started the ones not begun, then said it
    was interrupted. SIGHUP (the terminal closed) the same: the entries' group no longer gets it from the
    terminal."""
    from tests.helpers import wait_until

    inputs = tmp_path / "in"
    inputs.mkdir()
    for name in "abc":
        (inputs / f"{name}.json").write_text("{}")
    fake = _fake_bin(tmp_path / "fakebin", "cuzk-mp", FAKE_CUZK) / "cuzk-mp"
    env = {**os.environ, "CUZK_MP": str(fake), "BP_TEST_LOG": str(tmp_path / "ids.log"), "BP_TEST_WAIT": "15"}
    proc = subprocess.Popen([str(SCRIPTS / "batch-prove.sh"), "--circuit", "c", "--out", str(tmp_path / "out"),
                             "-j", "1", str(inputs)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        wait_until(lambda: _ids(tmp_path), timeout=60)  # the first entry's client waits for its job
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, (out, err)
    assert len(_ids(tmp_path)) == 1, _ids(tmp_path)
    assert "0 of 3 jobs done" in out and "interrupted" in out, out
    assert not list((tmp_path / "out").glob("*/.done"))
    assert (tmp_path / "out" / "a" / ".pending").exists()  # kept its request id: the rerun re-attaches to it


def test_batch_help_and_argument_errors(tmp_path: Path) -> None:
    proc = batch(tmp_path, "--circuit", "c", "--help")
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.startswith("usage: batch-prove.sh") and "set -" not in proc.stdout
    assert not any(line.startswith("#") for line in proc.stdout.splitlines())
    for args, needle in ((["--circuit"], "--circuit needs a value"), (["--out", "o", "in"], "--circuit ID"),
                         (["--circuit", "c", "--out", "o", "a", "b"], "one INPUT_DIR only"),
                         (["--bogus"], "unknown option --bogus"),
                         (["--circuit", "c", "--out", "o", "-j", "0", str(tmp_path)], "-j needs a positive"),
                         (["--circuit", "c", "--out", "o", str(tmp_path / "nope")], "is not a directory")):
        proc = batch(tmp_path, *args)
        assert proc.returncode == 2 and needle in proc.stderr and proc.stdout == "", (args, proc.stderr)
    # what the client would refuse for every job is refused once, before any job: not each entry marked
    # failed (a new attempt, a new request id, on every rerun) and exit 1
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "a.json").write_text("{}")
    for args, needle in ((["--priority", "URGENT"], "--priority needs CRITICAL, HIGH, NORMAL or LOW, not 'URGENT'"),
                         (["--timeout", "1h"], "--timeout needs a number of seconds, not '1h'")):
        proc = batch(tmp_path, "--circuit", "c", "--out", str(tmp_path / "out"), *args, str(inputs))
        assert proc.returncode == 2 and needle in proc.stderr and proc.stdout == "", (args, proc.stderr)
        assert _ids(tmp_path) == [] and not (tmp_path / "out").exists()


# --- start-up notifications ----------------------------------------------------------------------

def test_starting_sends_status_and_extension(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(tmp_path / "notify"))
        monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
        assert notify.starting("loading key porep-32g\n(3 of 4)", notify.read_budget_s(32 << 30))
        fields = dict(line.split("=", 1) for line in sock.recv(4096).decode().splitlines())
        assert fields["STATUS"] == "loading key porep-32g (3 of 4)"
        assert int(fields["EXTEND_TIMEOUT_USEC"]) == int((60 + 32 * 1024 / 50) * 1e6)
        assert notify.starting("starting the engine", 1.0)
        fields = dict(line.split("=", 1) for line in sock.recv(4096).decode().splitlines())
        assert int(fields["EXTEND_TIMEOUT_USEC"]) == int(notify.MIN_STEP_S * 1e6)
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert not notify.starting("outside systemd", 10.0)
    assert notify.setup_budget_s(20) > notify.setup_budget_s(16) > notify.MIN_STEP_S


def test_batch_prove_long_names_through_a_daemon(tmp_path: Path) -> None:
    """Two inputs whose long names share their first 100 characters, through a real daemon: both
    jobs are proved (one request id each) and every proof verifies (``--verify``), with an output
    folder whose name holds "public_" (each proof_<i>.json is found by its file name alone)."""
    from cuzk_mp.circuits.synthetic_kinds import write_synthetic

    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "CUZK_MP": f"{sys.executable} -m cuzk_mp"}
    (tmp_path / "cuzk.toml").write_text(config_text(tmp_path, tmp_path / "keys", prefix=f"cuzk-batch-{os.getpid()}"))
    inputs = tmp_path / "in"
    inputs.mkdir()
    prefix = "sector-" + "0123456789" * 10
    for seed, tail in ((1, "a"), (2, "b")):
        _, wtns = write_synthetic("porep-like", 10, tmp_path / f"w{seed}", seed=seed)
        wtns.rename(inputs / f"{prefix}-{tail}.wtns")
    with open(tmp_path / "daemon.log", "wb") as log:
        daemon = subprocess.Popen([sys.executable, "-m", "cuzk_mp", "daemon", "--config", str(tmp_path / "cuzk.toml")],
                                  env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            addr = f"unix://{tmp_path}/cuzk.sock"
            ready = subprocess.run([str(SCRIPTS / "wait-ready.sh"), "--connect", addr, "--timeout", "300"], env=env,
                                   capture_output=True, text=True, timeout=320)
            assert ready.returncode == 0, ready.stderr + (tmp_path / "daemon.log").read_text()[-4000:]
            proc = subprocess.run([str(SCRIPTS / "batch-prove.sh"), str(inputs), "--verify", "--circuit", "syn",
                                   "--connect", addr, "-j", "2", "--out", str(tmp_path / "public_out")], env=env,
                                  capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            assert proc.stdout.count("[ok]") == 2 and "2 of 2 jobs done" in proc.stdout
            with Client(addr) as client:
                jobs = [json.loads((tmp_path / "public_out" / f"{prefix}-{t}" / "result.json").read_text())["job_id"]
                        for t in "ab"]
                assert len(set(jobs)) == 2 and all(client.await_proof(j, 10).state == "done" for j in jobs)
        finally:
            daemon.send_signal(signal.SIGTERM)
            assert daemon.wait(60) == 0


def test_wait_ready_help() -> None:
    """--help prints the script's head comment, without its comment marks and nothing of the code."""
    proc = subprocess.run([str(SCRIPTS / "wait-ready.sh"), "--help"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and proc.stderr == ""
    lines = proc.stdout.splitlines()
    assert lines[0] == "Wait until a cuzk-mp daemon serves, or give up."
    assert lines[-1] == 'command (default: cuzk-mp), e.g. CUZK_MP="python -m cuzk_mp.cli".'
    assert "set -" not in proc.stdout and not any(line.startswith("#") for line in lines)


@pytest.mark.parametrize("args, says", [
    (["--connect"], "--connect needs a value"),
    (["--timeout", "soon"], "--timeout needs a number of seconds, not 'soon'"),
    (["--interval", "x"], "--interval needs a number of seconds, not 'x'"),
])
def test_wait_ready_bad_arguments_are_usage_errors(args: list[str], says: str) -> None:
    """A bad argument is exit 2, saying which, at once: never exit 1, which tells a caller that the
    daemon did not come up in time, nor a loop that polls with it."""
    env = {**os.environ, "CUZK_MP": f"{sys.executable} -m cuzk_mp"}
    proc = subprocess.run([str(SCRIPTS / "wait-ready.sh"), *args], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and proc.stderr == f"wait-ready.sh: {says}\n", (proc.returncode, proc.stderr)


def test_wait_ready_with_a_malformed_address_blames_no_daemon() -> None:
    """An address the client cannot use (a path without unix://) stops the wait at once (exit 2) with the
    client's own line, not "the daemon at ADDR refused the call": no daemon was asked anything."""
    env = {**os.environ, "CUZK_MP": f"{sys.executable} -m cuzk_mp"}
    proc = subprocess.run([str(SCRIPTS / "wait-ready.sh"), "--connect", "/run/cuzk-mp/cuzk.sock"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "refused" not in proc.stderr, proc.stderr
    assert "'/run/cuzk-mp/cuzk.sock': expected unix:///path or host:port" in proc.stderr, proc.stderr


def test_wait_ready_with_tokens(tmp_path: Path) -> None:
    """A daemon that requires tokens: wait-ready.sh without one stops at once with exit 2 (waiting
    would not help); with --token it sees the daemon ready."""
    token = "wait-ready-token-0001"
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "CUZK_MP": f"{sys.executable} -m cuzk_mp"}
    env.pop("CUZK_MP_TOKEN", None)
    (tmp_path / "cuzk.toml").write_text(config_text(tmp_path, tmp_path / "keys", prefix=f"cuzk-wr-{os.getpid()}",
                                                    daemon=f'tokens = ["{token}"]'))
    with open(tmp_path / "daemon.log", "wb") as log:
        daemon = subprocess.Popen([sys.executable, "-m", "cuzk_mp", "daemon", "--config", str(tmp_path / "cuzk.toml")],
                                  env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            addr = f"unix://{tmp_path}/cuzk.sock"
            ready = subprocess.run([str(SCRIPTS / "wait-ready.sh"), "--connect", addr, "--token", token,
                                    "--timeout", "300"], env=env, capture_output=True, text=True, timeout=320)
            assert ready.returncode == 0, ready.stderr + (tmp_path / "daemon.log").read_text()[-4000:]
            refused = subprocess.run([str(SCRIPTS / "wait-ready.sh"), "--connect", addr, "--timeout", "300"],
                                     env=env, capture_output=True, text=True, timeout=60)
            assert refused.returncode == 2 and "waiting cannot help" in refused.stderr, refused.stderr
            assert "this daemon requires a token" in refused.stderr, refused.stderr
        finally:
            daemon.send_signal(signal.SIGTERM)
            assert daemon.wait(60) == 0
