"""Prometheus metrics of the daemon, through ``prometheus_client``.

This module owns the daemon-side metric state: counters and histograms fed by the job table
(every partition and job result) and the server (every request), and the scrape-time figures
read from the engine's typed status and metrics. Both are rendered as Prometheus text format
0.0.4 by ``prometheus_client`` (served by GET /metrics and GetMetrics). Durations are cumulative
histograms, so rates and quantiles can be computed by Prometheus; what only grows is a counter;
what varies is a label, never part of a name; the unit is the name's (``_bytes``, ``_seconds``),
never a label value's.

Metric names (all prefixed ``cuzk_``):

* ``build_info{version,python}`` = 1
* ``proofs_completed_total{circuit}``, ``proofs_failed_total{circuit}``: partitions
* ``jobs_finished_total{circuit,state}``: finished jobs by final state (done, failed, cancelled)
* ``job_duration_seconds{circuit}``: submit to finish of jobs that completed (histogram)
* ``engine_stage_seconds{stage}``: the one histogram of per-partition stage times, as the engine
  measured them (queue_wait, ring_wait, shm_write, witness, synthesis, staging, device, ...)
* ``gpu_busy_seconds_total{device}``: sum of the proved partitions' device-compute time
* ``requests_total{op}``, ``request_errors_total{op,kind}``, ``request_duration_seconds{op}``
* ``connections_refused_total``: connections refused unread because ``[daemon] max_connections`` were open
* scrape time: ``daemon_state{state}`` (1 for the state the daemon is in, as GetStatus's
  ``daemon.state``, 0 for every other: created, starting, running, draining, stopped, failed),
  ``start_time_seconds`` (Unix time; uptime = ``time() - cuzk_start_time_seconds``),
  ``queue_depth``, ``jobs{state}`` (the job table now), ``queued_input_bytes`` (the input bytes the
  unfinished jobs hold: ``[daemon] max_queued_input`` caps it), ``connections`` (protocol connections
  open now) and ``connections_max`` (``[daemon] max_connections``), ``srs_budget_bytes``,
  ``memory_budget_bytes{kind}`` (GetStatus's ``memory_budget``: total, safety_margin, queue, processes,
  pipeline, srs, srs_per_prover, host_budget; total - safety_margin is what ``memory_bytes{kind="host"}`` is
  budgeted to),
  ``ring_slots{state}`` (free, filling, ready, staging: every state, 0 included), ``ring_occupancy``,
  ``srs_bytes{circuit,process,tier}`` (every configured key: resident where ``process`` is set, else
  tier disk or generated on load), ``memory_bytes{kind}`` (host, host_pss, host_rss,
  shm; host = host_pss + shm), ``process_memory_bytes{process,kind}`` (each process's pss and uss),
  ``processes_alive{role}``, ``degraded{role}`` (1 while a role has no live process and keeps dying;
  GetStatus says why)
* with ``[fleet]``, the fleet's gauges and ``fleet_job_failures_total{box,circuit,kind}``
  (:mod:`.fleet.report`)
* the engine's own: ``engine_jobs_submitted_total``, ``engine_jobs_finished_total{state}``,
  ``engine_partitions_proved_total``, ``engine_partitions_failed_total``,
  ``engine_partition_retries_total``, ``engine_late_proofs_used_total``, ``engine_partitions_discarded_total``
  (proved, then not delivered: their job's zkey file changed before its last proof),
  ``engine_process_restarts_total{role}``, ``engine_ring_transitions_total{event}`` (published,
  released, reclaimed), ``engine_ring_waits_total{side}`` (free, ready), ``engine_queue_pending``,
  ``engine_partitions_in_flight``, ``engine_jobs_active``, ``engine_ring_live_slots``,
  ``engine_ring_peak_live_slots``, ``engine_prover_busy_seconds_total{process}``,
  ``engine_prover_device_bytes{process,kind}`` (used, peak).
"""

from __future__ import annotations

import platform
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from cuzk_mp import __version__
from cuzk_mp.pipeline.ring import STATE_NAMES
from cuzk_mp.pipeline.status import EngineMetrics, EngineStatus
from cuzk_mp.pipeline.types import STAGES

disable_created_metrics()  # no *_created series: scrapes show what the daemon measured, nothing else

# From 0.1 ms: a small circuit's stages on a GPU take tenths of a millisecond to a few (a whole job some
# 20 ms), each in a bucket of its own; to an hour: key loads and large circuits' jobs.
DURATION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
# the byte figures of GetStatus's memory_budget (its "provers" is a count)
BUDGET_BYTES = ("total", "safety_margin", "queue", "processes", "pipeline", "srs", "srs_per_prover", "host_budget")

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs
Gauge = tuple[str, str, Mapping[Labels, float] | float]  # (name, help, one value or a value per label set)


