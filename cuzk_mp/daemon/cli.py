"""The ``cuzk-mp daemon`` and ``cuzk-mp client`` verbs.

This module owns the command-line face of the daemon package: ``add_parsers(subparsers)`` adds
both verbs to the one ``cuzk-mp`` parser (cuzk_mp/cli.py), and each verb has a run function.

``cuzk-mp daemon --config FILE`` serves until SIGTERM/SIGINT (``--check`` only validates the
file, prints what it resolved to, sizes in GiB, and warnings about weak access settings and keys
it ignores). The command line's ``--log-level`` (or ``-v``) overrides ``[logging] level``. Its
exit codes: 0 stopped after a drain (or ``--check`` passed); 1 start-up failed (the engine: the
message says why); 2 the configuration is invalid (or a listen address is taken); 65
(EX_DATAERR) the journal is damaged or missing (the message names the file and how to start
afresh; nothing was changed); 75 (EX_TEMPFAIL) another daemon already runs with this journal,
socket or shm prefix (this one changed nothing).

``cuzk-mp client VERB --connect ADDR`` talks to a daemon (ADDR defaults to
``$CUZK_MP_CONNECT``, else ``127.0.0.1:9820``; ``--token`` defaults to ``$CUZK_MP_TOKEN``)::

    submit  --circuit ID [INPUT.json|INPUT.wtns ...] [--partitions N] [--priority P]
            [--request-id R]                       -> {"job_id", "state", "duplicate"}
    await   JOB_ID [--timeout S] [--out DIR]       -> job summary (proofs written with --out)
    prove   --circuit ID --out DIR [INPUT ...]     -> DIR/proof_<i>.json, public_<i>.json,
                                                      verification_key.json; job summary
    cancel  JOB_ID | status [--detail] | metrics | preload ID | evict ID
    ready                                          -> exit 0 if the daemon is running and
                                                      serving, 1 if not (yet), 3 if unreachable
                                                      (scripts/wait-ready.sh polls it)

A synthetic circuit given no inputs gets seeds 0..P-1 (P = ``--partitions`` or the circuit's
configured default). Exit codes: 0 success; 1 the job failed or was cancelled (or an eviction
was refused); 2 bad input (the daemon's InputError, a bad file, a missing or refused token, an
argument out of range such as ``--timeout nan``, ``inf``, ``1e300`` or a negative one); 3 the
daemon could not be reached (or broke the connection, or ADDR answers HTTP: the status port); 124
AwaitProof/Prove timed out (the job goes on). A job that did not end done ends ``await`` and ``prove``
with one line on stderr after its summary, as every failing command ends.
"""

from __future__ import annotations

import argparse
import contextlib
import asyncio
import json
import multiprocessing
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cuzk_mp.errors import InputError, Terminated
from cuzk_mp.logs import final_error
from cuzk_mp.stdout import print_result
from cuzk_mp.paths import FileArg
from cuzk_mp.exit_codes import (
    EXIT_ALREADY_RUNNING, EXIT_FAILED, EXIT_INPUT, EXIT_INTERRUPTED, EXIT_JOURNAL_DAMAGED,
    EXIT_TIMEOUT, EXIT_UNREACHABLE,
)

PRIORITIES = ("CRITICAL", "HIGH", "NORMAL", "LOW")


def _timeout_arg(text: str) -> float:
    """argparse type of --timeout: seconds, finite, 0..MAX_TIMEOUT_S (else exit 2 with a message)."""
    from cuzk_mp.daemon.client import check_timeout

    try:
        value = float(text)
        return check_timeout(value)  # type: ignore[return-value]
    except (ValueError, InputError):
        from cuzk_mp.daemon.protocol import MAX_TIMEOUT_S
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds in 0..{MAX_TIMEOUT_S:g} "
                                         "(leave --timeout out to wait until the job ends)") from None


def _count_arg(text: str) -> int:
    """argparse type of --partitions: 1..MAX_PARTITIONS."""
    from cuzk_mp.daemon.protocol import MAX_PARTITIONS

    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_PARTITIONS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a partition count in 1..{MAX_PARTITIONS}")
    return value


