"""What each verb of the ``cuzk-mp`` command line does: prove (in this process, through a running
daemon, or through this user's warm daemon), verify, export a key, calculate a witness, set up and
write benchmark circuits.

The verbs live apart from :mod:`cuzk_mp.cli`, which owns the command's shape (its parsers, global
options, exit codes and entry point), so that each reads on its own. Heavy modules (numpy, the
backends, the daemon's client) are imported inside the verbs so ``--help`` stays instant. The log
lines keep the command's logger, ``cuzk_mp.cli``, whichever module writes them.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import CuzkError, InputError, Unavailable
from .exit_codes import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE
from .formats.atomic import refuse_outputs_over_inputs
from .logs import final_error
from .stdout import print_result

if TYPE_CHECKING:  # numpy loads with a verb, not for --help
    import numpy as np

log = logging.getLogger("cuzk_mp.cli")  # the command's logger: its lines are named as they always were

def _prove_and_write(zkey_path: Path, witness: Callable[[], np.ndarray], args: argparse.Namespace) -> int:
    """Shared tail of ``groth16 prove`` and ``fullprove``: key, witness, proof, two JSON files.

    The backend starts (CuPy's import, the CUDA context, the kernel modules) on a helper thread
    while this one reads the key and the witness (a GPU's context on a third, beside CuPy's
    import: :mod:`.backends.gpu.early_context`); both start before anything here imports numpy,
    whose import (~0.3 s on an H200 box) would otherwise come first (``witness`` imports its reader
    when called); ``prove`` then loads the key for this proof alone
    beside the witness map (no precomputed tables that only pay over many proofs). The key's coded
    A, B (and with ``--r1cs`` C) rows are the shared circuit data cache (``KEY.zkey.synth-ab``
    beside the key, else in the cache folder), built by the first proof and mapped by the next
    ones: at 2^20 building them takes ~0.12 s, mapping them ~8 ms (perf/circuit_data_cache.py)."""
    from concurrent.futures import ThreadPoolExecutor

    from .backends import get_backend

    t0 = time.perf_counter()
    if args.backend in ("gpu", "auto"):  # the CUDA context, made beside CuPy's import (best effort)
        from .backends.gpu.early_context import start_primary_context

        start_primary_context()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="cuzk-backend-start") as pool:
        starting = pool.submit(get_backend, args.backend)  # first: the CUDA start overlaps the imports below
        from .formats.r1cs import read_r1cs
        from .formats.atomic import write_json_files
        from .formats.snarkjs_json import proof_to_json, public_to_json
        from .formats.zkey import read_zkey
        from .groth16.prover import prove
        from .groth16.synthesis import ConstraintEvaluator

        try:
            evaluator: ConstraintEvaluator | None = ConstraintEvaluator.from_files(
                os.fspath(zkey_path), os.fspath(args.r1cs) if args.r1cs else None)
            r1cs = None
        except CuzkError as exc:
            if isinstance(exc, InputError):  # a bad key or r1cs: the user's error, as is
                raise
            # no writable place for the cache: this proof builds the rows for itself
            log.info("circuit-data cache unavailable (%s): building the key's rows in memory", exc)
            evaluator, r1cs = None, read_r1cs(args.r1cs) if args.r1cs else None
        # With the circuit data from the cache the prover never reads section 4 again: the cache
        # was built from this very file (its size, mtime and header are recorded) and checked it then.
        zkey = read_zkey(zkey_path, check_coefs=evaluator is None)
        w = witness()
        t1 = time.perf_counter()
        backend = starting.result()
    log.info("imports, key and witness in %.3f s, backend %s ready %.3f s later", t1 - t0, backend.name,
             time.perf_counter() - t1)
    proof, public = prove(backend, zkey, w, evaluator=evaluator, r1cs=r1cs, verify=not args.no_verify)
    write_json_files([(args.proof, proof_to_json(proof)), (args.public, public_to_json(public))])
    log.info("proved with the %s backend in %.3f s: %s, %s", backend.name, time.perf_counter() - t0,
             args.proof, args.public)
    return EXIT_OK


def _through_a_daemon(args: argparse.Namespace) -> int | None:
    """The exit code where a daemon proves (``--connect``, ``--keep-warm`` or $CUZK_MP_KEEP_WARM),
    None for a one-shot process."""
    if args.connect and args.keep_warm:
        raise InputError("--connect and --keep-warm: give one (the daemon at ADDR, or a warm daemon of this key)")
    if args.connect:  # over $CUZK_MP_KEEP_WARM too
        return _prove_through_daemon(args)
    if args.keep_warm is None:
        args.keep_warm = _env_seconds("CUZK_MP_KEEP_WARM")
    return _prove_warm(args) if args.keep_warm else None


def _cmd_prove(args: argparse.Namespace) -> int:
    refuse_outputs_over_inputs(args, ("proof", "public"), ("zkey", "wtns", "r1cs"))
    code = _through_a_daemon(args)
    if code is not None:
        return code

    def witness() -> np.ndarray:  # numpy's import (~0.3 s on a GPU box) runs after the CUDA start has begun
        from .formats.wtns import read_wtns

        return read_wtns(args.wtns)

    return _prove_and_write(args.zkey, witness, args)


def _prove_through_daemon(args: argparse.Namespace) -> int:
    """``groth16 prove|fullprove --connect ADDR``: the running daemon at ADDR proves with its
    resident key (the circuit of its config whose ``zkey`` is this very file,
    :func:`cuzk_mp.daemon.prove_files.circuit_of_key`) and this process writes the two files: no
    numpy, CuPy or CUDA start here, ~0.2 s a 2^16 proof on the H200
    (perf/results/daemon-latency-gpu-2^16-h200.json). The daemon checks the witness, proves and
    verifies; its error comes back with its exit code (2 for a bad witness or a refused token, 1
    for a failed job, 3 when the daemon is out of reach)."""
    from .daemon.prove_files import Unreachable

    if args.backend != "auto" or args.r1cs or args.no_verify:
        raise InputError("--connect: the daemon's config decides the backend, the constraint check and the "
                         "verification; leave out --backend, --r1cs and --no-verify")
    job = _daemon_job(args)
    try:
        return _prove_at(args.connect, args.token, None, args, job, uuid.uuid4().hex)
    except Unreachable as e:
        return final_error(EXIT_UNREACHABLE, str(e))


def _prove_warm(args: argparse.Namespace) -> int:
    """``groth16 prove|fullprove --keep-warm SECONDS``: the one-shot command's result (same key,
    witness or input, --backend, --r1cs, --no-verify) from this user's warm daemon of the key
    (:mod:`cuzk_mp.daemon.warm`), started here when none runs and left running until SECONDS pass
    with no proof: the first call pays the daemon's start and key load, the next ones are client
    processes (~0.2 s where a one-shot GPU process takes ~1.4 s at 2^16 on the H200). A daemon out of
    reach, or one that refuses the job (it is shutting down as it idles out, or at a cap: its
    connections or unfinished jobs), is asked again, twice at most, after a short wait, through
    :func:`~cuzk_mp.daemon.warm.ensure`: that starts a new daemon only where none answers by then (and
    says so), so a refusal at a cap is asked again of the same daemon, never answered by a start.
    The proof is asked for under one request id throughout: a daemon restarted from its journal
    answers with the job it already has instead of proving it twice. The last refusal or loss is
    the command's answer (exit 3)."""
    from .daemon.prove_files import Unreachable
    from .daemon.warm import CIRCUIT_ID, WarmSpec, ensure

    if not (0 < args.keep_warm <= MAX_KEEP_WARM_S):
        raise InputError(f"--keep-warm {args.keep_warm:g}: a number of seconds in (0, {MAX_KEEP_WARM_S:g}] "
                         "(a daemon that should never leave is a `cuzk-mp daemon` service)")
    wasm = getattr(args, "wasm", None)  # fullprove: the daemon computes the witness
    job = _daemon_job(args)  # the inputs are checked before a daemon is started for them
    spec = WarmSpec(args.zkey.absolute(), args.backend, args.r1cs.absolute() if args.r1cs else None,
                    not args.no_verify, args.keep_warm, wasm.absolute() if wasm else None)
    request_id = uuid.uuid4().hex  # the same job however often it is sent (a restarted daemon re-attaches)
    for attempt in range(WARM_ATTEMPTS):
        addr = ensure(spec)
        try:
            return _prove_at(addr, "", CIRCUIT_ID, args, job, request_id)
        except (Unreachable, Unavailable) as e:
            if attempt == WARM_ATTEMPTS - 1:
                return final_error(EXIT_UNREACHABLE, str(e))
            # a daemon killed a moment ago may still take a connect; one that refused (it idled out as
            # this call came, or is at a cap) takes a second or two to go or to finish some jobs
            wait = (1.0 if isinstance(e, Unavailable) else 0.2) * (attempt + 1)
            what = f"the warm daemon at {addr} refused the job: {e}" if isinstance(e, Unavailable) else str(e)
            log.info("%s; asking again in %.1f s (a new warm daemon is started only if none answers then)",
                     what, wait)
            time.sleep(wait)
    raise AssertionError("unreachable")


