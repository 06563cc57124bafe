"""The daemon's TOML configuration file as written: its tables, their keys and defaults, and the
decoding of the file's tables into them.

Why a module of its own: what the file may say (and how a wrong key is named in the error) is
one contract, apart from what the daemon makes of it (:mod:`.config` resolves it, checks it and
maps it onto the engine). The file is read with :mod:`tomllib` and decoded into ``msgspec`` Structs
that forbid unknown fields, so a typo is a start-up error that names the key (cuzk silently ignored
unknown keys and turned unparseable sizes into 50 GiB). Sizes are written ``"64GiB"``, ``"512MiB"``
or as a plain number of bytes; durations ``"30s"``, ``"5m"``, ``"1h"`` or a number of seconds
(:func:`parse_duration`). Every key is documented with its default in
``config/cuzk-mp.example.toml``.

The keys of cuzk that mean nothing here (:data:`FOREIGN_KEYS`, one table with the reason for
each) are accepted with a warning naming them, never silently. Any other unknown key is still an
error, in cuzk's ``[scheduler]`` section too.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

import msgspec

from cuzk_mp.daemon.fleet.config import FleetSection
from cuzk_mp.daemon.transport import DEFAULT_MAX_FRAME
from cuzk_mp.errors import ConfigError

SizeValue = int | str
DurationValue = int | float | str
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_LEVEL_ALIASES = {"trace": "debug", "warn": "warning"}  # cuzk's (Rust tracing) names

# Keys of cuzk's configuration that have no meaning in cuzk-mp: accepted with a warning naming
# each, so a file written for cuzk starts. Key -> why it does nothing here (what does it instead).
FOREIGN_KEYS: dict[str, str] = {
    "memory.pinned_budget": "the proving keys' memory is what memory.total_budget leaves after the pipeline",
    "memory.working_memory_budget": "the pipeline's memory is memory.host_budget",
    "memory.eviction_min_idle": "an idle key is evicted, least recently used first, as soon as the key "
                                "memory budget needs the room",
    "gpus.gpu_threads": "each prover process sizes its own CPU threads",
    "gpus.affinity": "each device has its own prover process",
    "scheduler.max_batch_size": "small partitions already READY are proved together, up to "
                                "pipeline.prover_batch; large ones one at a time",
    "scheduler.max_batch_wait_ms": "a prover never waits to fill a batch: it takes what is READY",
    "scheduler.sort_by_type": "jobs run by priority ([circuits.ID] priority), then in submit order",
    "pipeline.enabled": "the pipeline is the only way to prove",
    "pipeline.synthesis_lookahead": "how far synthesis runs ahead of the provers is pipeline.ring_slots",
    "pipeline.synthesis_concurrency": "concurrent syntheses are synthesis.partition_workers",
    "pipeline.max_parallel_synthesis": "concurrent syntheses are synthesis.partition_workers (or derived "
                                       "from memory.host_budget)",
    "pipeline.slot_size": "a ring slot holds one partition, sized by the circuit",
    "pipeline.max_gpu_queue_depth": "the ring is the queue in front of the provers: pipeline.ring_slots",
}


class DaemonSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[daemon]``: where the daemon listens and how long it keeps things."""

    listen: str = "127.0.0.1:9820"
    socket_mode: str = "0600"
    status_listen: str = ""
    journal: str = ""
    max_frame_bytes: SizeValue = f"{DEFAULT_MAX_FRAME >> 20}MiB"
    frame_timeout: DurationValue = "60s"
    max_connections: int = 256
    max_queued_jobs: int = 10000  # unfinished (queued or running) jobs of all clients
    max_queued_input: SizeValue = "2GiB"  # the input bytes those jobs hold; 0: no byte cap
    max_jobs_per_owner: int = 0  # unfinished jobs of one client identity (a token); 0: no cap
    tokens: list[str] = []
    admin_tokens: list[str] = []
    max_client_priority: Literal["CRITICAL", "HIGH", "NORMAL", "LOW"] = "CRITICAL"  # of a client token's jobs
    result_ttl: DurationValue = "1h"
    shutdown_grace: DurationValue = "30s"
    exit_when_idle: DurationValue = 0  # 0: never


class SrsSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[srs]``: the parameter cache and the keys loaded at start-up (``param_cache`` "":
    :func:`cuzk_mp.paths.default_cache_dir`)."""

    param_cache: str = ""
    preload: list[str] = []


class MemorySection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[memory]``: the host memory the daemon may use, all told."""

    total_budget: SizeValue = "auto"
    safety_margin: SizeValue = "4GiB"
    host_budget: SizeValue = "auto"


class SynthesisSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[synthesis]``: the synthesis worker processes."""

    partition_workers: int | None = None  # None: derived from memory.host_budget
    threads_per_partition: int | Literal["auto"] = "auto"  # 0 is "auto" too
    threads: int | None = None  # the older name of threads_per_partition (cuzk's; 0 = auto)


class PipelineSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[pipeline]``: the shared-memory slot ring and per-partition policy."""

    ring_slots: int | None = None  # None: derived from memory.host_budget
    prover_batch: int = 8
    shm_prefix: str = ""
    verify_proofs: bool = True
    max_attempts: int = 2
    start_timeout: DurationValue = "300s"
    task_timeout: DurationValue = "30m"


class GpusSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[gpus]``: the backend and the devices that prove."""

    backend: Literal["auto", "cpu", "gpu"] = "auto"
    devices: list[int] | None = None  # None or []: every visible device
    gpu_workers_per_device: int = 2


class LoggingSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[logging]``: level and line format of the daemon's log."""

    level: str = "info"  # LOG_LEVELS, or an alias of LOG_LEVEL_ALIASES
    format: Literal["text", "json"] = "text"


class CircuitSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[circuits.ID]``: a circom circuit (zkey, wasm, r1cs) or a synthetic one."""

    zkey: str | None = None
    wasm: str | None = None
    r1cs: str | None = None
    synthetic: Literal["porep-like", "dense-random"] | None = None
    log_n: int | None = None
    key_source: Literal["file", "device"] = "file"  # synthetic only: where its INSECURE dev key comes from
    partitions: int = 1
    priority: Literal["CRITICAL", "HIGH", "NORMAL", "LOW"] = "NORMAL"


class RawConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The file as written, every section defaulted (``circuits`` is decoded separately)."""

    daemon: DaemonSection = msgspec.field(default_factory=DaemonSection)
    srs: SrsSection = msgspec.field(default_factory=SrsSection)
    memory: MemorySection = msgspec.field(default_factory=MemorySection)
    synthesis: SynthesisSection = msgspec.field(default_factory=SynthesisSection)
    pipeline: PipelineSection = msgspec.field(default_factory=PipelineSection)
    gpus: GpusSection = msgspec.field(default_factory=GpusSection)
    logging: LoggingSection = msgspec.field(default_factory=LoggingSection)
    fleet: FleetSection = msgspec.field(default_factory=FleetSection)


_DURATIONS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "": 1.0}
_CIRCUIT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def parse_duration(value: object, key: str) -> float:
    """Seconds from ``"250ms"``, ``"30s"``, ``"5m"``, ``"1h"``, ``"2d"`` or a number."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        m = re.match(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d|)\s*$", value) \
            if isinstance(value, str) else None
        if m is None:
            raise ConfigError(f"{key}: cannot parse duration {value!r} (write e.g. \"30s\", "
                              "\"5m\", \"1h\" or a number of seconds)")
        seconds = float(m.group(1)) * _DURATIONS[m.group(2)]
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigError(f"{key}: a duration must be a finite number >= 0, got {value!r}")
    return seconds


def _explain(err: msgspec.ValidationError, prefix: str) -> str:
    """Turn msgspec's ``... - at `$.a.b``` into a message naming the TOML key ``a.b``."""
    text = str(err).replace(" | null`", "`")  # None stands for a key left out: TOML has no null
    where = ""
    if " - at `$" in text:
        text, _, path = text.partition(" - at `$")
        where = path.rstrip("`").lstrip(".")
    where = ".".join(p for p in (prefix, where) if p)
    m = re.match(r"Object contains unknown field `(.+)`", text)
    if m:
        key = ".".join(p for p in (where, m.group(1)) if p)
        return f"unknown key `{key}`"
    allowed = _enum_values(where)
    if text.startswith("Invalid enum value") and allowed:
        text += f" (one of: {', '.join(v if v == 'an integer' else repr(v) for v in allowed)})"
    return f"`{where}`: {text}" if where else text


