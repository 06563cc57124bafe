"""The one ``cuzk-mp`` command line: snarkjs's Groth16 verbs, then the engine's own.

The snarkjs-compatible verbs take snarkjs's positional arguments, its short aliases and, where
snarkjs has them, its default file names, so a script can swap ``snarkjs`` for ``cuzk-mp``::

    cuzk-mp groth16 prove    [circuit_final.zkey] [witness.wtns] [proof.json] [public.json]   (g16p)
    cuzk-mp groth16 fullprove [input.json] [circuit.wasm] [circuit_final.zkey] [proof.json] [public.json]  (g16f)
    cuzk-mp groth16 verify   [verification_key.json] [public.json] [proof.json]               (g16v)
    cuzk-mp zkey export verificationkey [circuit_final.zkey] [circuit_vk.json]                (zkev)
    cuzk-mp wtns calculate   [circuit.wasm] [input.json] [witness.wtns]                       (wc)

plus ``setup``, ``circuit porep-like|dense-random``, ``shm clean``, ``bench``, ``daemon`` and ``client``.
This module owns the command's shape (its parsers, global options, exit codes and entry point);
what each verb does is :mod:`.cli_verbs`'. Heavy modules are imported inside the verbs so
``--help`` stays instant.

The global options (``--log-level``, ``-v``/``--verbose``) are accepted anywhere on the line,
as snarkjs accepts ``-v`` after its arguments. Every way out of :func:`main` is an exit code
from :data:`EXIT_CODES` with a one-line message on stderr, never a traceback (an unexpected
exception is reported as an internal error; ``--log-level DEBUG`` adds its traceback). That line is
one line whatever the message (:func:`.logs.final_error`), and a JSON log line where the logs are JSON.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from . import __version__
from .cli_verbs import (
    _cmd_circuit, _cmd_export_vk, _cmd_fullprove, _cmd_prove, _cmd_setup, _cmd_shm_clean, _cmd_verify,
    _cmd_wtns_calculate,
)
from .errors import (
    CuzkError, HungUp, InputError, ResourceError, Terminated, Unavailable, out_of_device_memory,
)
from .exit_codes import (
    EXIT_CODES, EXIT_FAILED, EXIT_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_RESOURCES,
    EXIT_UNREACHABLE,
)
from .logs import FORMATS, child_format, configure, final_error, library_level_problem
from .paths import FileArg

log = logging.getLogger("cuzk_mp.cli")

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
BACKENDS = ("auto", "cpu", "gpu")
BACKEND_HELP = "auto (the default): the GPU where CuPy sees one, else the CPU"


# --- the parsers -----------------------------------------------------------------------------

def _json_input(what: str) -> FileArg:
    """The type of a JSON input, which a pipe may give (/dev/stdin)."""
    return FileArg(what, stream="/dev/stdin")


# The positional files of each snarkjs verb: (dest, snarkjs 0.7.6's default name, help, its type).
ZKEY = ("zkey", "circuit_final.zkey", "proving key", FileArg("proving key"))
PROOF_OUT = ("proof", "proof.json", "proof written here", FileArg("proof", output=True, stream="/dev/stdout"))
PUBLIC_OUT = ("public", "public.json", "public signals written here",
              FileArg("public signals", output=True, stream="/dev/stdout"))
WASM = ("wasm", "circuit.wasm", "circom witness generator", FileArg("witness generator", stream="/dev/stdin"))
INPUT = ("input", "input.json", "circuit input", _json_input("circuit input"))
R1CS = FileArg("circuit")


@dataclass(frozen=True)
class SnarkjsVerb:
    """One snarkjs verb: its alias, its long form's words, its positional files and its function."""

    alias: str
    words: tuple[str, ...]
    help: str
    files: tuple[tuple[str, str, str, FileArg], ...]
    func: Callable[[argparse.Namespace], int]
    proves: bool = False  # takes --backend, --r1cs and --no-verify (every verb takes --protocol groth16)
    connects: bool = False  # takes --connect and --token (a running daemon proves)
    more_aliases: tuple[str, ...] = ()  # snarkjs's other short names of the verb

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        """The verb's positional files (each optional, with snarkjs's default) and options."""
        for dest, default, what, kind in self.files:
            p.add_argument(dest, type=kind, nargs="?", default=Path(default), help=f"{what} (default {default})")
        # snarkjs reads its options on any verb (and ignores those a verb has no use for)
        p.add_argument("--protocol", choices=("groth16",), default="groth16",
                       help="snarkjs's option, taken for its scripts: groth16 is the one protocol here")
        if self.proves:
            p.add_argument("--backend", default="auto", choices=BACKENDS, help=BACKEND_HELP)
            p.add_argument("--r1cs", type=R1CS,
                           help="check the witness against this circuit first (names the failing constraint)")
            p.add_argument("--no-verify", action="store_true",
                           help="skip the self-verification of the proof (benchmarks)")
        if self.connects:
            p.add_argument("--connect", metavar="ADDR",
                           help="prove through the running daemon at ADDR (unix:///path or host:port) whose "
                                "config has this key: no start-up here, ~0.2 s a small proof")
            p.add_argument("--token", default=os.environ.get("CUZK_MP_TOKEN", ""),
                           help="the daemon's shared-secret token (default $CUZK_MP_TOKEN): an admin token "
                                "where the daemon has tokens, as only an admin sees which file each key is")
            p.add_argument("--keep-warm", type=float, metavar="SECONDS",
                           help="prove through this user's warm daemon of the key, started when none runs and "
                                "gone after SECONDS without a proof (the SECONDS of the call that started it; at most "
                                "7 days): later proofs skip the start-up (default $CUZK_MP_KEEP_WARM, which --connect "
                                "overrides; unset or 0: a one-shot process)")
        p.set_defaults(func=self.func)


