"""/metrics as Prometheus reads it: parsed by ``prometheus_client``'s own parser, every family typed as
what it measures (counters for what only grows, gauges for levels, histograms for durations), named
without ids, labelled, documented; ``build_info``; and the HTTP server's 405 with its ``Allow`` header.

The daemon runs in-process around the engine double (tests/fake_engine.py), so the test is fast and
still scrapes the real HTTP endpoint.
"""

from __future__ import annotations

import asyncio
import http.client
import platform
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cuzk_mp import __version__
from cuzk_mp.daemon import metrics
from cuzk_mp.daemon.client import AsyncClient, synthetic_partitions
from cuzk_mp.daemon.server import Daemon

from tests.fake_engine import FakeEngine, make_config, run_daemon
from tests.helpers import free_port

# Every family the daemon exports: its type and its label names. A new metric joins this table, so
# whoever adds one decides what it is.
FAMILIES: dict[str, tuple[str, frozenset[str]]] = {name: (kind, frozenset(labels)) for name, kind, labels in (
    ("cuzk_build_info", "gauge", ("version", "python")),
    ("cuzk_daemon_state", "gauge", ("state",)),
    ("cuzk_proofs_completed", "counter", ("circuit",)),
    ("cuzk_proofs_failed", "counter", ("circuit",)),
    ("cuzk_jobs_finished", "counter", ("circuit", "state")),
    ("cuzk_job_duration_seconds", "histogram", ("circuit",)),
    ("cuzk_engine_stage_seconds", "histogram", ("stage",)),
    ("cuzk_gpu_busy_seconds", "counter", ("device",)),
    ("cuzk_requests", "counter", ("op",)),
    ("cuzk_request_errors", "counter", ("op", "kind")),
    ("cuzk_request_duration_seconds", "histogram", ("op",)),
    ("cuzk_start_time_seconds", "gauge", ()),
    ("cuzk_queue_depth", "gauge", ()),
    ("cuzk_jobs", "gauge", ("state",)),
    ("cuzk_queued_input_bytes", "gauge", ()),
    ("cuzk_connections", "gauge", ()),
    ("cuzk_connections_max", "gauge", ()),
    ("cuzk_connections_refused", "counter", ()),
    ("cuzk_srs_budget_bytes", "gauge", ()),
    ("cuzk_memory_budget_bytes", "gauge", ("kind",)),
    ("cuzk_ring_slots", "gauge", ("state",)),
    ("cuzk_ring_occupancy", "gauge", ()),
    ("cuzk_srs_bytes", "gauge", ("circuit", "process", "tier")),
    ("cuzk_memory_bytes", "gauge", ("kind",)),
    ("cuzk_process_memory_bytes", "gauge", ("process", "kind")),
    ("cuzk_processes_alive", "gauge", ("role",)),
    ("cuzk_degraded", "gauge", ("role",)),
    ("cuzk_engine_jobs_submitted", "counter", ()),
    ("cuzk_engine_jobs_finished", "counter", ("state",)),
    ("cuzk_engine_partitions_proved", "counter", ()),
    ("cuzk_engine_partitions_failed", "counter", ()),
    ("cuzk_engine_partition_retries", "counter", ()),
    ("cuzk_engine_partitions_discarded", "counter", ()),
    ("cuzk_engine_late_proofs_used", "counter", ()),
    ("cuzk_engine_process_restarts", "counter", ("role",)),
    ("cuzk_engine_ring_transitions", "counter", ("event",)),
    ("cuzk_engine_ring_waits", "counter", ("side",)),
    ("cuzk_engine_queue_pending", "gauge", ()),
    ("cuzk_engine_partitions_in_flight", "gauge", ()),
    ("cuzk_engine_jobs_active", "gauge", ()),
    ("cuzk_engine_ring_live_slots", "gauge", ()),
    ("cuzk_engine_ring_peak_live_slots", "gauge", ()),
    ("cuzk_engine_prover_busy_seconds", "counter", ("process",)),
    ("cuzk_engine_prover_device_bytes", "gauge", ("process", "kind")),
)}
# a gauge named like one of these accumulates: it would have to be a counter
CUMULATIVE = re.compile(r"(_total|_count|_sum|_bucket|_created|_seconds_spent|uptime.*)$")


