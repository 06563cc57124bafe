"""A config written for cuzk mostly works; what the daemon says about a config; its start-up status.

cuzk's keys that mean nothing here are accepted with a warning naming each, ``gpus.devices = []`` is
every GPU and ``threads = 0`` the automatic count; enum errors list the allowed values; ``--check``
prints sizes in GiB; the command line's log level overrides the file's; the install text of the unit
and the README yields a config that agrees with the unit; systemd hears of each long start-up step.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

from cuzk_mp import cli
from cuzk_mp.daemon import config as C
from cuzk_mp.daemon import config_file
from cuzk_mp.daemon import notify
from cuzk_mp.daemon.server import Daemon
from cuzk_mp.errors import ConfigError
from cuzk_mp.paths import default_cache_dir
from cuzk_mp.pipeline.keys import synthetic_key_paths

from tests.fake_engine import FakeEngine, run_daemon

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "config" / "cuzk-mp.example.toml"
UNIT = REPO / "config" / "cuzk-mp.service"

# A file as cuzk's documentation writes one (its listener moved to loopback: without tokens this
# daemon refuses one that other hosts reach), with every key cuzk documents.
CUZK_STYLE = """
[daemon]
listen = "127.0.0.1:9820"
status_listen = ""

[srs]
param_cache = "{cache}"
preload = []

[memory]
total_budget = "64GiB"
safety_margin = "5GiB"
eviction_min_idle = "5m"
pinned_budget = "100GiB"
working_memory_budget = "50GiB"

[synthesis]
threads = 0
partition_workers = 2

[gpus]
devices = []
gpu_threads = 32
gpu_workers_per_device = 2

[gpus.affinity]
porep = [0]

[scheduler]
max_batch_size = 1
max_batch_wait_ms = 10000
sort_by_type = true

[pipeline]
enabled = true
synthesis_lookahead = 1
synthesis_concurrency = 1
max_parallel_synthesis = 18
slot_size = 0
max_gpu_queue_depth = 0

[logging]
level = "warn"

