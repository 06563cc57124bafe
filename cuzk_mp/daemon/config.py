"""The daemon's TOML configuration: decoding, validation and mapping onto the engine.

This module owns the one configuration file of ``cuzk-mp daemon``. The file is read with
:mod:`tomllib` and decoded into ``msgspec`` Structs that forbid unknown fields, so a typo is a
start-up error that names the key (cuzk silently ignored unknown keys and turned unparseable sizes
into 50 GiB). Sizes are written ``"64GiB"``, ``"512MiB"`` or as a
plain number of bytes; durations ``"30s"``, ``"5m"``, ``"1h"`` or a number of seconds. Every key is
documented with its default in ``config/cuzk-mp.example.toml`` and every key does something: the
resolved :class:`DaemonConfig` carries the engine's :class:`EngineConfig`, one :class:`CircuitSpec`
per ``[circuits.ID]`` table, and what ``[memory]`` decides (:mod:`.budget`): the pipeline's shape
where the file leaves it to ``host_budget``, and the SRS memory budget.

Relative paths in the file are taken relative to the directory that holds the file.

A file written for cuzk mostly works as it is: ``gpus.devices = []`` means every visible GPU and
``synthesis.threads = 0`` the automatic thread count, as there; ``logging.level`` takes cuzk's
``trace`` and ``warn``; and the keys of cuzk that mean nothing here (:data:`FOREIGN_KEYS`, one table
with the reason for each) are accepted with a warning naming them, never silently. Any other
unknown key is still an error, in cuzk's ``[scheduler]`` section too.

The resolved engine config passes :meth:`EngineConfig.validate` with messages naming the file's keys,
so ``cuzk-mp daemon --check`` refuses whatever the engine would refuse at the start.
"""

from __future__ import annotations

import hashlib
import math
import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import msgspec

from cuzk_mp.daemon import protocol as P
from cuzk_mp.daemon.budget import largest, memory_budget, queue_bound, shape_for
from cuzk_mp.daemon.fleet.config import FleetConfig, FleetSection, resolve_fleet
from cuzk_mp.daemon.transport import DEFAULT_MAX_FRAME, Address, parse_address
from cuzk_mp.errors import ConfigError
from cuzk_mp.paths import default_cache_dir
from cuzk_mp.pipeline.memory import fmt_bytes, machine_memory_bytes, parse_size
from cuzk_mp.pipeline.types import CircuitSpec, EngineConfig, Priority

SizeValue = int | str
DurationValue = int | float | str
LOG_LEVELS = ("debug", "info", "warning", "error")
# Of [daemon] shutdown_grace, this much is kept for the engine's own stop (terminate its
# processes, 5 s, then kill), so that the whole drain stays within the grace; in-flight
# partitions get the rest to finish.
ENGINE_STOP_RESERVE_S = 6.0
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
# The key of the file that sets each EngineConfig field: EngineConfig.validate's messages name it.
ENGINE_KEYS: dict[str, str] = {
    "backend": "gpus.backend", "devices": "gpus.devices", "gpu_workers_per_device": "gpus.gpu_workers_per_device",
    "partition_workers": "synthesis.partition_workers", "synthesis_threads": "synthesis.threads_per_partition",
    "ring_slots": "pipeline.ring_slots", "shm_prefix": "pipeline.shm_prefix", "verify_proofs": "pipeline.verify_proofs",
    "max_attempts": "pipeline.max_attempts", "prover_batch": "pipeline.prover_batch", "param_cache": "srs.param_cache",
    "srs_budget_bytes": "memory.total_budget", "start_timeout_s": "pipeline.start_timeout",
    "task_timeout_s": "pipeline.task_timeout",
}
# The EngineConfig fields of the pipeline's shape, by their name in budget.shape_for's `given`.
SHAPE_FIELDS = {"ring_slots": "ring_slots", "partition_workers": "partition_workers",
                "synthesis_threads": "threads_per_partition"}


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


@dataclass(frozen=True)
class CircuitConfig:
    """A configured circuit: the engine's spec plus the daemon's default priority."""

    spec: CircuitSpec
    priority: Priority


