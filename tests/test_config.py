"""The daemon's TOML config: every key decoded, every mistake named, mapped onto the engine."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import msgspec
import pytest

from cuzk_mp.daemon import config as C
from cuzk_mp.daemon.transport import Address, parse_address
from cuzk_mp.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "config" / "cuzk-mp.example.toml"
SMALL = {"memory": {"total_budget": "64GiB"}}


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "cuzk.toml"
    p.write_text(text)
    return p


def resolve(raw: dict, tmp_path: Path) -> C.DaemonConfig:
    merged = {**SMALL, **raw}
    return C.resolve(merged, base=tmp_path, source="t.toml")


def test_example_config_loads_and_maps_onto_the_engine(tmp_path: Path) -> None:
    text = EXAMPLE.read_text().replace('param_cache = ""', f'param_cache = "{tmp_path}"')
    cfg = C.load_config(write(tmp_path, text))
    assert cfg.listen == Address("tcp", host="127.0.0.1", port=9820)
    assert cfg.socket_mode == 0o600 and cfg.status_listen is None
    assert cfg.journal_path == tmp_path / "journal.sqlite"
    assert cfg.max_frame_bytes == 128 * 2**20
    assert cfg.result_ttl_s == 3600 and cfg.shutdown_grace_s == 30
    e = cfg.engine
    assert (e.backend, e.devices, e.gpu_workers_per_device) == ("auto", None, 2)
    # threads_per_partition = "auto": the machine's cores shared among the workers
    assert (e.partition_workers, e.synthesis_threads, e.ring_slots) == (2, max(1, (os.cpu_count() or 1) // 2), 4)
    assert (e.verify_proofs, e.max_attempts, e.start_timeout_s) == (True, 2, 300.0)
    assert e.param_cache == tmp_path and e.shm_prefix == C.default_shm_prefix(tmp_path / "journal.sqlite")
    assert (cfg.frame_timeout_s, cfg.max_connections, cfg.tokens, cfg.admin_tokens) == (60.0, 256, (), ())
    assert e.srs_budget_bytes is not None and e.srs_budget_bytes > 0
    spec = cfg.circuits["porep-like-10"].spec
    assert (spec.synthetic, spec.log_n, spec.partitions) == ("porep-like", 10, 1)
    assert cfg.circuits["porep-like-10"].priority.name == "NORMAL"


def test_every_key_is_documented_in_the_example() -> None:
    text = EXAMPLE.read_text()
    sections = {"daemon": C.DaemonSection, "srs": C.SrsSection, "memory": C.MemorySection,
                "synthesis": C.SynthesisSection, "pipeline": C.PipelineSection,
                "gpus": C.GpusSection, "logging": C.LoggingSection, "fleet": C.FleetSection}
    for name, struct in sections.items():
        assert f"[{name}]" in text
        for field in struct.__struct_fields__:
            assert re.search(rf"^#? ?{field} = ", text, re.M), f"{name}.{field} undocumented"
    for field in C.CircuitSection.__struct_fields__:
        assert re.search(rf"^#? ?{field} = ", text, re.M), f"circuits.ID.{field} undocumented"


def test_example_defaults_equal_the_code_defaults() -> None:
    raw = tomllib.loads(EXAMPLE.read_text())
    raw.pop("circuits")
    assert msgspec.convert(raw, C.RawConfig) == C.RawConfig()


@pytest.mark.parametrize("raw, key", [
    ({"daemon": {"listne": "x"}}, "daemon.listne"),
    ({"gpus": {"device": [0]}}, "gpus.device"),
    ({"bogus": {}}, "bogus"),
    ({"circuits": {"c1": {"synthetic": "porep-like", "log_n": 10, "partition": 2}}},
     "circuits.c1.partition"),
])
def test_unknown_key_is_an_error_naming_it(raw: dict, key: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"unknown key `{key}`")):
        resolve(raw, tmp_path)


def test_unknown_key_in_a_file_names_the_file_and_key(tmp_path: Path) -> None:
    p = write(tmp_path, '[synthesis]\npartition_workers = 2\nthreadz = 4\n')
    with pytest.raises(ConfigError) as ei:
        C.load_config(p)
    assert str(p) in str(ei.value) and "synthesis.threadz" in str(ei.value)


@pytest.mark.parametrize("text, value", [
    ("64GiB", 64 * 2**30), ("512MiB", 512 * 2**20), ("1.5GB", 1_500_000_000),
    ("4096", 4096), (4096, 4096), ("2 TiB", 2 * 2**40), ("10kb", 10_000),
])
def test_sizes(text: object, value: int) -> None:
    assert C.parse_size(text, "k") == value


@pytest.mark.parametrize("bad", ["64 parsecs", "GiB", "-5GiB", "1e9", True, -1, "auto", [1]])
def test_bad_sizes_name_the_key(bad: object) -> None:
    with pytest.raises(ConfigError, match="memory.safety_margin"):
        C.parse_size(bad, "memory.safety_margin")


def test_auto_only_where_allowed() -> None:
    assert C.parse_size("auto", "k", allow_auto=True) is None


@pytest.mark.parametrize("text, seconds", [
    ("30s", 30.0), ("5m", 300.0), ("1h", 3600.0), ("250ms", 0.25), (12, 12.0), ("2d", 172800.0),
])
def test_durations(text: object, seconds: float) -> None:
    assert C.parse_duration(text, "k") == seconds


@pytest.mark.parametrize("bad", ["soon", "5 minutes", -1, "1y"])
def test_bad_durations_name_the_key(bad: object) -> None:
    with pytest.raises(ConfigError, match="daemon.result_ttl"):
        C.parse_duration(bad, "daemon.result_ttl")


def test_bad_size_in_config_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="memory.total_budget"):
        C.resolve({"memory": {"total_budget": "lots"}}, base=tmp_path)
    with pytest.raises(ConfigError, match="daemon.max_frame_bytes"):
        resolve({"daemon": {"max_frame_bytes": "12 bananas"}}, tmp_path)


def test_wrong_type_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="synthesis.partition_workers"):
        resolve({"synthesis": {"partition_workers": "two"}}, tmp_path)
    with pytest.raises(ConfigError, match="gpus.backend"):
        resolve({"gpus": {"backend": "tpu"}}, tmp_path)
    with pytest.raises(ConfigError, match="logging.format"):
        resolve({"logging": {"format": "xml"}}, tmp_path)


@pytest.mark.parametrize("raw, key", [
    ({"circuits": {"c": {"synthetic": "porep-like", "log_n": 10, "zkey": "a.zkey"}}},
     "circuits.c"),
    ({"circuits": {"c": {"synthetic": "porep-like"}}}, "circuits.c.log_n"),
    ({"circuits": {"c": {"synthetic": "porep-like", "log_n": 40}}}, "circuits.c.log_n"),
    ({"circuits": {"c": {"synthetic": "porep-like", "log_n": 8}}}, "circuits.c.log_n"),
    ({"circuits": {"c": {"r1cs": "x.r1cs"}}}, "circuits.c.zkey"),
    ({"circuits": {"c": {"zkey": "missing.zkey", "r1cs": "x.r1cs"}}}, "circuits.c.zkey"),
    ({"circuits": {"c": {"synthetic": "porep-like", "log_n": 10, "partitions": 0}}},
     "circuits.c.partitions"),
    ({"circuits": {"bad id!": {"synthetic": "porep-like", "log_n": 10}}}, "circuits.bad id!"),
    ({"srs": {"preload": ["nope"]}}, "srs.preload"),
    ({"daemon": {"listen": "127.0.0.1:9820", "status_listen": "127.0.0.1:9820"}},
     "daemon.status_listen"),
    ({"daemon": {"listen": "unix://relative.sock"}}, "daemon"),
    ({"daemon": {"listen": "localhost:99999"}}, "daemon"),
    ({"daemon": {"socket_mode": "rw"}}, "daemon.socket_mode"),
    ({"daemon": {"max_frame_bytes": 10}}, "daemon.max_frame_bytes"),
    ({"gpus": {"devices": [0, 0]}}, "gpus.devices"),
    ({"synthesis": {"partition_workers": 0}}, "synthesis.partition_workers"),
    ({"pipeline": {"ring_slots": 0}}, "pipeline.ring_slots"),
    ({"pipeline": {"shm_prefix": "bad/prefix"}}, "pipeline.shm_prefix"),
    ({"memory": {"total_budget": "1GiB", "safety_margin": "2GiB"}}, "memory.total_budget"),
])
def test_impossible_combinations_name_the_key(raw: dict, key: str, tmp_path: Path) -> None:
    (tmp_path / "x.r1cs").write_bytes(b"r1cs")
    with pytest.raises(ConfigError, match=re.escape(key)):
        resolve(raw, tmp_path)


def test_circom_paths_are_relative_to_the_file(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    for name in ("c.zkey", "c.r1cs", "c.wasm"):
        (keys / name).write_bytes(b"x")
    p = write(tmp_path, '[memory]\ntotal_budget = "64GiB"\n[circuits.c]\nzkey = "keys/c.zkey"\n'
                        'r1cs = "keys/c.r1cs"\nwasm = "keys/c.wasm"\npriority = "HIGH"\n'
                        'partitions = 3\n')
    from cuzk_mp.daemon import budget
    from cuzk_mp.pipeline.memory import estimated_circuit_size
    budget_calls: list[object] = []
    # the files are placeholders, not zkeys: size the ring without reading them
    monkeypatch.setattr(budget, "circuit_size",
                        lambda cc, backend="cpu": budget_calls.append(cc) or estimated_circuit_size(1 << 10, 1 << 10))
    cfg = C.load_config(p)
    spec = cfg.circuits["c"].spec
    assert spec.zkey == keys / "c.zkey" and spec.r1cs == keys / "c.r1cs"
    assert spec.wasm == keys / "c.wasm" and spec.partitions == 3 and spec.synthetic is None
    assert cfg.circuits["c"].priority.name == "HIGH" and len(budget_calls) == 1


def test_values_map_onto_engine_config(tmp_path: Path) -> None:
    cfg = resolve({
        "daemon": {"listen": "unix:///tmp/x/cuzk.sock", "socket_mode": "0660",
                   "status_listen": "[::1]:9821", "journal": "j/journal.db",
                   "result_ttl": "10m", "shutdown_grace": 5},
        "srs": {"param_cache": "cache"},
        "synthesis": {"partition_workers": 3, "threads": 2},
        "pipeline": {"ring_slots": 6, "shm_prefix": "cuzk-test", "verify_proofs": False,
                     "max_attempts": 3, "start_timeout": "1m"},
        "gpus": {"backend": "cpu", "devices": [0, 1], "gpu_workers_per_device": 1},
        "logging": {"level": "debug", "format": "json"},
    }, tmp_path)
    assert cfg.listen == Address("unix", path="/tmp/x/cuzk.sock") and cfg.socket_mode == 0o660
    assert cfg.status_listen == Address("tcp", host="::1", port=9821)
    assert cfg.journal_path == tmp_path / "j" / "journal.db"
    assert (cfg.result_ttl_s, cfg.shutdown_grace_s) == (600.0, 5.0)
    e = cfg.engine
    assert (e.backend, e.devices, e.gpu_workers_per_device) == ("cpu", [0, 1], 1)
    assert (e.partition_workers, e.synthesis_threads, e.ring_slots) == (3, 2, 6)
    assert (e.shm_prefix, e.verify_proofs, e.max_attempts, e.start_timeout_s) == (
        "cuzk-test", False, 3, 60.0)
    assert e.param_cache == tmp_path / "cache"
    assert (cfg.log_level, cfg.log_format) == ("debug", "json")
    e.validate()


def test_memory_budget_is_what_is_left(tmp_path: Path) -> None:
    from cuzk_mp.circuits.synthetic_kinds import synthetic_circuit
    from cuzk_mp.pipeline.memory import PROCESS_BASE_BYTES, SYNTH_SCRATCH_BYTES, WorkingSets, model_working_sets
    from cuzk_mp.pipeline.memory import CircuitSize, ENGINE_ALLOWANCE_BYTES
    from cuzk_mp.pipeline.ring import partition_segment_bytes

    def pipeline(log_n: int, kind: str, slots: int, workers: int, provers: int) -> int:
        """The model's pipeline share: the engine, the ring, the workers, the provers (keys excluded)."""
        n_vars = synthetic_circuit(kind, log_n).n_wires
        ws: WorkingSets = model_working_sets(CircuitSize(1 << log_n, n_vars, 0, 0), "cpu", 2)
        assert ws.synth == SYNTH_SCRATCH_BYTES  # a worker's scratch: never a partition's vectors
        return ENGINE_ALLOWANCE_BYTES + slots * partition_segment_bytes(1 << log_n, n_vars) + workers * ws.synth \
            + provers * ws.prover

    cfg = resolve({"memory": {"total_budget": "16GiB", "safety_margin": "1GiB"},
                   "synthesis": {"partition_workers": 2}, "pipeline": {"ring_slots": 3},
                   "gpus": {"backend": "cpu", "devices": [0]},
                   "circuits": {"a": {"synthetic": "porep-like", "log_n": 12},
                                "b": {"synthetic": "porep-like", "log_n": 16}}}, tmp_path)
    # the largest circuit's segment sizes the ring
    expect = 16 * 2**30 - 2**30 - 4 * PROCESS_BASE_BYTES - pipeline(16, "porep-like", 3, 2, 1)
    assert cfg.engine.srs_budget_bytes == expect
    two = resolve({"memory": {"total_budget": "16GiB", "safety_margin": "1GiB"},
                   "synthesis": {"partition_workers": 2}, "pipeline": {"ring_slots": 3},
                   "gpus": {"backend": "cpu", "devices": [0, 1]},
                   "circuits": {"b": {"synthetic": "porep-like", "log_n": 16}}}, tmp_path)
    srs_total = 16 * 2**30 - 2**30 - 5 * PROCESS_BASE_BYTES - pipeline(16, "porep-like", 3, 2, 2)
    assert two.engine.srs_budget_bytes == srs_total // 2  # each prover keeps its own keys
    dense = resolve({"memory": {"total_budget": "16GiB", "safety_margin": "1GiB"},
                     "synthesis": {"partition_workers": 2}, "pipeline": {"ring_slots": 3},
                     "gpus": {"backend": "cpu", "devices": [0]},
                     "circuits": {"d": {"synthetic": "dense-random", "log_n": 16}}}, tmp_path)
    assert dense.circuits["d"].spec.synthetic == "dense-random"
    dense_n = synthetic_circuit("dense-random", 16).n_wires
    assert partition_segment_bytes(1 << 16, dense_n) > partition_segment_bytes(1 << 16, 1 << 16)  # 2L chain inputs
    assert dense.engine.srs_budget_bytes == 16 * 2**30 - 2**30 - 4 * PROCESS_BASE_BYTES - pipeline(
        16, "dense-random", 3, 2, 1)


