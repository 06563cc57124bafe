"""The bench picture: stages placed in time per process, the JSON timeline, and the plot drawn from it.

A tiny CPU bench (two simulated devices, two ring slots) runs once for the module; its JSON is checked
for the timeline (every proved partition's spans, the lanes, the memory samples and the bounds), and
the figure drawn from that JSON is checked for its lanes, its bars (one per span, where the span is)
and its legend. The progress bar keeps log lines off its own line on a terminal: this process's, and
a child's written to the stderr it inherited (on a pseudo-terminal).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cuzk_mp.pipeline import bench
from cuzk_mp.pipeline.benchplot import lanes_of, main as benchplot_main
from cuzk_mp.pipeline.benchreport import Progress, step
from cuzk_mp.pipeline.messages import CircuitRef
from cuzk_mp.pipeline.scheduler import Scheduler
from cuzk_mp.pipeline.timeline import ProverClocks, synthesis_spans
from cuzk_mp.pipeline.types import JobSpec, PartitionInput

from tests.helpers import KEY_CACHE, LOG_N

HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
NO_MATPLOTLIB = "matplotlib is not installed (the 'test' extra installs it): the JSON timeline is checked without it"
DURATION_STAGES = ("shm_write", "synthesis", "staging", "device_wait", "device", "finalize")


# ---- placing stages in time (no processes)

def test_synthesis_spans_end_at_the_publish_in_run_order() -> None:
    t = {"ring_wait": 0.5, "shm_write": 0.25, "synthesis": 1.0, "witness": 0.25, "queue_wait": 9.0}
    spans = {s.stage: s for s in synthesis_spans(t, "cuzk-synth-1", published_at=100.0, dispatched_at=98.0)}
    assert set(spans) == {"ring_wait", "shm_write", "synthesis", "witness"}  # queue_wait runs in no process
    assert (spans["synthesis"].start, spans["synthesis"].end) == (99.0, 100.0)
    assert (spans["shm_write"].start, spans["shm_write"].end) == (98.75, 99.0)
    assert (spans["ring_wait"].start, spans["ring_wait"].end) == (98.25, 98.75)
    assert (spans["witness"].start, spans["witness"].end) == (99.0, 99.25)  # the first part of synthesis
    assert {s.process for s in spans.values()} == {"cuzk-synth-1"}
    # nothing starts before the dispatch: a span that would is cut there
    clipped = {s.stage: s for s in synthesis_spans(t, "w", published_at=100.0, dispatched_at=98.9)}
    assert clipped["ring_wait"].start == clipped["shm_write"].start == 98.9 and clipped["synthesis"].start == 99.0
    assert synthesis_spans(t, None, 100.0) == []  # no worker known: nothing to place


def test_prover_stages_follow_the_device_lock_and_the_finalizer() -> None:
    clocks = ProverClocks()
    # a found the device free: placed as late as its proof's arrival allows
    a = {s.stage: s for s in clocks.spans({"staging": 0.1, "device_wait": 0.0, "device": 2.0, "finalize": 0.5},
                                          "cuzk-prover-0", slot=1, done_at=12.6, ready_wait=0.3)}
    assert (a["staging"].start, a["device"].start, a["device"].end) == (10.0, 10.1, 12.1)
    assert (a["finalize"].start, a["finalize"].end) == (12.1, 12.6)
    assert a["ring_wait"].process == "ring-slot-1" and (a["ring_wait"].start, a["ring_wait"].end) == (9.7, 10.0)
    # b waited 1.9 s for the lock: its device stage began where a's ended (its proof arrived later than
    # that alone would say), and its staging and wait lead up to it
    b = {s.stage: s for s in clocks.spans({"staging": 0.1, "device_wait": 1.9, "device": 2.0, "finalize": 1.0},
                                          "cuzk-prover-0", slot=2, done_at=15.5, ready_wait=0.0)}
    assert b["device"].start == a["device"].end and b["device_wait"].end == b["device"].start
    assert b["staging"].end == pytest.approx(b["device_wait"].start)
    assert "ring_wait" not in b  # it was taken the moment it was published
    # c's finalize waits for b's (one finalizer thread): b's runs to 15.1, c's device stage ends at 14.3
    c = {s.stage: s for s in clocks.spans({"staging": 0.1, "device_wait": 1.9, "device": 0.2, "finalize": 0.1},
                                          "cuzk-prover-0", slot=1, done_at=15.25)}
    assert c["device"].start == b["device"].end and c["finalize"].start == b["finalize"].end
    # a proof heard of too early for its own stages cannot make its device stage overlap the one before it
    d = {s.stage: s for s in clocks.spans({"staging": 0.0, "device_wait": 0.0, "device": 1.0}, "cuzk-prover-0",
                                          slot=0, done_at=c["device"].end + 0.5)}
    assert d["device"].start == c["device"].end
    # another prover has its own lock
    e = {s.stage: s for s in clocks.spans({"staging": 0.0, "device_wait": 0.0, "device": 1.0}, "cuzk-prover-1",
                                          slot=0, done_at=11.0)}
    assert e["device"].start == 10.0
    assert clocks.spans({"staging": 0.1}, "cuzk-prover-0", 0, 1.0) == []  # no device stage: no proof to place


def test_scheduler_places_the_stages_of_the_attempt_that_proved() -> None:
    s = Scheduler(max_attempts=2)
    s.add_job(JobSpec("j", "c", [PartitionInput("synthetic", seed=0)]), CircuitRef("c", "/nonexistent.zkey"))
    task = s.next_task()
    assert task is not None
    task.worker = "cuzk-synth-0"
    t0 = time.monotonic()
    time.sleep(0.05)  # the worker's 0.031 s of stages fit between the dispatch and the publish
    s.on_published(task.task_id, 3, {"ring_wait": 0.01, "shm_write": 0.001, "synthesis": 0.02, "witness": 0.01})
    s.on_taken(task.task_id, "cuzk-prover-0", 0)
    time.sleep(0.1)  # and the prover's 0.085 s (READY wait included) before the proof arrives
    out = s.on_proof(task.task_id, {"pi_a": []}, [1], {"ring_wait": 0.04, "staging": 0.002, "device_wait": 0.0,
                                                        "device": 0.05, "finalize": 0.003}, 0)
    (_, result), = out.partitions
    spans = {(sp.stage, sp.process): sp for sp in result.spans}
    assert set(spans) == {("ring_wait", "cuzk-synth-0"), ("shm_write", "cuzk-synth-0"), ("synthesis", "cuzk-synth-0"),
                          ("witness", "cuzk-synth-0"), ("ring_wait", "ring-slot-3"), ("staging", "cuzk-prover-0"),
                          ("device_wait", "cuzk-prover-0"), ("device", "cuzk-prover-0"), ("finalize", "cuzk-prover-0")}
    for sp in result.spans:
        assert t0 - 1.0 <= sp.start <= sp.end <= time.monotonic() + 1.0
    # the READY wait is the prover's part of ring_wait (0.04 in all, 0.01 of it waiting for a free slot)
    ready = spans[("ring_wait", "ring-slot-3")]
    assert ready.end - ready.start == pytest.approx(0.03)
    assert ready.end == pytest.approx(spans[("staging", "cuzk-prover-0")].start)
    for stage in DURATION_STAGES:
        sp = [v for (st, _), v in spans.items() if st == stage][0]
        assert sp.end - sp.start == pytest.approx(result.timings[stage], abs=1e-6)


# ---- progress while waiting

def test_progress_eta_uses_the_rate_after_the_first_item(capsys: pytest.CaptureFixture[str]) -> None:
    p = Progress(5)
    assert p.eta_s(time.monotonic()) is None
    p.advance()
    assert p.t_first is not None and p.eta_s(p.t_first + 10) is None  # one item says nothing of the rate
    p.advance()
    assert p.eta_s(p.t_first + 2.0) == pytest.approx(2.0 / 1 * 3)  # 1 item in 2 s since the first, 3 left
    p.advance()
    p.advance()
    p.advance()
    assert p.eta_s(time.monotonic()) is None  # done
    err = capsys.readouterr().err
    assert "5/5 proofs" in err and "ETA" in err


def test_step_logs_begin_heartbeat_and_end(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="cuzk_mp.bench"):
        with step("loading a key", heartbeat_s=0.05):
            time.sleep(0.3)
    lines = [r.getMessage() for r in caplog.records if r.name == "cuzk_mp.bench"]
    assert lines[0] == "[bench] loading a key ..."
    assert any(line.startswith("[bench] still loading a key (") for line in lines[1:-1])
    assert lines[-1].startswith("[bench] loading a key: done in ")


# ---- a tiny bench, its JSON timeline and its picture

@pytest.fixture(scope="module")
def bench_result(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """A tiny CPU bench with two simulated devices: (its JSON, the file)."""
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    parser = argparse.ArgumentParser()
    bench.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", "--backend", "cpu", "--log-n", str(LOG_N), "--partitions", "3", "--jobs", "3",
                              "--in-flight", "2", "--partition-workers", "1", "--devices", "0,1", "--ring-slots",
                              "2", "--cache", str(KEY_CACHE), "--json", str(out), "--quiet"])
    assert args.func(args) == 0
    return json.loads(out.read_text()), out


def test_bench_json_has_the_timeline(bench_result: tuple[dict[str, Any], Path]) -> None:
    result, _ = bench_result
    parts = result["partitions"]
    tl = result["timeline"]
    assert len(parts) == 9 and all(p["error"] is None for p in parts)
    assert tl["t0"] <= min(s["start"] for p in parts for s in p["spans"])  # the first run's start: one clock
    assert tl["wall_t0"] == pytest.approx(min(p["t_submit"] for p in parts), abs=5.0)  # its date: the first submit's
    assert tl["lanes"] == lanes_of(parts)
    assert tl["lanes"][0] == "cuzk-synth-0" and tl["lanes"][-2:] == ["cuzk-prover-0", "cuzk-prover-1"]
    assert {lane for lane in tl["lanes"] if lane.startswith("ring-slot-")} <= {"ring-slot-0", "ring-slot-1"}
    for p in parts:
        spans = p["spans"]
        by_stage = {s["stage"]: s for s in spans}
        # every stage a process ran is placed, with the process that ran it ...
        assert set(by_stage) >= {"shm_write", "synthesis", "witness", "staging", "device_wait", "device", "finalize"}
        assert {by_stage[s]["process"] for s in ("shm_write", "synthesis")} == {"cuzk-synth-0"}
        assert {by_stage[s]["process"] for s in ("staging", "device", "finalize")} == {f"cuzk-prover-{p['device']}"}
        # ... for as long as the process measured it ...
        for stage in DURATION_STAGES:
            assert by_stage[stage]["end"] - by_stage[stage]["start"] == pytest.approx(p["timings"][stage], abs=1e-6)
        # ... in the order the processes ran them: the slot published, the READY wait, the prover's stages
        chain = [by_stage[s] for s in ("synthesis", "staging", "device_wait", "device")]
        ready = [s for s in spans if s["process"].startswith("ring-slot-")]
        if ready:
            chain.insert(1, ready[0])
        assert all(x["end"] <= y["start"] + 1e-6 for x, y in zip(chain, chain[1:]))
        assert all(x["end"] == pytest.approx(y["start"], abs=1e-6) for x, y in zip(chain[-3:], chain[-2:]))
        assert by_stage["finalize"]["start"] >= by_stage["device"]["end"]
        # ... never before it happened (nothing before the submit) and late by at most how long the engine
        # takes to hear of a message, which the provers' work on both cores of a small machine stretches
        # (a partition that waited for the device lock inherits the lateness of the one before it)
        assert min(s["start"] for s in spans) >= tl["t0"]
        assert max(s["end"] for s in spans) <= p["t_done_mono"] + 0.25
    for dev in (0, 1):  # one device lock per prover: its device stages never overlap
        device = sorted((s["start"], s["end"]) for p in parts for s in p["spans"]
                        if s["stage"] == "device" and s["process"] == f"cuzk-prover-{dev}")
        assert all(a_end <= b_start + 1e-9 for (_, a_end), (b_start, _) in zip(device, device[1:]))
    mem = tl["memory"]
    n = len(mem["t"])
    assert n >= 2 and mem["t"] == sorted(mem["t"]) and len(mem["host_bytes"]) == len(mem["shm_bytes"]) == n
    assert set(mem["pss_bytes_by_process"]) >= {"engine", "cuzk-synth-0", "cuzk-prover-0", "cuzk-prover-1"}
    for i in range(n):
        total = sum(series[i] for series in mem["pss_bytes_by_process"].values()) + mem["shm_bytes"][i]
        assert mem["host_bytes"][i] == total
    assert max(mem["host_bytes"]) == result["peak_host_bytes"]  # the same samples as the peak
    assert tl["bounds"] == {"bound_bytes": result["memory_bound"]["bound_bytes"],
                            "model_bound_bytes": result["memory_bound"]["model_bound_bytes"],
                            "host_budget_bytes": None}


@pytest.mark.skipif(not HAVE_MATPLOTLIB, reason=NO_MATPLOTLIB)
def test_plot_shows_every_lane_stage_and_job_of_the_json(bench_result: tuple[dict[str, Any], Path],
                                                        tmp_path: Path) -> None:
    from matplotlib.patches import Rectangle

    from cuzk_mp.pipeline.benchplot import STAGE_LABELS, draw

    result, path = bench_result
    fig = draw(json.loads(path.read_text()))  # drawn from the JSON file alone
    lanes_ax, mem_ax = fig.axes
    tl, t0 = result["timeline"], result["timeline"]["t0"]
    # one lane per process (and ring slot), labelled, top to bottom as in the JSON
    labels = [t.get_text() for t in lanes_ax.get_yticklabels()]
    ticks = list(lanes_ax.get_yticks())
    assert [lab for _, lab in sorted(zip(ticks, labels), reverse=True)] == tl["lanes"]
    # one bar per span, in its process's lane, where and as long as the span is
    bars = {r.get_gid(): r for r in lanes_ax.patches if isinstance(r, Rectangle) and r.get_gid()}
    spans = Counter((s["stage"], s["process"], p["job"], p["index"]) for p in result["partitions"] for s in p["spans"])
    assert Counter(tuple(g.split("|")[:2]) + (g.split("|")[2], int(g.split("|")[3])) for g in bars) == spans
    lane_of = dict(zip(labels, ticks))
    for p in result["partitions"]:
        for s in p["spans"]:
            r = bars[f"{s['stage']}|{s['process']}|{p['job']}|{p['index']}"]
            assert r.get_x() == pytest.approx(s["start"] - t0, abs=1e-9)
            assert r.get_width() == pytest.approx(s["end"] - s["start"], abs=1e-9)
            assert abs(r.get_y() + r.get_height() / 2 - lane_of[s["process"]]) < 0.5  # inside its lane
    # every stage coloured alike and named in the legend, and the jobs told apart
    colours: dict[str, set[tuple[float, ...]]] = {}
    for gid, r in bars.items():
        colours.setdefault(gid.split("|")[0], set()).add(tuple(r.get_facecolor()))
    assert all(len(c) == 1 for c in colours.values()) and len({next(iter(c)) for c in colours.values()}) == len(colours)
    legend = {t.get_text() for t in lanes_ax.get_legend().get_texts()}
    assert {STAGE_LABELS[s] for s in colours} <= legend
    jobs = sorted({p["job"] for p in result["partitions"]})
    assert all(any(job in text for text in legend) for job in jobs)
    looks = {(tuple(r.get_edgecolor()), r.get_hatch()) for gid, r in bars.items() if gid.split("|")[2] == jobs[0]}
    others = {(tuple(r.get_edgecolor()), r.get_hatch()) for gid, r in bars.items() if gid.split("|")[2] != jobs[0]}
    assert len(looks) == 1 and not looks & others
    # the configuration as the title
    title = lanes_ax.get_title(loc="left")
    assert f"porep-like 2^{LOG_N}" in title and "cpu backend" in title and "3 jobs x 3 partitions" in title
    assert "1 synthesis worker x" in title and "2 ring slots" in title
    # memory over time against the bound
    host = [ln for ln in mem_ax.get_lines() if ln.get_gid() == "host_bytes"][0]
    assert list(host.get_xdata()) == pytest.approx([t - t0 for t in tl["memory"]["t"]])
    unit = 2**30 if max(host.get_ydata()) * 2**20 >= 2 * 2**30 else 2**20
    assert list(host.get_ydata()) == pytest.approx([b / unit for b in tl["memory"]["host_bytes"]])
    bound = [ln for ln in mem_ax.get_lines() if ln.get_gid() == "bound_bytes"][0]
    assert bound.get_ydata()[0] == pytest.approx(tl["bounds"]["bound_bytes"] / unit)
    # and the file: redrawn from the saved JSON as a real PNG
    png = tmp_path / "t.png"
    assert benchplot_main([str(path), str(png)]) == 0
    from matplotlib.image import imread

    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and imread(png).shape[0] > 400


def test_replot_of_a_result_without_timeline_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"config": {}, "partitions": []}))
    assert benchplot_main([str(old), str(tmp_path / "x.png")]) == 2
    assert "no timeline" in capsys.readouterr().err


@pytest.mark.skipif(not HAVE_MATPLOTLIB, reason=NO_MATPLOTLIB)
def test_a_plot_that_cannot_be_written_is_an_output_error_naming_it(bench_result: tuple[dict[str, Any], Path],
                                                                   tmp_path: Path) -> None:
    from cuzk_mp.errors import OutputError
    from cuzk_mp.pipeline.benchplot import plot_timeline

    full = tmp_path / "full.png"
    full.symlink_to("/dev/full")
    with pytest.raises(OutputError, match=r"full\.png: cannot write it: No space left on device"):
        plot_timeline(bench_result[0], full)
    svg = tmp_path / "t.svg"
    plot_timeline(bench_result[0], svg)  # the format still follows the suffix
    assert b"<svg" in svg.read_bytes()[:400]


def _read_terminal(master: int, out: bytes = b"", bar_after: bytes | None = None) -> bytes:
    """``out`` and what the terminal ``master`` gets next: until a bar ("1/5 proofs") stands after
    ``bar_after`` (the relay's thread has written the line, and the bar under it), else until it is quiet."""
    import select

    while (b"1/5 proofs" not in out.partition(bar_after)[2]) if bar_after else True:
        if not select.select([master], [], [], 5.0 if bar_after else 0.5)[0]:
            break
        out += os.read(master, 65536)
    return out


def _screen(text: str) -> list[str]:
    """What a terminal shows of ``text``: each line as its carriage returns left it (overwritten)."""
    shown = []
    for line in text.split("\n"):
        cells: list[str] = []
        col = 0
        for ch in line:
            if ch == "\r":
                col = 0
                continue
            cells[col:col + 1] = [ch]
            col += 1
        shown.append("".join(cells).rstrip())
    return shown


def test_a_log_line_on_a_terminal_never_runs_onto_the_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine logs while the bar is drawn (a retry, a restart): through the relay the bench installs
    on a terminal, the line stands alone on the terminal, and the bar comes back under it."""

    from cuzk_mp.pipeline.benchreport import TerminalRelay

    master, slave = os.openpty()
    fd = os.dup(slave)  # stands for stderr on a terminal
    root = logging.getLogger()
    try:
        relay = TerminalRelay.install(fd)
        assert relay is not None
        stream = open(fd, "w", closefd=False)  # noqa: SIM115 - the logging handler's stream, fd closed below
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        monkeypatch.setattr(root, "handlers", [handler])
        p = Progress(5, relay=relay)
        p.advance()
        logging.getLogger("cuzk_mp.pipeline.engine").warning("a prover died: its partitions are retried")
        out = _read_terminal(master, bar_after=b"retried")
        p.close()
        stream.close()
        relay.close()
        out = _read_terminal(master, out)
    finally:
        for f in (fd, slave, master):
            os.close(f)
    shown = _screen(out.decode())
    assert "WARNING a prover died: its partitions are retried" in shown, shown
    bars = [i for i, line in enumerate(shown) if "1/5 proofs" in line]
    assert bars and bars[-1] > shown.index("WARNING a prover died: its partitions are retried"), shown
    assert root.handlers == [handler]  # the bar adds no handlers of its own


def test_a_child_processs_line_on_a_terminal_never_runs_onto_the_bar() -> None:
    """An engine child writes its log lines to the stderr it inherited, past this process's logging.
    With the relay installed on a terminal, a process started meanwhile inherits its pipe: the child's
    line stands alone above the bar, which comes back under it; closed, the terminal is stderr again."""
    import subprocess

    from cuzk_mp.pipeline.benchreport import TerminalRelay

    master, slave = os.openpty()
    fd = os.dup(slave)  # stands for stderr on a terminal
    try:
        relay = TerminalRelay.install(fd)
        assert relay is not None and not os.isatty(fd)
        p = Progress(5, relay=relay)
        p.advance()
        line = "(cuzk-prover-0 pid=1) WARNING a line of its own"
        subprocess.run([sys.executable, "-c", f"import os; os.write({fd}, b'{line}\\n')"], pass_fds=(fd,), check=True)
        out = _read_terminal(master, bar_after=b"own")
        p.close()
        relay.close()
        assert os.isatty(fd)
        out = _read_terminal(master, out)
    finally:
        for f in (fd, slave, master):
            os.close(f)
    shown = _screen(out.decode())
    assert line in shown, shown
    assert not any("proofs" in s for s in shown if line in s), shown
    bars = [i for i, s in enumerate(shown) if "1/5 proofs" in s]
    assert bars and bars[-1] > shown.index(line), shown


def test_jobs_are_numbered_in_submit_order_on_the_spans_clock() -> None:
    """A job's colour and legend follow the order of its earliest span (on the monotonic clock), not the
    wall-clock submit times a step of the clock reorders, nor the ids' string order."""
    from cuzk_mp.pipeline.benchplot import _bars

    def part(job: str, t_submit: float, start: float) -> dict[str, Any]:
        return {"job": job, "index": 0, "t_submit": t_submit,
                "spans": [{"stage": "queue_wait", "process": "engine", "start": start, "end": start + 0.1}]}

    # submitted in the order 2, 10, 3: the clock was set back an hour before the last submit
    parts = [part("bench-0-10", 5000.0, 11.0), part("bench-0-2", 4999.0, 10.0), part("bench-0-3", 1400.0, 12.0)]
    bars, jobs = _bars({"partitions": parts}, 10.0)
    assert jobs == {"bench-0-2": 0, "bench-0-10": 1, "bench-0-3": 2}
    assert sorted(b["start"] for b in bars) == [0.0, 1.0, 2.0]