WARM_ATTEMPTS = 3


MAX_KEEP_WARM_S = 7 * 86400.0


def _env_seconds(name: str) -> float:
    """A number of seconds from the environment (0 where unset or empty)."""
    value = os.environ.get(name, "").strip()
    try:
        return float(value) if value else 0.0
    except ValueError:
        raise InputError(f"${name}={value!r}: a number of seconds") from None


def _daemon_job(args: argparse.Namespace) -> tuple[Path, Any]:
    """(the file, the job's partition): prove's .wtns or fullprove's input, the key file checked."""
    from .daemon.prove_files import input_partition, witness_partition

    if not args.zkey.is_file():
        raise InputError(f"{args.zkey}: no such key file")
    if hasattr(args, "wtns"):
        return args.wtns, witness_partition(args.wtns)
    return args.input, input_partition(args.input)


def _prove_at(addr: str, token: str, circuit: str | None, args: argparse.Namespace, job: tuple[Path, Any],
              request_id: str) -> int:
    """The proof of ``job`` (:func:`_daemon_job`) by the daemon at ``addr``, written to args.proof
    and args.public (:func:`cuzk_mp.daemon.prove_files.prove_to_files`)."""
    from .daemon.prove_files import prove_to_files

    cid, job_id = prove_to_files(addr, token, circuit, args.zkey, *job, args.proof, args.public, request_id)
    log.info("proved by the daemon at %s (circuit %s, job %s): %s, %s", addr, cid, job_id, args.proof,
             args.public)
    return EXIT_OK


