"""Prometheus metrics: the daemon's counters and histograms, and the text exposition format.

This module owns the daemon-side metric state. It is fed by the job table (every partition and
job result, every request) and rendered, together with gauges read from the engine's status and
metrics at scrape time, as Prometheus text format 0.0.4 (served by GET /metrics and GetMetrics).
Unlike cuzk's "summary" over the last 1000 durations (reference/cuzk.md section 1.8), durations
are real cumulative histograms, so rates and quantiles can be computed by Prometheus.

Metric names (all prefixed ``cuzk_``):

* ``proofs_completed_total{circuit}``, ``proofs_failed_total{circuit}``: partitions
* ``jobs_total{circuit,state}``: finished jobs by final state (done, failed, cancelled)
* ``job_duration_seconds{circuit}``: submit to finish of jobs that completed (histogram)
* ``partition_stage_seconds{stage}``: per-partition stage timings from the engine (histogram)
* ``gpu_busy_seconds_total{device}``: sum of the partitions' device-compute time
* ``requests_total{op}``, ``request_errors_total{op,kind}``, ``request_duration_seconds{op}``
* gauges at scrape time: ``queue_depth``, ``jobs{state}``, ``ring_slots{state}``,
  ``ring_occupancy``, ``srs_bytes{circuit,tier}``, ``srs_budget_bytes``, ``memory_bytes{kind}``,
  ``processes_alive{role}``, ``uptime_seconds``
* ``engine_*``: everything in ``Engine.metrics()`` (counters, gauges, stage histograms).
"""

from __future__ import annotations

import math
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

Labels = tuple[tuple[str, str], ...]

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    120.0, 300.0, 600.0, 1800.0, 3600.0)


def _labels(**kv: object) -> Labels:
    return tuple(sorted((k, str(v)) for k, v in kv.items()))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _fmt_labels(labels: Labels, extra: tuple[str, str] | None = None) -> str:
    items = list(labels) + ([extra] if extra else [])
    if not items:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in items) + "}"


