"""GPU MSM and fixed-base benchmark (the MSM rows of perf/gpu_bench.py), checked as it goes.

Bases are made on the device by the fixed-base kernel from known discrete logs
t_i (t_i G), so every timed MSM is also checked: sum_i s_i (t_i G) must equal
(sum_i s_i t_i) G, with the dot product done by the numba Fr kernels. Scalars:
"random" (uniform, < 2^254) or "porep" (40 % zeros, 40 % ones, 20 % random).
Times are CUDA-event medians of ``reps`` runs after one warm-up, with the
per-phase split of ``MsmG1/G2.last_timings`` (classify, ones, digits, sort,
accumulate, reduce, finish).

Usage: ``python3 perf/gpu_msm_bench.py [--quick | --accumulate | --windows C,C.. | --reduce | --fixed-base]
[--multiples C] [--out FILE.json]``;
prints a table last. ``msm_rows(quick)`` is what perf/gpu_bench.py calls.
``--accumulate`` times only the bucket accumulation variants of :data:`ACCUMULATE_VARIANTS`
(XYZZ with other register caps or Fq products, the grid batch-affine rounds with a few chunk /
round / thread choices) for G1 and G2 at 2^24, random and
PoRep-like, then the reduction knobs (every result checked). :func:`time_msm` with ``multiples=c`` times the MSM over
precomputed multiples (the table build is timed apart).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from py_arkworks_bls12381 import G1Point, G2Point, Scalar  # noqa: E402

from cuzk_mp.algebra import fr  # noqa: E402
from cuzk_mp.algebra.field import R_MOD  # noqa: E402

from device_run import GpuStack  # noqa: E402

with GpuStack(__name__) as GPU_STACK:  # run as a script without it, only --help works (main() exits 2 saying why)
    import cupy

    from cuzk_mp.backends.gpu import fixed_base, msm
    from cuzk_mp.backends.gpu.modules import get_module

CHECKPOINT: Any = lambda rows: None  # main() points this at the --out writer (partial results survive a timeout)
PHASES = ("ones", "digits", "sort", "accumulate", "reduce", "d2h", "finish")


def _xyzz(**kw: Any) -> msm.MsmParams:
    """XYZZ accumulation whatever the default (which takes the grid rounds for G2), with ``kw``."""
    return msm.MsmParams(ga_rounds=0, **kw)


def _grid(**kw: Any) -> msm.MsmParams:
    """The grid rounds for both groups (at most 8 unless ``kw`` says), with ``kw``."""
    return msm.MsmParams(**{"ga_rounds": 8, "ga_g1": True, **kw})


# Bucket accumulation variants timed side by side (launch knobs of one compiled module, or a module
# compiled with other knobs at first use).
ACCUMULATE_VARIANTS: dict[str, msm.MsmParams] = {} if not GPU_STACK else {
    "xyzz": _xyzz(),
    # msm_accumulate's resident blocks of 128 (its register cap): G1 defaults to 4, G2 to 1 (= 2)
    "xyzz_mb2": _xyzz(acc_min_blocks=2),
    "xyzz_mb3": _xyzz(acc_min_blocks=3),
    "xyzz_mb4": _xyzz(acc_min_blocks=4),
    "xyzz_mb5": _xyzz(acc_min_blocks=5),
    # G1 only: the formulas' Y3 = a b - c d as two products, not the default's one reduction
    # (mont_t::mul_add, EC_FQ_FUSED=1)
    "unfused": _xyzz(fq_fused=False),
    # G1 only: the Fq products inlined at every use (EC_FQ_CALLS=0; the default makes them calls)
    "inline": _xyzz(fq_calls=False),
    # the radix sort's scatter at N blocks of 256 a SM (msm.cu MSM_RADIX_MIN_BLOCKS; default 2)
    "xyzz_rmb3": _xyzz(radix_min_blocks=3),
    "xyzz_rmb4": _xyzz(radix_min_blocks=4),
    # grid batch-affine rounds (kernels/msm/grid_affine.cuh): one inversion per round over all its
    # pairs; grid_rN: at most N rounds, grid_cN: 2^N entries a chunk, grid_tN: 2^N threads
    "grid": _grid(),
    "grid_r3": _grid(ga_rounds=3),
    "grid_c24": _grid(ga_chunk=1 << 24),
    "grid_c25": _grid(ga_chunk=1 << 25),
    "grid_c28": _grid(ga_chunk=1 << 28),
    "grid_t16": _grid(ga_threads=1 << 16),
    "grid_mb3": _grid(ga_min_blocks=3),
    "grid_mb4": _grid(ga_min_blocks=4),
    "grid_t18": _grid(ga_threads=1 << 18),
}


def random_scalars(n: int, dist: str, seed: int) -> np.ndarray:
    """(n, 4) standard-form scalars below 2^254; "porep": 80 % replaced by 0 (40 %) or 1 (40 %);
    "boolean": every scalar 0 or 1 (half each)."""
    g = np.random.default_rng(seed)
    if dist == "boolean":
        s = np.zeros((n, 4), dtype=np.uint64)
        s[:, 0] = g.integers(0, 2, size=n, dtype=np.uint64)
        return s
    s = g.integers(0, 1 << 63, size=(n, 4), dtype=np.uint64) * np.uint64(2) + g.integers(0, 2, size=(n, 4), dtype=np.uint64)
    s[:, 3] >>= np.uint64(2)
    if dist == "porep":
        pick = g.random(n)
        s[pick < 0.8] = 0
        s[pick < 0.4, 0] = 1
    return s


def dot_mod_r(s: np.ndarray, t: np.ndarray) -> int:
    """sum_i s_i t_i mod r for canonical standard-form rows (numba Fr kernels)."""
    p = fr.mul(s, t)  # s t R^-1 each
    while p.shape[0] > 1:
        if p.shape[0] % 2:
            p = np.concatenate([p, np.zeros((1, 4), dtype=np.uint64)])
        h = p.shape[0] // 2
        p = fr.add(p[:h], p[h:])
    return fr.to_ints(p, mont=False)[0] * FR_R % R_MOD


FR_R = (1 << 256) % R_MOD


class Bases:
    """n device points t_i G (t_i random below 2^254) and the host t_i."""

    def __init__(self, g2: bool, n: int, seed: int) -> None:
        self.g2, self.gen = g2, (G2Point() if g2 else G1Point())
        self.t = random_scalars(n, "random", seed)
        ev = [cupy.cuda.Event() for _ in range(2)]
        ev[0].record()
        self.d_points = fixed_base.FixedBase(self.gen).run_device(cupy.asarray(self.t))
        ev[1].record()
        ev[1].synchronize()
        self.make_ms = float(cupy.cuda.get_elapsed_time(ev[0], ev[1]))
        # the last scalar array (held, so no later array can take its place in memory), a sample of
        # its rows, and its expected sum
        self._last: tuple[Any, bytes, Any] = (None, b"", None)

    def expected(self, s: np.ndarray) -> Any:
        """(sum_i s_i t_i) G, remembered for the last scalar array while it holds the same rows (a
        2^27 dot product takes seconds). Keyed by the array itself and a sample of its rows: an
        array's address alone was reused by the next array of the same size (the porep rows after
        the random ones were checked against the random scalars' sum)."""
        sample = np.ascontiguousarray(s[:: max(1, s.shape[0] // 4096)]).tobytes()
        if self._last[0] is not s or self._last[1] != sample:
            total = dot_mod_r(s, self.t[: s.shape[0]])
            self._last = (s, sample, self.gen * Scalar.from_le_bytes(total.to_bytes(32, "little")))
        return self._last[2]


def multiples_of(bases: Bases, n: int, c: int) -> tuple[msm.Multiples, float]:
    """The precomputed multiples table (c-bit windows) of the first n bases, and its build ms."""
    ev = [cupy.cuda.Event() for _ in range(2)]
    ev[0].record()
    w = msm.window_count(c)
    mult = msm.Multiples(fixed_base.multiples_table(bases.d_points[:n], c, w), c, w, n)
    ev[1].record()
    ev[1].synchronize()
    return mult, float(cupy.cuda.get_elapsed_time(ev[0], ev[1]))


def time_msm(bases: Bases, s: np.ndarray, reps: int, params: msm.MsmParams | None = None,
             check: bool = True, multiples: int | msm.Multiples | None = None) -> dict[str, Any]:
    """Median ms (CUDA events, classification excluded: the prover classifies while staging)
    and phase split of ``reps`` runs; ``ok`` = result checked. ``multiples``: the window bits
    of a precomputed multiples table to build (its build time is ``build_ms``), or a table."""
    n = s.shape[0]
    mult, build_ms = None, 0.0
    if isinstance(multiples, int):
        mult, build_ms = multiples_of(bases, n, multiples)
    elif multiples is not None:
        mult = multiples
    cls = msm.MsmG2 if bases.g2 else msm.MsmG1
    obj = cls(mult.table[:n] if mult is not None else bases.d_points[:n], params, mult)
    d_s = cupy.asarray(s)
    plan = msm.classify(d_s)
    got = obj.launch(d_s, plan).result()  # warm-up
    runs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        pending = obj.launch(d_s, plan)
        pending.result()
        runs.append((dict(pending.timings), time.perf_counter() - t0))
    row: dict[str, Any] = {"ms": statistics.median(r[0]["total"] for r in runs),
                           "wall_ms": 1e3 * statistics.median(r[1] for r in runs), "build_ms": build_ms}
    for ph in PHASES + tuple(sorted(k for k in runs[0][0] if k.startswith("ga_"))):
        row[ph] = statistics.median(r[0].get(ph, 0.0) for r in runs)
    row["ok"] = bool(got == bases.expected(s)) if check else None
    row["resident_threads"] = obj.resident_threads
    obj.close()
    return row


def time_fixed_base(g2: bool, n: int, reps: int, params: fixed_base.FixedBaseParams | None = None,
                    check: int = 0) -> float:
    """Median device ms of n fixed-base products (tables already resident); with ``check``, that
    many sampled rows (and the first) are compared with arkworks first (AssertionError if not)."""
    fb = fixed_base.FixedBase(G2Point() if g2 else G1Point(), params)
    host = random_scalars(n, "random", n)
    d_s = cupy.asarray(host)
    out = cupy.empty((n, 24 if g2 else 12), dtype=np.uint64)
    fb.run_device(d_s, out)
    if check:
        from cuzk_mp.algebra import curve
        from cuzk_mp.algebra.field import limbs_to_ints

        rows = [0] + sorted(np.random.default_rng(n).choice(n, size=min(check, n), replace=False).tolist())
        got = cupy.asnumpy(out[cupy.asarray(rows)])
        to_lem = curve.g2_ark_to_lem if g2 else curve.g1_ark_to_lem
        gen = G2Point() if g2 else G1Point()
        for k, (i, v) in enumerate(zip(rows, limbs_to_ints(host[rows]))):
            assert np.array_equal(got[k], to_lem(gen * Scalar.from_le_bytes((v % R_MOD).to_bytes(32, "little")))), i
    times = []
    for _ in range(reps):
        ev = [cupy.cuda.Event() for _ in range(2)]
        ev[0].record()
        fb.run_device(d_s, out)
        ev[1].record()
        ev[1].synchronize()
        times.append(float(cupy.cuda.get_elapsed_time(ev[0], ev[1])))
    return statistics.median(times)


def fixed_base_rows(lg: int, reps: int, groups: tuple[str, ...]) -> dict[str, Any]:
    """The dev setup's fixed-base kernel at 2^lg random scalars, the 8-bit table against the signed
    16-bit windows (``FixedBaseParams.wbits``), 64 sampled rows of each checked against arkworks."""
    rows: dict[str, Any] = {}
    for grp in groups:
        for label, params in (("w8", fixed_base.FixedBaseParams(wbits=0)), ("signed16", fixed_base.FixedBaseParams())):
            key = f"{grp}_fixed_base_{label}_2^{lg}"
            rows[f"{key}_ms"] = time_fixed_base(grp == "g2", 1 << lg, reps, params, check=64)
            rows[f"{key}_ok"] = True
            CHECKPOINT(rows)
    return rows


def _flatten(rows: dict[str, Any], key: str, r: dict[str, Any]) -> None:
    rows[f"{key}_ms"] = r["ms"]
    rows[f"{key}_ok"] = r["ok"]
    rows[f"{key}_resident_threads"] = r["resident_threads"]
    if r.get("build_ms"):
        rows[f"{key}_build_ms"] = r["build_ms"]
    for ph in PHASES + tuple(k for k in r if k.startswith("ga_")):
        rows[f"{key}_{ph}_ms"] = r[ph]


def msm_rows(quick: bool) -> dict[str, Any]:
    """All rows: G1 random/porep at 2^20/2^24/2^26, G2 at 2^20/2^24, knob sweeps, fixed-base."""
    if quick:
        return bench_rows({False: (20,), True: (20,)}, reps=3, sweep_lg=None, fb_sizes=(20,))
    return bench_rows({False: (20, 24, 26), True: (20, 24)}, reps=3, sweep_lg=24, fb_sizes=(20, 24))


def bench_rows(plan: dict[bool, tuple[int, ...]], reps: int, sweep_lg: int | None,
               fb_sizes: tuple[int, ...]) -> dict[str, Any]:
    """MSM rows for {g2: log2 sizes}, an optional knob sweep at 2^sweep_lg, fixed-base rows."""
    rows: dict[str, Any] = {}
    for g2, sizes in plan.items():
        grp = "g2" if g2 else "g1"
        _compile(rows, g2)  # per group, so G1 rows exist even if a G2 compile is slow
        bases = Bases(g2, 1 << max(sizes), seed=7)
        rows[f"{grp}_fixed_base_bases_2^{max(sizes)}_ms"] = bases.make_ms
        CHECKPOINT(rows)
        for lg in sizes:
            for dist in ("random", "porep"):
                r = time_msm(bases, random_scalars(1 << lg, dist, lg), reps)
                _flatten(rows, f"{grp}_msm_{dist}_2^{lg}", r)
                CHECKPOINT(rows)
        if sweep_lg is not None and sweep_lg in sizes:
            _sweep(rows, grp, bases, sweep_lg, reps)
            CHECKPOINT(rows)
        del bases
        cupy.get_default_memory_pool().free_all_blocks()
    for g2 in (False, True):
        for lg in fb_sizes:
            rows[f"{'g2' if g2 else 'g1'}_fixed_base_2^{lg}_ms"] = time_fixed_base(g2, 1 << lg, reps)
    rows["gpu"] = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    rows["date"] = datetime.date.today().isoformat()
    return rows


def accumulate_rows(lg: int = 24, reps: int = 3, names: list[str] | None = None,
                    groups: tuple[str, ...] = ("g1", "g2"), dists: tuple[str, ...] = ("random", "porep"),
                    multiples: int | None = None) -> dict[str, Any]:
    """Rows at 2^lg of ``groups`` for the :data:`ACCUMULATE_VARIANTS` entries ``names`` (all: None;
    the scalar distributions ``dists``, checked; over a table of ``multiples``-bit precomputed
    multiples, rows ``..._mult<c>_...``, else plain), then, for all, the runtime reduction knobs
    of the G2 default."""
    rows: dict[str, Any] = {}
    picked = {k: ACCUMULATE_VARIANTS[k] for k in (names or ACCUMULATE_VARIANTS)}
    tag = f"_mult{multiples}" if multiples else ""
    for g2 in [g == "g2" for g in ("g1", "g2") if g in groups]:
        grp = "g2" if g2 else "g1"
        bases = Bases(g2, 1 << lg, seed=7)
        mult = multiples_of(bases, 1 << lg, multiples)[0] if multiples else None
        for dist in dists:
            s = random_scalars(1 << lg, dist, lg)
            for name, params in picked.items():
                _flatten(rows, f"{grp}_acc_{name}{tag}_{dist}_2^{lg}", time_msm(bases, s, reps, params, True, mult))
                CHECKPOINT(rows)
        if g2 and names is None:
            _reduce_sweep(rows, grp, bases, lg, reps)
        del bases, mult
        cupy.get_default_memory_pool().free_all_blocks()
    rows["gpu"] = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    rows["date"] = datetime.date.today().isoformat()
    return rows


def _load(rows: dict[str, Any], label: str, path: str, defines: dict[str, int]) -> None:
    """Load one module (the shipped binary, or NVRTC where none fits); seconds in ``load_<label>_s``."""
    t0 = time.perf_counter()
    get_module(path, defines)
    rows[f"load_{label}_s"] = time.perf_counter() - t0


def _compile(rows: dict[str, Any], g2: bool) -> None:
    """Load one group's modules; seconds each."""
    grp = "g2" if g2 else "g1"
    for path, defines in ((msm.MSM_PATH, msm.MsmParams().defines(g2)),
                          (fixed_base.FB_PATH, fixed_base.FixedBaseParams().defines(g2))):
        _load(rows, f"{path.split('/')[0]}_{grp}", path, defines)
        CHECKPOINT(rows)


def _sweep(rows: dict[str, Any], grp: str, bases: Bases, lg: int, reps: int) -> None:
    """Window bits and segment length at 2^lg random scalars (runtime knobs, no recompile)."""
    s = random_scalars(1 << lg, "random", 99)
    for c in (lg - 6, lg - 5, lg - 3, lg - 2):
        rows[f"{grp}_sweep_2^{lg}_c{c}_ms"] = time_msm(bases, s, reps, msm.MsmParams(window_bits=c), False)["ms"]
    for seg in (32, 128):
        rows[f"{grp}_sweep_2^{lg}_seg{seg}_ms"] = time_msm(bases, s, reps, msm.MsmParams(seg=seg), False)["ms"]
    _reduce_sweep(rows, grp, bases, lg, reps)


def _random_rows(lg: int, reps: int, groups: tuple[str, ...], multiples: int | None,
                 configs: list[tuple[str, msm.MsmParams]]) -> dict[str, Any]:
    """Random 2^lg MSMs of ``groups``, each result checked, once per (name, params) of ``configs``
    (over a table of ``multiples``-bit precomputed multiples, else plain): rows
    ``<group>_<name>_random_2^lg_*``."""
    rows: dict[str, Any] = {}
    for g2 in [g == "g2" for g in ("g1", "g2") if g in groups]:
        grp = "g2" if g2 else "g1"
        bases = Bases(g2, 1 << lg, seed=7)
        s = random_scalars(1 << lg, "random", lg)
        mult = multiples_of(bases, 1 << lg, multiples)[0] if multiples else None
        for name, params in configs:
            _flatten(rows, f"{grp}_{name}_random_2^{lg}", time_msm(bases, s, reps, params, True, mult))
            CHECKPOINT(rows)
        del bases, mult
        cupy.get_default_memory_pool().free_all_blocks()
    rows["gpu"] = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    rows["date"] = datetime.date.today().isoformat()
    return rows


def window_rows(lg: int, reps: int, groups: tuple[str, ...], windows: tuple[int, ...],
                multiples: int | None = None) -> dict[str, Any]:
    """Random 2^lg MSMs (checked) at each window size of ``windows`` (precomputed multiples:
    ``multiples`` bits instead, one row): what :func:`msm.choose_window` is tuned with."""
    configs = ([(f"mult{multiples}", msm.MsmParams())] if multiples
               else [(f"window{c}", msm.MsmParams(window_bits=c)) for c in windows])
    return _random_rows(lg, reps, groups, multiples, configs)


# (levels, r): the reduction's MsmParams.reduce_levels and reduce_threads r; the first is the
# defaults before the second reduction over the chunks' sums (combine_seg and group 2 in all)
REDUCE_GRID = ((1, 1 << 15), (2, 1 << 15), (2, 1 << 16), (2, 1 << 17))


def _reduce_params(levels: int, r: int) -> msm.MsmParams:
    return msm.MsmParams(reduce_levels=levels, reduce_threads=r)


def _reduce_tag(levels: int, r: int) -> str:
    return f"l{levels}_r{r.bit_length() - 1}"


def reduce_rows(lg: int, reps: int, groups: tuple[str, ...], multiples: int | None = None) -> dict[str, Any]:
    """Random 2^lg MSMs (checked) over the reduction's knobs of :data:`REDUCE_GRID`: how a chunk's
    sum gets its weight (reduce_levels: a scalar multiplication a thread, or a second reduction over
    the chunks' sums) and reduce_threads r (buckets per thread of the bucket reduction: nb / r).
    ``multiples``: over a table of that many bits."""
    pre = f"mult{multiples}" if multiples else "plain"
    return _random_rows(lg, reps, groups, multiples,
                        [(f"{pre}_{_reduce_tag(lv, r)}", _reduce_params(lv, r)) for lv, r in REDUCE_GRID])


def _reduce_sweep(rows: dict[str, Any], grp: str, bases: Bases, lg: int, reps: int) -> None:
    """The reduction knobs of :data:`REDUCE_GRID` on random and PoRep-like scalars (unchecked)."""
    for dist in ("random", "porep"):
        s = random_scalars(1 << lg, dist, 99)
        for lv, r in REDUCE_GRID:
            res = time_msm(bases, s, reps, _reduce_params(lv, r), False)
            rows[f"{grp}_sweep_{dist}_2^{lg}_{_reduce_tag(lv, r)}_ms"] = res["ms"]
            rows[f"{grp}_sweep_{dist}_2^{lg}_{_reduce_tag(lv, r)}_reduce_ms"] = res["reduce"]


def _table(rows: dict[str, Any]) -> str:
    lines = [f"{'MSM':36} {'ms':>9} ok   " + " ".join(f"{p[:6]:>7}" for p in PHASES)]
    for k in sorted(rows):
        if k.endswith("_ms") and k[:-3] + "_ok" in rows:
            base = k[:-3]
            lines.append(f"{base:36} {rows[k]:9.2f} {str(rows[base + '_ok'])[0]}    "
                         + " ".join(f"{rows.get(f'{base}_{p}_ms', 0.0):7.2f}" for p in PHASES))
    lines += [f"{k:48} {v:9.2f}" for k, v in sorted(rows.items())
              if isinstance(v, float) and ("sweep" in k or "fixed_base" in k or k.startswith("load"))]
    return "\n".join(lines)


def main() -> None:
    """Run the rows, print the table last, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2^20 only, 3 reps")
    ap.add_argument("--accumulate", action="store_true", help="only the accumulation variants at 2^24")
    ap.add_argument("--variants", default=None,
                    help=f"with --accumulate: a comma list of "
                         f"{', '.join(ACCUMULATE_VARIANTS) or 'the names in ACCUMULATE_VARIANTS'} (default all)")
    ap.add_argument("--reps", type=int, default=3, help="with --accumulate: timed runs per row")
    ap.add_argument("--groups", default="g1,g2", help="with --accumulate: g1, g2 or both (default)")
    ap.add_argument("--lg", type=int, default=24, help="with --accumulate: log2 of the MSM size (default 24)")
    ap.add_argument("--dists", default="random,porep", help="with --accumulate: random, porep or both (default)")
    ap.add_argument("--windows", default=None,
                    help="a comma list of window bits: random MSMs at --lg for --groups at each (no --accumulate)")
    ap.add_argument("--multiples", type=int, default=None,
                    help="with --windows, --reduce or --accumulate: precomputed multiples of this many bits")
    ap.add_argument("--reduce", action="store_true",
                    help="random MSMs at --lg for --groups over the reduction knobs of REDUCE_GRID")
    ap.add_argument("--fixed-base", action="store_true",
                    help="the fixed-base kernel at --lg for --groups: 8-bit table against signed 16-bit windows")
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    GPU_STACK.require("gpu_msm_bench.py")
    global CHECKPOINT
    if args.out:
        out = args.out
        CHECKPOINT = lambda rows: out.write_text(json.dumps(rows, indent=1, sort_keys=True))  # noqa: E731
    names = args.variants.split(",") if args.variants else None
    if names and set(names) - set(ACCUMULATE_VARIANTS):
        ap.error(f"unknown variants {sorted(set(names) - set(ACCUMULATE_VARIANTS))}")
    groups = tuple(args.groups.split(","))
    if set(groups) - {"g1", "g2"}:
        ap.error(f"--groups: g1 and/or g2, not {args.groups}")
    dists = tuple(args.dists.split(","))
    if set(dists) - {"random", "porep"}:
        ap.error(f"--dists: random and/or porep, not {args.dists}")
    if args.fixed_base:
        rows = fixed_base_rows(args.lg, args.reps, groups)
    elif args.reduce:
        rows = reduce_rows(args.lg, args.reps, groups, args.multiples)
    elif args.windows:
        rows = window_rows(args.lg, args.reps, groups, tuple(int(c) for c in args.windows.split(",")),
                           args.multiples)
    elif args.accumulate:
        rows = accumulate_rows(args.lg, args.reps, names, groups, dists, args.multiples)
    else:
        rows = msm_rows(args.quick)
    CHECKPOINT(rows)
    print(_table(rows))


if __name__ == "__main__":
    main()
