"""The prover finalizer's cost per proof, alone and batched, and whether a pairing check holds the GIL.

The finalizer (one thread in each prover process) assembles each proof with fresh r, s and
self-verifies it. ``prove_finalize_batch`` does k proofs of one key with one pairing check of
k + 3 pairs; this measures, on this machine's CPU, for each key size and each k:

* ``finalize_ms``: ``prove_finalize_batch`` of k proofs (assembly + one batch check), per proof;
* ``assembly_ms``: the same with ``verify=False`` (so verify = finalize - assembly), per proof;
* ``former_ms`` (k = 1 only): the finalize this replaced, term by term as snarkjs writes it
  (five G1 multiplications and one G2) and a four-pair check per proof.

Each figure is the median (and the least, ``*_min``: what a quiet machine gives) of ``--reps``
runs of 16 proofs each (16 / k batches); within a rep every variant runs in turn, so a change in
a shared machine's load falls on all alike. The MSM sums
come from real proofs of the synthetic PoRep-like circuit on the CPU backend (``--distinct``
witnesses, used in turn): finalize costs do not depend on the witness, only on the number of
public signals. Keys: ``ensure_synthetic_key`` in cuzk-mp's cache folder (made once).

GIL: a pure-Python counting thread runs while the main thread makes one arkworks call (a pairing
check of k + 3 pairs, a G2 and a G1 multiplication, a 3-term multiexp), then sleeps as long;
the counter's progress during the call over its progress during the sleep is ~0 for a call that
holds the GIL throughout and ~1 for one that releases it (less when the cores are busy: the
counter may find no free core); also how many calls let it run more than the switch interval
at the call's start could explain. Then the same counter beside whole finalizes (the former way
and in batches of each k): its pace, and its stalls per proof finalized.

    .venv/bin/python perf/finalize_bench.py --log-n 12,16 --out perf/results/finalize-cpu.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from py_arkworks_bls12381 import GT, G1Point  # noqa: E402

from cuzk_mp.algebra import curve  # noqa: E402
from cuzk_mp.backends.base import MsmSums  # noqa: E402
from cuzk_mp.formats.snarkjs_json import Proof  # noqa: E402
from cuzk_mp.formats.zkey import ZKey  # noqa: E402
from cuzk_mp.groth16.keys import prepared_vk_of  # noqa: E402
from cuzk_mp.groth16.prover import header_points, prove_finalize_batch, random_scalar  # noqa: E402
from cuzk_mp.groth16.verifier import pairing_holds  # noqa: E402

PROOFS_PER_REP = 16


def log(text: str) -> None:
    """Progress on stderr."""
    print(f"[finalize-bench] {text}", file=sys.stderr, flush=True)


def make_sums(log_n: int, distinct: int, cache: Path) -> tuple[ZKey, list[tuple[MsmSums, list[int]]]]:
    """The key of porep-like 2^log_n and the MSM sums + public signals of ``distinct`` witnesses."""
    from cuzk_mp.backends.cpu import CpuBackend
    from cuzk_mp.circuits.synthetic import PorepLike
    from cuzk_mp.formats.zkey import read_zkey
    from cuzk_mp.groth16.prover import prove_start_batch, public_signals
    from cuzk_mp.groth16.synthesis import ConstraintEvaluator
    from cuzk_mp.pipeline.keys import ensure_synthetic_key

    t0 = time.perf_counter()
    zkey_path, _ = ensure_synthetic_key("porep-like", log_n, cache, "cpu")
    zkey = read_zkey(zkey_path)
    evaluator = ConstraintEvaluator.from_zkey(zkey)
    backend = CpuBackend(threads=os.cpu_count() or 1)
    key = backend.load_key(zkey)
    log(f"2^{log_n}: key ready in {time.perf_counter() - t0:.1f} s; proving {distinct} witnesses for their sums")
    items = []
    try:
        for seed in range(distinct):
            inputs = evaluator.evaluate(PorepLike(log_n).witness(seed, 0))
            staged = backend.stage(key, inputs)
            try:
                sums = prove_start_batch(backend, key, [staged], zkey.n_public)[0]  # type: ignore[arg-type]
            finally:
                backend.release(staged)
            items.append((sums, public_signals(inputs.w, zkey.n_public)))
    finally:
        key.close()
        backend.close()
    log(f"2^{log_n}: sums ready after {time.perf_counter() - t0:.1f} s")
    return zkey, items


def former_finalize(zkey: ZKey, sums: MsmSums, public: list[int]) -> Proof:
    """The finalize this replaced: snarkjs's assembly term by term and a four-pair check."""
    hp, fr = header_points(zkey), curve.fr_to_ark
    r, s = random_scalar(), random_scalar()
    pi_a = hp.alpha1 + sums.a + hp.delta1 * fr(r)
    pi_b = hp.beta2 + sums.b2 + hp.delta2 * fr(s)
    b1 = hp.beta1 + sums.b1 + hp.delta1 * fr(s)
    pi_c = sums.c + sums.h + pi_a * fr(s) + b1 * fr(r) - hp.delta1 * fr(r * s)
    assert pairing_holds(prepared_vk_of(zkey), public, pi_a, pi_b, pi_c)
    return Proof(pi_a=curve.ark_to_g1(pi_a), pi_b=curve.ark_to_g2(pi_b), pi_c=curve.ark_to_g1(pi_c))