def _frame_arg(text: str) -> int:
    """argparse type of --max-frame-bytes: 1 KiB .. 4 GiB - 1 (the u32 length prefix)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1024 <= value <= 2**32 - 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a byte count in 1024..4294967295")
    return value


CONNECT_ENV = "CUZK_MP_CONNECT"
DEFAULT_CONNECT = "127.0.0.1:9820"  # the daemon's default [daemon] listen


def _connect_address(args: argparse.Namespace) -> Any:
    """The daemon's address: ``--connect``, else ``$CUZK_MP_CONNECT`` (set but empty is unset, as the
    scripts read it with ``${CUZK_MP_CONNECT:-...}``), else :data:`DEFAULT_CONNECT`; ``args.connect``
    is left as the text the messages name. A malformed value from the environment is a ConfigError that
    names the variable: the command line the user reads shows no address at all."""
    from cuzk_mp.daemon.transport import parse_address
    from cuzk_mp.errors import ConfigError

    if args.connect is not None:
        return parse_address(args.connect)
    args.connect = os.environ.get(CONNECT_ENV) or DEFAULT_CONNECT
    try:
        return parse_address(args.connect)
    except ConfigError as e:
        raise ConfigError(f"${CONNECT_ENV}: {e}") from None


OUT_FOLDER = FileArg("folder", output=True, folder=True)  # client's --out: made if missing


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``daemon`` and ``client`` verbs to the ``cuzk-mp`` parser."""
    d = subparsers.add_parser("daemon", help="run the proving daemon (SIGTERM/SIGINT drain it)")
    d.add_argument("--config", required=True, type=FileArg("config file"), help="the TOML configuration file")
    d.add_argument("--check", action="store_true", help="validate the configuration and exit")
    d.set_defaults(func=run_daemon)

    c = subparsers.add_parser("client", help="talk to a running daemon")
    c_sub = c.add_subparsers(dest="verb", required=True)

    def verb(name: str, help_text: str) -> argparse.ArgumentParser:
        p = c_sub.add_parser(name, help=help_text)
        p.add_argument("--connect", help=f"unix:///path or host:port (default ${CONNECT_ENV} or {DEFAULT_CONNECT})")
        p.add_argument("--max-frame-bytes", type=_frame_arg, metavar="BYTES",
                       help="the largest frame this client sends or takes, 1024..4294967295 (default 134217728 "
                            "= 128 MiB, as the daemon's [daemon] max_frame_bytes): a reply over it ends the call "
                            "(exit 2); raise both for jobs of many partitions")
        p.add_argument("--token", default=None,
                       help="the daemon's shared-secret token (default $CUZK_MP_TOKEN)")
        p.set_defaults(func=run_client)
        return p

    def job_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--circuit", required=True, help="circuit id from the daemon's config")
        p.add_argument("inputs", nargs="*", type=FileArg("input"), help="input .json / .wtns per partition")
        p.add_argument("--partitions", type=_count_arg, help="synthetic circuits: seeds 0..N-1")
        p.add_argument("--priority", choices=PRIORITIES,
                       help="the job's queue priority (default: the circuit's configured one)")
        p.add_argument("--request-id", default="", help="idempotency key (and the job id); default: a fresh "
                       "one, named if the daemon is lost")

    job_args(verb("submit", 'queue a job, print {"job_id", "state", "duplicate"} as JSON'))
    a = verb("await", "wait for a job")
    a.add_argument("job_id", help="the job's id (submit's job_id, the --request-id it was sent with)")
    a.add_argument("--timeout", type=_timeout_arg, help="seconds to wait (default: until it ends; exit 124 "
                   "after, the job goes on)")
    a.add_argument("--out", type=OUT_FOLDER, help="write proofs, public signals and the vk here")
    p = verb("prove", "submit, wait, write DIR/proof_<i>.json, public_<i>.json, vk")
    job_args(p)
    p.add_argument("--out", required=True, type=OUT_FOLDER, help="write proofs, public signals and the vk here")
    p.add_argument("--timeout", type=_timeout_arg, help="seconds to wait (default: until it ends; exit 124 "
                   "after, the job goes on)")
    verb("cancel", "cancel a job").add_argument("job_id", help="the job's id (submit's job_id, the --request-id "
                                                 "it was sent with)")
    verb("status", "print the status JSON").add_argument(
        "--detail", action="store_true", help="include paths and process ids (admin token)")
    verb("ready", "exit 0 if the daemon is running and serving, 1 if not, 3 if unreachable, 2 if it refuses "
         "the call (a token missing or wrong)")
    verb("metrics", "print the Prometheus metrics")
    for name, what in (("preload", "load a circuit's proving key"), ("evict", "unload a circuit's proving key")):
        p = verb(name, what)
        p.add_argument("circuit_id", nargs="?", help="circuit id from the daemon's config")
        p.add_argument("--circuit", dest="circuit_flag", help="the same, as submit and prove take it")


