"""Arithmetic floors of one Groth16 partition on the GPU: the field products each stage needs with
the algorithms the backend runs, at the device's measured product rates, beside the measured
times and the targets. A computation from committed measurements, not a measurement.

Why: every stage of the partition is multiply-bound (the MSM accumulation and the NTT passes issue
Montgomery products at the integer-multiply pipe's rate), so the product count of a stage divided by
the measured product rate is a floor no scheduling can beat; the sum of the floors says how far the
partition can go with these algorithms, and which target would need fewer products instead.

What is counted (the backend's own choices, from :mod:`cuzk_mp.backends.gpu.knobs` and
:mod:`cuzk_mp.backends.gpu.plan`):
* each section's scalars split as the MSM splits them (zeros skipped, ones summed, the rest through
  the windows), from the synthetic circuit's witness at ``--sample-log-n`` scaled to the size; B1 and
  B2 over the wires with B entries (the packed sections), C over the private wires, H dense;
* Pippenger: ``n W(c)`` mixed additions (c from ``choose_window``, or the precomputed multiples' c
  where the device plan keeps them), the reduction's 2 full additions per bucket (once with
  multiples, per window without);
* a mixed XYZZ addition: 8 products + 2 squares (ec/xyzz.cuh); a full one 12 + 2; G2 the same
  counts of Fq2 products and squares (2 Fq products each); the G2 module's Fq2 product is the lazy
  one (msm_params.G2_FP2: ff/fp2_lazy.cuh, 744 IMADs against fp2_t's ~900), counted at the measured
  fp2_t rate times 900 / 744;
* the H step: 3 x (iNTT with the coset factor, NTT) over ``pass_schedule`` (stage 0 of every pass
  and the first pass's outer twiddle have no product) and the combine's 2 products a row.
Not counted: sorting, digit extraction, transfers, the device witness map (memory-bound work that
runs beside other streams): the floors are of the products alone.

    python perf/floors.py [--sample-log-n 14] [--json perf/results/floors-h200.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cuzk_mp.backends.gpu.knobs import NttParams, pass_schedule, plan_params  # noqa: E402
from cuzk_mp.backends.gpu.msm_geometry import choose_window, window_count  # noqa: E402
from cuzk_mp.backends.gpu.msm_params import msm_params_for  # noqa: E402
from cuzk_mp.backends.gpu.plan import KeyShape, plan_device  # noqa: E402
from cuzk_mp.circuits.synthetic_kinds import synthetic_circuit  # noqa: E402

RESULTS = ROOT / "perf" / "results"
H200_FREE = 139 << 30  # usable device bytes of an H200, as perf/device_plan.py's --free-gib default
MADD = (8, 2)  # (products, squares) of a mixed XYZZ addition
FULL_ADD = (12, 2)
# an affine addition of the grid rounds (grid_affine.cuh): 3 products of the shared inversion's
# prefix / walk back, the slope and y3, and the square of the slope (the inversion itself amortised)
AFFINE_ADD = (5, 1)
LAZY_FQ2 = 900 / 744  # fp2_t's IMADs per Fq2 product over fp2_lazy's (ff/fp2_lazy.cuh)
# The partitions modelled: (log_n, circuit, witness) -> (target ms or None, measured source).
# witness "circuit": the circuit's own; "porep": 40 % zeros, 40 % ones, 20 % random scalars in every
# section; "random": every scalar random. Targets: the rows of the GPU partition and 2^27 targets.
_POINTS = "gpu-msm-2^27-h200.json:partition_2^24_points_key."  # a point on every row: dense-random shape
_P24 = "gpu-session-h200-grid-g2.json:partition_2^24_circuit_key_ms.grid_g2."
CASES: dict[tuple[int, str, str], tuple[float | None, str]] = {
    (24, "porep-like", "circuit"): (150.0, _P24 + "circuit.total"),
    (24, "porep-like", "porep"): (150.0, _P24 + "porep.total"),
    (24, "porep-like", "random"): (None, _P24 + "random.total"),
    (24, "dense-random", "random"): (500.0, _POINTS + "prove_random_2^24_total_ms"),
    (27, "porep-like", "circuit"): (1200.0, "pipeline-h200-2^27.json:s_per_partition"),
}


def _load(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / name).read_text())


def rates() -> dict[str, float]:
    """Measured H200 product rates (per second): perf/results/gpu-h200.json."""
    d = _load("gpu-h200.json")
    return {"fq_mul": d["fq_mul_per_s"], "fq_sqr": d["fq_sqr_chains1_per_s"], "fq2_mul": d["fq2_mul_chains1_per_s"],
            "fr_mul": d["fr_mul_per_s"]}


def addition_seconds(kind: tuple[int, int], g2: bool, r: dict[str, float]) -> float:
    """Seconds of one curve addition's products at the measured rates."""
    muls, sqrs = kind
    if g2:
        return muls / (r["fq2_mul"] * LAZY_FQ2) + sqrs * 2 / r["fq_mul"]
    return muls / r["fq_mul"] + sqrs / r["fq_sqr"]