def batch_rep_ms(zkey: ZKey, items: list[tuple[MsmSums, list[int]]], k: int, rep: int, verify: bool) -> float:
    """ms per proof of 16 proofs finalized in batches of k; every proof must pass."""
    t0 = time.perf_counter()
    for b in range(PROOFS_PER_REP // k):
        start = rep * PROOFS_PER_REP + b * k
        results = prove_finalize_batch(zkey, [items[(start + i) % len(items)] for i in range(k)], verify=verify)
        assert all(isinstance(p, Proof) for p in results), "a proof failed self-verification"
    return 1e3 * (time.perf_counter() - t0) / PROOFS_PER_REP


def former_rep_ms(zkey: ZKey, items: list[tuple[MsmSums, list[int]]], rep: int) -> float:
    """ms per proof of 16 proofs finalized the former way."""
    t0 = time.perf_counter()
    for i in range(PROOFS_PER_REP):
        former_finalize(zkey, *items[(rep * PROOFS_PER_REP + i) % len(items)])
    return 1e3 * (time.perf_counter() - t0) / PROOFS_PER_REP


def measure(zkey: ZKey, items: list[tuple[MsmSums, list[int]]], ks: list[int], reps: int) -> dict[str, list[float]]:
    """Every variant's ms per proof in each rep; the variants take turns within a rep, so a change
    in the machine's load falls on all of them alike."""
    samples: dict[str, list[float]] = {}
    for rep in range(reps):
        samples.setdefault("former", []).append(former_rep_ms(zkey, items, rep))
        for k in ks:
            samples.setdefault(f"finalize/{k}", []).append(batch_rep_ms(zkey, items, k, rep, True))
            samples.setdefault(f"assembly/{k}", []).append(batch_rep_ms(zkey, items, k, rep, False))
    return samples


def _batch_rep_verified(zkey: ZKey, items: list[tuple[MsmSums, list[int]]], k: int, rep: int) -> float:
    return batch_rep_ms(zkey, items, k, rep, True)


def _idle(rep: int) -> float:
    """Nothing for 50 ms: the counter's pace alone."""
    time.sleep(0.05)
    return 0.0


def gil_share(zkey: ZKey, items: list[tuple[MsmSums, list[int]]], ks: list[int], reps: int) -> dict[str, Any]:
    """What finalizing leaves of the interpreter to another thread (a worker's staging, say): a
    pure-Python thread counts while this one finalizes 16 proofs per rep, the former way and in
    batches of each k. Reported per variant: the counter's pace next to its pace alone, and its
    stalls (gaps over 1 ms between two counts: the GIL held by the finalizer, or no free core)
    in ms per proof finalized and the longest one."""
    variants: dict[str, Callable[[int], float]] = {"former": lambda rep: former_rep_ms(zkey, items, rep)}
    for k in ks:
        variants[f"k={k}"] = functools.partial(_batch_rep_verified, zkey, items, k)
    variants["alone"] = _idle

    def run(fn: Callable[[int], float], rep: int) -> tuple[float, float, float]:
        stop, out = threading.Event(), {"n": 0, "stalled": 0.0, "longest": 0.0}

        def count() -> None:
            last, n, stalled, longest = time.perf_counter(), 0, 0.0, 0.0
            while not stop.is_set():
                now = time.perf_counter()
                if now - last > 0.001:
                    stalled, longest = stalled + now - last, max(longest, now - last)
                last, n = now, n + 1
            out.update(n=n, stalled=stalled, longest=longest)

        t = threading.Thread(target=count)
        t.start()
        t0 = time.perf_counter()
        fn(rep)
        wall = time.perf_counter() - t0
        stop.set()
        t.join()
        return out["n"] / wall, out["stalled"], out["longest"]

    runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in variants}
    for rep in range(reps):
        for name, fn in variants.items():
            runs[name].append(run(fn, rep))
    alone = statistics.median(r[0] for r in runs.pop("alone"))
    return {name: {"counter_pace_vs_alone": statistics.median(r[0] for r in rs) / alone,
                   "counter_stalled_ms_per_proof": 1e3 * statistics.median(r[1] for r in rs) / PROOFS_PER_REP,
                   "counter_longest_stall_ms": 1e3 * statistics.median(r[2] for r in rs)}
            for name, rs in runs.items()}


