"""The ``[fleet]`` section of the daemon's configuration: the shared queue's database and this box.

This module owns the section's shape (:class:`FleetSection`, decoded by msgspec with unknown keys
refused, like every other section of the daemon's file) and its resolved form
(:class:`FleetConfig`, every duration in seconds). It imports nothing from the queue library, so
the daemon's configuration can include it without loading the fleet layer: a daemon whose
``[fleet] dsn`` is empty runs alone, exactly as without the section.

Durations are parsed by the daemon configuration's own parser, passed in by the caller
(``resolve_fleet(..., duration=parse_duration)``), which keeps imports one-way: the daemon's
configuration includes this module, never the reverse.
"""

from __future__ import annotations

import importlib.util
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from cuzk_mp.errors import ConfigError

DurationValue = int | float | str
DurationParser = Callable[[object, str], float]

BOX_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
DSN_SCHEMES = ("postgresql://", "postgres://")
# A box must renew its claims several times within the stall timeout, or one slow heartbeat
# (a busy database, a GC pause) would hand its running jobs to another box.
MIN_HEARTBEATS_PER_STALL = 3


class FleetSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[fleet]``: the shared PostgreSQL queue (off while ``dsn`` is empty)."""

    dsn: str = ""
    box: str = ""
    heartbeat_interval: DurationValue = "5s"
    stall_timeout: DurationValue = "30s"
    max_attempts: int = 3
    retry_delay: DurationValue = "2s"
    connect_timeout: DurationValue = "10s"
    inputs_dir: str = ""
    max_jobs: int = 0


@dataclass(frozen=True)
class FleetConfig:
    """The resolved section: what :meth:`Fleet.connect` needs (checked by :func:`check_fleet`).

    ``inputs_dir`` is where this box writes the inputs of the jobs its clients submit (a
    directory every box can read at the same path, e.g. a network mount); None means clients
    pass their own references. ``max_jobs`` is how many jobs this box runs at once; 0 lets the
    daemon choose (one per prover process).

    ``reconnect_max_s`` is the longest wait between two attempts to restore the box's LISTEN link
    after the database was lost (the waits grow from 0.2 s to it). The link's return also renews the
    box's connection pool, whose own waits between attempts keep doubling through an outage, so this
    bounds how soon after the database's return a box works again, whatever the outage's length. Not
    a key of the configuration file: the default serves every fleet (tests shorten it).
    """

    dsn: str
    box: str
    heartbeat_interval_s: float = 5.0
    stall_timeout_s: float = 30.0
    max_attempts: int = 3
    retry_delay_s: float = 2.0
    connect_timeout_s: float = 10.0
    inputs_dir: Path | None = None
    max_jobs: int = 0
    reconnect_max_s: float = 5.0


def redact_dsn(dsn: str) -> str:
    """The DSN with any password replaced by ``***`` (for logs and messages)."""
    dsn = re.sub(r"(://[^/@:]*:)[^/@]*@", r"\1***@", dsn)
    return re.sub(r"(password\s*=\s*)('[^']*'|\S+)", r"\1***", dsn)


def check_fleet(cfg: FleetConfig, key: str) -> None:
    """Reject values that cannot work; ConfigError naming ``key.<field>``."""
    if not (cfg.dsn.startswith(DSN_SCHEMES) or "=" in cfg.dsn):
        raise ConfigError(f"{key}.dsn: expected a PostgreSQL URI (postgresql://user@host/db) or "
                          f"libpq key=value pairs, got {redact_dsn(cfg.dsn)!r}")
    if not BOX_NAME_RE.match(cfg.box):
        raise ConfigError(f"{key}.box: 1-64 of letters, digits, '_', '.', '-' starting with a letter "
                          f"or digit, got {cfg.box!r}")
    if cfg.heartbeat_interval_s <= 0:
        raise ConfigError(f"{key}.heartbeat_interval: must be > 0, got {cfg.heartbeat_interval_s:g} s")
    if cfg.stall_timeout_s < MIN_HEARTBEATS_PER_STALL * cfg.heartbeat_interval_s:
        raise ConfigError(f"{key}.stall_timeout: must be at least {MIN_HEARTBEATS_PER_STALL} x "
                          f"heartbeat_interval ({MIN_HEARTBEATS_PER_STALL * cfg.heartbeat_interval_s:g} s), "
                          f"got {cfg.stall_timeout_s:g} s")
    if cfg.max_attempts < 1:
        raise ConfigError(f"{key}.max_attempts: must be >= 1, got {cfg.max_attempts}")
    if cfg.connect_timeout_s <= 0:
        raise ConfigError(f"{key}.connect_timeout: must be > 0, got {cfg.connect_timeout_s:g} s")
    if cfg.reconnect_max_s <= 0:
        raise ConfigError(f"{key}.reconnect_max_s: must be > 0, got {cfg.reconnect_max_s:g} s")
    if cfg.max_jobs < 0:
        raise ConfigError(f"{key}.max_jobs: must be >= 0 (0: one per prover process), got {cfg.max_jobs}")


def resolve_fleet(section: FleetSection, *, source: str, base: Path,
                  duration: DurationParser) -> FleetConfig | None:
    """The resolved ``[fleet]`` section, or None when ``dsn`` is empty (this box runs alone).

    ``duration(value, key)`` parses a duration (the daemon configuration's ``parse_duration``);
    ``base`` is the directory relative paths are taken from; ``source`` names the file in
    messages. ``box`` defaults to the host name.
    """
    if not section.dsn:
        return None
    key = f"{source}: fleet"
    if importlib.util.find_spec("pgqueuer") is None or importlib.util.find_spec("psycopg") is None:
        raise ConfigError(f"{key}.dsn: a fleet needs the optional `fleet` extra (pgqueuer, psycopg): "
                          "pip install '/path/to/cuzk-mp[fleet]' (the checkout's folder) where the daemon runs")
    inputs_dir = None
    if section.inputs_dir:
        inputs_dir = Path(section.inputs_dir).expanduser()
        inputs_dir = inputs_dir if inputs_dir.is_absolute() else base / inputs_dir
    cfg = FleetConfig(dsn=section.dsn, box=section.box or socket.gethostname().split(".")[0],
                      heartbeat_interval_s=duration(section.heartbeat_interval, f"{key}.heartbeat_interval"),
                      stall_timeout_s=duration(section.stall_timeout, f"{key}.stall_timeout"),
                      max_attempts=section.max_attempts,
                      retry_delay_s=duration(section.retry_delay, f"{key}.retry_delay"),
                      connect_timeout_s=duration(section.connect_timeout, f"{key}.connect_timeout"),
                      inputs_dir=inputs_dir, max_jobs=section.max_jobs)
    check_fleet(cfg, key)
    return cfg
