"""The daemon's TOML config: every key decoded, every mistake named, mapped onto the engine."""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from pathlib import Path

import msgspec
import pytest

from cuzk_mp.daemon import config as C
from cuzk_mp.daemon import config_file
from cuzk_mp.daemon.fleet.config import FleetSection
from cuzk_mp.daemon.transport import Address, parse_address
from cuzk_mp.errors import ConfigError
from tests.helpers import small_circom_key

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
    # the pipeline's shape is left to memory.host_budget, as in a file that gives nothing
    bare = C.resolve({"srs": {"param_cache": str(tmp_path)}, "circuits": tomllib.loads(text)["circuits"]},
                     base=tmp_path)
    assert (e.partition_workers, e.synthesis_threads, e.ring_slots) == (
        bare.engine.partition_workers, bare.engine.synthesis_threads, bare.engine.ring_slots)
    assert (e.verify_proofs, e.max_attempts, e.start_timeout_s) == (True, 2, 300.0)
    assert e.param_cache == tmp_path and e.shm_prefix == C.default_shm_prefix(tmp_path / "journal.sqlite")
    assert (cfg.frame_timeout_s, cfg.max_connections, cfg.tokens, cfg.admin_tokens) == (60.0, 256, (), ())
    assert e.srs_budget_bytes is not None and e.srs_budget_bytes > 0
    spec = cfg.circuits["porep-like-10"].spec
    assert (spec.synthetic, spec.log_n, spec.partitions) == ("porep-like", 10, 1)
    assert cfg.circuits["porep-like-10"].priority.name == "NORMAL"


def test_every_key_is_documented_in_the_example() -> None:
    text = EXAMPLE.read_text()
    sections = {"daemon": config_file.DaemonSection, "srs": config_file.SrsSection,
                "memory": config_file.MemorySection, "synthesis": config_file.SynthesisSection,
                "pipeline": config_file.PipelineSection, "gpus": config_file.GpusSection,
                "logging": config_file.LoggingSection, "fleet": FleetSection}
    for name, struct in sections.items():
        assert f"[{name}]" in text
        for field in struct.__struct_fields__:
            assert re.search(rf"^#? ?{field} = ", text, re.M), f"{name}.{field} undocumented"
    for field in config_file.CircuitSection.__struct_fields__:
        assert re.search(rf"^#? ?{field} = ", text, re.M), f"circuits.ID.{field} undocumented"


def test_example_defaults_equal_the_code_defaults() -> None:
    raw = tomllib.loads(EXAMPLE.read_text())
    raw.pop("circuits")
    assert msgspec.convert(raw, config_file.RawConfig) == config_file.RawConfig()


def test_the_example_configures_what_an_empty_file_does(tmp_path: Path) -> None:
    """Installed as it is, the example pins nothing: it resolves to the config of a file that gives only
    its circuits (the pipeline's shape derived from memory.host_budget, as in an empty file)."""
    text = EXAMPLE.read_text()
    example = tmp_path / "example.toml"
    example.write_text(text)
    bare = tmp_path / "bare.toml"
    bare.write_text(text[text.index("\n[circuits."):])  # the example circuit only
    assert "partition_workers" not in bare.read_text() and "ring_slots" not in bare.read_text()
    assert C.load_config(example) == dataclasses.replace(C.load_config(bare), path=example.resolve())


def test_the_examples_commented_out_values_are_valid(tmp_path: Path) -> None:
    """Each ``# key = value`` line of the example (a key with no fixed default, shown with an example
    value) resolves once uncommented."""
    text = EXAMPLE.read_text()
    head, circuits = text[:text.index("\n[circuits.")], text[text.index("\n[circuits."):]
    lines = re.findall(r"^# (\w+ = .+)$", head, re.M)
    assert {line.split(" = ")[0] for line in lines} >= {"partition_workers", "ring_slots", "devices"}
    cfg = C.load_config(write(tmp_path, re.sub(r"^# (\w+ = .+)$", r"\1", head, flags=re.M) + circuits))
    assert (cfg.engine.partition_workers, cfg.engine.ring_slots, cfg.engine.devices) == (2, 4, [0, 1])


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
    assert config_file.parse_duration(text, "k") == seconds


@pytest.mark.parametrize("bad", ["soon", "5 minutes", -1, "1y"])
def test_bad_durations_name_the_key(bad: object) -> None:
    with pytest.raises(ConfigError, match="daemon.result_ttl"):
        config_file.parse_duration(bad, "daemon.result_ttl")


def test_bad_size_in_config_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="memory.total_budget"):
        C.resolve({"memory": {"total_budget": "lots"}}, base=tmp_path)
    with pytest.raises(ConfigError, match="daemon.max_frame_bytes"):
        resolve({"daemon": {"max_frame_bytes": "12 bananas"}}, tmp_path)