def gil_probe(zkey: ZKey, pairs: int, calls: int = 20) -> dict[str, Any]:
    """Whether arkworks calls let a pure-Python thread run: a counting thread's progress during one
    call next to its progress during a sleep as long (a call holding the GIL throughout: ~0; one
    releasing it: ~1, less when the machine's cores are busy), median of ``calls`` calls each."""
    pvk, hp = prepared_vk_of(zkey), header_points(zkey)
    s = curve.fr_to_ark(random_scalar())
    ops: dict[str, Callable[[], object]] = {
        f"pairing_check_{pairs}_pairs": lambda: GT.pairing_check([pvk.alpha1] * pairs, [pvk.beta2] * pairs),
        "g2_scalar_mul": lambda: hp.delta2 * s,
        "g1_scalar_mul": lambda: hp.delta1 * s,
        "g1_multiexp_3": lambda: G1Point.multiexp_unchecked([hp.alpha1, hp.beta1, hp.delta1], [s, s, s]),
    }
    count, stop = [0], threading.Event()

    def counter() -> None:
        while not stop.is_set():
            count[0] += 1

    t = threading.Thread(target=counter, daemon=True)
    t.start()
    time.sleep(0.1)
    out: dict[str, Any] = {}
    try:
        for name, op in ops.items():
            during = asleep = beyond = 0
            took = []
            for _ in range(calls):
                c0, t0 = count[0], time.perf_counter()
                op()
                dt, c1 = time.perf_counter() - t0, count[0]
                time.sleep(dt)
                c2 = count[0]
                during, asleep = during + c1 - c0, asleep + c2 - c1
                # a call that holds the GIL still lets the counter run one switch interval as it starts
                beyond += (c1 - c0) > 2 * (c2 - c1) * min(1.0, sys.getswitchinterval() / dt)
                took.append(dt)
            out[name] = {"call_ms": 1e3 * statistics.median(took),
                         "counter_progress_vs_sleep": during / max(1, asleep),
                         "calls_where_counter_ran_beyond_one_switch_interval": f"{beyond}/{calls}"}
    finally:
        stop.set()
        t.join()
    return out


def main() -> None:
    """Measure and write the JSON."""
    from cuzk_mp.paths import default_cache_dir
    from cuzk_mp.pipeline.benchreport import machine_info

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log-n", default="12,16", help="key sizes (comma-separated log2 of the domain)")
    ap.add_argument("--k", default="1,2,4,8,16", help="batch sizes (each divides 16)")
    ap.add_argument("--reps", type=int, default=7, help="runs of 16 proofs per figure (the median is kept)")
    ap.add_argument("--distinct", type=int, default=16, help="distinct witnesses proved for their MSM sums")
    ap.add_argument("--cache", type=Path, default=None, help="param cache folder (default: cuzk-mp's)")
    ap.add_argument("--switch-interval", type=float, default=0.0005,
                    help="sys.setswitchinterval during the GIL probe (the prover process's value)")
    ap.add_argument("--out", type=Path, default=None, help="write the JSON here (else stdout)")
    a = ap.parse_args()
    ks = [int(x) for x in a.k.split(",")]
    if any(PROOFS_PER_REP % k for k in ks):
        ap.error(f"every k must divide {PROOFS_PER_REP}")
    sizes: dict[str, Any] = {}
    gil: dict[str, Any] = {}
    for log_n in [int(x) for x in a.log_n.split(",")]:
        zkey, items = make_sums(log_n, a.distinct, a.cache or default_cache_dir())
        row: dict[str, Any] = {"n_public": zkey.n_public, "distinct_witnesses": len(items), "k": {}}
        samples = measure(zkey, items, ks, a.reps)
        med = {name: statistics.median(v) for name, v in samples.items()}
        row["former_ms"], row["former_ms_min"] = med["former"], min(samples["former"])
        for k in ks:
            fin, asm = med[f"finalize/{k}"], med[f"assembly/{k}"]
            fin_min, asm_min = min(samples[f"finalize/{k}"]), min(samples[f"assembly/{k}"])
            row["k"][str(k)] = {"finalize_ms": fin, "assembly_ms": asm, "verify_ms": fin - asm,
                                "proofs_per_s": 1e3 / fin, "finalize_ms_min": fin_min, "assembly_ms_min": asm_min,
                                "verify_ms_min": fin_min - asm_min}
            log(f"2^{log_n} k={k}: finalize {fin:.2f} ms/proof (assembly {asm:.2f}); former {med['former']:.2f}")
        sizes[str(log_n)] = row
        if not gil:
            sys.setswitchinterval(a.switch_interval)
            gil = {"switch_interval_s": a.switch_interval, **gil_probe(zkey, 4), **gil_probe(zkey, max(ks) + 3),
                   "beside_finalizing": gil_share(zkey, items, ks, a.reps)}
            log(f"GIL: {gil}")
        zkey.close()
    doc = {"what": "prover finalizer per proof: assembly + batched self-verification (prove_finalize_batch)",
           "command": " ".join([Path(sys.executable).name, *sys.argv]),
           "machine": machine_info([]), "proofs_per_rep": PROOFS_PER_REP, "reps": a.reps,
           "sizes": sizes, "gil": gil}
    text = json.dumps(doc, indent=1)
    if a.out:
        a.out.write_text(text + "\n")
        log(f"wrote {a.out}")
    else:
        print(text)


if __name__ == "__main__":
    main()