def _enum_values(key: str) -> tuple[object, ...]:
    """The values a Literal-typed key takes (``gpus.backend``, ``circuits.ID.priority``, ...; "an integer"
    among them where the key also takes one); () if none."""
    parts = key.split(".")
    if parts[0] == "circuits":
        struct: Any = CircuitSection
        parts = parts[2:]
    else:
        struct = RawConfig
    info: Any = msgspec.inspect.type_info(struct)
    for i, name in enumerate(parts):
        field = next((f for f in getattr(info, "fields", ()) if f.name == name), None)
        if field is None:
            return ()
        if i < len(parts) - 1:
            info = field.type
            continue
        kinds = field.type.types if isinstance(field.type, msgspec.inspect.UnionType) else (field.type,)
        values = tuple(v for t in kinds if isinstance(t, msgspec.inspect.LiteralType) for v in t.values)
        return values + (("an integer",) if any(isinstance(t, msgspec.inspect.IntType) for t in kinds) else ())
    return ()


def _foreign_keys(raw: dict[str, Any], source: str) -> tuple[dict[str, Any], list[str]]:
    """``raw`` without the keys of :data:`FOREIGN_KEYS`, and a warning naming each one found. A section
    of cuzk's that has none here (``[scheduler]``) is dropped; any other key in it is an unknown key,
    named ``section.key``."""
    tables = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    warnings = []
    for key, why in FOREIGN_KEYS.items():
        section, name = key.split(".")
        table = tables.get(section)
        if isinstance(table, dict) and name in table:
            del table[name]
            warnings.append(f"{source}: {key} is a cuzk setting with no meaning here, ignored: {why}")
    for section in sorted({k.split(".")[0] for k in FOREIGN_KEYS} - set(RawConfig.__struct_fields__)):
        table = tables.get(section)
        if not isinstance(table, dict):
            continue
        if table:
            known = ", ".join(k.split(".")[1] for k in FOREIGN_KEYS if k.startswith(f"{section}."))
            raise ConfigError(f"{source}: unknown key `{section}.{next(iter(table))}` ([{section}] is a section "
                              f"of cuzk's with no meaning here: only its keys {known} are accepted, and ignored)")
        if not raw[section]:  # an empty table: no key of it is warned about
            warnings.append(f"{source}: [{section}] is a cuzk section with no meaning here, ignored")
        del tables[section]
    return tables, warnings


def _decode(raw: dict[str, Any], source: str) -> tuple[RawConfig, dict[str, CircuitSection]]:
    """Decode the TOML tables into Structs; errors name the key."""
    tables = dict(raw)
    circuits_raw = tables.pop("circuits", {})
    try:
        cfg = msgspec.convert(tables, RawConfig)
    except msgspec.ValidationError as e:
        raise ConfigError(f"{source}: {_explain(e, '')}") from None
    if not isinstance(circuits_raw, dict):
        raise ConfigError(f"{source}: `circuits` must be a table of [circuits.ID] tables")
    circuits: dict[str, CircuitSection] = {}
    for cid, table in circuits_raw.items():
        if not _CIRCUIT_ID_RE.match(cid):
            raise ConfigError(f"{source}: circuits.{cid}: a circuit id is 1-64 characters of "
                              "letters, digits, '_', '.', '-'")
        try:
            circuits[cid] = msgspec.convert(table, CircuitSection)
        except msgspec.ValidationError as e:
            raise ConfigError(f"{source}: {_explain(e, f'circuits.{cid}')}") from None
    return cfg, circuits