@functools.cache
def scalar_mix(kind: str, sample_log_n: int) -> dict[str, dict[str, float]]:
    """Per section: its rows as a fraction of n_wires, and the fractions of those rows whose scalar
    is 0, 1 or other, from one witness of the circuit at 2^sample_log_n."""
    circ = synthetic_circuit(kind, sample_log_n)
    r1cs = circ.r1cs()
    w = circ.witness(1, 0)
    zero = ~w.any(axis=1)
    one = (w[:, 0] == 1) & ~w[:, 1:].any(axis=1)
    n = w.shape[0]
    rows = {"a": np.arange(n), "c": np.arange(circ.n_public + 1, n),
            "b": np.unique(r1cs.b.indices.astype(np.int64))}
    out = {}
    for name, idx in rows.items():
        out[name] = {"rows": idx.size / n, "zero": float(zero[idx].mean()), "one": float(one[idx].mean())}
        out[name]["other"] = 1.0 - out[name]["zero"] - out[name]["one"]
    return out


def msm_floor(n_other: int, n_one: int, g2: bool, multiples_c: int | None, grid: bool,
              r: dict[str, float], copies: int | None = None) -> dict[str, Any]:
    """Products of one MSM: the windows' additions (affine where the grid rounds run: they merge
    nearly every entry of a bucket at the measured sizes, ~50-100 entries a bucket), the ones' sum
    (XYZZ: the rounds never take it), the reduction. ``copies``: with ``multiples_c``, a table of
    that many multiples (2^(c j) P, j < copies) instead of one per window, so each run of ``copies``
    consecutive windows shares a bucket set (None: every window, one set)."""
    c = multiples_c or choose_window(max(1, n_other))
    nw = window_count(c)
    sets = (-(-nw // copies) if copies else 1) if multiples_c else nw
    buckets = (1 << (c - 1)) * sets
    window_adds = n_other * nw
    s = window_adds * addition_seconds(AFFINE_ADD if grid else MADD, g2, r) + n_one * addition_seconds(MADD, g2, r)
    s += 2 * buckets * addition_seconds(FULL_ADD, g2, r)
    return {"c": c, "windows": nw, "multiples": bool(multiples_c), "grid_rounds": grid,
            "window_additions": window_adds, "ones": n_one, "reduction_buckets": buckets,
            "floor_ms": round(s * 1e3, 2)}


H_POINT_BYTES = 96  # an affine G1 point on the device (x, y: 12 uint64)


def h_copies(lg: int, r: dict[str, float]) -> list[dict[str, Any]]:
    """The dense H MSM at 2^lg with wider windows over a few copies of its points (2^(c j) H_i,
    j < copies; copies = 1: no multiples, a bucket set per window): its floor and the device memory
    the extra copies take. Where the plan has no room for a copy per window (2^27: 12 of 12 GiB),
    a few copies let c grow (fewer window additions) without a bucket set per window. Products
    only: measured, the 2^27 pipeline with 2 copies (c = 24) ran 6.7 % slower a partition
    (perf/results/pipeline-h200-2^27-h-copies.json: 2^23-bucket sets and a point table twice the
    size cost the accumulation more than the products saved)."""
    n = 1 << lg
    out = []
    for c in range(21, 27):
        for copies in range(1, 6):
            f = msm_floor(n, 0, False, c if copies > 1 else None, False, r, copies if copies > 1 else None)
            if copies == 1 and f["c"] != c:
                f = msm_floor(n, 0, False, c, False, r, 1)  # no multiples at this c: a set per window
            out.append({"c": c, "copies": copies, "windows": f["windows"], "window_additions": f["window_additions"],
                        "reduction_buckets": f["reduction_buckets"], "floor_ms": f["floor_ms"],
                        "extra_device_gib": round((copies - 1) * n * H_POINT_BYTES / (1 << 30), 1)})
    return out


def ntt_floor(lg: int, r: dict[str, float]) -> dict[str, Any]:
    """Fr products of the H step at 2^lg: 3 x (iNTT + coset factor + NTT) and the combine."""
    n = 1 << lg
    passes = pass_schedule(lg, plan_params(lg, NttParams()))
    per_transform = sum((n // 2) * (k - 1) + (n if s_lo > 0 else 0) for s_lo, k in passes)
    muls = 3 * (2 * per_transform + n) + 2 * n
    return {"passes": passes, "fr_products": muls, "floor_ms": round(muls / r["fr_mul"] * 1e3, 2)}


def measured_ms(source: str) -> float:
    """A committed H200 measurement in ms: ``file:dotted.path`` (seconds where the key says so)."""
    name, path = source.split(":")
    value: Any = _load(name)
    for key in path.split("."):
        value = value[key]
    return float(value) * (1e3 if path.startswith("s_per") else 1.0)


def partition(lg: int, circuit: str, witness: str, sample_log_n: int, r: dict[str, float]) -> dict[str, Any]:
    """The floors of one partition of ``circuit`` at 2^lg rows with the ``witness`` of :data:`CASES`,
    beside the measured total and the target."""
    circ = synthetic_circuit(circuit, lg)
    n_wires = circ.n_wires
    mix = scalar_mix(circuit, sample_log_n)
    fixed = {"porep": (0.4, 0.4, 0.2), "random": (0.0, 0.0, 1.0)}.get(witness)
    if fixed:
        mix = {k: {"rows": v["rows"], "zero": fixed[0], "one": fixed[1], "other": fixed[2]} for k, v in mix.items()}
    b_rows = int(mix["b"]["rows"] * n_wires)
    shape = KeyShape(1 << lg, n_wires, circ.n_public, (("b1", b_rows), ("b2", b_rows)))
    plan = plan_device(shape, H200_FREE, workers=2, multiples="auto")
    mult = plan.multiples
    params = plan.msm_params(msm_params_for(1 << lg))
    grid_g1, grid_g2 = bool(params.ga_rounds and params.ga_g1), bool(params.ga_rounds)
    stages: dict[str, Any] = {"ntt_h": ntt_floor(lg, r)}
    stages["msm_h"] = msm_floor(1 << lg, 0, False, mult.get("h"), grid_g1, r)
    for name, part, g2 in (("a", "a", False), ("b1", "b", False), ("c", "c", False), ("b2", "b", True)):
        m = mix[part]
        rows = m["rows"] * n_wires
        n_other, n_one = int(m["other"] * rows), int(m["one"] * rows)
        stages[f"msm_{name}"] = msm_floor(n_other, n_one, g2, mult.get(name), grid_g2 if g2 else grid_g1, r)
    total = sum(st["floor_ms"] for st in stages.values())
    target, source = CASES[(lg, circuit, witness)]
    got = measured_ms(source)
    return {"log_n": lg, "circuit": circuit, "witness": witness, "n_wires": n_wires, "scalar_mix": mix,
            "multiples": mult, "stages": stages, "floor_total_ms": round(total, 1), "measured_ms": round(got, 1),
            "measured_source": source, "floor_over_measured": round(total / got, 3), "target_ms": target,
            "target_over_floor": None if target is None else round(target / total, 3)}


def msm_checks(r: dict[str, float]) -> list[dict[str, Any]]:
    """The floor of single MSMs' window additions against their measured accumulation phase, and
    of the ones' sums against the ones phase (the phases the floor counts: its calibration)."""
    now = _load("gpu-msm-2^27-h200.json")["rows"]
    m = _load("gpu-msm-h200-2026-12-03.json")["rows"]
    c27 = window_count(choose_window(1 << 27))
    porep_w = int(0.2 * (1 << 27)) * window_count(choose_window(int(0.2 * (1 << 27))))
    ones = int(0.4 * (1 << 27))
    rows = [  # (what, mixed additions, G2, measured ms, source)
        ("g1 random 2^27", (1 << 27) * c27, False, now["g1_acc_xyzz_random_2^27_accumulate_ms"],
         "gpu-msm-2^27-h200.json g1_acc_xyzz_random_2^27_accumulate_ms"),
        ("g1 porep 2^27, windows", porep_w, False, now["g1_acc_xyzz_porep_2^27_accumulate_ms"],
         "gpu-msm-2^27-h200.json g1_acc_xyzz_porep_2^27_accumulate_ms"),
        ("g1 porep 2^27, ones", ones, False, now["g1_acc_xyzz_porep_2^27_ones_ms"],
         "gpu-msm-2^27-h200.json g1_acc_xyzz_porep_2^27_ones_ms"),
        ("g2 porep 2^27, windows", porep_w, True, now["g2_acc_xyzz_porep_2^27_accumulate_ms"],
         "gpu-msm-2^27-h200.json g2_acc_xyzz_porep_2^27_accumulate_ms"),
        ("g2 porep 2^27, ones", ones, True, now["g2_acc_xyzz_porep_2^27_ones_ms"],
         "gpu-msm-2^27-h200.json g2_acc_xyzz_porep_2^27_ones_ms"),
        ("g1 random 2^24", (1 << 24) * window_count(choose_window(1 << 24)), False,
         m["g1_msm_random_2^24_accumulate_ms"], "gpu-msm-h200-2026-12-03.json g1_msm_random_2^24_accumulate_ms"),
        ("g2 random 2^24", (1 << 24) * window_count(choose_window(1 << 24)), True,
         m["g2_msm_random_2^24_accumulate_ms"], "gpu-msm-h200-2026-12-03.json g2_msm_random_2^24_accumulate_ms"),
    ]
    out = []
    for what, madds, g2, got, source in rows:
        floor = madds * addition_seconds(MADD, g2, r) * 1e3
        out.append({"msm": what, "mixed_additions": madds, "floor_ms": round(floor, 1), "measured_ms": round(got, 1),
                    "floor_over_measured": round(floor / got, 3), "source": source})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sample-log-n", type=int, default=14, help="size of the witness the scalar mix is read from")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    r = rates()
    parts = [partition(lg, circuit, witness, args.sample_log_n, r) for lg, circuit, witness in CASES]
    checks = msm_checks(r)
    print("MSM accumulation against its floor (H200):")
    for c in checks:
        print(f"  {c['msm']:<24} floor {c['floor_ms']:8.1f} ms  measured {c['measured_ms']:8.1f} ms  "
              f"({100 * c['floor_over_measured']:.0f} %)")
    names = ["ntt_h", "msm_h", "msm_a", "msm_b1", "msm_c", "msm_b2"]
    print("\npartition floors, ms (products only, at the measured rates):")
    head = "".join(f"{s:>9}" for s in [*names, "floor"])
    print(f"  {'partition (witness)':<30}{head}{'measured':>10}{'target':>8}")
    for p in parts:
        row = "".join(f"{p['stages'][s]['floor_ms']:9.1f}" for s in names)
        what = f"2^{p['log_n']} {p['circuit']} ({p['witness']})"
        target = p["target_ms"] or "-"
        print(f"  {what:<30}{row}{p['floor_total_ms']:9.1f}{p['measured_ms']:10.1f}{target:>8}")
    copies = h_copies(27, r)
    now = next(x for x in copies if x["c"] == choose_window(1 << 27) and x["copies"] == 1)
    print(f"\nthe H MSM at 2^27 over copies of its points (now: c = {now['c']}, no copies, {now['floor_ms']:.1f} ms):")
    print(f"  {'c':>3} {'copies':>7} {'windows':>8} {'buckets':>10} {'floor ms':>9} {'extra GiB':>10}")
    for x in sorted(copies, key=lambda x: x["floor_ms"])[:8]:
        print(f"  {x['c']:>3} {x['copies']:>7} {x['windows']:>8} {x['reduction_buckets']:>10} {x['floor_ms']:9.1f}"
              f" {x['extra_device_gib']:10.1f}")
    if args.json:
        out = {"what": __doc__.splitlines()[0], "command": "python perf/floors.py " + " ".join(sys.argv[1:]),
               "machine": {"note": "computed from committed H200 measurements, no device involved",
                           "python": platform.python_version()},
               "rates_per_s": r, "msm_checks": checks, "partitions": parts, "h_msm_copies_2^27": copies}
        args.json.write_text(json.dumps(out, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