def test_host_budget_derives_what_the_file_leaves_out(tmp_path: Path) -> None:
    from cuzk_mp.pipeline.memory import GiB
    circuits = {"big": {"synthetic": "porep-like", "log_n": 20}}
    roomy = resolve({"memory": {"total_budget": "64GiB", "host_budget": "32GiB"}, "gpus": {"devices": [0]},
                     "circuits": circuits}, tmp_path)
    e = roomy.engine  # the GPU model (backend auto): the cores the prover leaves, a slot per worker + 3
    from cuzk_mp.pipeline.memory import MIN_RING_SLOTS, READY_PER_PROVER, synthesis_cores
    spare = synthesis_cores(os.cpu_count() or 1, "gpu", 1)
    assert 1 <= e.partition_workers <= spare
    assert e.ring_slots == max(MIN_RING_SLOTS, e.partition_workers + 1 + READY_PER_PROVER)
    assert e.synthesis_threads == max(1, spare // e.partition_workers)
    assert roomy.host_budget_bytes == 32 * GiB
    kept = resolve({"memory": {"total_budget": "64GiB", "host_budget": "32GiB"}, "gpus": {"devices": [0]},
                    "pipeline": {"ring_slots": 5}, "synthesis": {"threads_per_partition": 3},
                    "circuits": circuits}, tmp_path)
    assert (kept.engine.ring_slots, kept.engine.synthesis_threads) == (5, 3)  # given values are kept
    with pytest.raises(ConfigError, match="memory.host_budget"):
        resolve({"memory": {"total_budget": "64GiB", "host_budget": "512MiB"}, "circuits": circuits}, tmp_path)
    with pytest.raises(ConfigError, match="synthesis.threads"):
        resolve({"synthesis": {"threads": 2, "threads_per_partition": 4}}, tmp_path)
    auto = resolve({"memory": {"total_budget": "20GiB", "safety_margin": "4GiB"}}, tmp_path)
    assert auto.host_budget_bytes == 16 * GiB  # "auto": what the total leaves after the margin


@pytest.mark.parametrize("text, addr", [
    ("unix:///run/cuzk.sock", Address("unix", path="/run/cuzk.sock")),
    ("127.0.0.1:9820", Address("tcp", host="127.0.0.1", port=9820)),
    ("tcp://localhost:1", Address("tcp", host="localhost", port=1)),
    ("[::1]:9820", Address("tcp", host="::1", port=9820)),
])
def test_addresses(text: str, addr: Address) -> None:
    assert parse_address(text) == addr
    assert parse_address(str(addr)) == addr


@pytest.mark.parametrize("bad", ["9820", "host:", ":9820", "host:0", "host:http", "unix://x"])
def test_bad_addresses(bad: str) -> None:
    with pytest.raises(ConfigError):
        parse_address(bad)


def test_not_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        C.load_config(write(tmp_path, "[daemon\nlisten = 1"))
    with pytest.raises(ConfigError, match="not found"):
        C.load_config(tmp_path / "nope.toml")


TOKEN = "t0ken-for-tests-0001"


@pytest.mark.parametrize("daemon, key", [
    ({"listen": "0.0.0.0:9820"}, "daemon.listen = '0.0.0.0:9820' is reachable from other hosts"),
    ({"listen": "[::]:9820"}, "daemon.listen"),
    ({"listen": "example.org:9820"}, "daemon.listen"),
    ({"status_listen": "192.168.1.5:9821"}, "daemon.status_listen"),
    ({"tokens": ["short"]}, "daemon.tokens[0]: a token is 16-256"),
    ({"tokens": ["has a space in it!!!"]}, "daemon.tokens[0]"),
    ({"admin_tokens": [TOKEN], "tokens": [TOKEN]}, "distinct"),
    ({"tokens": [TOKEN, TOKEN]}, "distinct"),
    ({"max_connections": 0}, "daemon.max_connections"),
    ({"frame_timeout": 0}, "daemon.frame_timeout"),
    ({"frame_timeout": "forever"}, "daemon.frame_timeout"),
])
def test_access_settings_are_checked(daemon: dict, key: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape(key)) as info:
        resolve({"daemon": daemon}, tmp_path)
    assert TOKEN not in str(info.value) or "distinct" in key  # a secret is never echoed


def test_non_loopback_listeners_need_tokens(tmp_path: Path) -> None:
    for listen in ("127.0.0.1:9820", "127.5.0.1:9820", "[::1]:9820", "localhost:9820",
                   "unix:///tmp/x.sock"):
        assert resolve({"daemon": {"listen": listen}}, tmp_path).tokens == ()
    cfg = resolve({"daemon": {"listen": "0.0.0.0:9820", "tokens": [TOKEN],
                              "admin_tokens": ["admin-token-0000001"], "frame_timeout": "5s",
                              "max_connections": 3}}, tmp_path)
    assert cfg.tokens == (TOKEN,) and cfg.admin_tokens == ("admin-token-0000001",)
    assert (cfg.frame_timeout_s, cfg.max_connections) == (5.0, 3)


def test_default_shm_prefix_is_stable_per_journal(tmp_path: Path) -> None:
    a = resolve({"daemon": {"journal": "a/journal.sqlite"}}, tmp_path)
    again = resolve({"daemon": {"journal": str(tmp_path / "a" / "journal.sqlite")}}, tmp_path)
    b = resolve({"daemon": {"journal": "b/journal.sqlite"}}, tmp_path)
    assert a.engine.shm_prefix == again.engine.shm_prefix != b.engine.shm_prefix
    assert re.fullmatch(r"cuzk-[0-9a-f]{12}", a.engine.shm_prefix or "")
    (tmp_path / "link").symlink_to(tmp_path / "a")
    via_link = resolve({"daemon": {"journal": "link/journal.sqlite"}}, tmp_path)
    assert via_link.engine.shm_prefix == a.engine.shm_prefix  # one journal, one prefix
    fixed = resolve({"pipeline": {"shm_prefix": "cuzk-fixed"}}, tmp_path)
    assert fixed.engine.shm_prefix == "cuzk-fixed"


def test_check_warns_about_weak_access(tmp_path: Path) -> None:
    from cuzk_mp.daemon.access import config_warnings

    quiet = resolve({"daemon": {"listen": f"unix://{tmp_path}/d.sock"}}, tmp_path)
    assert config_warnings(quiet) == []
    loud = resolve({"daemon": {"listen": f"unix://{tmp_path}/d.sock", "socket_mode": "0777"}}, tmp_path)
    [w] = config_warnings(loud)
    assert "0777" in w and "world-writable" in w and "every job" in w
    remote = resolve({"daemon": {"listen": "0.0.0.0:9820", "tokens": [TOKEN]}}, tmp_path)
    [w] = config_warnings(remote)
    assert "clear text" in w
    p = write(tmp_path, f'[daemon]\ntokens = ["{TOKEN}"]\n[memory]\ntotal_budget = "64GiB"\n')
    p.chmod(0o644)
    assert any("every user can read it" in w for w in config_warnings(C.load_config(p)))
    p.chmod(0o600)
    assert config_warnings(C.load_config(p)) == []


def test_a_short_shutdown_grace_is_warned_about(tmp_path: Path) -> None:
    """A grace that leaves in-flight partitions little or no time after the engine's stop reserve
    says so (at --check and at the start); 30 s (the default) does not."""
    short = resolve({"daemon": {"shutdown_grace": "2s"}}, tmp_path)
    assert short.shutdown_grace_s == 2
    assert [w for w in short.warnings if "daemon.shutdown_grace = 2 s: 6 s of it is kept" in w
            and "has 0 s to finish" in w]
    ten = resolve({"daemon": {"shutdown_grace": "10s"}}, tmp_path)
    assert [w for w in ten.warnings if "has 4 s to finish" in w]
    assert not [w for w in resolve({}, tmp_path).warnings if "shutdown_grace" in w]


def test_places_the_daemon_writes_are_checked_up_front(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The journal's folder and the param cache: a path under a regular file, or a folder this
    process may not write (a read-only mount), is a ConfigError naming the key (exit 2, at
    --check too); folders still to be made are judged by their nearest existing parent."""
    from cuzk_mp.daemon.cli import check_writable_places

    fine = resolve({"daemon": {"journal": str(tmp_path / "state" / "new" / "j.sqlite")},
                    "srs": {"param_cache": str(tmp_path / "cache")}}, tmp_path)
    check_writable_places(fine)
    (tmp_path / "afile").write_text("")
    under_a_file = resolve({"daemon": {"journal": str(tmp_path / "afile" / "j.sqlite")}}, tmp_path)
    with pytest.raises(ConfigError, match=r"daemon\.journal: .*afile is not a folder"):
        check_writable_places(under_a_file)
    read_only = tmp_path / "ro"
    read_only.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == read_only else real_access(p, mode))
    cache_ro = resolve({"daemon": {"journal": str(tmp_path / "j.sqlite")},
                        "srs": {"param_cache": str(read_only / "cache")}}, tmp_path)
    with pytest.raises(ConfigError, match=r"srs\.param_cache: .*ro/cache cannot be written: .*ro is not writable"):
        check_writable_places(cache_ro)