def _scrape(port: int) -> tuple[str, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.headers["Content-Type"], r.read().decode()


def _families(text: str) -> dict[str, Any]:
    fams = list(text_string_to_metric_families(text))
    names = [f.name for f in fams]
    assert len(names) == len(set(names)), f"a family name twice: {sorted(n for n in names if names.count(n) > 1)}"
    return {f.name: f for f in fams}


def _check_family(f: Any) -> None:
    kind, labels = FAMILIES[f.name]
    assert f.type == kind, f"{f.name} is a {f.type}, should be a {kind}"
    assert re.fullmatch(r"cuzk_[a-z]+(_[a-z]+)*", f.name), f"{f.name}: ids and values go in labels, not names"
    doc = f.documentation
    assert len(doc) >= 15 and doc[-1] in ".)" and doc[0].isupper() and f.name not in doc, f"{f.name}: help {doc!r}"
    if ("seconds" in f.name) != f.name.endswith("_seconds"):
        raise AssertionError(f"{f.name}: a time in seconds is named *_seconds (and only a time is)")
    if kind == "gauge":
        assert not CUMULATIVE.search(f.name), f"{f.name}: a gauge named like a running total"
    for s in f.samples:
        assert set(s.labels) - {"le"} == labels, f"{s.name}: labels {sorted(s.labels)}, want {sorted(labels)}"
        assert all(re.fullmatch(r"[a-z][a-z_]*", k) for k in s.labels), s
        if kind == "counter":
            assert s.name == f.name + "_total" and s.value >= 0, s
        elif kind == "gauge":
            assert s.name == f.name, s
        assert not s.labels.get("kind", "").endswith(("_bytes", "_seconds")), f"{s}: the unit is the name's"
    if kind == "histogram":
        for key in {tuple(sorted((k, v) for k, v in s.labels.items() if k != "le")) for s in f.samples}:
            mine = [s for s in f.samples if tuple(sorted((k, v) for k, v in s.labels.items() if k != "le")) == key]
            buckets = [s.value for s in mine if s.name.endswith("_bucket")]
            count = [s.value for s in mine if s.name.endswith("_count")]
            inf = [s.value for s in mine if s.name.endswith("_bucket") and s.labels["le"] == "+Inf"]
            assert buckets == sorted(buckets) and count and inf == count, f"{f.name}{dict(key)}"
            assert any(s.name.endswith("_sum") for s in mine)


def test_metrics_parse_as_typed_documented_labelled_families(tmp_path: Path) -> None:
    port = free_port()

    async def body(d: Daemon, addr: str) -> None:
        async with await AsyncClient.connect(addr) as c:
            await c.prove("syn", synthetic_partitions(2), timeout_s=10)
        ctype, first = await asyncio.to_thread(_scrape, port)
        assert ctype.startswith("text/plain; version=0.0.4")
        fams = _families(first)
        assert set(fams) == set(FAMILIES), (f"not exported: {sorted(set(FAMILIES) - set(fams))}; "
                                            f"not classified here: {sorted(set(fams) - set(FAMILIES))}")
        for f in fams.values():
            _check_family(f)
        (info,) = fams["cuzk_build_info"].samples
        assert info.value == 1 and info.labels == {"version": __version__, "python": platform.python_version()}
        done = {s.labels["circuit"]: s.value for s in fams["cuzk_proofs_completed"].samples}
        assert done == {"syn": 2}
        assert [(s.labels, s.value) for s in fams["cuzk_jobs_finished"].samples] == \
            [({"circuit": "syn", "state": "done"}, 1.0)]
        stage_count = {s.labels["stage"]: s.value for s in fams["cuzk_engine_stage_seconds"].samples
                       if s.name.endswith("_count")}
        assert stage_count["device"] == 2
        # every ring state, 0 included (a series that vanishes reads as "no data", not as none free)
        slots = {s.labels["state"]: s.value for s in fams["cuzk_ring_slots"].samples}
        assert slots == {"free": 1, "filling": 0, "ready": 1, "staging": 0}
        # the label values the module's metric reference lists
        kinds = [s.labels["kind"] for s in fams["cuzk_memory_bytes"].samples]
        documented = re.search(r"``memory_bytes\{kind\}`` \(([^;)]*)", metrics.__doc__ or "")
        assert documented and kinds == re.split(r",\s+", documented.group(1)) == ["host", "host_pss", "host_rss", "shm"]
        # more work: no counter goes back, and the ones that count it moved
        async with await AsyncClient.connect(addr) as c:
            await c.prove("syn", synthetic_partitions(2), timeout_s=10)
            await c.status()
        again = _families((await asyncio.to_thread(_scrape, port))[1])
        for name, f in again.items():
            if f.type != "counter":
                continue
            before = {tuple(sorted(s.labels.items())): s.value for s in fams[name].samples}
            for s in f.samples:
                assert s.value >= before.get(tuple(sorted(s.labels.items())), 0.0), f"{s.name} went back"
        moved = {s.labels["circuit"]: s.value for s in again["cuzk_proofs_completed"].samples}
        assert moved == {"syn": 4}
        started = again["cuzk_start_time_seconds"].samples[0].value
        assert started == fams["cuzk_start_time_seconds"].samples[0].value == d.started_at  # a level, not a count

    run_daemon(tmp_path, body, status_listen=f"127.0.0.1:{port}")


def test_the_daemon_state_is_one_of_every_state_while_starting_running_and_draining(tmp_path: Path) -> None:
    """An alert on a daemon stuck starting or draining reads ``cuzk_daemon_state``: every state the daemon
    goes through is a series, 1 for the one it is in and 0 for the others, as /status says it. Scraped
    over HTTP while the engine starts, while it serves, and while the engine stops in the drain."""
    import json

    from cuzk_mp.daemon.handlers import DaemonState

    port = free_port()
    seen: dict[str, tuple[dict[str, float], str]] = {}

    def look(when: str) -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10) as r:
            said = json.loads(r.read())["daemon"]["state"]
        series = {s.labels["state"]: s.value for s in _families(_scrape(port)[1])["cuzk_daemon_state"].samples}
        seen[when] = series, said

    class Engine(FakeEngine):
        def start(self) -> FakeEngine:
            look("start")
            return super().start()

        def stop(self, grace_s: float = 30.0) -> None:
            look("stop")
            super().stop(grace_s)

    async def main() -> None:
        d = Daemon(make_config(tmp_path, status_listen=f"127.0.0.1:{port}"), engine_factory=Engine)
        await d.start()
        try:
            await asyncio.to_thread(look, "serving")
        finally:
            await d.stop()

    asyncio.run(main())
    every = {s.value for s in DaemonState}
    for when, state in (("start", "starting"), ("serving", "running"), ("stop", "draining")):
        series, said = seen[when]
        assert said == state and set(series) == every, (when, said, series)
        assert series == {s: float(s == state) for s in every}, (when, series)