def run_daemon(args: argparse.Namespace) -> int:
    """``cuzk-mp daemon``: load the config, then serve until a signal drains the daemon."""
    import logging

    from cuzk_mp.daemon.access import config_warnings
    from cuzk_mp.daemon.config import load_config
    from cuzk_mp.daemon.instance_lock import AlreadyRunning
    from cuzk_mp.daemon.journal import JournalDamaged
    from cuzk_mp.daemon.ops import setup_logging
    from cuzk_mp.daemon.server import serve

    cfg = load_config(args.config)
    check_writable_places(cfg)
    warnings = [*cfg.warnings, *config_warnings(cfg)]
    if args.check:
        for w in warnings:
            print(f"cuzk-mp daemon: warning: {w}", file=sys.stderr)
        print(check_summary(cfg, len(warnings)))
        return 0
    multiprocessing.current_process().name = "cuzk-daemon"
    setup_logging(_log_level(args) or cfg.log_level, cfg.log_format)
    for w in warnings:
        logging.getLogger("cuzk_mp.daemon").warning("[start] %s", w)
    try:
        return asyncio.run(serve(cfg))
    except AlreadyRunning as e:
        return final_error(EXIT_ALREADY_RUNNING, str(e), prefix="cuzk-mp daemon", logger=__name__,
                           names=[cfg.journal_path])
    except JournalDamaged as e:
        return final_error(EXIT_JOURNAL_DAMAGED, f"refusing to start: {e}", prefix="cuzk-mp daemon", logger=__name__,
                           names=[cfg.journal_path])


def _log_level(args: argparse.Namespace) -> str | None:
    """The command line's level (``--log-level``, else ``-v`` INFO / ``-vv`` DEBUG), if it gives one."""
    verbose = getattr(args, "verbose", 0) or 0
    level: str | None = getattr(args, "log_level", None)
    return level or ("DEBUG" if verbose >= 2 else "INFO" if verbose else None)


def check_writable_places(cfg: Any) -> None:
    """The folders the daemon writes (the journal's, the param cache) must be folders it may write,
    or be makeable in one, and a unix socket's must keep other users out, with a regular file or
    nothing at the socket's lock file (``<socket>.lock``): a ConfigError naming the key otherwise (at
    ``--check`` too), rather than an OSError from deep inside the start."""
    from cuzk_mp.daemon.access import check_socket_places
    from cuzk_mp.daemon.instance_lock import check_lock_file
    from cuzk_mp.daemon.transport import foreign_file
    from cuzk_mp.errors import ConfigError
    from cuzk_mp.paths import folder_problem

    check_socket_places(cfg)
    source = cfg.path or "config"
    places = [("srs.param_cache", cfg.param_cache), ("daemon.journal", cfg.journal_path.parent)]  # the cache first:
    # the journal's default place is in it
    for key, addr in (("daemon.listen", cfg.listen), ("daemon.status_listen", cfg.status_listen)):
        if addr is not None and addr.kind == "unix":
            places.append((key, Path(addr.path).parent))
            problem = foreign_file(addr.path)
            if problem is not None:
                raise ConfigError(f"{source}: {key}: {problem}; the daemon will not replace it (remove it, or "
                                  "name another path)")
            check_lock_file(f"{source}: {key}", Path(addr.path + ".lock"))
    for key, folder in places:
        problem = folder_problem(folder)
        if problem is not None:
            raise ConfigError(f"{source}: {key}: {folder} cannot be written: {problem}")
    from cuzk_mp.daemon.journal_files import check_start_files  # the journal's own files, where they are there

    check_start_files(cfg.journal_path, f"{source}: daemon.journal")


def check_summary(cfg: Any, warnings: int = 0) -> str:
    """What ``daemon --check`` prints of a valid config: where it listens, the circuits, the pipeline's
    shape, the memory split (sizes in GiB) and the access rules."""
    from cuzk_mp.backends import resolve_backend_name
    from cuzk_mp.logs import fmt_bytes

    e = cfg.engine
    devices = "every visible device" if e.devices is None else ", ".join(map(str, e.devices))
    backend = f"auto backend ({resolve_backend_name('auto')} on this machine)" if e.backend == "auto" \
        else f"{e.backend} backend"
    return (f"{cfg.path}: OK ({len(cfg.circuits)} circuits, listen {cfg.listen}"
            f"{f', {warnings} warnings' if warnings else ''})\n"
            f"  engine: {backend}, devices {devices}, {e.partition_workers} synthesis workers x "
            f"{e.synthesis_threads} threads, {e.ring_slots} ring slots, shm prefix {e.shm_prefix}\n"
            f"  memory: total {fmt_bytes(cfg.memory_total_bytes)}, safety margin {fmt_bytes(cfg.safety_margin_bytes)}, "
            f"queued jobs' inputs {fmt_bytes(cfg.queue_bytes)}, "
            f"pipeline (host budget) {fmt_bytes(cfg.host_budget_bytes)}, proving keys {fmt_bytes(e.srs_budget_bytes)}\n"
            f"  access: {_access_summary(cfg)}\n"
            f"  files: journal {cfg.journal_path}, param cache {cfg.param_cache}")