def test_wrong_type_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape("`synthesis.partition_workers`: Expected `int`, got `str`")):
        resolve({"synthesis": {"partition_workers": "two"}}, tmp_path)  # a key left out is None: no null in TOML
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
    small_circom_key(keys)
    (keys / "c.wasm").write_bytes(b"x")  # read by the first witness, not by the config
    p = write(tmp_path, '[memory]\ntotal_budget = "64GiB"\n[circuits.c]\nzkey = "keys/c.zkey"\n'
                        'r1cs = "keys/c.r1cs"\nwasm = "keys/c.wasm"\npriority = "HIGH"\n'
                        'partitions = 3\n')
    from cuzk_mp.daemon import budget
    from cuzk_mp.pipeline.memory import estimated_circuit_size
    budget_calls: list[object] = []
    # size the ring without reading the key's sections
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
    from cuzk_mp.pipeline.segment import partition_segment_bytes

    def pipeline(log_n: int, kind: str, slots: int, workers: int, provers: int) -> int:
        """The model's pipeline share: the engine, the ring, the workers, the provers (keys excluded)."""
        n_vars = synthetic_circuit(kind, log_n).n_wires
        # prover_batch 8, at most the ring's slots
        ws: WorkingSets = model_working_sets(CircuitSize(1 << log_n, n_vars, 0, 0), "cpu", 2, 8, slots)
        assert ws.synth == SYNTH_SCRATCH_BYTES  # a worker's scratch: never a partition's vectors
        return ENGINE_ALLOWANCE_BYTES + slots * partition_segment_bytes(1 << log_n, n_vars) + workers * ws.synth \
            + provers * ws.prover

    cfg = resolve({"memory": {"total_budget": "16GiB", "safety_margin": "1GiB"},
                   "synthesis": {"partition_workers": 2}, "pipeline": {"ring_slots": 3},
                   "gpus": {"backend": "cpu", "devices": [0]},
                   "circuits": {"a": {"synthetic": "porep-like", "log_n": 12},
                                "b": {"synthetic": "porep-like", "log_n": 16}}}, tmp_path)
    # the largest circuit's segment sizes the ring; the queued jobs' inputs take their share first: daemon.
    # max_queued_input (2 GiB by default, more than a 128 MiB frame, less than 10000 of them)
    queue = 2 * 2**30
    assert cfg.queue_bytes == queue
    expect = 16 * 2**30 - 2**30 - queue - 4 * PROCESS_BASE_BYTES - pipeline(16, "porep-like", 3, 2, 1)
    assert cfg.engine.srs_budget_bytes == expect
    two = resolve({"memory": {"total_budget": "16GiB", "safety_margin": "1GiB"},
                   "synthesis": {"partition_workers": 2}, "pipeline": {"ring_slots": 3},
                   "gpus": {"backend": "cpu", "devices": [0, 1]},
                   "circuits": {"b": {"synthetic": "porep-like", "log_n": 16}}}, tmp_path)
    srs_total = 16 * 2**30 - 2**30 - queue - 5 * PROCESS_BASE_BYTES - pipeline(16, "porep-like", 3, 2, 2)
    assert two.engine.srs_budget_bytes == srs_total // 2  # each prover keeps its own keys
    dense = resolve({"memory": {"total_budget": "16GiB", "safety_margin": "1GiB"},
                     "synthesis": {"partition_workers": 2}, "pipeline": {"ring_slots": 3},
                     "gpus": {"backend": "cpu", "devices": [0]},
                     "circuits": {"d": {"synthetic": "dense-random", "log_n": 16}}}, tmp_path)
    assert dense.circuits["d"].spec.synthetic == "dense-random"
    dense_n = synthetic_circuit("dense-random", 16).n_wires
    assert partition_segment_bytes(1 << 16, dense_n) > partition_segment_bytes(1 << 16, 1 << 16)  # 2L chain inputs
    assert dense.engine.srs_budget_bytes == 16 * 2**30 - 2**30 - queue - 4 * PROCESS_BASE_BYTES - pipeline(
        16, "dense-random", 3, 2, 1)