def test_the_memory_budget_is_in_the_scrape_as_the_status_reports_it(tmp_path: Path) -> None:
    """A dashboard puts the memory in use (``cuzk_memory_bytes``) against the ``[memory]`` budget: the
    scrape has the budget's byte figures, the same as the status's ``memory_budget``."""
    import json

    port = free_port()

    async def body(d: Daemon, addr: str) -> None:
        def status() -> dict[str, Any]:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10) as r:
                return dict(json.loads(r.read()))

        text = (await asyncio.to_thread(_scrape, port))[1]
        budget = (await asyncio.to_thread(status))["memory_budget"]
        exported = {s.labels["kind"]: s.value for f in text_string_to_metric_families(text)
                    if f.name == "cuzk_memory_budget_bytes" for s in f.samples}
        assert exported == {k: float(v) for k, v in budget.items() if k != "provers"}
        assert exported["total"] > exported["safety_margin"] > 0

    run_daemon(tmp_path, body, status_listen=f"127.0.0.1:{port}")


def test_requests_refused_at_admission_are_counted_as_errors(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A request answered with an ErrorReply counts in ``cuzk_request_errors_total`` also where the
    refusal is made before a handler runs: a frame over ``max_frame_bytes`` (op ``malformed``, as a
    frame that is no request) and a request beyond the in-flight cap of its connection."""
    import struct

    from cuzk_mp.daemon import handlers
    from cuzk_mp.daemon import protocol as P
    from cuzk_mp.daemon.transport import frame

    from tests.helpers import exchange, raw_roundtrip

    monkeypatch.setattr(handlers, "MAX_IN_FLIGHT_PER_CONN", 1)
    port = free_port()

    async def body(d: Daemon, addr: str) -> None:
        path = addr[len("unix://"):]
        (big,) = await asyncio.to_thread(raw_roundtrip, path, [struct.pack(">I", 2**31) + b"junk"])
        assert big.kind == "InputError"
        d.engine.gate.clear()  # type: ignore[union-attr]  # the job waits: its AwaitProof stays in flight
        async with await AsyncClient.connect(addr) as c:
            job = await c.submit("syn", synthetic_partitions(1))
        waits = b"".join(frame(P.encode(P.AwaitProof(id=i, job_id=job.job_id, timeout_s=30))) for i in (1, 2))
        (refused,), _ = await asyncio.to_thread(exchange, path, waits, 1, 30.0, False)  # the first still waits
        d.engine.gate.set()  # type: ignore[union-attr]
        assert isinstance(refused, P.ErrorReply) and refused.id == 2 and refused.kind == "ResourceError", refused
        errors = {(s.labels["op"], s.labels["kind"]): s.value
                  for f in text_string_to_metric_families((await asyncio.to_thread(_scrape, port))[1])
                  if f.name == "cuzk_request_errors" for s in f.samples}
        assert errors == {("malformed", "InputError"): 1.0, ("AwaitProof", "ResourceError"): 1.0}, errors

    run_daemon(tmp_path, body, status_listen=f"127.0.0.1:{port}")


def test_http_answers_other_methods_with_405_and_allow(tmp_path: Path) -> None:
    port = free_port()

    def ask(method: str, path: str) -> tuple[int, str | None, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.request(method, path, body=b"x" if method in ("POST", "PUT") else None)
            r = conn.getresponse()
            return r.status, r.getheader("Allow"), r.read()
        finally:
            conn.close()

    async def body(d: Daemon, addr: str) -> None:
        for method in ("POST", "PUT", "DELETE", "OPTIONS"):
            code, allow, text = await asyncio.to_thread(ask, method, "/metrics")
            assert (code, allow) == (405, "GET, HEAD"), method
            assert b"GET, HEAD" in text
        code, allow, _ = await asyncio.to_thread(ask, "GET", "/metrics")
        assert code == 200 and allow is None
        code, _, text = await asyncio.to_thread(ask, "HEAD", "/metrics")
        assert code == 200 and text == b""

    run_daemon(tmp_path, body, status_listen=f"127.0.0.1:{port}")


def test_stage_histogram_takes_only_stage_seconds() -> None:
    """Timings also carry counts (device_batch, finalize_batch) and core-seconds (synthesis_cpu): none of
    them is a stage duration, so none becomes a label of the stage histogram."""
    from prometheus_client import generate_latest

    from cuzk_mp.daemon.metrics import DaemonMetrics
    from cuzk_mp.pipeline.types import STAGES

    m = DaemonMetrics()
    m.observe_partition("c", True, {"synthesis": 0.5, "device": 0.2, "device_batch": 4.0, "finalize_batch": 16.0,
                                    "synthesis_cpu": 3.0, "finalize": 0.01}, 0)
    text = generate_latest(m.registry).decode()
    stages = {s.labels["stage"] for f in text_string_to_metric_families(text)
              if f.name == "cuzk_engine_stage_seconds" for s in f.samples}
    assert stages == {"synthesis", "device", "finalize"} and stages <= set(STAGES)


def test_the_duration_buckets_tell_small_stages_apart_and_reach_an_hour() -> None:
    """A one-partition job of a small circuit on a GPU takes about 20 ms in all (the H200 run of
    perf/results/daemon-latency-h200.json: queue_wait 0.23 ms, ring_wait 0.54 ms, staging 1.7 ms,
    device 7.8 ms); each of these stages lands in a bucket of its own, not all in the first. A key
    load or a job of a large circuit takes minutes: it lands in a bucket below +Inf."""
    from prometheus_client import generate_latest

    from cuzk_mp.daemon.metrics import DaemonMetrics

    stages = {"queue_wait": 0.00023, "ring_wait": 0.00054, "staging": 0.0017, "device": 0.0078}
    m = DaemonMetrics()
    m.observe_partition("c", True, stages, 0)
    m.observe_job("c", "done", 1800.0)
    text = generate_latest(m.registry).decode()
    first_bucket: dict[str, float] = {}  # stage -> the bound of the first bucket that counts it
    job_bucket = float("inf")
    for f in text_string_to_metric_families(text):
        for s in f.samples:
            if s.name == "cuzk_engine_stage_seconds_bucket" and s.value:
                le = float(s.labels["le"])
                first_bucket[s.labels["stage"]] = min(le, first_bucket.get(s.labels["stage"], le))
            if s.name == "cuzk_job_duration_seconds_bucket" and s.value:
                job_bucket = min(job_bucket, float(s.labels["le"]))
    assert len(set(first_bucket.values())) == len(stages), first_bucket
    assert job_bucket < float("inf")


def test_the_key_bytes_say_which_are_resident() -> None:
    """``cuzk_srs_bytes`` has a row for every configured key, resident or not (a key file resident
    nowhere: tier disk, its file's size); its help names each tier, so that nobody sums the files on
    disk as resident bytes against ``cuzk_srs_budget_bytes``."""
    from cuzk_mp.daemon.metrics import DaemonMetrics, Scrape
    from cuzk_mp.pipeline.circuits import KeyRow
    from cuzk_mp.pipeline.ring import RingStats
    from cuzk_mp.pipeline.scheduler import QueueStatus
    from cuzk_mp.pipeline.status import EngineStatus, MemoryStatus, RingStatus

    rows = [KeyRow("a", "cuzk-prover-0", "host", 1000, None), KeyRow("b", None, "disk", 5000, None),
            KeyRow("c", None, "generated on load", 0, None), KeyRow("d", "cuzk-prover-0", None, 0, "unreadable")]
    st = EngineStatus(state="running", prefix="p", backend="cpu", devices=[0], degraded=[], queue=QueueStatus(0, 0),
                      jobs=[], processes=[], ring=RingStatus([], RingStats(0, 0, 0, 0, 0, 0, 0)), srs=rows,
                      memory=MemoryStatus(host_bytes=0, host_pss_bytes=0, host_rss_bytes=0, shm_bytes=0,
                                          live_segments=0, processes=[], device={}))
    (fam,) = [f for f in text_string_to_metric_families(DaemonMetrics().render(Scrape(engine=st)))
              if f.name == "cuzk_srs_bytes"]
    tiers = {s.labels["tier"] for s in fam.samples}
    assert tiers == {"host", "disk", "generated on load", "failed"}
    assert [t for t in tiers if t not in fam.documentation] == [], fam.documentation


def test_every_family_is_in_the_readme() -> None:
    """The README's table of /metrics names every family as a scrape shows it (a counter with its
    ``_total``), the fleet's gauges and counter included."""
    from cuzk_mp.daemon.fleet import box, report

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    names = [f"{name}_total" if kind == "counter" else name for name, (kind, _) in FAMILIES.items()]
    names += [name for name, _, _ in report.gauges([], [])] + [box.DATABASE_UP[0]]
    names.append(report.failures("b", {})[0] + "_total")  # a counter
    missing = [n for n in names if f"`{n}`" not in readme]
    assert not missing, f"not in the README's metrics: {missing}"
