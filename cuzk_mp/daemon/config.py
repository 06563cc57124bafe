"""The daemon's configuration resolved: every value of the file parsed, checked and mapped onto the engine.

This module owns the one configuration of ``cuzk-mp daemon``; what the file may say, and its
decoding into Structs whose errors name the key, is :mod:`.config_file`'s, and the checks that
each look at one table are :mod:`.config_checks`'. The resolved
:class:`DaemonConfig` carries the engine's :class:`EngineConfig`, one :class:`CircuitSpec` per
``[circuits.ID]`` table, and what ``[memory]`` decides (:mod:`.budget`): the pipeline's shape
where the file leaves it to ``host_budget``, and the SRS memory budget.

Relative paths in the file are taken relative to the directory that holds the file.

A file written for cuzk mostly works as it is: ``gpus.devices = []`` means every visible GPU and
``synthesis.threads = 0`` the automatic thread count, as there; ``logging.level`` takes cuzk's
``trace`` and ``warn``; and the keys of cuzk that mean nothing here
(:data:`~.config_file.FOREIGN_KEYS`) are accepted with a warning naming them, never silently.

The resolved engine config passes :meth:`EngineConfig.validate` with messages naming the file's keys,
so ``cuzk-mp daemon --check`` refuses whatever the engine would refuse at the start.
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cuzk_mp.daemon.budget import largest, memory_budget, queue_bound, shape_for
from cuzk_mp.daemon.config_checks import (
    _check_counts, _check_key_files, _check_tokens, _host_budget, _idle_exit, _max_frame, _queue_caps, _socket_mode,
)
from cuzk_mp.daemon.config_file import (
    LOG_LEVEL_ALIASES, LOG_LEVELS, CircuitSection, RawConfig, SynthesisSection, _decode, _foreign_keys, parse_duration,
)
from cuzk_mp.daemon.fleet.config import FleetConfig, FleetSection, resolve_fleet
from cuzk_mp.daemon.transport import Address, parse_address
from cuzk_mp.errors import ConfigError
from cuzk_mp.paths import default_cache_dir
from cuzk_mp.pipeline.memory import machine_memory_bytes, parse_size
from cuzk_mp.pipeline.types import CircuitSpec, EngineConfig, Priority

# Of [daemon] shutdown_grace, this much is kept for the engine's own stop (terminate its
# processes, 5 s, then kill), so that the whole drain stays within the grace; in-flight
# partitions get the rest to finish.
ENGINE_STOP_RESERVE_S = 6.0
# At the stop, the journal's last writes (the finished jobs' states) and its close are waited for this
# long at most: on a folder whose storage hangs an fsync never returns, and the process must still exit
# (those jobs run again after a restart). On a working disk they take milliseconds.
JOURNAL_STOP_WAIT_S = 10.0
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
        if not path.exists():  # a dangling symlink too
            raise ConfigError(f"{key}.{name}: file not found: {path}")
        check_regular_file(f"{key}.{name}", path)
        files[name] = path
    assert files["zkey"] is not None
    _check_key_files(key, files["zkey"], files["r1cs"])
    spec = CircuitSpec(circuit_id=cid, zkey=files["zkey"], wasm=files["wasm"],
                       r1cs=files["r1cs"], partitions=c.partitions)
    return CircuitConfig(spec, Priority[c.priority])


def check_regular_file(key: str, path: Path) -> None:
    """``path`` a regular file this process can open (ConfigError naming ``key`` and what it is
    otherwise): a FIFO, a device or an unreadable file is there, so "file not found" would send the
    operator looking for the wrong thing, and a FIFO read by a job (or opened by SQLite, the
    journal) would wait on its writer or fail with a message that does not say why."""
    import os

    from cuzk_mp.errors import InputError
    from cuzk_mp.formats.atomic import open_regular

    try:
        fd, _ = open_regular(path, str(path))
    except InputError as e:
        raise ConfigError(f"{key}: {e}") from None
    os.close(fd)


def default_shm_prefix(journal_path: Path) -> str:
    """The shm prefix of a daemon whose config sets none: ``cuzk-`` and a hash of the journal's
    real path, so the same config always gets the same prefix and a restart removes what a
    killed predecessor left in /dev/shm (two daemons never share a journal or a prefix: both
    are locked, see daemon.instance_lock)."""
    digest = hashlib.blake2b(str(journal_path.resolve()).encode(), digest_size=6).hexdigest()
    return f"cuzk-{digest}"


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

    def address(key: str, text: str) -> Address:
        try:
            return parse_address(text)
        except ConfigError as e:
            raise ConfigError(f"{source}: daemon.{key}: {e}") from None

    listen = address("listen", d.listen)
    status_listen = address("status_listen", d.status_listen) if d.status_listen else None
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
    unset = FleetSection()
    alone = [f"fleet.{k}" for k in FleetSection.__struct_fields__ if getattr(cfg.fleet, k) != getattr(unset, k)]
    if fleet is None and alone:
        warnings.append(f"{source}: {', '.join(alone)} given without fleet.dsn: this daemon runs alone (the fleet "
                        "is on only with a dsn)")
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


MAX_CONFIG_BYTES = 16 << 20  # far above any config (a thousand circuits and tokens take well under 1 MiB); a
# bound, so that a path that never ends (/dev/zero, a pipe whose writer goes on) is refused, not read until the
# process's memory runs out


def load_config(path: str | Path) -> DaemonConfig:
    """Read, validate and resolve the TOML file at ``path`` (ConfigError naming the key)."""
    from cuzk_mp.formats.atomic import read_at_most

    path = Path(path)
    try:
        with open(path, "rb") as f:  # a folder, a file this user may not read: OSError, exit 2 naming the file
            data = read_at_most(f, MAX_CONFIG_BYTES)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: more than {MAX_CONFIG_BYTES} bytes, more than a config file holds")
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