def test_host_budget_derives_what_the_file_leaves_out(tmp_path: Path) -> None:
    from cuzk_mp.pipeline.memory import GiB
    circuits = {"big": {"synthetic": "porep-like", "log_n": 20}}
    roomy = resolve({"memory": {"total_budget": "64GiB", "host_budget": "32GiB"},
                     "gpus": {"devices": [0], "backend": "gpu"}, "circuits": circuits}, tmp_path)
    e = roomy.engine  # the GPU model: the cores the prover leaves, a slot per worker + 3
    from cuzk_mp.pipeline.memory import MIN_RING_SLOTS, READY_PER_PROVER, synthesis_cores
    spare = synthesis_cores(os.cpu_count() or 1, "gpu", 1)
    assert 1 <= e.partition_workers <= spare
    assert e.ring_slots == max(MIN_RING_SLOTS, e.partition_workers + 1 + READY_PER_PROVER)
    assert e.synthesis_threads == max(1, spare // e.partition_workers)
    assert roomy.host_budget_bytes == 32 * GiB
    kept = resolve({"memory": {"total_budget": "64GiB", "host_budget": "32GiB"},
                    "gpus": {"devices": [0], "backend": "gpu"},
                    "pipeline": {"ring_slots": 5}, "synthesis": {"threads_per_partition": 3},
                    "circuits": circuits}, tmp_path)
    assert (kept.engine.ring_slots, kept.engine.synthesis_threads) == (5, 3)  # given values are kept
    with pytest.raises(ConfigError, match="memory.host_budget"):
        resolve({"memory": {"total_budget": "64GiB", "host_budget": "512MiB"}, "circuits": circuits}, tmp_path)
    with pytest.raises(ConfigError, match="synthesis.threads"):
        resolve({"synthesis": {"threads": 2, "threads_per_partition": 4}}, tmp_path)
    auto = resolve({"memory": {"total_budget": "20GiB", "safety_margin": "4GiB"}}, tmp_path)
    # "auto": what the total leaves after the margin and the queued jobs' inputs (daemon.max_queued_input)
    assert auto.host_budget_bytes == 14 * GiB


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



@pytest.mark.parametrize("key", ["listen", "status_listen"])
def test_a_bad_address_names_its_key(key: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=rf"^t\.toml: daemon\.{key}: 'unix:/run/x\.sock': expected unix:///path"):
        resolve({"daemon": {key: "unix:/run/x.sock"}}, tmp_path)

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


def test_the_client_priority_cap_is_checked_warned_about_and_shown(tmp_path: Path) -> None:
    """``daemon.max_client_priority``: a priority name (anything else names the key and the values);
    with client tokens, the default (no cap) is warned about; a cap without client tokens caps
    nothing and says so; ``--check``'s summary shows it, and never a token."""
    from cuzk_mp.daemon.access import config_warnings
    from cuzk_mp.daemon.cli import check_summary
    from cuzk_mp.pipeline.types import Priority

    with pytest.raises(ConfigError, match=r"`daemon.max_client_priority`: Invalid enum value 'URGENT' "
                                          r"\(one of: 'CRITICAL', 'HIGH', 'LOW', 'NORMAL'\)"):
        resolve({"daemon": {"max_client_priority": "URGENT"}}, tmp_path)
    assert resolve({}, tmp_path).max_client_priority is Priority.CRITICAL
    capped = resolve({"daemon": {"tokens": [TOKEN], "max_client_priority": "NORMAL"}}, tmp_path)
    assert capped.max_client_priority is Priority.NORMAL
    assert not [w for w in config_warnings(capped) if "max_client_priority" in w]
    assert "a client's job asks at most priority NORMAL (daemon.max_client_priority)" in check_summary(capped)
    assert TOKEN not in check_summary(capped)
    uncapped = resolve({"daemon": {"tokens": [TOKEN]}}, tmp_path)
    [warning] = [w for w in config_warnings(uncapped) if "max_client_priority" in w]
    assert 'daemon.max_client_priority = "CRITICAL" (the default): every client token may submit jobs at ' \
           "priority CRITICAL" in warning
    admins_only = resolve({"daemon": {"admin_tokens": [TOKEN]}}, tmp_path)  # no client to cap
    assert not [w for w in config_warnings(admins_only) if "max_client_priority" in w]
    for daemon in ({"max_client_priority": "LOW"}, {"admin_tokens": [TOKEN], "max_client_priority": "HIGH"}):
        [warning] = [w for w in config_warnings(resolve({"daemon": daemon}, tmp_path)) if "max_client_priority" in w]
        assert "without daemon.tokens: it caps nothing" in warning
    assert "no tokens (every caller is an administrator" in check_summary(resolve({}, tmp_path))


@pytest.mark.parametrize("daemon, message", [
    ({"max_queued_jobs": 0}, "t.toml: daemon.max_queued_jobs: must be >= 1, got 0"),
    ({"max_queued_jobs": -5}, "t.toml: daemon.max_queued_jobs: must be >= 1, got -5"),
    ({"max_jobs_per_owner": -1}, "t.toml: daemon.max_jobs_per_owner: must be >= 0 (0: no cap), got -1"),
    ({"max_queued_input": "lots"}, "t.toml: daemon.max_queued_input: cannot parse size 'lots'"),
    ({"max_queued_input": -1}, "t.toml: daemon.max_queued_input: a size cannot be negative (-1)"),
    ({"max_queued_jobs": "many"}, "`daemon.max_queued_jobs`: Expected `int`"),
])
def test_queue_caps_are_checked(daemon: dict, message: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        resolve({"daemon": daemon}, tmp_path)


def test_queue_caps_and_the_queue_share_of_memory(tmp_path: Path) -> None:
    """The caps on unfinished jobs, and the memory they let the jobs' inputs hold: the budget's queue term
    (the byte cap, or one frame where that is more, or max_queued_jobs frames where that is less)."""
    from cuzk_mp.daemon.budget import queue_bound
    from cuzk_mp.pipeline.memory import GiB, MiB

    cfg = resolve({}, tmp_path)
    assert (cfg.max_queued_jobs, cfg.max_queued_input_bytes, cfg.max_jobs_per_owner) == (10000, 2 * GiB, 0)
    assert cfg.queue_bytes == 2 * GiB
    given = resolve({"daemon": {"max_queued_jobs": 50, "max_queued_input": "512MiB", "max_jobs_per_owner": 4,
                                "tokens": [TOKEN]}}, tmp_path)
    assert (given.max_queued_jobs, given.max_queued_input_bytes, given.max_jobs_per_owner) == (50, 512 * MiB, 4)
    assert queue_bound(512 * MiB, 50, 128 * MiB) == 512 * MiB
    assert queue_bound(64 * MiB, 50, 128 * MiB) == 128 * MiB  # a lone job may fill a frame, whatever the cap
    assert queue_bound(2 * GiB, 4, 128 * MiB) == 512 * MiB  # four jobs of a frame each hold no more
    assert queue_bound(0, 8, 128 * MiB) == GiB  # no byte cap: the jobs cap bounds the bytes
    srs = {cap: resolve({"daemon": {"max_queued_input": cap}, "gpus": {"backend": "cpu"}}, tmp_path).engine
           .srs_budget_bytes for cap in ("1GiB", "3GiB")}
    assert srs["1GiB"] - srs["3GiB"] == 2 * GiB  # every byte the queue may hold is a byte the keys may not
    with pytest.raises(ConfigError, match=r"memory\.total_budget: 64\.00 GiB does not cover memory\.safety_margin "
                                          r"\(4\.00 GiB\) and the queued jobs' inputs \(1250\.00 GiB: "
                                          r"daemon\.max_queued_input"):
        resolve({"daemon": {"max_queued_input": 0}}, tmp_path)  # 10000 frames of 128 MiB
    assert resolve({"daemon": {"max_queued_input": 0, "max_queued_jobs": 8}}, tmp_path).queue_bytes == GiB


def test_a_per_owner_cap_without_tokens_is_warned_about(tmp_path: Path) -> None:
    plain = resolve({"daemon": {"max_jobs_per_owner": 3}}, tmp_path)
    assert any("daemon.max_jobs_per_owner = 3 without tokens: every client is one owner" in w
               for w in plain.warnings), plain.warnings
    tenants = resolve({"daemon": {"max_jobs_per_owner": 3, "tokens": [TOKEN]}}, tmp_path)
    assert not any("max_jobs_per_owner" in w for w in tenants.warnings)



def test_fleet_keys_without_a_dsn_are_warned_about(tmp_path: Path) -> None:
    """A [fleet] that names its box and inputs but no dsn (left out, or kept elsewhere) runs alone: said."""
    alone = resolve({"fleet": {"box": "gpu-1", "inputs_dir": str(tmp_path)}}, tmp_path)
    assert alone.fleet is None
    assert any("fleet.box, fleet.inputs_dir given without fleet.dsn: this daemon runs alone" in w
               for w in alone.warnings), alone.warnings
    assert not any("fleet." in w for w in resolve({"fleet": {"dsn": ""}}, tmp_path).warnings)

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
    remote = resolve({"daemon": {"listen": "0.0.0.0:9820", "tokens": [TOKEN], "max_client_priority": "NORMAL"}},
                     tmp_path)
    [w] = config_warnings(remote)
    assert "clear text" in w
    p = write(tmp_path, f'[daemon]\ntokens = ["{TOKEN}"]\nmax_client_priority = "HIGH"\n'
                        '[memory]\ntotal_budget = "64GiB"\n')
    p.chmod(0o644)
    assert any("every user can read it" in w for w in config_warnings(C.load_config(p)))
    p.chmod(0o600)
    assert config_warnings(C.load_config(p)) == []
    [w] = config_warnings(resolve({}, tmp_path))  # the default: loopback TCP, no tokens
    assert "without tokens: every local user" in w and "127.0.0.1:9820" in w


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
    default_journal = resolve({"srs": {"param_cache": str(read_only / "cache")}}, tmp_path)  # the journal in it
    with pytest.raises(ConfigError, match=r"srs\.param_cache: "):  # named as the key that was given
        check_writable_places(default_journal)
    (tmp_path / "precious.txt").write_text("data")
    not_a_socket = resolve({"daemon": {"listen": f"unix://{tmp_path}/precious.txt"}}, tmp_path)
    with pytest.raises(ConfigError, match=r"daemon\.listen: .*precious\.txt: exists and is not a socket"):
        check_writable_places(not_a_socket)
    assert (tmp_path / "precious.txt").read_text() == "data"


@pytest.mark.parametrize("kind", ["folder", "fifo", "device", "dangling symlink"])
def test_a_journal_that_is_no_regular_file_is_refused_by_the_check(kind: str, tmp_path: Path) -> None:
    """The journal itself (not only its folder) must be a file the daemon can open as its database, or be
    made: a folder, a FIFO, a device or a symlink to nothing there is a ConfigError naming daemon.journal
    and the file (exit 2, at --check too), where --check said OK and the start failed with SQLite's
    "unable to open database file" or "disk I/O error", for /dev/zero as a full disk (exit 4, "free the
    disk")."""
    import subprocess
    import sys

    from cuzk_mp.daemon.cli import check_writable_places
    from tests.helpers import ENV, REPO

    journal = tmp_path / "journal.sqlite"
    if kind == "folder":
        journal.mkdir()
    elif kind == "fifo":
        os.mkfifo(journal)
    elif kind == "device":
        journal = Path("/dev/zero")
    else:
        journal.symlink_to(tmp_path / "gone" / "journal.sqlite")
    cfg = resolve({"daemon": {"journal": str(journal)}, "srs": {"param_cache": str(tmp_path / "cache")}}, tmp_path)
    with pytest.raises(ConfigError, match=rf"daemon\.journal: {re.escape(str(journal))}: "):
        check_writable_places(cfg)
    config = write(tmp_path, f'[daemon]\njournal = "{journal}"\n[srs]\nparam_cache = "{tmp_path / "cache"}"\n'
                             '[memory]\ntotal_budget = "64GiB"\n')
    proc = subprocess.run([sys.executable, "-m", "cuzk_mp", "daemon", "--config", str(config), "--check"],
                          capture_output=True, text=True, timeout=60, cwd=REPO, env=ENV)
    assert proc.returncode == 2 and f"daemon.journal: {journal}: " in proc.stderr, (proc.returncode, proc.stderr)


# ---- what the engine would refuse at the start is refused by the config (and so by --check)

@pytest.mark.parametrize("raw, message", [
    ({"pipeline": {"task_timeout": 0}}, "t.toml: pipeline.task_timeout: must be positive, got 0 s"),
    ({"pipeline": {"start_timeout": "0s"}}, "t.toml: pipeline.start_timeout: must be positive, got 0 s"),
    ({"pipeline": {"start_timeout": 1e300}},
     "t.toml: pipeline.start_timeout: 1e+300 s is more than 2.592e+06 s (30 days): a typo, not a plan"),
    ({"pipeline": {"task_timeout": "31d"}},
     "t.toml: pipeline.task_timeout: 2.6784e+06 s is more than 2.592e+06 s (30 days): a typo, not a plan"),
    ({"pipeline": {"ring_slots": 300}}, "t.toml: pipeline.ring_slots: 300 is more than 256"),
    ({"pipeline": {"ring_slots": 0}}, "t.toml: pipeline.ring_slots: 0 must be an integer >= 1"),
    ({"pipeline": {"max_attempts": 0}}, "t.toml: pipeline.max_attempts: 0 must be an integer >= 1"),
    ({"pipeline": {"prover_batch": 0}}, "t.toml: pipeline.prover_batch: 0 must be an integer >= 1"),
    ({"synthesis": {"partition_workers": 0}}, "t.toml: synthesis.partition_workers: 0 must be an integer >= 1"),
    ({"gpus": {"gpu_workers_per_device": 0}}, "t.toml: gpus.gpu_workers_per_device: 0 must be an integer >= 1"),
    ({"gpus": {"gpu_workers_per_device": 5000}}, "t.toml: gpus.gpu_workers_per_device: 5000 is more than 1024 threads"),
    ({"synthesis": {"threads_per_partition": 100000}},
     "t.toml: synthesis.threads_per_partition: 100000 is more than 1024 threads"),
])
def test_what_the_engine_refuses_is_refused_naming_the_key(raw: dict, message: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        resolve(raw, tmp_path)
    assert str(e.value) == message


def test_a_derived_value_the_engine_refuses_says_it_was_derived(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^t\.toml: pipeline\.ring_slots \(derived from memory\.host_budget\): "
                                          r"\d+ is more than 256$"):
        resolve({"gpus": {"backend": "cpu", "devices": list(range(300))}}, tmp_path)  # a slot per prover


def test_every_engine_field_is_named_by_its_config_key() -> None:
    from cuzk_mp.pipeline.types import EngineConfig

    assert set(C.ENGINE_KEYS) == {f.name for f in dataclasses.fields(EngineConfig)}
    with pytest.raises(ConfigError, match=r"^EngineConfig\.task_timeout_s: must be positive, got 0 s$"):
        EngineConfig(task_timeout_s=0).validate()  # the engine's own callers read its field names
    raw = config_file.RawConfig()
    keys = {f"{section}.{name}" for section in raw.__struct_fields__
            for name in getattr(raw, section).__struct_fields__}
    assert set(C.ENGINE_KEYS.values()) <= keys


def test_max_frame_bytes_must_carry_the_reply_of_a_one_partition_job(tmp_path: Path) -> None:
    """A smaller limit would make every submit refused ("submit at most 0 partitions a job"): the
    config refuses it, naming the least that works."""
    from cuzk_mp.daemon import protocol as P

    least = P.job_reply_bytes(1)
    for small in ("1KiB", least - 1):
        with pytest.raises(ConfigError, match=rf"^t\.toml: daemon\.max_frame_bytes: \d+ bytes cannot carry the reply "
                                              rf"of a job of one partition .* set at least {least}$"):
            resolve({"daemon": {"max_frame_bytes": small}}, tmp_path)
    cfg = resolve({"daemon": {"max_frame_bytes": least}}, tmp_path)
    assert P.max_job_partitions(cfg.max_frame_bytes) == 1
    with pytest.raises(ConfigError, match=r"daemon\.max_frame_bytes: .* u32 length prefix"):
        resolve({"daemon": {"max_frame_bytes": "4GiB"}}, tmp_path)


def test_a_file_that_is_not_utf8_names_the_file_and_the_byte(tmp_path: Path) -> None:
    p = tmp_path / "n.toml"
    p.write_bytes(b'[daemon]\nlisten = "\xff"\n')
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(p))}: not valid TOML: not UTF-8 text: byte 0xff at "
                                          r"byte offset 19 \(line 2\)$"):
        C.load_config(p)