SNARKJS_VERBS = (
    SnarkjsVerb("g16p", ("groth16", "prove"), "a proof from a witness: ZKEY WTNS PROOF.json PUBLIC.json",
                (ZKEY, ("wtns", "witness.wtns", "witness", FileArg("witness")), PROOF_OUT, PUBLIC_OUT), _cmd_prove,
                proves=True, connects=True, more_aliases=("zpw",)),
    SnarkjsVerb("g16f", ("groth16", "fullprove"), "witness + proof in one call (no .wtns on disk): INPUT.json "
                "WASM ZKEY PROOF.json PUBLIC.json", (INPUT, WASM, ZKEY, PROOF_OUT, PUBLIC_OUT), _cmd_fullprove,
                proves=True, connects=True, more_aliases=("g16i",)),
    SnarkjsVerb("g16v", ("groth16", "verify"), "verify VK.json PUBLIC.json PROOF.json: prints OK! (exit 0) or "
                "why not (exit 1)",
                (("vk", "verification_key.json", "verification key", _json_input("verification key")),
                 ("public", "public.json", "public signals", _json_input("public signals")),
                 ("proof", "proof.json", "proof", _json_input("proof"))),
                _cmd_verify),
    SnarkjsVerb("zkev", ("zkey", "export", "verificationkey"), "export the verification key: ZKEY VK.json",
                (ZKEY, ("vk", "circuit_vk.json", "verification key written here (snarkjs's default name)",
                        FileArg("verification key", output=True, stream="/dev/stdout"))),
                _cmd_export_vk),
    SnarkjsVerb("wc", ("wtns", "calculate"), "calculate a witness: WASM INPUT.json WITNESS.wtns",
                (WASM, INPUT, ("wtns", "witness.wtns", "witness written here",
                               FileArg("witness", output=True, stream="/dev/stdout"))), _cmd_wtns_calculate),
)
GROUP_HELP = {("groth16",): "prove and verify (snarkjs's arguments)", ("zkey",): "zkey tools",
              ("zkey", "export"): "export parts of a zkey", ("wtns",): "witness tools"}