@dataclass(frozen=True)
class DaemonConfig:
    """The validated configuration, every value parsed (bytes, seconds, paths, addresses)."""

    path: Path | None
    listen: Address
    socket_mode: int
    status_listen: Address | None
    journal_path: Path
    max_frame_bytes: int
    result_ttl_s: float
    shutdown_grace_s: float
    param_cache: Path
    preload: tuple[str, ...]
    circuits: dict[str, CircuitConfig]
    memory_total_bytes: int
    safety_margin_bytes: int
    engine: EngineConfig
    log_level: str
    log_format: str
    host_budget_bytes: int
    frame_timeout_s: float = 60.0
    max_connections: int = 256
    tokens: tuple[str, ...] = ()
    admin_tokens: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()  # keys accepted but ignored (FOREIGN_KEYS), circuits without an r1cs
    fleet: FleetConfig | None = None  # [fleet] with a dsn: this daemon is one box of a fleet
    exit_when_idle_s: float = 0.0  # stop after this long with no connection and no job (0: never)
    max_queued_jobs: int = 10000
    max_queued_input_bytes: int = 2 << 30  # 0: no byte cap
    max_jobs_per_owner: int = 0  # 0: no cap
    max_client_priority: Priority = Priority.CRITICAL  # the most urgent a client token's job asks

    @property
    def queue_bytes(self) -> int:
        """The most input bytes the unfinished jobs hold at once: the budget's queue term
        (:func:`~cuzk_mp.daemon.budget.queue_bound`)."""
        return queue_bound(self.max_queued_input_bytes, self.max_queued_jobs, self.max_frame_bytes)


_DURATIONS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "": 1.0}
_CIRCUIT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_TOKEN_RE = re.compile(r"^[\x21-\x7e]{16,256}$")


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


def _path(value: str, base: Path) -> Path:
    """A path from the file: ``~`` expanded, relative ones taken from the file's directory."""
    p = Path(value).expanduser()
    return p if p.is_absolute() else (base / p)


def _circuit(cid: str, c: CircuitSection, base: Path, source: str) -> CircuitConfig:
    """Validate one ``[circuits.ID]`` table and build its CircuitSpec."""
    key = f"{source}: circuits.{cid}"
    if c.partitions < 1:
        raise ConfigError(f"{key}.partitions: must be >= 1, got {c.partitions}")
    if c.synthetic is not None:
        given = [k for k in ("zkey", "wasm", "r1cs") if getattr(c, k) is not None]
        if given:
            raise ConfigError(f"{key}: a synthetic circuit takes no {', '.join(given)} "
                              "(its key is made in the param cache)")
        from cuzk_mp.circuits.synthetic_kinds import MAX_LOG_N, MIN_LOG_N
        if c.log_n is None or not MIN_LOG_N <= c.log_n <= MAX_LOG_N:
            raise ConfigError(f"{key}.log_n: a synthetic circuit needs log_n in "
                              f"{MIN_LOG_N}..{MAX_LOG_N}, got {c.log_n}")
        spec = CircuitSpec(circuit_id=cid, synthetic=c.synthetic, log_n=c.log_n,
                           partitions=c.partitions, key_source=c.key_source)
        return CircuitConfig(spec, Priority[c.priority])
    if c.log_n is not None:
        raise ConfigError(f"{key}.log_n: only a synthetic circuit takes log_n")
    if c.key_source != "file":
        raise ConfigError(f"{key}.key_source: \"device\" is for synthetic circuits (a circom circuit's key is "
                          "its zkey file)")
    files: dict[str, Path | None] = {}
    for name in ("zkey", "r1cs", "wasm"):
        value = getattr(c, name)
        if value is None:
            if name == "zkey":
                raise ConfigError(f"{key}.zkey: a circom circuit needs `zkey` "
                                  "(or set synthetic = \"porep-like\" or \"dense-random\")")
            files[name] = None
            continue
        path = _path(value, base)
        if path.is_dir():
            raise ConfigError(f"{key}.{name}: {path} is a folder, not a file")
        if not path.is_file():
            raise ConfigError(f"{key}.{name}: file not found: {path}")
        files[name] = path
    assert files["zkey"] is not None
    _check_key_files(key, files["zkey"], files["r1cs"])
    spec = CircuitSpec(circuit_id=cid, zkey=files["zkey"], wasm=files["wasm"],
                       r1cs=files["r1cs"], partitions=c.partitions)
    return CircuitConfig(spec, Priority[c.priority])