def _access_summary(cfg: Any) -> str:
    """Who may do what, as ``--check`` shows it: the tokens counted (never shown) and the priority cap."""
    if not (cfg.tokens or cfg.admin_tokens):
        return "no tokens (every caller is an administrator and asks any priority)"
    return (f"{len(cfg.tokens)} client tokens, {len(cfg.admin_tokens)} admin tokens; a client's job asks at most "
            f"priority {cfg.max_client_priority.name} (daemon.max_client_priority) or its circuit's own")


def _summary(reply: Any) -> dict[str, Any]:
    """What ``client prove``/``await`` print of a JobReply (``failed_on`` only where a fleet job has any)."""
    return {
        "job_id": reply.job_id, "circuit_id": reply.circuit_id, "state": reply.state,
        "timed_out": reply.timed_out, "error": reply.error, "error_kind": reply.error_kind,
        **({"failed_on": reply.failed_on} if reply.failed_on else {}),
        "submitted_at": reply.submitted_at, "finished_at": reply.finished_at,
        "partitions": [{"index": p.index, "state": p.state, "device": p.device,
                        "attempts": p.attempts, "total_s": p.timings.get("total"),
                        "error": p.error} for p in reply.partitions],
    }


class _StdoutClosed(Exception):
    """stdout was closed by its reader (``client status | head``): not the daemon's connection."""


def _out(text: str) -> None:
    """The verb's result on stdout (:func:`~cuzk_mp.stdout.print_result`: exit 2 where it cannot be written);
    a reader gone early is told apart from the daemon's connection, which is a ConnectionError too."""
    try:
        print_result(text)
    except BrokenPipeError:
        raise _StdoutClosed() from None


def _print(obj: Any) -> None:
    _out(json.dumps(obj, indent=1, default=str) + "\n")


def _partitions(client: Any, args: argparse.Namespace) -> list[Any]:
    from cuzk_mp.daemon.client import partition_from_file, synthetic_partitions

    if args.inputs:
        if args.partitions is not None:
            raise InputError("--partitions is for synthetic circuits without input files")
        return [partition_from_file(p, client.max_frame_bytes) for p in args.inputs]
    count = args.partitions
    if count is None:
        circuits = client.status()["daemon"]["circuits"]
        if args.circuit not in circuits:
            raise InputError(f"--circuit: unknown circuit {args.circuit!r} "
                             f"(configured: {', '.join(sorted(circuits))})")
        if circuits[args.circuit]["synthetic"] is None:
            raise InputError(f"circuit {args.circuit!r} needs input files (.json or .wtns)")
        count = circuits[args.circuit]["partitions"]
    return synthetic_partitions(count)