def _cmd_fullprove(args: argparse.Namespace) -> int:
    refuse_outputs_over_inputs(args, ("proof", "public"), ("input", "wasm", "zkey", "r1cs"))
    code = _through_a_daemon(args)  # the daemon runs the wasm (compiled once, kept warm)
    if code is not None:
        return code

    def witness() -> np.ndarray:
        from .circuits.circom import WitnessCalculator, load_input_json

        t0 = time.perf_counter()
        w = WitnessCalculator(args.wasm).calculate(load_input_json(args.input), _print_circom_log)
        log.info("witness of %d values from %s in %.3f s", len(w), args.wasm, time.perf_counter() - t0)
        return w

    return _prove_and_write(args.zkey, witness, args)


def _cmd_verify(args: argparse.Namespace) -> int:
    from .formats.snarkjs_json import proof_from_json, public_from_json, read_json, vk_from_json
    from .groth16.verifier import check

    vk = vk_from_json(read_json(args.vk), name=str(args.vk))
    public = public_from_json(read_json(args.public), name=str(args.public))
    proof = proof_from_json(read_json(args.proof), name=str(args.proof))
    problem = check(vk, public, proof)
    if problem is None:
        _print("OK!")
        return EXIT_OK
    _print(f"Invalid proof: {problem}")
    return EXIT_FAILED


def _cmd_export_vk(args: argparse.Namespace) -> int:
    from .formats.snarkjs_json import vk_to_json, write_json
    from .formats.zkey import read_zkey
    from .groth16.keys import vk_from_zkey

    refuse_outputs_over_inputs(args, ("vk",), ("zkey",))
    write_json(args.vk, vk_to_json(vk_from_zkey(read_zkey(args.zkey))))
    return EXIT_OK


def _cmd_wtns_calculate(args: argparse.Namespace) -> int:
    from .circuits.circom import calculate_witness_file

    refuse_outputs_over_inputs(args, ("wtns",), ("wasm", "input"))
    calculate_witness_file(args.wasm, args.input, args.wtns, _print_circom_log)
    return EXIT_OK


def _print_circom_log(line: str) -> None:
    """A line of the circuit's ``log()`` calls, on stdout as snarkjs prints it."""
    _print(line)


def _print(line: str) -> None:
    """A line on stdout (:func:`~cuzk_mp.stdout.print_result`: exit 2 where it cannot be written, not
    exit 1, ``groth16 verify``'s answer for an invalid proof). A reader that closed its end early
    (BrokenPipeError) is :func:`~cuzk_mp.cli.main`'s."""
    print_result(line + "\n")


def _cmd_setup(args: argparse.Namespace) -> int:
    from .backends import get_backend
    from .groth16.setup import setup_file

    refuse_outputs_over_inputs(args, ("zkey",), ("r1cs",))
    setup_file(args.r1cs, args.zkey, get_backend(args.backend))
    return EXIT_OK


def _cmd_circuit(args: argparse.Namespace) -> int:
    from .circuits.synthetic_kinds import write_synthetic

    r1cs, wtns = write_synthetic(args.kind, args.log_n, Path(args.out_dir), seed=args.seed, partition=args.partition)
    _print(str(r1cs))
    _print(str(wtns))
    return EXIT_OK


def _cmd_shm_clean(args: argparse.Namespace) -> int:
    """``shm clean``: what no engine start of this user would remove (one had to come), now. An
    engine killed together with its children (or in its stop while no READY prover ran:
    :mod:`.pipeline.engine`) keeps its ring in /dev/shm (a partition's size per slot) until another
    engine of this user starts; only the rings whose maker is gone go
    (:func:`.pipeline.shm_names.remove_abandoned`)."""
    from .pipeline.shm_names import SHM_DIR, remove_abandoned

    removed = remove_abandoned(None)
    for name in removed:
        _print(f"{SHM_DIR}/{name}")
    log.info("removed %d object(s) of engines that are gone from %s", len(removed), SHM_DIR)
    return EXIT_OK