def _check_key_files(key: str, zkey_path: Path, r1cs_path: Path | None) -> None:
    """The circuit's zkey readable (its header and sections; ConfigError naming ``KEY.zkey``) and its
    r1cs, where given, a circuit of that key as far as the headers tell (naming ``KEY.r1cs``): every job
    of a mismatched pair would fail, each blamed on its input."""
    from cuzk_mp.errors import InputError
    from cuzk_mp.formats.r1cs import read_r1cs_header
    from cuzk_mp.formats.zkey import read_zkey
    from cuzk_mp.groth16.circuit_data import check_header_match

    try:
        zkey = read_zkey(zkey_path, check_coefs=False)
    except InputError as e:
        raise ConfigError(f"{key}.zkey: {e}") from None
    with zkey:
        if r1cs_path is None:
            return
        try:
            h = read_r1cs_header(r1cs_path)
            check_header_match(str(r1cs_path), h["n_wires"], h["n_pub_out"] + h["n_pub_in"], h["n_constraints"],
                               zkey)
        except InputError as e:
            raise ConfigError(f"{key}.r1cs: {e}") from None


def _check_counts(cfg: RawConfig, source: str) -> None:
    """Reject what only the file can get wrong: thread counts below 0 (0 is "auto"), both names of the
    thread count, repeated or negative device ids ([] is every device), a bad shm prefix. The engine's
    own fields are checked by EngineConfig.validate (:func:`_validate_engine`)."""
    checks = [
        ("synthesis.threads", 1 if cfg.synthesis.threads is None else cfg.synthesis.threads, 0),
        ("synthesis.threads_per_partition", 1 if cfg.synthesis.threads_per_partition == "auto"
         else cfg.synthesis.threads_per_partition, 0),
    ]
    for key, value, low in checks:
        if value < low:
            raise ConfigError(f"{source}: {key}: must be >= {low}, got {value}")
    if cfg.synthesis.threads is not None and cfg.synthesis.threads_per_partition not in ("auto", 0):
        raise ConfigError(f"{source}: synthesis.threads: the older name of synthesis.threads_per_partition; "
                          "give one of them")
    devices = cfg.gpus.devices
    if devices:  # [] is every visible device, as leaving the key out
        if len(set(devices)) != len(devices) or min(devices) < 0:
            raise ConfigError(f"{source}: gpus.devices: ids must be distinct and >= 0, "
                              f"got {devices}")
    if cfg.pipeline.shm_prefix and not re.match(r"^[A-Za-z0-9_-]{1,32}$", cfg.pipeline.shm_prefix):
        raise ConfigError(f"{source}: pipeline.shm_prefix: 1-32 of letters, digits, '_', '-'")


def _socket_mode(value: str, source: str) -> int:
    """Parse ``daemon.socket_mode`` (octal text such as ``"0600"``)."""
    try:
        mode = int(value, 8)
    except ValueError:
        raise ConfigError(f"{source}: daemon.socket_mode: not an octal mode: {value!r}") from None
    if not 0 <= mode <= 0o777:
        raise ConfigError(f"{source}: daemon.socket_mode: {value!r} is outside 0000..0777")
    return mode


def default_shm_prefix(journal_path: Path) -> str:
    """The shm prefix of a daemon whose config sets none: ``cuzk-`` and a hash of the journal's
    real path, so the same config always gets the same prefix and a restart removes what a
    killed predecessor left in /dev/shm (two daemons never share a journal or a prefix: both
    are locked, see daemon.instance_lock)."""
    digest = hashlib.blake2b(str(journal_path.resolve()).encode(), digest_size=6).hexdigest()
    return f"cuzk-{digest}"


def _check_tokens(d: DaemonSection, listen: Address, status_listen: Address | None,
                  source: str) -> None:
    """Tokens are long printable secrets; a listener beyond loopback needs them."""
    for key in ("tokens", "admin_tokens"):
        for i, token in enumerate(getattr(d, key)):
            if not _TOKEN_RE.match(token):
                raise ConfigError(f"{source}: daemon.{key}[{i}]: a token is 16-256 printable "
                                  "ASCII characters without spaces")
    if set(d.tokens) & set(d.admin_tokens) or len(set(d.tokens)) != len(d.tokens):
        raise ConfigError(f"{source}: daemon.tokens / daemon.admin_tokens: every token must be "
                          "distinct (a token is one client's identity)")
    if d.tokens or d.admin_tokens:
        return
    for key, addr in (("listen", listen), ("status_listen", status_listen)):
        if addr is not None and not addr.loopback:
            raise ConfigError(f"{source}: daemon.{key} = {str(addr)!r} is reachable from other "
                              "hosts: set daemon.tokens (clients then pass --token or "
                              "$CUZK_MP_TOKEN), or listen on a loopback address or a unix socket")