def _snarkjs_verbs(sub: argparse._SubParsersAction) -> None:
    groups: dict[tuple[str, ...], argparse._SubParsersAction] = {}
    for verb in SNARKJS_VERBS:
        parent = sub
        for depth in range(1, len(verb.words)):
            prefix = verb.words[:depth]
            if prefix not in groups:
                group = parent.add_parser(prefix[-1], help=GROUP_HELP[prefix])
                groups[prefix] = group.add_subparsers(dest=f"verb{depth}", required=True, metavar="VERB")
            parent = groups[prefix]
        verb.add_arguments(parent.add_parser(verb.words[-1], help=verb.help))
    for verb in SNARKJS_VERBS:
        verb.add_arguments(sub.add_parser(verb.alias, aliases=list(verb.more_aliases),
                                          help=f"= {' '.join(verb.words)} (snarkjs alias)"))


def _own_verbs(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("setup", help="INSECURE development setup: CIRCUIT.r1cs -> CIRCUIT.zkey (random "
                       "toxic waste)")
    s.add_argument("r1cs", type=R1CS, help="the circuit (circom's .r1cs)")
    s.add_argument("zkey", type=FileArg("proving key", output=True),
                   help="the proving key written here (snarkjs's .zkey)")
    s.add_argument("--backend", default="auto", choices=BACKENDS, help=BACKEND_HELP)
    s.set_defaults(func=_cmd_setup, default_log_level="INFO")  # long runs: progress, rate and ETA by default

    m = sub.add_parser("shm", help="the slot rings of engines in /dev/shm")
    m_sub = m.add_subparsers(dest="shm_verb", required=True, metavar="VERB")
    m_sub.add_parser("clean", help="remove the rings of this user's engines that are gone (killed with their "
                     "children): never a running process's ring nor another "
                     "user's; prints each object removed").set_defaults(func=_cmd_shm_clean)

    c = sub.add_parser("circuit", help="generate benchmark circuits")
    c_sub = c.add_subparsers(dest="kind", required=True)
    for kind, what in (("porep-like", "the PoRep-shaped synthetic circuit (80%% of the witness 0 or 1)"),
                       ("dense-random", "the dense synthetic circuit (every witness value full-width random)")):
        pl = c_sub.add_parser(kind, help=f"{what}: writes its .r1cs and a sample .wtns")
        pl.add_argument("--log-n", type=int, required=True, help="log2 of the number of rows (domain size)")
        pl.add_argument("out_dir", type=FileArg("folder", output=True, folder=True),
                        help=f"folder for {kind}-LOG_N.r1cs and {kind}-LOG_N.wtns (made if missing)")
        pl.add_argument("--seed", type=int, default=0, help="the sample witness's seed (default 0)")
        pl.add_argument("--partition", type=int, default=0,
                        help="the sample witness's partition index (default 0): each (seed, partition) is "
                             "another witness of the same circuit")
        pl.set_defaults(func=_cmd_circuit)


def _service_verbs(sub: argparse._SubParsersAction) -> None:
    """Verbs owned by the pipeline and daemon packages (each adds its own parsers)."""
    from .daemon.cli import add_parsers as add_daemon_parsers
    from .daemon.fleet.cli import add_parser as add_fleet_parser
    from .pipeline.bench import add_parser as add_bench_parser

    add_bench_parser(sub)
    add_daemon_parsers(sub)
    add_fleet_parser(sub)


def _log_level(value: str) -> str:
    level = value.upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"{value!r} is not a log level; use one of {', '.join(LOG_LEVELS)}")
    return level


def _epilog() -> str:
    codes = "\n".join(f"  {code:>3}  {what}" for code, what in EXIT_CODES)
    return ("--log-level and -v may stand anywhere on the line; CUZK_MP_LOG_FORMAT=json logs JSON lines;\n"
            "numba's and CuPy's own loggers stay at WARNING unless CUZK_MP_LIBRARY_LOG_LEVEL names a level.\n\n"
            f"exit codes:\n{codes}")


_NEGATIVE_VALUE = re.compile(r"^-\.?\d")