def test_host_budget_is_at_most_what_the_total_leaves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """memory.host_budget is part of memory.total_budget less memory.safety_margin: more is refused,
    naming the keys and the numbers (with total_budget "auto", this machine's RAM)."""
    from cuzk_mp.pipeline.memory import GiB

    with pytest.raises(ConfigError) as e:
        resolve({"memory": {"total_budget": "8GiB", "host_budget": "100GiB"}}, tmp_path)
    assert str(e.value).startswith(
        "t.toml: memory.host_budget: 100.00 GiB is more than memory.total_budget (8.00 GiB) less "
        "memory.safety_margin (4.00 GiB) and the queued jobs' inputs (2.00 GiB, daemon.max_queued_input): at most "
        "2.00 GiB (2147483648 bytes)")
    with pytest.raises(ConfigError, match=r"memory\.host_budget: 4\.00 GiB .* memory\.safety_margin \(5\.00 GiB\)"):
        resolve({"memory": {"total_budget": "8GiB", "safety_margin": "5GiB", "host_budget": "4GiB"}}, tmp_path)
    all_of_it = resolve({"memory": {"total_budget": "64GiB", "host_budget": "58GiB"}}, tmp_path)
    assert all_of_it.host_budget_bytes == 58 * GiB
    with pytest.raises(ConfigError, match=r"memory\.host_budget: 60\.00 GiB .* the queued jobs' inputs \(2\.00 GiB, "
                                          r"daemon\.max_queued_input\): at most 58\.00 GiB"):
        resolve({"memory": {"total_budget": "64GiB", "host_budget": "60GiB"}}, tmp_path)
    small = resolve({"memory": {"total_budget": "64GiB", "host_budget": "59GiB"},  # a small queue leaves more
                     "daemon": {"max_queued_input": "64MiB", "max_frame_bytes": "64MiB"}}, tmp_path)
    assert small.host_budget_bytes == 59 * GiB and small.queue_bytes == 64 * 2**20
    monkeypatch.setattr(C, "machine_memory_bytes", lambda: 16 * GiB)
    with pytest.raises(ConfigError, match=r"memory\.total_budget \(auto: this machine's memory, 16\.00 GiB\)"):
        C.resolve({"memory": {"host_budget": "13GiB"}}, base=tmp_path, source="t.toml")