def resolve(raw: dict[str, Any], *, base: Path, source: str = "config") -> DaemonConfig:
    """Validate a parsed TOML document and build the :class:`DaemonConfig`.

    ``base`` is the directory relative paths are taken from; ``source`` names the file in
    messages. Every error is a ConfigError naming the key.
    """
    raw, warnings = _foreign_keys(raw, source)
    cfg, circuit_tables = _decode(raw, source)
    _check_counts(cfg, source)
    level = LOG_LEVEL_ALIASES.get(cfg.logging.level.lower(), cfg.logging.level.lower())
    if level not in LOG_LEVELS:
        aliases = ", ".join(f"{a} is read as {b}" for a, b in LOG_LEVEL_ALIASES.items())
        raise ConfigError(f"{source}: `logging.level`: {cfg.logging.level!r} is not a log level (one of: "
                          f"{', '.join(LOG_LEVELS)}; {aliases})")
    d = cfg.daemon
    try:
        listen = parse_address(d.listen)
        status_listen = parse_address(d.status_listen) if d.status_listen else None
    except ConfigError as e:
        raise ConfigError(f"{source}: daemon: {e}") from None
    if status_listen is not None and status_listen == listen:
        raise ConfigError(f"{source}: daemon.status_listen: same address as daemon.listen")
    _check_tokens(d, listen, status_listen, source)
    if d.max_connections < 1:
        raise ConfigError(f"{source}: daemon.max_connections: must be >= 1, got {d.max_connections}")
    queue_caps = _queue_caps(d, source)
    frame_timeout = parse_duration(d.frame_timeout, f"{source}: daemon.frame_timeout")
    if frame_timeout <= 0:
        raise ConfigError(f"{source}: daemon.frame_timeout: must be > 0 (an unfinished frame "
                          "must not hold its memory forever)")
    param_cache = _path(cfg.srs.param_cache, base) if cfg.srs.param_cache else default_cache_dir()
    circuits = {cid: _circuit(cid, c, base, source) for cid, c in circuit_tables.items()}
    for cid in cfg.srs.preload:
        if cid not in circuits:
            raise ConfigError(f"{source}: srs.preload: unknown circuit {cid!r} "
                              f"(configured: {sorted(circuits)})")
    max_frame = _max_frame(d, source)
    queue = queue_bound(queue_caps["max_queued_input_bytes"], queue_caps["max_queued_jobs"], max_frame)
    given_total = parse_size(cfg.memory.total_budget, f"{source}: memory.total_budget", allow_auto=True)
    margin = parse_size(cfg.memory.safety_margin, f"{source}: memory.safety_margin")
    assert margin is not None
    total = machine_memory_bytes() if given_total is None else given_total
    if total <= margin:
        raise ConfigError(f"{source}: memory.total_budget: {total} bytes do not even cover "
                          f"memory.safety_margin ({margin})")
    host = _host_budget(cfg.memory, total, margin, queue, source, auto_total=given_total is None)
    journal_path = _path(d.journal, base) if d.journal else param_cache / "journal.sqlite"
    given = _given_shape(cfg)
    engine = EngineConfig(
        backend=cfg.gpus.backend, devices=cfg.gpus.devices or None,
        gpu_workers_per_device=cfg.gpus.gpu_workers_per_device,
        **{field: given[name] for field, name in SHAPE_FIELDS.items() if name in given},
        shm_prefix=cfg.pipeline.shm_prefix or default_shm_prefix(journal_path),
        verify_proofs=cfg.pipeline.verify_proofs,
        max_attempts=cfg.pipeline.max_attempts, prover_batch=cfg.pipeline.prover_batch, param_cache=param_cache,
        start_timeout_s=parse_duration(cfg.pipeline.start_timeout,
                                       f"{source}: pipeline.start_timeout"),
        task_timeout_s=parse_duration(cfg.pipeline.task_timeout, f"{source}: pipeline.task_timeout"),
    )
    _validate_engine(engine, cfg, given, source)  # the values the file gives, before they size anything
    circuit = largest((c.spec for c in circuits.values()), engine.backend)
    try:
        shape = shape_for(host, engine, circuit, given)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    engine = replace(engine, ring_slots=shape.ring_slots, partition_workers=shape.partition_workers,
                     synthesis_threads=shape.threads_per_partition)
    engine = replace(engine, srs_budget_bytes=memory_budget(total, margin, engine, circuit, source, queue))
    _validate_engine(engine, cfg, given, source)  # and the engine the daemon starts, as it will check it
    fleet = resolve_fleet(cfg.fleet, source=source, base=base, duration=parse_duration)
    warnings += _witness_check_warnings(circuits, engine.verify_proofs, source)
    if d.max_jobs_per_owner and not (d.tokens or d.admin_tokens):
        warnings.append(f"{source}: daemon.max_jobs_per_owner = {d.max_jobs_per_owner} without tokens: every client "
                        "is one owner, so it caps all unfinished jobs together (as daemon.max_queued_jobs does); "
                        "set daemon.tokens to give each client a cap of its own")
    grace_s = parse_duration(d.shutdown_grace, f"{source}: daemon.shutdown_grace")
    if grace_s < 2 * ENGINE_STOP_RESERVE_S:
        left = max(grace_s - ENGINE_STOP_RESERVE_S, 0.0)
        warnings.append(
            f"{source}: daemon.shutdown_grace = {grace_s:g} s: {ENGINE_STOP_RESERVE_S:g} s of it is kept for stopping "
            f"the engine's processes, so a partition in flight at SIGTERM has {left:g} s to finish before it is "
            "cancelled (its job is journaled and runs again after a restart)")
    return DaemonConfig(
        path=None, listen=listen, socket_mode=_socket_mode(d.socket_mode, source),
        status_listen=status_listen,
        journal_path=journal_path, max_frame_bytes=max_frame,
        result_ttl_s=parse_duration(d.result_ttl, f"{source}: daemon.result_ttl"),
        shutdown_grace_s=grace_s,
        param_cache=param_cache, preload=tuple(cfg.srs.preload), circuits=circuits,
        memory_total_bytes=total, safety_margin_bytes=margin, engine=engine,
        log_level=level, log_format=cfg.logging.format, host_budget_bytes=host,
        frame_timeout_s=frame_timeout, max_connections=d.max_connections,
        tokens=tuple(d.tokens), admin_tokens=tuple(d.admin_tokens), warnings=tuple(warnings),
        fleet=fleet, exit_when_idle_s=_idle_exit(d, fleet is not None, source), **queue_caps,
        max_client_priority=Priority[d.max_client_priority],
    )