@dataclass
class Scrape:
    """What the daemon knows at scrape time besides its counters: its own figures, the engine's, and
    gauges and counters other parts of the daemon add (``extra``, ``counts``)."""

    started_at: float = 0.0  # Unix time the daemon started
    state: str = ""  # the daemon's state now, one of ``states``
    states: Sequence[str] = ()  # every state the daemon goes through (no family without them)
    queue_depth: int = 0
    job_counts: Mapping[str, int] = field(default_factory=dict)
    memory_budget: Mapping[str, int] = field(default_factory=dict)  # the status's memory_budget
    queued_input_bytes: int = 0
    connections: int = 0  # protocol connections open now
    max_connections: int = 0  # [daemon] max_connections
    engine: EngineStatus | None = None
    engine_metrics: EngineMetrics | None = None
    extra: Sequence[Gauge] = ()
    counts: Sequence[Gauge] = ()  # counters, in the gauges' shape (a value per label set)


class DaemonMetrics:
    """Counters and histograms the daemon accumulates (thread-safe), and the scrape-time families."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        prometheus_client.Gauge("cuzk_build_info", "The daemon's version and Python (value 1).", ["version", "python"],
              registry=r).labels(__version__, platform.python_version()).set(1)
        self.proofs_completed = Counter("cuzk_proofs_completed", "Partition proofs completed, by circuit.",
                                        ["circuit"], registry=r)
        self.proofs_failed = Counter("cuzk_proofs_failed", "Partition proofs that failed, by circuit.",
                                     ["circuit"], registry=r)
        self.jobs = Counter("cuzk_jobs_finished", "Finished jobs by circuit and final state.",
                            ["circuit", "state"], registry=r)
        self.job_duration = Histogram("cuzk_job_duration_seconds", "Submit-to-finish time of completed jobs.",
                                      ["circuit"], buckets=DURATION_BUCKETS, registry=r)
        self.stage = Histogram("cuzk_engine_stage_seconds",
                               "Per-partition stage durations as the engine measured them, by stage.",
                               ["stage"], buckets=DURATION_BUCKETS, registry=r)
        self.gpu_busy = Counter("cuzk_gpu_busy_seconds", "Device-compute seconds of proved partitions, by device.",
                                ["device"], registry=r)
        self.requests = Counter("cuzk_requests", "Requests handled, by op.", ["op"], registry=r)
        self.request_errors = Counter("cuzk_request_errors",
                                      "Requests answered with an ErrorReply, by op and error kind.",
                                      ["op", "kind"], registry=r)
        self.connections_refused = Counter("cuzk_connections_refused",
                                           "Connections refused unread because [daemon] max_connections were open.",
                                           registry=r)
        self.request_duration = Histogram("cuzk_request_duration_seconds",
                                          "Time to answer a request (AwaitProof/Prove include the wait).",
                                          ["op"], buckets=DURATION_BUCKETS, registry=r)
        self._scrape: Scrape | None = None
        self._lock = threading.Lock()
        r.register(self)  # collect() below adds the scrape-time families

    def observe_partition(self, circuit: str, ok: bool, timings: Mapping[str, float],
                          device: int | None) -> None:
        """Count one finished partition and record its stage timings."""
        (self.proofs_completed if ok else self.proofs_failed).labels(circuit).inc()
        for stage, seconds in timings.items():
            if stage in STAGES:  # not the counts (device_batch, finalize_batch) nor core-seconds (synthesis_cpu)
                self.stage.labels(stage).observe(seconds)
        if ok and "device" in timings:
            self.gpu_busy.labels("cpu" if device is None else str(device)).inc(timings["device"])

    def observe_job(self, circuit: str, state: str, seconds: float) -> None:
        """Count one finished job; completed jobs also feed the duration histogram."""
        self.jobs.labels(circuit, state).inc()
        if state == "done":
            self.job_duration.labels(circuit).observe(seconds)

    def observe_request(self, op: str, seconds: float, error_kind: str | None) -> None:
        """Count one handled request (and its error kind, if it failed)."""
        self.requests.labels(op).inc()
        self.request_duration.labels(op).observe(seconds)
        if error_kind is not None:
            self.request_errors.labels(op, error_kind).inc()

    def render(self, scrape: Scrape) -> str:
        """The whole exposition: the counters and histograms, then the scrape-time families."""
        with self._lock:  # one scrape at a time sees its own figures
            self._scrape = scrape
            try:
                return generate_latest(self.registry).decode()
            finally:
                self._scrape = None

    def describe(self) -> list[Metric]:
        """Nothing to describe up front: the scrape-time families depend on the scrape."""
        return []

    def collect(self) -> Iterator[Metric]:
        """The scrape-time families (the module docstring's "scrape time" and "engine" lists)."""
        s = self._scrape
        if s is None:
            return
        if s.states:  # every state a series (the enum pattern): an alert reads how long one has been 1
            yield _gauge("cuzk_daemon_state", "The daemon's state: 1 for the one it is in (as GetStatus says), "
                         "0 for the others.", {("state",): None}, [((k,), float(k == s.state)) for k in s.states])
        yield _gauge("cuzk_start_time_seconds", "When the daemon started (Unix time).", s.started_at)
        yield _gauge("cuzk_queue_depth", "Partitions accepted and not yet finished.", s.queue_depth)
        yield _gauge("cuzk_jobs", "Jobs in the job table by state.", {("state",): None},
                     [((k,), float(v)) for k, v in s.job_counts.items()])
        yield _gauge("cuzk_queued_input_bytes", "Input bytes held by unfinished jobs until they finish "
                     "([daemon] max_queued_input caps them).", s.queued_input_bytes)
        yield _gauge("cuzk_connections", "Protocol connections open now (beyond [daemon] max_connections a new "
                     "one is refused unread).", s.connections)
        yield _gauge("cuzk_connections_max", "The [daemon] max_connections setting: the protocol connections "
                     "served at once.", s.max_connections)
        yield _gauge("cuzk_srs_budget_bytes", "Bytes of proving keys allowed to stay resident.",
                     s.memory_budget.get("srs", 0))
        yield _gauge("cuzk_memory_budget_bytes", "The [memory] budget by kind, as GetStatus's memory_budget: total, "
                     "the parts it is cut into (safety_margin, queue, processes, pipeline, srs), srs_per_prover "
                     "and host_budget.", {("kind",): None},
                     [((k,), float(v)) for k, v in s.memory_budget.items() if k in BUDGET_BYTES])
        if s.engine is not None:
            yield from _status_families(s.engine)
        if s.engine_metrics is not None:
            yield from _engine_families(s.engine_metrics)
        for name, help_text, values in s.extra:
            if isinstance(values, Mapping):
                names = [k for k, _ in next(iter(values), ())]
                yield _gauge(name, help_text, {tuple(names): None},
                             [(tuple(v for _, v in labels), float(value)) for labels, value in values.items()])
            else:
                yield _gauge(name, help_text, float(values))
        for name, help_text, values in s.counts:
            per_labels = values if isinstance(values, Mapping) else {(): values}
            names = [k for k, _ in next(iter(per_labels), ())]
            yield _counter(name, help_text, names,
                           [([v for _, v in labels], float(value)) for labels, value in per_labels.items()])



def _gauge(name: str, help_text: str, value: float | dict[tuple[str, ...], None],
           samples: list[tuple[tuple[str, ...], float]] | None = None) -> GaugeMetricFamily:
    """A gauge family: one value, or (label names as the dict's one key, samples)."""
    if isinstance(value, dict):
        (labels,) = value
        g = GaugeMetricFamily(name, help_text, labels=list(labels))
        for values, v in samples or []:
            g.add_metric(list(values), v)
        return g
    return GaugeMetricFamily(name, help_text, value=float(value))


def _counter(name: str, help_text: str, labels: list[str], samples: list[tuple[list[str], float]]) -> Metric:
    c = CounterMetricFamily(name, help_text, labels=labels)
    for values, v in samples:
        c.add_metric(values, v)
    return c


def _status_families(st: EngineStatus) -> Iterator[Metric]:
    states = dict.fromkeys(STATE_NAMES, 0)  # every state, 0 included: a series never vanishes
    for slot in st.ring.slots:
        states[slot.state] = states.get(slot.state, 0) + 1
    yield _gauge("cuzk_ring_slots", "Ring slots by state.", {("state",): None},
                 [((k,), float(v)) for k, v in states.items()])
    busy = sum(v for k, v in states.items() if k != "free")
    yield _gauge("cuzk_ring_occupancy", "Fraction of ring slots not free.",
                 busy / len(st.ring.slots) if st.ring.slots else 0.0)
    yield _gauge("cuzk_srs_bytes", "Proving-key bytes by circuit, prover process and tier: resident in a prover "
                 "(tier host or device); a key file resident nowhere (tier disk, no process); 0 for a key the "
                 "provers generate on load and have not yet (tier generated on load); a load that failed (tier "
                 "failed); the resident bytes are those of tiers host and device.",
                 {("circuit", "process", "tier"): None},
                 [((k.circuit, k.process or "", k.tier or "failed"), float(k.bytes)) for k in st.srs])
    m = st.memory
    yield _gauge("cuzk_memory_bytes", "Host memory of the engine's process tree by kind (PSS: shared pages "
                 "once; host = PSS + shm; RSS for reference).", {("kind",): None},
                 [(("host",), float(m.host_bytes)), (("host_pss",), float(m.host_pss_bytes)),
                  (("host_rss",), float(m.host_rss_bytes)), (("shm",), float(m.shm_bytes))])
    per_name: dict[tuple[str, str], float] = {}
    for pm in m.processes:  # processes of one name (helpers such as multiprocessing's) add up
        for kind, v in (("pss", pm.pss), ("uss", pm.uss)):
            per_name[(pm.name, kind)] = per_name.get((pm.name, kind), 0.0) + v
    yield _gauge("cuzk_process_memory_bytes", "The engine's processes' PSS and USS (private) bytes, by name.",
                 {("process", "kind"): None}, sorted(per_name.items()))
    alive: dict[str, int] = {}
    for p in st.processes:
        alive[p.role] = alive.get(p.role, 0) + int(p.alive)
    yield _gauge("cuzk_processes_alive", "Live engine processes by role.", {("role",): None},
                 [((k,), float(v)) for k, v in sorted(alive.items())])
    degraded = {d.role for d in st.degraded}
    yield _gauge("cuzk_degraded", "Whether a role is degraded: 1 while it has no live process and keeps dying "
                 "(GetStatus says why).",
                 {("role",): None}, [((role,), float(role in degraded)) for role in ("prover", "synth")])


def _engine_families(em: EngineMetrics) -> Iterator[Metric]:
    c = em.counters
    yield _counter("cuzk_engine_jobs_submitted", "Jobs the engine accepted.", [], [([], c.jobs_submitted)])
    yield _counter("cuzk_engine_jobs_finished", "Jobs the engine finished, by final state.", ["state"],
                   [([k], v) for k, v in sorted(c.jobs_finished.items())])
    yield _counter("cuzk_engine_partitions_proved", "Partitions proved.", [], [([], c.partitions_proved)])
    yield _counter("cuzk_engine_partitions_failed", "Partitions failed.", [], [([], c.partitions_failed)])
    yield _counter("cuzk_engine_partition_retries", "Partition attempts retried after a failure or a death.",
                   [], [([], c.partition_retries)])
    yield _counter("cuzk_engine_partitions_discarded",
                   "Partitions proved but not delivered: their job's zkey file changed before its last proof.",
                   [], [([], c.partitions_discarded)])
    yield _counter("cuzk_engine_late_proofs_used", "Proofs of attempts given up as lost that arrived first.",
                   [], [([], c.late_proofs_used)])
    yield _counter("cuzk_engine_process_restarts", "Engine processes restarted, by role.", ["role"],
                   [([k], v) for k, v in sorted(em.restarts.items())])
    ring = em.ring
    yield _counter("cuzk_engine_ring_transitions", "Ring slot transitions, by event.", ["event"],
                   [(["published"], ring.published), (["released"], ring.released), (["reclaimed"], ring.reclaimed)])
    yield _counter("cuzk_engine_ring_waits", "Times a producer (free) or consumer (ready) found no slot and "
                   "blocked.", ["side"], [(["free"], ring.free_waits), (["ready"], ring.ready_waits)])
    yield _gauge("cuzk_engine_queue_pending", "Partition attempts waiting for a synthesis worker.",
                 em.queue.pending)
    yield _gauge("cuzk_engine_partitions_in_flight", "Partition attempts in an engine process.", em.queue.in_flight)
    yield _gauge("cuzk_engine_jobs_active", "Unfinished jobs in the engine.", em.jobs_active)
    yield _gauge("cuzk_engine_ring_live_slots", "Ring slots not free.", ring.live)
    yield _gauge("cuzk_engine_ring_peak_live_slots", "Most ring slots ever not free at once.", ring.peak_live)
    yield _counter("cuzk_engine_prover_busy_seconds", "Kernel-busy seconds of each prover process (by name: "
                   "a restarted prover adds to what its predecessor counted).", ["process"],
                   [([k], p.busy_seconds) for k, p in sorted(em.provers.items())])
    yield _gauge("cuzk_engine_prover_device_bytes", "Device memory of each prover process (GPU), by kind.",
                 {("process", "kind"): None},
                 [((k, kind), float(v)) for k, p in sorted(em.provers.items())
                  for kind, v in (("used", p.device_used_bytes), ("peak", p.device_peak_bytes)) if v is not None])
