"""The checks on the daemon's configuration that each look at one part of the file: a circuit's
key files, thread and device counts, the socket mode, the tokens, the queue caps, the frame limit,
the idle exit and the host budget.

Why a module of its own: each check turns one table's values into what the daemon uses, or a
ConfigError that names the key, and none of them needs the rest of the file; :mod:`.config`
calls them while it resolves the whole (:func:`~.config.resolve`) and keeps the checks that weigh
one part against another (the engine's shape and memory budget).
"""

from __future__ import annotations

import re
from pathlib import Path

from cuzk_mp.daemon import protocol as P
from cuzk_mp.daemon.config_file import DaemonSection, MemorySection, RawConfig, parse_duration
from cuzk_mp.daemon.transport import Address
from cuzk_mp.errors import ConfigError
from cuzk_mp.logs import fmt_bytes
from cuzk_mp.pipeline.memory import parse_size

_TOKEN_RE = re.compile(r"^[\x21-\x7e]{16,256}$")


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