def _witness_check_warnings(circuits: dict[str, CircuitConfig], verify: bool, source: str) -> list[str]:
    """What checks a circom circuit's witnesses when its table gives no r1cs (accepted: a one-shot
    ``groth16 prove`` without --r1cs is the same): only the self-verification, or nothing."""
    out = []
    for cid, cc in sorted(circuits.items()):
        if cc.spec.synthetic is not None or cc.spec.r1cs is not None:
            continue
        out.append(f"{source}: circuits.{cid} has no r1cs: " + (
            "a witness is checked only by the proof's self-verification (an unsatisfied one fails its job "
            "without naming the constraint)" if verify else
            "and pipeline.verify_proofs = false: an unsatisfied witness gives a proof that does not verify, "
            "returned as done"))
    return out


def _queue_caps(d: DaemonSection, source: str) -> dict[str, int]:
    """``daemon.max_queued_jobs``, ``max_queued_input`` (bytes) and ``max_jobs_per_owner``, checked: the
    caps that keep the unfinished jobs' inputs (held in memory until each job finishes) bounded."""
    if d.max_queued_jobs < 1:
        raise ConfigError(f"{source}: daemon.max_queued_jobs: must be >= 1, got {d.max_queued_jobs}")
    if d.max_jobs_per_owner < 0:
        raise ConfigError(f"{source}: daemon.max_jobs_per_owner: must be >= 0 (0: no cap), got "
                          f"{d.max_jobs_per_owner}")
    size = parse_size(d.max_queued_input, f"{source}: daemon.max_queued_input")
    assert size is not None
    return {"max_queued_jobs": d.max_queued_jobs, "max_queued_input_bytes": size,
            "max_jobs_per_owner": d.max_jobs_per_owner}


def _idle_exit(d: DaemonSection, in_fleet: bool, source: str) -> float:
    """``daemon.exit_when_idle`` in seconds (0: never). A fleet box takes jobs from the shared
    queue, not only from its connections, so it never counts as idle: the two are refused together."""
    s = parse_duration(d.exit_when_idle, f"{source}: daemon.exit_when_idle")
    if s and in_fleet:
        raise ConfigError(f"{source}: daemon.exit_when_idle: a fleet box serves the shared queue and "
                          "is never idle; leave it 0 (never) with [fleet]")
    return s