[circuits.porep-like-10]
synthetic = "porep-like"
log_n = 10
"""


def test_a_cuzk_config_starts_with_a_warning_per_ignored_key(tmp_path: Path) -> None:
    path = tmp_path / "cuzk.toml"
    path.write_text(CUZK_STYLE.format(cache=tmp_path / "params"))
    cfg = C.load_config(path)
    assert cfg.engine.devices is None  # [] is every visible GPU
    assert cfg.engine.synthesis_threads == max(1, (os.cpu_count() or 1) // 2)  # threads = 0: automatic
    assert cfg.engine.partition_workers == 2 and cfg.engine.gpu_workers_per_device == 2
    assert cfg.log_level == "warning" and cfg.param_cache == tmp_path / "params"
    named = sorted(re.match(rf"{re.escape(str(path))}: (\S+) is a cuzk setting", w).group(1)  # type: ignore[union-attr]
                   for w in cfg.warnings)
    assert named == sorted(config_file.FOREIGN_KEYS)  # each ignored key once, by its name, with the file's
    for w in cfg.warnings:
        key = w.split(": ", 1)[1].split(" ", 1)[0]
        assert w.endswith(config_file.FOREIGN_KEYS[key])  # and why it does nothing here


def test_unknown_keys_that_are_not_cuzks_are_still_errors(tmp_path: Path) -> None:
    for raw, key in (({"gpus": {"gpu_thread": 32}}, "gpus.gpu_thread"),
                     ({"scheduler": {"max_batch": 2}}, "scheduler.max_batch`"),
                     ({"pipeline": {"enabled": True, "slots": 4}}, "pipeline.slots")):
        with pytest.raises(ConfigError, match=re.escape(f"unknown key `{key}")):
            C.resolve({"memory": {"total_budget": "64GiB"}, **raw}, base=tmp_path, source="t.toml")


def test_scheduler_is_cuzks_section_and_names_its_unknown_keys(tmp_path: Path) -> None:
    """[scheduler] has no meaning here: its cuzk keys are accepted with a warning, any other key is an
    unknown key named in full, and an empty [scheduler] is accepted with a warning too."""
    with pytest.raises(ConfigError) as e:
        C.resolve({"memory": {"total_budget": "64GiB"}, "scheduler": {"max_batch_size": 1, "bogus": 2}},
                  base=tmp_path, source="t.toml")
    assert str(e.value).startswith("t.toml: unknown key `scheduler.bogus` ([scheduler] is a section of cuzk's")
    assert "max_batch_size, max_batch_wait_ms, sort_by_type are accepted, and ignored" in str(e.value)
    empty = C.resolve({"memory": {"total_budget": "64GiB"}, "scheduler": {}}, base=tmp_path, source="t.toml")
    assert empty.warnings == ("t.toml: [scheduler] is a cuzk section with no meaning here, ignored",)


@pytest.mark.parametrize("text, says", [
    ("[pipeline]\ntask_timeout = 0\n", ": pipeline.task_timeout: must be positive, got 0 s"),
    ("[pipeline]\nstart_timeout = 0\n", ": pipeline.start_timeout: must be positive, got 0 s"),
    ("[pipeline]\nring_slots = 300\n", ": pipeline.ring_slots: 300 is more than 256"),
    ('[daemon]\nmax_frame_bytes = "1KiB"\n', ": daemon.max_frame_bytes: 1024 bytes cannot carry"),
    ('[memory]\ntotal_budget = "8GiB"\nhost_budget = "100GiB"\n', ": memory.host_budget: 100.00 GiB is more than"),
    ("[scheduler]\nbogus = 1\n", ": unknown key `scheduler.bogus`"),
])
def test_check_refuses_what_the_start_would(text: str, says: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """`daemon --check` (the unit's ExecStartPre) exits 2 naming the file and the key where the start
    would fail or the daemon could not serve."""
    path = tmp_path / "d.toml"
    path.write_text(f'[srs]\nparam_cache = "{tmp_path / "params"}"\n' + text)
    assert cli.main(["daemon", "--config", str(path), "--check"]) == 2
    err = capsys.readouterr().err
    assert f"{path}{says}" in err and "EngineConfig" not in err


def test_check_names_a_file_it_cannot_read(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Not UTF-8, a folder, not readable: exit 2 naming the file (never an internal error)."""
    bad = tmp_path / "n.toml"
    bad.write_bytes(b'[daemon]\nlisten = "\xff"\n')
    assert cli.main(["daemon", "--config", str(bad), "--check"]) == 2
    assert f"{bad}: not valid TOML: not UTF-8 text: byte 0xff at byte offset 19 (line 2)" in capsys.readouterr().err
    folder = tmp_path / "dir.toml"
    folder.mkdir()
    assert cli.main(["daemon", "--config", str(folder), "--check"]) == 2
    assert f"{folder}: Is a directory" in capsys.readouterr().err
    locked = tmp_path / "locked.toml"
    locked.write_text("")

    def refuse(f: object, limit: int) -> bytes:
        raise PermissionError(13, "Permission denied", str(locked))

    from cuzk_mp.formats import atomic

    monkeypatch.setattr(atomic, "read_at_most", refuse)  # as root, a mode of 0 does not stop the read
    assert cli.main(["daemon", "--config", str(locked), "--check"]) == 2
    assert f"{locked}: Permission denied" in capsys.readouterr().err


@pytest.mark.parametrize("raw, key, allowed", [
    ({"gpus": {"backend": "tpu"}}, "gpus.backend", "'auto', 'cpu', 'gpu'"),
    ({"logging": {"format": "xml"}}, "logging.format", "'json', 'text'"),
    ({"synthesis": {"threads_per_partition": "many"}}, "synthesis.threads_per_partition", "'auto', an integer"),
    ({"circuits": {"c": {"synthetic": "sparse", "log_n": 10}}}, "circuits.c.synthetic",
     "'dense-random', 'porep-like'"),
    ({"circuits": {"c": {"synthetic": "porep-like", "log_n": 10, "priority": "URGENT"}}}, "circuits.c.priority",
     "'CRITICAL', 'HIGH', 'LOW', 'NORMAL'"),
])
def test_enum_errors_list_the_allowed_values(raw: dict[str, Any], key: str, allowed: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        C.resolve({"memory": {"total_budget": "64GiB"}, **raw}, base=tmp_path, source="t.toml")
    assert f"`{key}`" in str(e.value) and f"(one of: {allowed})" in str(e.value)


def test_log_levels(tmp_path: Path) -> None:
    def level(value: str) -> str:
        return C.resolve({"memory": {"total_budget": "64GiB"}, "logging": {"level": value}}, base=tmp_path).log_level

    assert [level(v) for v in ("debug", "INFO", "warning", "error", "trace", "warn")] == \
        ["debug", "info", "warning", "error", "debug", "warning"]
    with pytest.raises(ConfigError, match=r"logging.level.*'loud'.*one of: debug, info, warning, error"):
        level("loud")


def test_threads_zero_means_auto_and_devices_still_checked(tmp_path: Path) -> None:
    auto = C.resolve({"memory": {"total_budget": "64GiB"}, "synthesis": {"threads_per_partition": 0}},
                     base=tmp_path)
    assert auto.engine.synthesis_threads == max(1, (os.cpu_count() or 1) // 2)
    with pytest.raises(ConfigError, match="synthesis.threads_per_partition: must be >= 0"):
        C.resolve({"memory": {"total_budget": "64GiB"}, "synthesis": {"threads_per_partition": -1}}, base=tmp_path)
    with pytest.raises(ConfigError, match="gpus.devices"):
        C.resolve({"memory": {"total_budget": "64GiB"}, "gpus": {"devices": [1, 1]}}, base=tmp_path)


def test_param_cache_defaults_to_the_one_cache_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUZK_MP_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    cfg = C.resolve({"memory": {"total_budget": "64GiB"}}, base=tmp_path)
    assert cfg.param_cache == default_cache_dir() == tmp_path / "xdg" / "cuzk-mp"
    assert cfg.engine.param_cache == cfg.param_cache and cfg.journal_path == cfg.param_cache / "journal.sqlite"
    monkeypatch.setenv("CUZK_MP_CACHE", str(tmp_path / "own"))
    assert C.resolve({"memory": {"total_budget": "64GiB"}}, base=tmp_path).param_cache == tmp_path / "own"


def test_check_prints_gib_and_the_ignored_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "cuzk.toml"
    path.write_text(CUZK_STYLE.format(cache=tmp_path / "params"))
    assert cli.main(["daemon", "--config", str(path), "--check"]) == 0
    out, err = capsys.readouterr()
    # each ignored key, and the access warning of its listener (loopback TCP without tokens)
    assert f"{path.resolve()}: OK (1 circuits" in out and f"{len(config_file.FOREIGN_KEYS) + 1} warnings" in out
    assert "warning: daemon.listen = '127.0.0.1:9820' without tokens: every local user" in err
    # the queued jobs' inputs (daemon.max_queued_input, 2 GiB by default) are kept out of the pipeline's budget
    assert ("total 64.00 GiB, safety margin 5.00 GiB, queued jobs' inputs 2.00 GiB, pipeline (host budget) "
            "57.00 GiB") in out
    assert re.search(r"proving keys \d+\.\d\d GiB", out) and " bytes" not in out
    assert all(f"warning: {path}: {key} is a cuzk setting" in err for key in config_file.FOREIGN_KEYS)


@pytest.mark.parametrize("argv, want", [([], "warning"), (["--log-level", "DEBUG"], "DEBUG"),
                                        (["-v"], "INFO"), (["daemon-args", "--log-level=ERROR"], "ERROR")])
def test_command_line_log_level_overrides_the_file(argv: list[str], want: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from cuzk_mp.daemon import ops, server

    path = tmp_path / "cuzk.toml"
    path.write_text(CUZK_STYLE.format(cache=tmp_path / "params"))  # level = "warn"
    got: list[str] = []
    monkeypatch.setattr(ops, "setup_logging", lambda level, fmt: got.append(level))

    async def serve(cfg: C.DaemonConfig) -> int:
        return 0

    monkeypatch.setattr(server, "serve", serve)
    rest = [a for a in argv if a != "daemon-args"]
    assert cli.main(["daemon", "--config", str(path), *rest]) == 0
    assert got == [want]


def _install_settings(text: str) -> dict[str, str]:
    """The ``key = "value"`` settings the install text asks for in the config file."""
    return dict(re.findall(r'\b(listen|param_cache|shm_prefix|journal|socket_mode) = "([^"]*)"', text))


def test_install_text_agrees_with_the_code_and_the_unit() -> None:
    readme = (REPO / "README.md").read_text()
    unit = UNIT.read_text()
    install = readme[readme.index("### Running the daemon under systemd"):]
    install = install[:install.index("```", install.index("```sh") + 5)]
    header = "".join(line for line in unit.splitlines(keepends=True) if line.startswith("#"))
    for text in (install, header):
        asked = _install_settings(text)
        # what the install text asks for, applied to the example, gives a config that fits the unit: the
        # socket in RuntimeDirectory, keys and journal in StateDirectory, and a prefix that is the same
        # at every start (derived from the journal) so a restart removes what a killed daemon left
        assert asked.get("shm_prefix", "") == ""
        raw = tomllib.loads(EXAMPLE.read_text())
        raw["daemon"]["listen"] = asked["listen"]
        raw["srs"]["param_cache"] = asked["param_cache"]
        cfg = C.resolve(raw, base=EXAMPLE.parent)
        assert str(cfg.listen) == "unix:///run/cuzk-mp/cuzk.sock" and "RuntimeDirectory=cuzk-mp" in unit
        assert cfg.journal_path == Path("/var/lib/cuzk-mp/journal.sqlite") and "StateDirectory=cuzk-mp" in unit
        assert cfg.engine.shm_prefix == C.default_shm_prefix(cfg.journal_path)
        assert "journal" in text and "prefix" in text  # and says so


# ---- start-up status for systemd

def test_start_tells_systemd_each_long_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = {"daemon": {"listen": f"unix://{tmp_path}/d.sock"}, "srs": {"param_cache": str(tmp_path / "cache"),
                                                                      "preload": ["syn"]},
           "memory": {"total_budget": "64GiB"}, "pipeline": {"start_timeout": "120s"},
           "circuits": {"syn": {"synthetic": "porep-like", "log_n": 12},
                        "made": {"synthetic": "dense-random", "log_n": 10}}}
    made = synthetic_key_paths("dense-random", 10, tmp_path / "cache")[0]  # its key is in the cache already
    made.parent.mkdir(parents=True)
    made.write_bytes(b"z" * 4096)
    cfg = C.resolve(raw, base=tmp_path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(tmp_path / "notify"))
        sock.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))

        async def main() -> None:
            d = Daemon(cfg, engine_factory=FakeEngine)
            await d.start()
            await d.stop()

        asyncio.run(main())
        messages = []
        while True:
            fields = dict(line.split("=", 1) for line in sock.recv(4096).decode().splitlines())
            messages.append(fields)
            if "STOPPING" in fields:
                break
    steps = [(m["STATUS"], int(m["EXTEND_TIMEOUT_USEC"])) for m in messages if "EXTEND_TIMEOUT_USEC" in m]
    assert [s for s, _ in steps] == [
        "starting the engine's processes (a first start compiles kernels)",
        "making (once) the INSECURE development key of syn (porep-like 2^12)",  # not in the cache yet
        "checking the development key of made (dense-random 2^10)",
        "loading the proving key of syn (0.00 GiB)",
    ]
    assert steps[0][1] == int((120 + 60) * 1e6)
    assert steps[1][1] == int(notify.setup_budget_s(12) * 1e6)
    assert steps[3][1] == int(notify.read_budget_s(0) * 1e6)
    ready = [m for m in messages if m.get("READY") == "1"]
    assert len(ready) == 1 and messages.index(ready[0]) == len(steps)  # READY after the last step


class Notices:
    """The sd_notify datagrams sent to a socket of ours, read as they come (systemd reads them at once:
    a queue left full would refuse the sender's next one)."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.05)
        self.got: list[dict[str, str]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while not self.stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            self.got.append(dict(line.split("=", 1) for line in data.decode().splitlines()))

    def close(self) -> list[dict[str, str]]:
        self.stop.set()
        self.thread.join()
        self.sock.close()
        return self.got


def test_a_serving_daemon_pings_the_watchdog_from_its_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``WatchdogSec=`` (the unit's), the daemon sends WATCHDOG=1 with a status line from its asyncio loop
    while it serves and through its drain: a loop that hangs stops them and systemd restarts it. A watchdog
    meant for another process (WATCHDOG_PID: a worker inherits the variables) is not answered."""
    assert "WatchdogSec=" in UNIT.read_text()
    notices = Notices(tmp_path / "notify")
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
    monkeypatch.setenv("WATCHDOG_USEC", "100000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert notify.watchdog_interval_s() == 0.05

    async def body(d: Daemon, addr: str) -> None:
        await asyncio.sleep(0.5)
        pings = [m for m in notices.got if m.get("WATCHDOG") == "1"]
        assert len(pings) >= 3
        assert pings[-1]["STATUS"] == f"running on unix://{tmp_path}/d.sock: 0 job(s) queued, 0 running"
        monkeypatch.setenv("WATCHDOG_PID", "1")
        assert notify.watchdog_interval_s() is None

    run_daemon(tmp_path, body)  # every datagram is sent once it returns: the reader takes them in 0.2 s
    time.sleep(0.2)
    after_stop = len(notices.got)
    time.sleep(0.2)
    sent = notices.close()
    assert any("STOPPING" in m for m in sent) and len(sent) == after_stop  # the stop ended the pings


def test_every_cache_default_is_the_one_cache_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine, the daemon and the bench default to cuzk_mp.paths.default_cache_dir, and nothing
    else in the package or perf/ makes up a cache folder of its own."""
    from cuzk_mp.pipeline.types import EngineConfig

    monkeypatch.delenv("CUZK_MP_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert EngineConfig().param_cache == tmp_path / "cuzk-mp" == cli.build_parser().parse_args(["bench"]).cache
    own = re.compile(r'Path\.home\(\)|environ(?:\.get)?\(\s*"(?:CUZK_MP_CACHE|XDG_CACHE_HOME)"|"~/\.cache')
    found = [f"{p.relative_to(REPO)}:{i}" for p in [*(REPO / "cuzk_mp").rglob("*.py"), *(REPO / "perf").glob("*.py")]
             if p.name != "paths.py" for i, line in enumerate(p.read_text().splitlines(), 1) if own.search(line)]
    assert found == []