class _Parser(argparse.ArgumentParser):
    """argparse with a verb's options allowed between its positionals, as snarkjs allows them
    (``g16p k.zkey w.wtns --backend cpu proof.json public.json``): a verb's parser (one with no
    sub-verbs) parses intermixed; a parser of sub-verbs, or one argparse cannot intermix, as usual."""

    _intermixing = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """argparse's parser taking a word that starts like a negative number (``-1GiB``, ``-1e3``,
        ``-.5``) as the value it follows, as it takes ``-1`` and ``-1.5``: the option's own check then
        refuses it by name, where argparse said only "expected one argument". No option of cuzk-mp
        starts with a digit (argparse keeps such words options where a parser has one)."""
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = _NEGATIVE_VALUE  # the verbs' parsers are made by this class too

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        if self._intermixing:
            parsed, rest = super().parse_known_args(args, namespace)
            return parsed, self._double_dash_kept(args, rest)
        if any(isinstance(a, argparse._SubParsersAction) for a in self._actions):
            return super().parse_known_args(args, namespace)
        self._intermixing = True  # parse_known_intermixed_args calls back into this method
        try:
            return super().parse_known_intermixed_args(args, namespace)
        except TypeError:  # a feature intermixing does not support (REMAINDER, ...): as usual
            return super().parse_known_args(args, namespace)
        finally:
            self._intermixing = False

    def _double_dash_kept(self, args: Sequence[str] | None, rest: list[str]) -> list[str]:
        """``rest`` with the ``--`` of ``args`` put back before the words that followed it, where the
        first pass of an intermixed parse (the positionals set aside) took it: Python 3.11's does so
        for a ``--`` that no positional precedes, and its second pass then read the files after it
        as options (``g16p -- -k.zkey ...``: "unrecognized arguments: -k.zkey")."""
        if args is None or "--" not in args or not any(
                a.nargs == argparse.SUPPRESS for a in self._get_positional_actions()):  # not the first pass
            return rest
        after = list(args[list(args).index("--") + 1:])
        n = len(after)
        if n and rest[len(rest) - n:] == after and rest[len(rest) - n - 1: len(rest) - n] != ["--"]:
            return [*rest[: len(rest) - n], "--", *after]
        return rest

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        """A usage error: argparse's usage and message, or, where the log lines are JSON
        (``CUZK_MP_LOG_FORMAT=json``), one JSON line like them (:func:`~.logs.final_error`); exit 2."""
        if child_format() == "json":
            raise SystemExit(final_error(EXIT_INPUT, f"{self.prog}: {message}"))
        super().error(message)