def _finish_job(client: Any, reply: Any, out: Path | None, timeout_s: float | None) -> int:
    """Write a done job's files to ``out`` (if given) and print its summary. Where a file cannot be
    written (a full disk) the summary is printed all the same, then the OutputError says how to
    write the files again; where the daemon has no verification key of the job's circuit now (it left
    the config after the job was proved) the proofs and the summary are written, then an OutputError
    names the key file. A job that did not end done (failed, cancelled, or still waited for after
    ``timeout_s``) ends the command with one line on stderr too, as every failing command ends: a
    script that keeps stderr as its log learns there which job and why, and how to go on."""
    from cuzk_mp.daemon.client import write_outputs
    from cuzk_mp.errors import InputError, OutputError

    no_key = None  # why the daemon has no verification key of the job's circuit now
    if out is not None and reply.state == "done":
        try:
            vk = client.vk_reply(reply.circuit_id)
        except InputError as e:  # the circuit left the config after the job was proved: its proofs are still its
            vk, no_key = None, str(e)
        try:
            write_outputs(reply, out, vk)
        except OutputError as e:
            unprinted = ""
            try:
                _print(_summary(reply))
            except OutputError as summary:  # the same full disk under stdout: the line still names the job
                unprinted = f" (and {summary.path}: {summary.problem})"
            raise OutputError(e.path, f"{e.problem}{unprinted}; the job is done: `cuzk-mp client await {reply.job_id} "
                                      "--out DIR` writes its files again while the daemon keeps its result ([daemon] "
                                      "result_ttl)") from None
    _print(_summary(reply))
    if no_key is not None:
        assert out is not None
        raise OutputError(out / "verification_key.json", f"not written: the daemon has no verification key of "
                                                         f"circuit {reply.circuit_id} now ({no_key}); the job's "
                                                         "proofs are written: verify them with the key they were "
                                                         "proved with")
    job = reply.job_id
    if reply.timed_out:
        waited = "" if timeout_s is None else f" after {timeout_s:g} s"  # None: the daemon's own limit
        return _client_error(EXIT_TIMEOUT, f"job {job} is still {reply.state}{waited}; it goes on in the daemon: "
                                           f"`cuzk-mp client await {job}` waits for it, `cuzk-mp client cancel {job}` "
                                           "stops it")
    if reply.state == "done":
        return 0
    if reply.state == "cancelled":
        return _client_error(EXIT_FAILED, f"job {job} was cancelled")
    return _client_error(EXIT_INPUT if _failed_on_input(reply) else EXIT_FAILED, f"job {job} failed: {_why(reply)}")


def _why(reply: Any) -> str:
    """What a failed job's reply says of its failure: the job's error, else its first failed partition's."""
    if reply.error:
        return str(reply.error)
    failed = [p for p in reply.partitions if p.error]
    if not failed:
        return f"{reply.error_kind or 'no reason given'}"
    more = f" (and {len(failed) - 1} more partitions)" if len(failed) > 1 else ""
    return f"partition {failed[0].index}: {failed[0].error}{more}"


def _failed_on_input(reply: Any) -> bool:
    """Whether a failed job failed on its input (a bad or unsatisfied witness, bad input JSON):
    exit 2, as the one-shot ``groth16 prove`` gives for the same file."""
    from cuzk_mp.errors import is_input_kind

    kinds = [reply.error_kind] + [p.error_kind for p in reply.partitions]
    return reply.state == "failed" and any(is_input_kind(k) for k in kinds)


@contextlib.contextmanager
def _naming_input_files(files: list[Path] | None) -> Iterator[None]:
    """A submit's refusal of one of its partitions names the input file it was read from
    (:func:`~cuzk_mp.daemon.client.name_input_file`), as ``groth16 prove --connect`` names its file."""
    from cuzk_mp.daemon.client import name_input_file

    try:
        yield
    except InputError as e:
        named = name_input_file(str(e), files or [])
        if named is None or type(e).__init__ is not InputError.__init__:
            raise
        raise type(e)(named) from None


def _client_verb(client: Any, args: argparse.Namespace) -> int:
    v = args.verb
    if v in ("preload", "evict"):
        if (args.circuit_id is None) == (args.circuit_flag is None):
            raise InputError(f"client {v}: give the circuit once (CIRCUIT or --circuit CIRCUIT)")
        args.circuit_id = args.circuit_id or args.circuit_flag
    if v in ("submit", "prove") and not args.request_id:  # made here, so a lost daemon can name the job
        args.request_id = uuid.uuid4().hex
    if v == "submit":
        with _naming_input_files(args.inputs):
            r = client.submit(args.circuit, _partitions(client, args), priority=args.priority,
                              request_id=args.request_id)
        _print({"job_id": r.job_id, "state": r.state, "duplicate": r.duplicate})
        return 0
    if v == "await":
        return _finish_job(client, client.await_proof(args.job_id, args.timeout), args.out, args.timeout)
    if v == "prove":
        with _naming_input_files(args.inputs):
            reply = client.prove(args.circuit, _partitions(client, args), priority=args.priority,
                                 request_id=args.request_id, timeout_s=args.timeout)
        return _finish_job(client, reply, args.out, args.timeout)
    if v == "cancel":
        r = client.cancel(args.job_id)
        _print({"job_id": r.job_id, "cancelled": r.cancelled, "state": r.state})
        return 0
    if v == "status":
        _print(client.status(args.detail))
        return 0
    if v == "ready":
        state = client.status()["daemon"]["state"]
        _out(state + "\n")
        return 0 if state == "running" else EXIT_FAILED
    if v == "metrics":
        _out(client.metrics())
        return 0
    if v == "preload":
        r = client.preload(args.circuit_id)
        _print({"circuit_id": r.circuit_id, "seconds": r.seconds})
        return 0
    r = client.evict(args.circuit_id)
    _print({"circuit_id": r.circuit_id, "evicted": r.evicted, "reason": r.reason})
    if r.evicted:
        return 0
    return _client_error(EXIT_FAILED, f"circuit {r.circuit_id} was not evicted: {r.reason or 'no reason given'}")


