"""The one ``cuzk-mp`` command line.

The snarkjs-compatible verbs take the same positional arguments as snarkjs,
so a script can swap ``snarkjs`` for ``cuzk-mp``::

    cuzk-mp groth16 prove CIRCUIT.zkey WITNESS.wtns PROOF.json PUBLIC.json
    cuzk-mp groth16 verify VK.json PUBLIC.json PROOF.json
    cuzk-mp zkey export verificationkey CIRCUIT.zkey VK.json
    cuzk-mp wtns calculate CIRCUIT.wasm INPUT.json WITNESS.wtns

plus ``setup``, ``circuit porep-like|dense-random``, ``bench``, ``daemon`` and ``client``.
Heavy modules are imported inside the verbs so ``--help`` stays instant.
Exit codes: 0 success, 1 a proof did not verify or a job failed, 2 bad input,
3 daemon unreachable and 124 timed out (``client`` verbs).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Callable

from .errors import CuzkError, InputError

log = logging.getLogger("cuzk_mp.cli")


def _cmd_prove(args: argparse.Namespace) -> int:
    from .backends import get_backend
    from .formats.r1cs import read_r1cs
    from .formats.snarkjs_json import proof_to_json, public_to_json, write_json
    from .formats.wtns import read_wtns
    from .formats.zkey import read_zkey
    from .groth16.prover import prove

    t0 = time.perf_counter()
    zkey = read_zkey(args.zkey)
    w = read_wtns(args.wtns)
    r1cs = read_r1cs(args.r1cs) if args.r1cs else None
    backend = get_backend(args.backend)
    proof, public = prove(backend, zkey, w, r1cs=r1cs, verify=not args.no_verify)
    write_json(args.proof, proof_to_json(proof))
    write_json(args.public, public_to_json(public))
    log.info("proved with the %s backend in %.3f s", backend.name, time.perf_counter() - t0)
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from .formats.snarkjs_json import proof_from_json, public_from_json, read_json, vk_from_json
    from .groth16.verifier import check

    vk = vk_from_json(read_json(args.vk), name=str(args.vk))
    public = public_from_json(read_json(args.public), name=str(args.public))
    proof = proof_from_json(read_json(args.proof), name=str(args.proof))
    problem = check(vk, public, proof)
    if problem is None:
        print("OK!")
        return 0
    print(f"Invalid proof: {problem}")
    return 1


def _cmd_export_vk(args: argparse.Namespace) -> int:
    from .formats.snarkjs_json import vk_to_json, write_json
    from .formats.zkey import read_zkey
    from .groth16.keys import vk_from_zkey

    write_json(args.vk, vk_to_json(vk_from_zkey(read_zkey(args.zkey))))
    return 0


def _cmd_wtns_calculate(args: argparse.Namespace) -> int:
    from .circuits.circom import calculate_witness_file

    calculate_witness_file(args.wasm, args.input, args.wtns)
    return 0


def _cmd_setup(args: argparse.Namespace) -> int:
    from .backends import get_backend
    from .groth16.setup import setup_file

    setup_file(args.r1cs, args.zkey, get_backend(args.backend))
    return 0


def _cmd_circuit(args: argparse.Namespace) -> int:
    from .circuits.synthetic_kinds import write_synthetic

    r1cs, wtns = write_synthetic(args.kind, args.log_n, Path(args.out_dir), seed=args.seed, partition=args.partition)
    print(r1cs)
    print(wtns)
    return 0


def _snarkjs_verbs(sub: argparse._SubParsersAction) -> None:
    g16 = sub.add_parser("groth16", help="prove and verify (snarkjs-compatible arguments)")
    g16_sub = g16.add_subparsers(dest="verb", required=True)
    p = g16_sub.add_parser("prove", help="prove CIRCUIT.zkey WITNESS.wtns PROOF.json PUBLIC.json")
    p.add_argument("zkey", type=Path)
    p.add_argument("wtns", type=Path)
    p.add_argument("proof", type=Path)
    p.add_argument("public", type=Path)
    p.add_argument("--backend", default="auto", choices=["auto", "cpu", "gpu"])
    p.add_argument("--r1cs", type=Path, help="check the witness against this circuit first (names the failing constraint)")
    p.add_argument("--no-verify", action="store_true", help="skip the self-verification of the proof (benchmarks)")
    p.set_defaults(func=_cmd_prove)
    v = g16_sub.add_parser("verify", help="verify VK.json PUBLIC.json PROOF.json: prints OK! (exit 0) or why not (exit 1)")
    v.add_argument("vk", type=Path)
    v.add_argument("public", type=Path)
    v.add_argument("proof", type=Path)
    v.set_defaults(func=_cmd_verify)

    zk = sub.add_parser("zkey", help="zkey tools")
    zk_sub = zk.add_subparsers(dest="verb", required=True)
    e = zk_sub.add_parser("export", help="export parts of a zkey")
    e_sub = e.add_subparsers(dest="what", required=True)
    ev = e_sub.add_parser("verificationkey", help="export verificationkey CIRCUIT.zkey VK.json")
    ev.add_argument("zkey", type=Path)
    ev.add_argument("vk", type=Path)
    ev.set_defaults(func=_cmd_export_vk)

    wt = sub.add_parser("wtns", help="witness tools")
    wt_sub = wt.add_subparsers(dest="verb", required=True)
    wc = wt_sub.add_parser("calculate", help="calculate CIRCUIT.wasm INPUT.json WITNESS.wtns")
    wc.add_argument("wasm", type=Path)
    wc.add_argument("input", type=Path)
    wc.add_argument("wtns", type=Path)
    wc.set_defaults(func=_cmd_wtns_calculate)


def _own_verbs(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("setup", help="INSECURE development setup: CIRCUIT.r1cs -> CIRCUIT.zkey (random toxic waste)")
    s.add_argument("r1cs", type=Path)
    s.add_argument("zkey", type=Path)
    s.add_argument("--backend", default="auto", choices=["auto", "cpu", "gpu"])
    s.set_defaults(func=_cmd_setup)

    c = sub.add_parser("circuit", help="generate benchmark circuits")
    c_sub = c.add_subparsers(dest="kind", required=True)
    for kind, what in (("porep-like", "the PoRep-shaped synthetic circuit (80% of the witness 0 or 1)"),
                       ("dense-random", "the dense synthetic circuit (every witness value full-width random)")):
        pl = c_sub.add_parser(kind, help=f"{what}: writes its .r1cs and a sample .wtns")
        pl.add_argument("--log-n", type=int, required=True, help="log2 of the number of rows (domain size)")
        pl.add_argument("out_dir", type=Path)
        pl.add_argument("--seed", type=int, default=0)
        pl.add_argument("--partition", type=int, default=0)
        pl.set_defaults(func=_cmd_circuit)


def _service_verbs(sub: argparse._SubParsersAction) -> None:
    """Verbs owned by the pipeline and daemon packages (each adds its own parsers)."""
    from .daemon.cli import add_parsers as add_daemon_parsers
    from .pipeline.bench import add_parser as add_bench_parser

    add_bench_parser(sub)
    add_daemon_parsers(sub)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser of ``cuzk-mp``."""
    parser = argparse.ArgumentParser(prog="cuzk-mp", description="Groth16 (BLS12-381) prover, snarkjs-compatible.")
    parser.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING (default), ERROR")
    sub = parser.add_subparsers(dest="command", required=True)
    _snarkjs_verbs(sub)
    _own_verbs(sub)
    _service_verbs(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except InputError as exc:
        print(f"cuzk-mp: error: {exc}", file=sys.stderr)
        return 2
    except CuzkError as exc:
        print(f"cuzk-mp: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except FileNotFoundError as exc:
        print(f"cuzk-mp: error: {exc.filename}: no such file", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