def _threads(s: SynthesisSection) -> int | None:
    """``threads_per_partition`` (or its older name ``threads``); None for "auto" (or 0)."""
    if s.threads is not None:
        return s.threads or None
    per = s.threads_per_partition
    return None if per == "auto" or per == 0 else per


def _given_shape(cfg: RawConfig) -> dict[str, int]:
    """The shape values the file gives: ``host_budget`` derives only the others."""
    given = {"ring_slots": cfg.pipeline.ring_slots, "partition_workers": cfg.synthesis.partition_workers,
             "threads_per_partition": _threads(cfg.synthesis)}
    return {name: value for name, value in given.items() if value is not None}


def _validate_engine(engine: EngineConfig, cfg: RawConfig, given: dict[str, int], source: str) -> None:
    """:meth:`EngineConfig.validate`, its messages naming the file's keys (:data:`ENGINE_KEYS`), so
    that ``--check`` refuses what the engine would refuse at the start."""
    def key(field: str) -> str:
        name = ENGINE_KEYS[field]
        if field == "synthesis_threads" and cfg.synthesis.threads is not None:
            name = "synthesis.threads"
        if field in SHAPE_FIELDS and SHAPE_FIELDS[field] not in given:
            name += " (derived from memory.host_budget)"
        return f"{source}: {name}"

    engine.validate(key)


def _max_frame(d: DaemonSection, source: str) -> int:
    """``daemon.max_frame_bytes``: a u32 length prefix, and room for the reply of a one-partition job
    (a smaller limit would refuse every submit)."""
    value = parse_size(d.max_frame_bytes, f"{source}: daemon.max_frame_bytes")
    assert value is not None
    least = P.job_reply_bytes(1)
    if value < least:
        raise ConfigError(f"{source}: daemon.max_frame_bytes: {value} bytes cannot carry the reply of a job of one "
                          f"partition (at least {least} bytes: its proof), so every submit would be refused; set "
                          f"at least {least}")
    if value > 2**32 - 1:
        raise ConfigError(f"{source}: daemon.max_frame_bytes: {value} bytes is more than a u32 length prefix "
                          f"holds (at most {2**32 - 1}, 4GiB-1)")
    return value


def _host_budget(m: MemorySection, total: int, margin: int, queue: int, source: str, *,
                 auto_total: bool) -> int:
    """``memory.host_budget`` in bytes ("auto": total_budget - safety_margin - the queue's bytes); more
    than that is refused: the pipeline's memory is part of the total, the margin is kept free, and the
    inputs of the daemon's unfinished jobs (``queue``: :func:`~cuzk_mp.daemon.budget.queue_bound`) are
    held beside the pipeline, not in it."""
    host = parse_size(m.host_budget, f"{source}: memory.host_budget", allow_auto=True)
    most = total - margin - queue
    if most <= 0:
        raise ConfigError(
            f"{source}: memory.total_budget: {fmt_bytes(total)} does not cover memory.safety_margin "
            f"({fmt_bytes(margin)}) and the queued jobs' inputs ({fmt_bytes(queue)}: daemon.max_queued_input, "
            "max_queued_jobs and max_frame_bytes allow that much); raise memory.total_budget, or lower "
            "daemon.max_queued_input")
    if host is None:
        return most
    if host > most:
        whose = "auto: this machine's memory, " if auto_total else ""
        raise ConfigError(
            f"{source}: memory.host_budget: {fmt_bytes(host)} is more than memory.total_budget "
            f"({whose}{fmt_bytes(total)}) less memory.safety_margin ({fmt_bytes(margin)}) and the queued "
            f"jobs' inputs ({fmt_bytes(queue)}, daemon.max_queued_input): at most {fmt_bytes(most)} ({most} "
            "bytes); lower memory.host_budget or daemon.max_queued_input, or raise memory.total_budget")
    return host


def load_config(path: str | Path) -> DaemonConfig:
    """Read, validate and resolve the TOML file at ``path`` (ConfigError naming the key)."""
    path = Path(path)
    try:
        data = path.read_bytes()  # a folder, a file this user may not read: OSError, exit 2 naming the file
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    try:
        raw = tomllib.loads(data.decode())
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"{path}: not valid TOML: not UTF-8 text: byte 0x{data[e.start]:02x} at byte offset "
                          f"{e.start} (line {line})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    cfg = resolve(raw, base=path.resolve().parent, source=str(path))
    return replace(cfg, path=path.resolve())