def test_an_auto_backend_is_sized_for_the_backend_it_will_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """"auto" on a box without a GPU is sized as "cpu" (not by the GPU's throughput model), and
    ``--check`` says which it resolved to."""
    import cuzk_mp.backends as backends
    from cuzk_mp.daemon.cli import check_summary

    def shape(backend: str) -> tuple[int, int]:
        cfg = resolve({"gpus": {"backend": backend}, "memory": {"total_budget": "64GiB"},
                       "circuits": {"x": {"synthetic": "porep-like", "log_n": 12}}}, tmp_path)
        return cfg.engine.ring_slots, cfg.engine.partition_workers

    monkeypatch.setattr(backends, "gpu_available", lambda: False)
    assert shape("auto") == shape("cpu")
    cfg = resolve({"circuits": {"x": {"synthetic": "porep-like", "log_n": 12}}}, tmp_path)
    assert "auto backend (cpu on this machine)" in check_summary(cfg, 0)
    monkeypatch.setattr(backends, "gpu_available", lambda: True)
    assert shape("auto") == shape("gpu") != shape("cpu")


@pytest.mark.parametrize("name", ["CUZK_MP_PROVER_BATCH", "CUZK_MP_FINALIZE_BATCH"])
@pytest.mark.parametrize("value", ["abc", "0", "-3", "2.5"])
def test_batch_overrides_in_the_environment_are_checked_with_the_config(monkeypatch: pytest.MonkeyPatch,
                                                                       name: str, value: str) -> None:
    """The provers read these; a bad value is refused naming the variable when the engine's config is
    checked (daemon --check, bench, engine start), not found as a crash in a child process."""
    from cuzk_mp.pipeline.types import EngineConfig, finalize_batch, prover_batch

    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=rf"^{name}='{re.escape(value)}': must be an integer >= 1$"):
        EngineConfig().validate()
    monkeypatch.setenv(name, " 3 ")
    EngineConfig().validate()
    assert (prover_batch(8), finalize_batch()) == ((3, 16) if name == "CUZK_MP_PROVER_BATCH" else (8, 3))