def run_client(args: argparse.Namespace) -> int:
    """``cuzk-mp client VERB``: one call to the daemon; the exit code says how it went."""
    from cuzk_mp.daemon.client import Client, check_out_folder
    from cuzk_mp.daemon.transport import DEFAULT_MAX_FRAME, CommClosedError, NotTheProtocol
    from cuzk_mp.errors import OutputError

    address = _connect_address(args)
    if getattr(args, "out", None) is not None:  # prove, await: before the job, not after it is proved
        check_out_folder(args.out)
    try:
        client = Client(address, max_frame_bytes=args.max_frame_bytes or DEFAULT_MAX_FRAME, token=args.token)
    except OSError as e:
        return _client_error(EXIT_UNREACHABLE, f"cannot reach the daemon at {args.connect}: {_not_reached(address, e)}")
    try:
        with client:
            return _client_verb(client, args)
    except _StdoutClosed:  # the reader of our output left: nothing more to say (the CLI's quiet exit)
        raise BrokenPipeError() from None
    except OutputError as e:  # stdout full: a submit's or prove's answer held the job's id, a fresh one
        if e.path != "stdout" or args.verb not in ("submit", "prove"):
            raise
        raise OutputError(e.path, f"{e.problem}; the daemon took the job: it goes on as job {args.request_id}: "
                                  f"`cuzk-mp client await {args.request_id}` waits for it and prints its summary"
                                  ) from None
    except NotTheProtocol as e:  # an HTTP server answered: the daemon was never reached, no job was taken
        return _client_error(EXIT_UNREACHABLE, f"cannot reach the daemon at {args.connect}: {e}")
    except (CommClosedError, ConnectionError, TimeoutError) as e:
        message = (f"the daemon at {args.connect} did not answer within the call's deadline (it hangs, or that "
                   "address takes connections and says nothing)" if isinstance(e, TimeoutError)
                   else f"lost the daemon at {args.connect}: {e}")
        if args.verb in ("submit", "prove") and args.request_id:
            message += (f"; if the daemon took the job, it goes on as job {args.request_id} (journaled, resumed "
                        f"after a restart): `cuzk-mp client await {args.request_id}`, or the same command with "
                        f"--request-id {args.request_id}, which never proves it twice")
        return _client_error(EXIT_UNREACHABLE, message)
    except KeyboardInterrupt as e:  # SIGINT, or SIGTERM, SIGHUP (Terminated): the daemon's job is not stopped by it
        if args.verb not in ("submit", "prove") or not args.request_id:
            raise
        code, what = (e.exit_code, e.what) if isinstance(e, Terminated) else (EXIT_INTERRUPTED, "interrupted")
        return _client_error(code, f"{what}; if the daemon took the job, it goes on as job {args.request_id}: "
                                   f"`cuzk-mp client await {args.request_id}` waits for it, `cuzk-mp client cancel "
                                   f"{args.request_id}` stops it")


def _not_reached(address: Any, e: OSError) -> str:
    """Why a connect failed: ``e``, or, where a unix address names something that is not a socket (its
    folder, a file), what is there: the kernel refuses such a connect as it refuses a stale socket's,
    and "Connection refused" points at a daemon that is down."""
    import stat

    if address.kind != "unix" or not isinstance(e, ConnectionRefusedError):
        return str(e)
    try:
        mode = os.stat(address.path).st_mode
    except OSError:
        return str(e)
    if stat.S_ISSOCK(mode):
        return str(e)
    what = "a folder" if stat.S_ISDIR(mode) else "a regular file" if stat.S_ISREG(mode) else "another kind of file"
    return f"{address.path} is {what}, not a socket: name the daemon's socket ([daemon] listen)"


def _client_error(code: int, message: str) -> int:
    """The line a failed client verb ends with (:func:`cuzk_mp.logs.final_error`)."""
    return final_error(code, message, prefix="cuzk-mp client", logger=__name__)