def build_parser(services: bool = True) -> argparse.ArgumentParser:
    """The argument parser of ``cuzk-mp``; without ``services`` the engine's verbs (bench, daemon,
    client), whose parsers import the pipeline and daemon packages, are left out."""
    parser = _Parser(prog="cuzk-mp", description="Groth16 (BLS12-381) prover, snarkjs-compatible.",
                     epilog=_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"cuzk-mp {__version__}")
    parser.add_argument("--log-level", type=_log_level, metavar="LEVEL",
                        help=f"{', '.join(LOG_LEVELS)} (default WARNING; -v is INFO, -vv DEBUG)")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log lines (as snarkjs's -v)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _snarkjs_verbs(sub)
    _own_verbs(sub)
    if services:
        _service_verbs(sub)
    return parser


# Verbs whose parsers need nothing of the pipeline and daemon packages: a one-shot prove starts
# without importing them (and asyncio, multiprocessing) just to build the parser.
LOCAL_VERBS = frozenset({"groth16", "zkey", "wtns", "setup", "circuit", "shm",
                         *(a for v in SNARKJS_VERBS for a in (v.alias, *v.more_aliases))})


def _verb(argv: Sequence[str]) -> str | None:
    """The first word that is not a global option (after :func:`global_options_first`)."""
    i = 0
    while i < len(argv):
        if argv[i] == "--log-level":
            i += 2
        elif argv[i].startswith("-"):
            i += 1
        else:
            return argv[i]
    return None


def global_options_first(argv: Sequence[str]) -> list[str]:
    """``argv`` with ``--log-level X``, ``--log-level=X``, ``-v``/``-vv``/``--verbose`` moved to the front.

    argparse takes a top-level option only before the verb; snarkjs users put ``-v`` last.
    Nothing after a ``--`` moves. A ``--log-level`` without a value stays where it is, for
    argparse to report.
    """
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest.extend(argv[i:])
            break
        if arg == "--log-level" and i + 1 < len(argv):
            front += argv[i : i + 2]
            i += 2
            continue
        if arg.startswith("--log-level=") or arg == "--verbose" or (arg.startswith("-v") and set(arg[1:]) == {"v"}):
            front.append(arg)
        else:
            rest.append(arg)
        i += 1
    return front + rest


# --- the entry point -------------------------------------------------------------------------

def _configure_logging(args: argparse.Namespace) -> str:
    """Root logging at the chosen level, text or (``CUZK_MP_LOG_FORMAT=json``) JSON lines, on stderr.

    The level: ``--log-level``, else ``-v`` (INFO) / ``-vv`` (DEBUG), else the verb's default
    (INFO for ``setup``, whose progress lines are INFO), else WARNING. numba's and CuPy's loggers stay at
    WARNING or above unless ``CUZK_MP_LIBRARY_LOG_LEVEL`` says otherwise (:mod:`.logs`).
    """
    level: str = args.log_level or ("DEBUG" if args.verbose >= 2 else "INFO" if args.verbose
                                    else getattr(args, "default_log_level", "WARNING"))
    configure(level, child_format(), process="cuzk-mp", text_format=LOG_FORMAT)
    asked = os.environ.get("CUZK_MP_LOG_FORMAT")
    if asked is not None and asked not in FORMATS:
        log.warning("CUZK_MP_LOG_FORMAT=%s is not one of %s: text lines are written", asked, ", ".join(FORMATS))
    problem = library_level_problem()
    if problem is not None:
        log.warning("%s", problem)
    return level


def exit_code(exc: BaseException) -> tuple[int, str]:
    """The exit code and the one-line message for an exception that ended a verb."""
    if isinstance(exc, InputError):
        return EXIT_INPUT, f"error: {exc}"
    if isinstance(exc, Unavailable):
        return EXIT_UNREACHABLE, f"unavailable: {exc}"
    if isinstance(exc, ResourceError):
        return EXIT_RESOURCES, f"not enough resources: {exc}"
    if isinstance(exc, CuzkError):
        return EXIT_FAILED, f"{type(exc).__name__}: {exc}"
    if out_of_device_memory(exc):
        return EXIT_RESOURCES, f"not enough resources: out of GPU memory: {exc}"
    if isinstance(exc, MemoryError):
        return EXIT_RESOURCES, "not enough resources: out of host memory"
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""  # none for os.getcwd() in a folder that is gone
        if isinstance(exc, (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)):
            return EXIT_INPUT, f"error: {where}{exc.strerror or exc}"
        return EXIT_FAILED, f"error: {where}{exc.strerror or exc}"
    if isinstance(exc, Terminated):  # SIGTERM, SIGHUP
        return exc.exit_code, exc.what
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED, "interrupted"
    return EXIT_INTERNAL, (f"internal error: {type(exc).__name__}: {exc} (a bug; rerun with --log-level DEBUG "
                           "for the traceback)")


def _terminate(signum: int, frame: Any) -> None:
    raise Terminated()


def _hang_up(signum: int, frame: Any) -> None:
    raise HungUp()


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP stop a verb other than the daemon as SIGINT does (:class:`Terminated`,
    :class:`HungUp`: the same cleanup). SIGHUP's default action would end the process where it
    stands (a terminal closed under a ``bench``: its temporary files and its engine's ring left
    behind); where it is ignored (``nohup``), it stays ignored."""
    signal.signal(signal.SIGTERM, _terminate)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, _hang_up)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code (see :data:`EXIT_CODES`)."""
    line = global_options_first(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser(services=_verb(line) not in LOCAL_VERBS)
        try:
            args = parser.parse_args(line)
        except SystemExit as exc:  # --help, --version (0) or a usage error (2), already printed by argparse
            return exc.code if isinstance(exc.code, int) else EXIT_INPUT
        _configure_logging(args)
    except KeyboardInterrupt as exc:
        # Ctrl-C, SIGTERM or SIGHUP as the command starts: the parser of an engine verb imports the
        # pipeline's modules and numpy (~0.1 s), the window of a supervisor's stop right after a start
        return final_error(*exit_code(exc))
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except BrokenPipeError:  # stdout closed early (`cuzk-mp client status | head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED
    except (Exception, KeyboardInterrupt) as exc:
        code, message = exit_code(exc)
        log.debug("%s ended with exit code %d", args.command, code, exc_info=True)
        return final_error(code, message, names=_names(args, exc))


def _names(args: argparse.Namespace, exc: BaseException) -> list[str]:
    """The file names the last line may hold: the command's path arguments and those an OSError names."""
    values = [v for value in vars(args).values() for v in (value if isinstance(value, list) else [value])]
    names = [str(v) for v in values if isinstance(v, Path)]
    if isinstance(exc, OSError):
        names += [n for n in (exc.filename, exc.filename2) if isinstance(n, str)]
    return names


def _say_where_a_fatal_signal_struck() -> None:
    """Python's faulthandler for a one-shot verb: a fatal signal prints "Fatal Python error: Bus
    error" and each thread's Python stack before the process dies of it. The one expected is SIGBUS:
    the .zkey (and its circuit-data cache) is mapped, never copied, and a read of a mapped page that a
    truncation took away (a key copied over in place while a proof reads it) is answered by the
    kernel with SIGBUS, which no Python code can catch; without this the shell said "Bus error" alone.
    Best effort: where two threads fault at once, the second may end the process before the first
    one's dump is written. No stderr (``2>&-``): nothing to print to, left off."""
    import faulthandler

    try:
        faulthandler.enable()
    except (RuntimeError, ValueError, OSError, AttributeError):  # stderr None, closed, or with no descriptor
        pass


def run() -> None:
    """The console script: :func:`main`, then out of the process.

    After a one-shot verb (its files written and closed) the process leaves with ``os._exit``
    once stdout, stderr and the log handlers are flushed: the interpreter's teardown (numba's
    thread pool, module finalisers) changes nothing on disk and cost ~0.35 s a ``groth16 prove``
    on the CPU backend (perf/results/oneshot-start-cpu.json). A process that made a CUDA context
    leaves its release by the driver to a forked child that outlives it
    (:func:`.backends.gpu.early_context.hand_off_teardown`). The engine's verbs (daemon, bench,
    client) end normally. SIGTERM and SIGHUP stop any verb but the daemon as SIGINT does
    (:func:`stop_on_signals`: the same cleanup, exit 143, 129); set here, in the process's own entry,
    not by :func:`main`, which callers may run in-process.

    ``OPENBLAS_NUM_THREADS`` is 1 unless the caller set it, in this process and the engine's workers it
    starts: numpy loads OpenBLAS, which starts a thread per core as it is imported (0.03 s of numpy's
    import on a 16-core GPU box), and nothing here calls BLAS (the field arithmetic is numba's and the
    GPU kernels'). A warm one-shot GPU prove is not measurably faster or slower for it: 0.817 s against
    0.865 s with 16 threads, 12 interleaved processes each, within the machine's spread
    (perf/results/oneshot-blas-threads-h100-2026-12-06-settled.json)."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy's import
    verb = _verb(global_options_first(sys.argv[1:]))
    if verb != "daemon":  # the daemon drains on SIGTERM and ignores SIGHUP by itself
        stop_on_signals()
    if verb not in LOCAL_VERBS:
        sys.exit(main())
    _say_where_a_fatal_signal_struck()
    from . import stackprof

    sampler = stackprof.start_from_env()  # where a one-shot command's time goes (CUZK_MP_STACK_PROFILE)
    code = main()
    stackprof.finish(sampler, f"cuzk-mp-{verb}")
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        if stream is None:  # started without it (`>&-`): Python gives None
            continue
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or broken: nothing more can be said there
            pass
    if "cupy" in sys.modules or __package__ + ".backends.gpu.early_context" in sys.modules:  # a CUDA context
        from .backends.gpu.early_context import hand_off_teardown

        hand_off_teardown()
    os._exit(code)


if __name__ == "__main__":  # spawned worker processes import this module again as __mp_main__
    run()