def test_a_key_and_r1cs_of_different_circuits_are_refused_by_the_check(tmp_path: Path) -> None:
    """Every job of such a pair would fail, each blamed on its input: the config check reads both
    headers and names the key; a key that is no zkey, or a folder, is named the same way."""
    from cuzk_mp.circuits.synthetic import PorepLike
    from cuzk_mp.formats.r1cs import write_r1cs

    small_circom_key(tmp_path)
    write_r1cs(tmp_path / "other.r1cs", PorepLike(10).r1cs())
    (tmp_path / "junk.zkey").write_bytes(b"zkey" + bytes(40))
    base = '[memory]\ntotal_budget = "64GiB"\n[circuits.c]\n'
    for body, message in (
        ('zkey = "c.zkey"\nr1cs = "other.r1cs"\n',
         r"^.*cuzk\.toml: circuits\.c\.r1cs: .*other\.r1cs does not match .*c\.zkey: r1cs has \d+ wires / \d+ public, "
         r"zkey has 7 / 3$"),
        ('zkey = "junk.zkey"\n', r"^.*cuzk\.toml: circuits\.c\.zkey: .*junk\.zkey"),
        ('zkey = "."\n', r"^.*cuzk\.toml: circuits\.c\.zkey: .* is a folder, not a file$"),
    ):
        with pytest.raises(ConfigError, match=message):
            C.load_config(write(tmp_path, base + body))
    C.load_config(write(tmp_path, base + 'zkey = "c.zkey"\nr1cs = "c.r1cs"\n'))  # the circuit's own pair