def _fmt_value(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if math.isnan(v):
        return "NaN"
    return repr(float(v)) if not float(v).is_integer() else str(int(v))


class Histogram:
    """A cumulative-bucket histogram per label set."""

    def __init__(self, buckets: Iterable[float] = DURATION_BUCKETS) -> None:
        self.buckets = tuple(sorted(buckets))
        self.counts: dict[Labels, list[int]] = {}
        self.sums: dict[Labels, float] = defaultdict(float)

    def observe(self, value: float, labels: Labels = ()) -> None:
        """Add one observation."""
        counts = self.counts.setdefault(labels, [0] * (len(self.buckets) + 1))
        for i, b in enumerate(self.buckets):
            if value <= b:
                counts[i] += 1
        counts[-1] += 1
        self.sums[labels] += value

    def lines(self, name: str) -> list[str]:
        """Text-format sample lines (_bucket, _sum, _count)."""
        out = []
        for labels, counts in sorted(self.counts.items()):
            for b, c in zip(self.buckets, counts):
                out.append(f"{name}_bucket{_fmt_labels(labels, ('le', _fmt_value(b)))} {c}")
            out.append(f"{name}_bucket{_fmt_labels(labels, ('le', '+Inf'))} {counts[-1]}")
            out.append(f"{name}_sum{_fmt_labels(labels)} {_fmt_value(self.sums[labels])}")
            out.append(f"{name}_count{_fmt_labels(labels)} {counts[-1]}")
        return out


class Exposition:
    """Builds one Prometheus text document, family by family."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def family(self, name: str, kind: str, help_text: str, samples: Iterable[str]) -> None:
        """Append a metric family with its HELP and TYPE lines."""
        self.parts.append(f"# HELP {name} {help_text}")
        self.parts.append(f"# TYPE {name} {kind}")
        self.parts.extend(samples)

    def simple(self, name: str, kind: str, help_text: str,
               values: Mapping[Labels, float] | float) -> None:
        """A counter or gauge: one value, or one per label set."""
        if not isinstance(values, Mapping):
            values = {(): float(values)}
        self.family(name, kind, help_text,
                    [f"{name}{_fmt_labels(k)} {_fmt_value(v)}" for k, v in sorted(values.items())])

    def text(self) -> str:
        """The document, newline-terminated."""
        return "\n".join(self.parts) + "\n"


class DaemonMetrics:
    """Counters and histograms the daemon accumulates (thread-safe; fed from the loop)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.proofs_completed: dict[Labels, float] = defaultdict(float)
        self.proofs_failed: dict[Labels, float] = defaultdict(float)
        self.jobs: dict[Labels, float] = defaultdict(float)
        self.gpu_busy: dict[Labels, float] = defaultdict(float)
        self.requests: dict[Labels, float] = defaultdict(float)
        self.request_errors: dict[Labels, float] = defaultdict(float)
        self.job_duration = Histogram()
        self.stage = Histogram()
        self.request_duration = Histogram()

    def observe_partition(self, circuit: str, ok: bool, timings: Mapping[str, float],
                          device: int | None) -> None:
        """Count one finished partition and record its stage timings."""
        with self._lock:
            (self.proofs_completed if ok else self.proofs_failed)[_labels(circuit=circuit)] += 1
            for stage, seconds in timings.items():
                self.stage.observe(seconds, _labels(stage=stage))
            if ok and "device" in timings:
                dev = "cpu" if device is None else device
                self.gpu_busy[_labels(device=dev)] += timings["device"]

    def observe_job(self, circuit: str, state: str, seconds: float) -> None:
        """Count one finished job; completed jobs also feed the duration histogram."""
        with self._lock:
            self.jobs[_labels(circuit=circuit, state=state)] += 1
            if state == "done":
                self.job_duration.observe(seconds, _labels(circuit=circuit))

    def observe_request(self, op: str, seconds: float, error_kind: str | None) -> None:
        """Count one handled request (and its error kind, if it failed)."""
        with self._lock:
            self.requests[_labels(op=op)] += 1
            self.request_duration.observe(seconds, _labels(op=op))
            if error_kind is not None:
                self.request_errors[_labels(op=op, kind=error_kind)] += 1

    def render(self, gauges: Iterable[tuple[str, str, Mapping[Labels, float] | float]],
               engine_metrics: Mapping[str, Any] | None = None) -> str:
        """The full exposition: accumulated families, the scrape-time ``gauges``
        (name, help, values), then the engine's own metrics."""
        ex = Exposition()
        with self._lock:
            ex.simple("cuzk_proofs_completed_total", "counter",
                      "Partition proofs completed, by circuit.", dict(self.proofs_completed))
            ex.simple("cuzk_proofs_failed_total", "counter",
                      "Partition proofs that failed, by circuit.", dict(self.proofs_failed))
            ex.simple("cuzk_jobs_total", "counter", "Finished jobs by circuit and final state.",
                      dict(self.jobs))
            ex.family("cuzk_job_duration_seconds", "histogram",
                      "Submit-to-finish time of completed jobs.",
                      self.job_duration.lines("cuzk_job_duration_seconds"))
            ex.family("cuzk_partition_stage_seconds", "histogram",
                      "Per-partition stage durations reported by the engine.",
                      self.stage.lines("cuzk_partition_stage_seconds"))
            ex.simple("cuzk_gpu_busy_seconds_total", "counter",
                      "Device-compute seconds of proved partitions, by device.",
                      dict(self.gpu_busy))
            ex.simple("cuzk_requests_total", "counter", "Requests handled, by op.",
                      dict(self.requests))
            ex.simple("cuzk_request_errors_total", "counter",
                      "Requests answered with an ErrorReply, by op and error kind.",
                      dict(self.request_errors))
            ex.family("cuzk_request_duration_seconds", "histogram",
                      "Time to answer a request (AwaitProof/Prove include the wait).",
                      self.request_duration.lines("cuzk_request_duration_seconds"))
        for name, help_text, values in gauges:
            ex.simple(name, "gauge", help_text, values)
        if engine_metrics:
            render_engine(ex, engine_metrics)
        return ex.text()


def _name(*parts: str) -> str:
    return "_".join("".join(ch if ch.isalnum() else "_" for ch in p) for p in parts if p)


def render_engine(ex: Exposition, em: Mapping[str, Any]) -> None:
    """Append ``Engine.metrics()``: ``counters`` as ``cuzk_engine_<name>_total``, ``gauges`` as
    ``cuzk_engine_<name>``, ``per_process`` as ``cuzk_engine_process_<stat>{process}`` and
    ``histograms`` ``{name: {label: {"buckets": [[le, n], ...],
    "sum", "count"}}}`` as ``cuzk_engine_<name>{stage=label}``. Any other numbers are flattened
    into gauges, so nothing the engine reports is dropped."""
    rest = dict(em)
    for key, value in flatten_numbers(rest.pop("counters", {}), "").items():
        name = _name("cuzk_engine", key.lstrip("_"))
        ex.simple(name + ("" if name.endswith("_total") else "_total"), "counter",
                  "Engine counter (Engine.metrics()).", value)
    for key, value in flatten_numbers(rest.pop("gauges", {}), "").items():
        ex.simple(_name("cuzk_engine", key.lstrip("_")), "gauge",
                  "Engine gauge (Engine.metrics()).", value)
    per_stat: dict[str, dict[Labels, float]] = defaultdict(dict)
    for proc, stats in (rest.pop("per_process", {}) or {}).items():
        for key, value in flatten_numbers(stats, "").items():
            per_stat[key.lstrip("_")][_labels(process=proc)] = value
    for key, values in sorted(per_stat.items()):
        ex.simple(_name("cuzk_engine_process", key), "gauge",
                  "Per-process engine statistic (Engine.metrics() per_process).", values)
    for hname, per_label in (rest.pop("histograms", {}) or {}).items():
        name = _name("cuzk_engine", hname)
        lines: list[str] = []
        for label, h in sorted((per_label or {}).items()):
            lab = _labels(stage=label)
            for le, count in h.get("buckets", []):
                lines.append(f"{name}_bucket{_fmt_labels(lab, ('le', _fmt_value(le)))} {count}")
            lines.append(f"{name}_bucket{_fmt_labels(lab, ('le', '+Inf'))} {h.get('count', 0)}")
            lines.append(f"{name}_sum{_fmt_labels(lab)} {_fmt_value(h.get('sum', 0.0))}")
            lines.append(f"{name}_count{_fmt_labels(lab)} {h.get('count', 0)}")
        ex.family(name, "histogram", "Engine histogram (Engine.metrics()).", lines)
    for key, value in sorted(flatten_numbers(rest).items()):
        ex.simple(key, "gauge", "Engine metric (Engine.metrics()).", value)


def flatten_numbers(obj: Any, prefix: str = "cuzk_engine") -> dict[str, float]:
    """Every number in a nested dict as ``prefix_key_subkey`` (for Engine.metrics())."""
    out: dict[str, float] = {}
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            key = "".join(ch if ch.isalnum() else "_" for ch in str(k))
            out.update(flatten_numbers(v, f"{prefix}_{key}"))
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        out[prefix] = float(obj)
    elif isinstance(obj, bool):
        out[prefix] = 1.0 if obj else 0.0
    return out
