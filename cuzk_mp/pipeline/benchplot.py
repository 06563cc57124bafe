"""The picture of a ``cuzk-mp bench`` run: one lane per process, every stage in time, memory beside it.

Owns the bench JSON's ``timeline`` section (:func:`timeline_section`: the lanes, the memory
samples and the bounds they are held to; each partition's ``spans`` come from the engine,
:mod:`.timeline`) and the drawing made from that JSON alone (:func:`draw`), so the picture can
be redrawn from a saved result (``python -m cuzk_mp.pipeline.benchplot RESULT.json OUT.png``).

Top panel: a lane per synthesis worker, per ring slot (the time a partition sat READY there) and
per prover process, top to bottom as a partition flows. A prover's lane has a row for the host
side (staging, waiting for the device), one for the device stage and one for finalize; the host
row splits where the prover's worker threads overlap. Each stage has its colour; each job
its edge colour and hatching, and device bars are labelled ``job.partition`` where they are wide
enough. Bottom panel: host memory over time (PSS by process kind, stacked, plus the ring's shm)
against the memory bound calibrated on the first job, the model's bound and the host budget.

matplotlib is optional (``pip install 'cuzk-mp[plot]'``) and imported only to draw.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from .benchreport import s_per_partition
from ..logs import fmt_bytes

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# drawing order of the legend and of overlapping bars
STAGE_COLORS = {
    "ring_wait": "#b8b8b8", "shm_write": "#9467bd", "synthesis": "#ff7f0e", "witness": "#ffd08a",
    "staging": "#17becf", "device_wait": "#f4a6c8", "device": "#1f77b4", "finalize": "#2ca02c",
}
STAGE_LABELS = {"ring_wait": "ring wait", "shm_write": "shm write", "synthesis": "synthesis",
                "witness": "witness (part of synthesis)", "staging": "staging", "device_wait": "device wait",
                "device": "device", "finalize": "finalize"}
PROVER_TRACKS = {"staging": "host", "device_wait": "host", "device": "device", "finalize": "finalize"}
JOB_EDGES = ("#1b1b1b", "#d62728", "#006d2c", "#54278f", "#8c510a", "#08519c", "#b2182b", "#525252")
JOB_HATCHES = ("", "//", "\\\\", "xx", "..", "--", "++", "oo")
LANE_GROUPS = ("cuzk-synth-", "ring-slot-", "cuzk-prover-")


def _lane_key(name: str) -> tuple[int, int, str]:
    for rank, prefix in enumerate(LANE_GROUPS):
        if name.startswith(prefix):
            suffix = name[len(prefix):]
            return rank, int(suffix) if suffix.isdigit() else 0, name
    return len(LANE_GROUPS), 0, name


def lanes_of(partitions: Iterable[dict[str, Any]]) -> list[str]:
    """The lanes, top to bottom: synthesis workers, ring slots, prover processes (each by number)."""
    return sorted({s["process"] for p in partitions for s in p.get("spans", [])}, key=_lane_key)


def timeline_section(partitions: list[dict[str, Any]], detail: Sequence[tuple[float, dict[str, int], int]],
                     bounds: dict[str, int | None], t0: float) -> dict[str, Any]:
    """The JSON ``timeline``: ``t0`` (the first run's start, just before its first submit, on
    ``time.monotonic()``), ``wall_t0`` (the same
    moment as a Unix time), ``lanes``, ``memory`` (columns: ``t``, ``host_bytes``, ``shm_bytes``,
    ``pss_bytes_by_process``) and ``bounds`` (bytes).

    Every time in the timeline (the spans, the memory samples' ``t``, ``t0``) is on the monotonic
    clock, the one the engine places its spans on: a step of the system clock during the bench moves
    no bar away from the others. ``wall_t0`` anchors it to real time, the wall clock read once (here,
    against the monotonic clock read with it): a time ``t`` of the timeline happened at about
    ``wall_t0 + (t - t0)``, as the wall clock read when the result was made."""
    names = sorted({n for _, by_name, _ in detail for n in by_name}, key=_lane_key)
    memory = {"t": [t for t, _, _ in detail],
              "host_bytes": [sum(by_name.values()) + shm for _, by_name, shm in detail],
              "shm_bytes": [shm for _, _, shm in detail],
              "pss_bytes_by_process": {n: [by_name.get(n, 0) for _, by_name, _ in detail] for n in names}}
    wall_t0 = time.time() - (time.monotonic() - t0)
    return {"t0": t0, "wall_t0": wall_t0, "lanes": lanes_of(partitions), "memory": memory, "bounds": bounds}


def _pack(intervals: list[tuple[float, float]]) -> tuple[list[int], int]:
    """Greedy rows for intervals (in the given order) so that none overlaps another in its row."""
    ends: list[float] = []
    rows = []
    eps = 1e-6
    for start, end in intervals:
        for r, last in enumerate(ends):
            if start >= last - eps:
                ends[r] = end
                rows.append(r)
                break
        else:
            ends.append(end)
            rows.append(len(ends) - 1)
    return rows, max(1, len(ends))


def _track(stage: str, lane: str) -> str:
    return PROVER_TRACKS.get(stage, "main") if lane.startswith("cuzk-prover-") else "main"


def _layout(bars: list[dict[str, Any]], lanes: list[str]) -> tuple[dict[str, tuple[float, float]], list[float]]:
    """Set each bar's ``y`` and ``h`` (in place); lane y ranges (bottom, top) and lane centres.

    Lanes are one unit high, listed top to bottom; a lane's rows share it equally."""
    ranges: dict[str, tuple[float, float]] = {}
    centres = []
    for i, lane in enumerate(lanes):
        top = len(lanes) - i
        ranges[lane] = (top - 1, top)
        centres.append(top - 0.5)
        mine = [b for b in bars if b["process"] == lane and b["stage"] != "witness"]
        tracks = [t for t in ("host", "device", "finalize", "main") if any(_track(b["stage"], lane) == t for b in mine)]
        rows_total = 0
        placed: list[tuple[dict[str, Any], int]] = []
        for track in tracks:
            of_track = sorted((b for b in mine if _track(b["stage"], lane) == track), key=lambda b: b["start"])
            if track == "host":  # a prover's worker threads stage at the same time: a row each
                rows, n = _pack([(b["start"], b["end"]) for b in of_track])
            else:  # one at a time by construction (a slot, a worker, the device lock, the finalizer)
                rows, n = [0] * len(of_track), 1
            placed += [(b, rows_total + r) for b, r in zip(of_track, rows)]
            rows_total += n
        height = 0.84 / max(1, rows_total)
        for b, row in placed:
            b["y"], b["h"] = top - 0.08 - (row + 1) * height, height * 0.9
    for b in bars:  # witness: a thinner bar inside its synthesis bar
        if b["stage"] == "witness":
            host = next((s for s in bars if s["stage"] == "synthesis" and s["process"] == b["process"]
                         and s["job"] == b["job"] and s["index"] == b["index"] and "y" in s), None)
            if host is not None:
                b["y"], b["h"] = host["y"] + host["h"] * 0.3, host["h"] * 0.4
    return ranges, centres


def title_text(result: dict[str, Any]) -> str:
    """The configuration as three readable lines (circuit and load; shape and machine; headline figures)."""
    c, m = result["config"], result.get("machine", {})
    runs = f" x {c['repeat']} runs" if c.get("repeat", 1) > 1 else ""
    devices = ", ".join(str(d) for d in c.get("devices", []))
    line1 = (f"cuzk-mp bench: {c['circuit']} 2^{c['log_n']}, {c['jobs']} jobs x {c['partitions']} partitions{runs} "
             f"({c['in_flight']} in flight), {c['backend']} backend, device{'s' if ',' in devices else ''} {devices}")
    pw, th = c["partition_workers"], c["synthesis_threads"]
    shape = (f"{pw} synthesis worker{'s' if pw != 1 else ''} x {th} thread{'s' if th != 1 else ''}, "
             f"{c['ring_slots']} ring slots, {c['gpu_workers']} prover workers per device"
             + (f", host budget {c['host_budget']}" if c.get("host_budget") else ""))
    machine = ", ".join(x for x in (m.get("cpu_model") or "", f"{m['cores']} cores" if m.get("cores") else "",
                                    f"{fmt_bytes(m['memory_bytes'])} RAM" if m.get("memory_bytes") else "",
                                    "; ".join(m.get("gpus") or [])) if x)
    per_job = f", {result['s_per_job']:.2f} s/job" if result.get("s_per_job") is not None else ""
    line3 = (f"{s_per_partition(result)[0]:.3f} s/partition steady{per_job}, first job {result['first_job_s']:.2f} s, "
             f"peak host {fmt_bytes(result['peak_host_bytes'])}, "
             f"{result['proofs_verified']}/{result['proofs_total']} proofs verified"
             + (f", commit {m['git_commit']}" if m.get("git_commit") else ""))
    return "\n".join((line1, f"{shape} | {machine}" if machine else shape, line3))


def _bars(result: dict[str, Any], t0: float) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Every span as a bar (seconds from ``t0``) and each job's ordinal, in submit order: the order of each
    job's earliest span (its queue wait begins at its submit), on the spans' monotonic clock, not of the
    wall-clock submit times a step of the clock reorders (nor of the ids, "bench-0-10" before "bench-0-2")."""
    parts = result["partitions"]
    first: dict[str, float] = {}
    for p in parts:
        for sp in p.get("spans", []):
            first[p["job"]] = min(first.get(p["job"], sp["start"]), sp["start"])
    jobs: dict[str, int] = {}
    for p in sorted(parts, key=lambda p: (first.get(p["job"], float("inf")), p["job"])):
        jobs.setdefault(p["job"], len(jobs))
    bars = [{"stage": s["stage"], "process": s["process"], "start": s["start"] - t0, "end": s["end"] - t0,
             "job": p["job"], "index": p["index"]} for p in parts for s in p.get("spans", [])]
    return bars, jobs


def draw(result: dict[str, Any]) -> Figure:
    """The figure for a bench result (the JSON as :func:`~.benchsummary.summarize` makes it)."""
    tl = result.get("timeline")
    if not tl:
        raise InputError("this bench result has no timeline (it was written by an older cuzk-mp): rerun the bench")
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its font cache notes are not the bench's
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    t0, lanes = tl["t0"], tl["lanes"]
    bars, jobs = _bars(result, t0)
    _, centres = _layout(bars, lanes)
    fig = Figure(figsize=(15, 3.2 + 0.42 * len(lanes) + 2.6))
    grid = fig.add_gridspec(2, 1, height_ratios=[max(2.0, 0.42 * len(lanes)), 2.4], hspace=0.12)
    ax = fig.add_subplot(grid[0])
    mem_ax = fig.add_subplot(grid[1], sharex=ax)
    x_end = max((b["end"] for b in bars), default=1.0)
    order = {s: i for i, s in enumerate(STAGE_COLORS)}
    for b in sorted(bars, key=lambda b: order.get(b["stage"], len(order))):
        if "y" not in b:
            continue
        k = jobs[b["job"]]
        ax.barh(b["y"], b["end"] - b["start"], left=b["start"], height=b["h"], align="edge",
                color=STAGE_COLORS.get(b["stage"], "#7f7f7f"), edgecolor=JOB_EDGES[k % len(JOB_EDGES)],
                hatch=JOB_HATCHES[k % len(JOB_HATCHES)], linewidth=0.6,
                gid=f"{b['stage']}|{b['process']}|{b['job']}|{b['index']}")
        if b["stage"] == "device" and b["end"] - b["start"] > 0.025 * x_end:
            ax.text((b["start"] + b["end"]) / 2, b["y"] + b["h"] / 2, f"{k}.{b['index']}", ha="center",
                    va="center", fontsize=6, color="white")
    for y in range(1, len(lanes)):
        ax.axhline(y, color="#dddddd", linewidth=0.6)
    ax.set_yticks(centres, lanes)
    ax.set_ylim(0, len(lanes))
    ax.set_xlim(0, x_end * 1.01)
    ax.tick_params(labelbottom=False)
    ax.set_title(title_text(result), fontsize=9, loc="left")
    stages = [s for s in STAGE_COLORS if any(b["stage"] == s for b in bars)]
    handles = [Patch(facecolor=STAGE_COLORS[s], label=STAGE_LABELS[s]) for s in stages]
    handles += [Patch(facecolor="white", edgecolor=JOB_EDGES[k % len(JOB_EDGES)],
                      hatch=JOB_HATCHES[k % len(JOB_HATCHES)], label=f"job {k}: {job}")
                for job, k in list(jobs.items())[:12]]
    if len(jobs) > 12:
        handles.append(Patch(facecolor="white", edgecolor="white", label=f"... {len(jobs) - 12} more jobs"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7, frameon=False)
    _memory_panel(mem_ax, tl, t0)
    mem_ax.set_xlabel(_x_label(tl))
    fig.subplots_adjust(left=0.09, right=0.83, top=1 - 0.75 / fig.get_figheight(), bottom=0.5 / fig.get_figheight())
    return fig


def _x_label(tl: dict[str, Any]) -> str:
    """The time axis's name: seconds from ``t0``, and its date (UTC) where the result has it."""
    wall = tl.get("wall_t0")
    since = "" if wall is None else time.strftime(" (%Y-%m-%d %H:%M:%S UTC)", time.gmtime(wall))
    return f"seconds since the first submit{since}"


def _memory_panel(ax: Any, tl: dict[str, Any], t0: float) -> None:
    mem, bounds = tl["memory"], tl.get("bounds", {})
    t = [x - t0 for x in mem["t"]]
    peak = max([*mem["host_bytes"], *(v for v in bounds.values() if v)], default=1)
    unit, unit_name = (2**30, "GiB") if peak >= 2 * 2**30 else (2**20, "MiB")
    groups: dict[str, list[float]] = {}
    for name, series in mem["pss_bytes_by_process"].items():
        kind = ("synthesis workers" if name.startswith("cuzk-synth-") else "provers" if name.startswith("cuzk-prover-")
                else "engine" if name == "engine" else "other processes")
        acc = groups.setdefault(kind, [0.0] * len(t))
        for i, v in enumerate(series):
            acc[i] += v / unit
    kinds = [k for k in ("engine", "synthesis workers", "provers", "other processes") if k in groups]
    colors = {"engine": "#c7c7c7", "synthesis workers": "#ffbb78", "provers": "#aec7e8", "other processes": "#e7e7e7",
              "ring shm": "#c5b0d5"}
    if t:
        ax.stackplot(t, *[groups[k] for k in kinds], [v / unit for v in mem["shm_bytes"]],
                     labels=[f"PSS: {k}" for k in kinds] + ["ring shm"],
                     colors=[colors[k] for k in kinds] + [colors["ring shm"]])
        ax.plot(t, [v / unit for v in mem["host_bytes"]], color="black", linewidth=0.8, label="host (PSS + shm)",
                gid="host_bytes")
    for key, label, style in (("bound_bytes", "bound (first-job calibration)", dict(color="#d62728", linestyle="--")),
                              ("model_bound_bytes", "the model's bound", dict(color="#6a3d9a", linestyle=":")),
                              ("host_budget_bytes", "host budget", dict(color="black", linestyle="-."))):
        if bounds.get(key):
            ax.axhline(bounds[key] / unit, linewidth=1.0, label=label, gid=key, **style)
    ax.set_ylabel(f"host memory ({unit_name})")
    ax.set_ylim(0, peak / unit * 1.08)
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7, frameon=False)


def plot_timeline(result: dict[str, Any], path: Path) -> None:
    """Draw :func:`draw`'s figure into ``path`` (the format follows its suffix: .png, .svg, .pdf), whole
    or not at all; a path that cannot take it is an OutputError naming it."""
    from ..formats.atomic import atomic_output

    fig = draw(result)
    with atomic_output(path, "wb") as f:  # a file object: matplotlib takes the format from the name no more
        fig.savefig(f, dpi=120, format=path.suffix.lstrip(".").lower() or None)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cuzk_mp.pipeline.benchplot RESULT.json OUT.png``: redraw a saved bench result."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0].startswith("-"):
        print("usage: python -m cuzk_mp.pipeline.benchplot RESULT.json OUT.png", file=sys.stderr)
        return 2
    try:
        result = json.loads(Path(args[0]).read_text())
        plot_timeline(result, Path(args[1]))
    except (OSError, ValueError, KeyError, InputError) as e:
        print(f"benchplot: {args[0]}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