def test_a_key_file_that_is_a_fifo_or_a_device_is_named_as_such_by_the_check(tmp_path: Path) -> None:
    """A circuit's file that exists but is a FIFO or a device is refused for what it is, naming the key
    and the file, never as "file not found" (it is there) nor waited on (a FIFO no process writes);
    a dangling symlink is a file not found."""
    small_circom_key(tmp_path)
    os.mkfifo(tmp_path / "fifo.zkey")
    (tmp_path / "dangling.zkey").symlink_to(tmp_path / "nowhere.zkey")
    base = '[memory]\ntotal_budget = "64GiB"\n[circuits.c]\n'
    for body, message in (
        ('zkey = "fifo.zkey"\n', r"^.*cuzk\.toml: circuits\.c\.zkey: .*fifo\.zkey: .*a FIFO \(a named pipe\), not a "
         r"regular file"),
        ('zkey = "/dev/zero"\n', r"^.*cuzk\.toml: circuits\.c\.zkey: /dev/zero: .*character device, not a regular"),
        ('zkey = "c.zkey"\nwasm = "fifo.zkey"\n', r"^.*cuzk\.toml: circuits\.c\.wasm: .*fifo\.zkey: .*a FIFO"),
        ('zkey = "dangling.zkey"\n', r"^.*cuzk\.toml: circuits\.c\.zkey: file not found: .*dangling\.zkey$"),
    ):
        with pytest.raises(ConfigError, match=message):
            C.load_config(write(tmp_path, base + body))


@pytest.mark.parametrize(("name", "value"), [("CUZK_GPU_MSM_SORT", "radix-"), ("CUZK_GPU_MSM_ACCUMULATE", "grid2"),
                                             ("CUZK_GPU_MSM_MULTIPLES", "h,q"), ("CUZK_GPU_BINARIES", "cuda11")])
def test_gpu_knobs_in_the_environment_are_checked_with_a_gpu_engine_config(monkeypatch: pytest.MonkeyPatch,
                                                                           name: str, value: str) -> None:
    """A GPU engine's provers read these; a value they would refuse is refused naming the variable when
    the config is checked (the CPU backend never reads them); importing the GPU knobs reads none."""
    from cuzk_mp.backends.gpu import knobs
    from cuzk_mp.pipeline.types import EngineConfig

    monkeypatch.setenv(name, value)
    assert knobs._shipped() == knobs.SHIPPED  # what the module makes at import never reads the environment
    with pytest.raises(ConfigError, match=rf"^{name}="):
        EngineConfig(backend="gpu").validate()
    EngineConfig(backend="cpu").validate()
    monkeypatch.setenv(name, "  ")  # blank: the default, as unset
    EngineConfig(backend="gpu").validate()


def test_an_unknown_gpu_knob_name_is_refused_with_a_gpu_engine_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUZK_GPU_* variable no reader has (a misspelt knob, or one of a variant that is not shipped) would be
    ignored in silence, the measurement or the service running with the default instead: a GPU engine's
    config refuses it, naming it and the knobs there are; the CPU backend reads none of them."""
    from cuzk_mp.backends.gpu.env_knobs import KNOWN_ENV
    from cuzk_mp.pipeline.types import EngineConfig

    for name in KNOWN_ENV:
        monkeypatch.delenv(name, raising=False)
    EngineConfig(backend="gpu").validate()
    for name in ("CUZK_GPU_MSM_MULTIPLE", "CUZK_GPU_MSM_G2_SPLIT"):
        monkeypatch.setenv(name, "1")
        listed = r"\(CUZK_GPU_BINARIES, CUZK_GPU_EXIT_HANDOFF, .*CUZK_GPU_MSM_SORT\)"
        with pytest.raises(ConfigError, match=rf"^{name}: no such knob {listed}"):
            EngineConfig(backend="gpu").validate()
        EngineConfig(backend="cpu").validate()
        monkeypatch.delenv(name)
    assert len(KNOWN_ENV) == 6
    # a one-shot verb's backend (get_backend, where a GPU is there) refuses it before it imports CuPy
    import cuzk_mp.backends as backends

    monkeypatch.setattr(backends, "gpu_unavailable_reason", lambda *a, **k: None)
    monkeypatch.setenv("CUZK_GPU_MSM_SORTS", "radix")
    with pytest.raises(ConfigError, match=r"^CUZK_GPU_MSM_SORTS: no such knob"):
        backends.get_backend("gpu")


def test_a_blank_multiples_knob_is_the_default() -> None:
    from cuzk_mp.backends.gpu.msm_geometry import plan_multiples

    sections = {"h": 96 << 20, "a": 96 << 20}
    assert plan_multiples(sections, 1 << 40, 1 << 20, "  ") == plan_multiples(sections, 1 << 40, 1 << 20, None) != {}
    assert plan_multiples(sections, 1 << 40, 1 << 20, "none") == {}


def test_a_config_that_never_ends_is_refused_after_its_limit(tmp_path: Path) -> None:
    """``--config /dev/zero`` (or a file of any size, or a pipe whose writer does not stop) is read no
    further than a config can be (``MAX_CONFIG_BYTES``) and refused naming it (exit 2); it was read to its
    end, /dev/zero until the process's memory ran out (a MemoryError traceback, or the OOM killer)."""
    import resource
    import subprocess
    import sys

    from tests.helpers import ENV, REPO

    def small() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    try:
        proc = subprocess.run([sys.executable, "-m", "cuzk_mp", "daemon", "--config", "/dev/zero", "--check"],
                              capture_output=True, text=True, timeout=60, cwd=REPO, env=ENV, preexec_fn=small)
    except subprocess.TimeoutExpired:
        pytest.fail("--config /dev/zero was read for ever")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].endswith(
        f"/dev/zero: more than {C.MAX_CONFIG_BYTES} bytes, more than a config file holds"), proc.stderr[-2000:]
    pipe = tmp_path / "cuzk.toml"  # a config from a pipe (``--config <(gen)``) is read as before
    os.mkfifo(pipe)
    gen = subprocess.Popen(["sh", "-c", f"printf '[memory]\\ntotal_budget = \"64GiB\"\\n' > {pipe}"])
    try:
        assert C.load_config(pipe).memory_total_bytes == 64 << 30
    finally:
        gen.wait(10)
