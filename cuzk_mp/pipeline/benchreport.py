"""Presentation for ``cuzk-mp bench``: the stderr progress bar, the summary table, the machine.

Owns no pipeline state: it formats what :mod:`.bench` measured (the picture is
:mod:`.benchplot`). matplotlib is an optional extra (``pip install 'cuzk-mp[plot]'``);
without it ``--plot`` fails with a message saying so, before any work starts.
"""

from __future__ import annotations

import logging
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from ..errors import InputError
from ..logs import duration_text
from ..logs import fmt_bytes

log = logging.getLogger("cuzk_mp.bench")
HEARTBEAT_S = 15.0  # a long step says it is still at work this often


@contextmanager
def step(what: str, heartbeat_s: float = HEARTBEAT_S) -> Iterator[None]:
    """Log ``what`` when it begins, every ``heartbeat_s`` while it lasts, and its time when it ends
    (the lines a user sees while the engine starts: kernels compile, keys load)."""
    t0 = time.monotonic()
    log.info("[bench] %s ...", what)
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(heartbeat_s):
            log.info("[bench] still %s (%.0f s so far)", what, time.monotonic() - t0)

    threading.Thread(target=beat, name="cuzk-bench-heartbeat", daemon=True).start()
    try:
        yield
    finally:
        stop.set()
    log.info("[bench] %s: done in %.1f s", what, time.monotonic() - t0)


class Progress:
    """A one-line progress bar on stderr (a new line every 10 % when stderr is not a terminal),
    with the elapsed time and, from the second finished item on, an ETA at the rate since the first
    (the first one carries the cold start). On a terminal no log line runs onto the bar: with a
    :class:`TerminalRelay` (which the bench installs wherever stderr is a terminal: its engine children
    write to the stderr they inherited, past this process's logging) every line of every process comes
    through the relay, which erases the bar before it and draws it again under it, and the bar is drawn on
    the terminal the relay keeps."""

    def __init__(self, total: int, label: str = "proofs", relay: TerminalRelay | None = None) -> None:
        self.total = max(1, total)
        self.label = label
        self.done = 0
        self.failed = 0
        self.t0 = time.monotonic()
        self.t_first: float | None = None
        self._lock = threading.Lock()
        self._out: TextIO = relay.term if relay is not None else sys.stderr
        self._tty = self._out.isatty()
        self._last_draw = 0.0
        self._last_decile = -1
        self._last_len = 0
        self._closed = False
        self._shown = ""  # the bar as it stands on the terminal, its line not ended ("" if none)
        self._relay = relay
        if relay is not None:
            relay.progress = self

    def advance(self, ok: bool = True) -> None:
        """Count one finished partition (called from the engine's thread)."""
        with self._lock:
            if self._closed:
                return
            self.done += 1
            self.failed += 0 if ok else 1
            if self.t_first is None:
                self.t_first = time.monotonic()
            self._draw(final=self.done >= self.total)

    def close(self) -> None:
        """Draw no more, ending a bar left part way on a terminal with its line: a bench that stops early
        (Ctrl-C, a failure) cancels its partitions, which are no progress, and the lines that follow
        (the engine's stop, the closing error) start on a line of their own."""
        with self._lock:
            if not self._closed and self._shown:
                self._out.write("\n")
                self._out.flush()
            self._closed, self._shown = True, ""
        if self._relay is not None:
            self._relay.progress = None

    def _erase(self) -> None:
        """Clear the bar's line before a log line is written (the log line then starts at its left)."""
        if self._shown:
            self._out.write("\r" + " " * len(self._shown) + "\r")
            self._out.flush()

    def _redraw(self) -> None:
        """Draw the bar again after a log line (:meth:`_erase`), on the line that follows it."""
        if self._shown and not self._closed:
            self._out.write(self._shown)
            self._out.flush()

    def write_above(self, text: str) -> None:
        """Write whole lines above the bar: erased, the lines, the bar drawn again under them, with no
        draw of the bar in between (the relay's lines, from any process)."""
        with self._lock:
            self._erase()
            self._out.write(text)
            self._out.flush()
            self._redraw()

    def eta_s(self, now: float) -> float | None:
        """Seconds left at the rate since the first finished item; None before the second one."""
        if self.t_first is None or self.done < 2 or self.done >= self.total:
            return None
        return (now - self.t_first) / (self.done - 1) * (self.total - self.done)

    def _draw(self, final: bool = False) -> None:
        now = time.monotonic()
        decile = 10 * self.done // self.total
        if self._tty and not final and now - self._last_draw < 0.2:
            return
        if not self._tty and decile == self._last_decile and not final:
            return
        self._last_draw, self._last_decile = now, decile
        width = 30
        fill = width * self.done // self.total
        elapsed = now - self.t0
        eta = self.eta_s(now)
        line = (f"[{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} {self.label}"
                f"{f' ({self.failed} failed)' if self.failed else ''}  {elapsed:6.1f} s"
                + ("" if final else "  ETA " + duration_text(eta)))
        padded, self._last_len = line.ljust(self._last_len), len(line)  # a shorter line covers the last one
        self._out.write(("\r" + padded + ("\n" if final else "")) if self._tty else line + "\n")
        self._out.flush()
        self._shown = line if self._tty and not final else ""


class TerminalRelay:
    """While a bench runs on a terminal, file descriptor ``fd`` (stderr) of this process is a pipe, and so
    is the stderr of every engine child started meanwhile, which inherits it: a thread copies what comes
    through to the terminal a whole line at a time, above the progress bar while one is drawn
    (:meth:`Progress.write_above`). So no line, whichever process wrote it and however (logging, a
    traceback, a library's own warning), runs onto the bar. The bar is drawn on :attr:`term`, the
    terminal itself. Off a terminal there is no bar to keep clear: :meth:`install` installs nothing."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._terminal = os.dup(fd)
        self.term: TextIO = os.fdopen(os.dup(self._terminal), "w", encoding="utf-8", errors="replace")
        self.progress: Progress | None = None
        self._lost = False  # the terminal could not be written: lines are read and dropped
        read_end, write_end = os.pipe()
        sys.stderr.flush()
        os.dup2(write_end, fd)
        os.close(write_end)
        self._thread = threading.Thread(target=self._copy, args=(read_end,), name="cuzk-bench-stderr", daemon=True)
        self._thread.start()

    @classmethod
    def install(cls, fd: int = 2) -> TerminalRelay | None:
        """A relay for ``fd`` where it is a terminal; None elsewhere (a file, a pipe, a test's capture)."""
        return cls(fd) if os.isatty(fd) else None

    def _copy(self, read_end: int) -> None:
        """Copy whole lines until every writer has closed the pipe (this process's ``fd`` given back, the
        children gone); a last line left unended is ended."""
        pending = b""
        try:
            while chunk := os.read(read_end, 1 << 16):
                lines, newline, pending = (pending + chunk).rpartition(b"\n")
                if newline:
                    self._write(lines + newline)
            if pending:
                self._write(pending + b"\n")
        finally:
            os.close(read_end)

    def _write(self, data: bytes) -> None:
        """Put lines on the terminal; once it cannot be written (closed, hung up) the lines are dropped,
        never left in the pipe, where they would block every process writing to its stderr."""
        if self._lost:
            return
        text = data.decode("utf-8", errors="replace")
        bar = self.progress
        try:
            if bar is not None:
                bar.write_above(text)
            else:
                self.term.write(text)
                self.term.flush()
        except (OSError, ValueError):
            self._lost = True

    def close(self, timeout_s: float = 5.0) -> None:
        """Give ``fd`` back to the terminal, then wait (``timeout_s`` at most) for the lines still in the
        pipe; a child that outlives the engine's stop keeps its lines coming through the thread."""
        sys.stderr.flush()
        os.dup2(self._terminal, self.fd)
        os.close(self._terminal)
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self.term.close()


def require_matplotlib() -> None:
    """Fail early (InputError) if ``--plot`` was asked for without matplotlib installed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InputError("--plot needs matplotlib: pip install 'cuzk-mp[plot]' (or pip install matplotlib)") from None


def gpu_names(devices: list[int] | None) -> list[str]:
    """Names of these GPUs (physical ids), or of every GPU it lists (None), from ``nvidia-smi``; empty
    when it is not available."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    names = dict(line.split(", ", 1) for line in out.strip().splitlines() if ", " in line)
    if devices is None:
        return [f"{d}: {name}" for d, name in names.items()]
    return [f"{d}: {names.get(str(d), '?')}" for d in devices]


def machine_info(gpu_devices: list[int] | None) -> dict[str, Any]:
    """CPU model, cores, memory, the GPUs used (by name; None: every GPU of the machine, for a
    process that leaves the choice to CUDA), load average, git commit."""
    model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from .memory import machine_memory_bytes

    mem = machine_memory_bytes()
    return {"cpu_model": model, "cores": os.cpu_count(), "memory_bytes": mem, "gpus": gpu_names(gpu_devices),
            "python": platform.python_version(), "loadavg_at_end": list(os.getloadavg()),
            "git_commit": _git_commit()}


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def median_stage(partitions: list[dict[str, Any]], stage: str) -> float | None:
    """Median of one stage's seconds over the partitions that have it."""
    values = [p["timings"][stage] for p in partitions if stage in p["timings"]]
    return statistics.median(values) if values else None


def _key_line(result: dict[str, Any]) -> str:
    """How the key got into the provers, and how long it took (before the clock of the jobs)."""
    seconds = result.get("key_load_s")
    took = "" if seconds is None else f" in {_fmt_s(seconds)}"
    if result["config"].get("key_source") == "device":
        return f"generated in the provers{took} (INSECURE dev key, no file)"
    return f"loaded{took}"


def _fmt_s(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f} s"


def _bound_row(bound: dict[str, Any]) -> str:
    """The memory bound's row: each bound's margin, or how far the peak went over it as the result's
    check says (:func:`~.benchsummary.bound_check`: a peak over the bound is never shown as a margin)."""
    excess = bound["working_set_excess_bytes"]
    return (f"{fmt_bytes(bound['bound_bytes'])}, peak {fmt_bytes(bound['peak_host_bytes'])} "
            f"({_against(bound['margin_bytes'], bound['bound_check'], bound['tolerance_bytes'])}; "
            f"model's bound {fmt_bytes(bound['model_bound_bytes'])}, "
            f"{_against(bound['model_margin_bytes'], bound['model_bound_check'], 0)}); "
            + ("no process outgrew its first-job working set" if excess <= 0
               else f"a process outgrew its first-job working set by {fmt_bytes(excess)}"))


def _against(margin: int, check: str, tolerance: int) -> str:
    """A bound's margin, or the bytes the peak went over it by and whether that is within the
    tolerance (``check``: the result's bound_check)."""
    if check == "held":
        return f"margin {fmt_bytes(margin)}"
    if check == "within tolerance":
        return f"over by {fmt_bytes(-margin)} (within the {fmt_bytes(tolerance)} tolerance)"
    beyond = f" (beyond the {fmt_bytes(tolerance)} tolerance)" if tolerance else ""
    return f"EXCEEDED by {fmt_bytes(-margin)}{beyond}"


def s_per_partition(result: dict[str, Any]) -> tuple[float, list[float]]:
    """(steady-state seconds per partition, per run) of a bench result: ``s_per_partition``, or in
    files written before it had that name, ``s_per_proof``."""
    if "s_per_partition" in result:
        return result["s_per_partition"], list(result.get("s_per_partition_runs") or [])
    return result["s_per_proof"], list(result.get("s_per_proof_runs") or [])


def _spread(runs: list[float]) -> str:
    if len(runs) < 2:
        return ""
    return f"  (median of {len(runs)} runs; min {min(runs):.3f}, max {max(runs):.3f})"


# What the steady rows say they are made of, where not a window after the first job (bench.steady_basis)
STEADY_NOTES = {
    "lone warm jobs": "  (one job a run: the runs after the first, each a lone job on a warm engine, fill and "
                      "drain included)",
    "cold job only": "  (no steady figure: one job, the cold one; --jobs 2+ or --repeat 2+ gives one)",
}


def table(result: dict[str, Any]) -> str:
    """The one summary table (text)."""
    busy = result["gpu_busy_fraction"]
    per_part, per_part_runs = s_per_partition(result)
    basis = result.get("steady_basis", "window")
    rows = [
        ("s/partition (steady state)", _fmt_s(per_part) + _spread(per_part_runs)
         + ("  (the pipeline's capacity: the window timed faster than its partitions' own stages allow)"
            if result.get("s_per_partition_floored") else "") + STEADY_NOTES.get(basis, "")),
        (f"s/job of {result['config']['partitions']} partitions (steady)",
         "n/a (older result)" if result.get("s_per_job") is None
         else _fmt_s(result["s_per_job"]) + _spread(result.get("s_per_job_runs") or [])),
        ("first (cold) job", _fmt_s(result["first_job_s"])),
        ("proving key", _key_line(result)),
        ("synthesis / partition (median)", _fmt_s(result["median_stage_s"].get("synthesis"))),
        ("device / partition (median)", _fmt_s(result["median_stage_s"].get("device"))),
        ("GPU kernel-busy fraction", "n/a (cpu backend)" if busy is None else f"{busy:.1%}" + "".join(
            f", {name} {frac:.1%}" for name, frac in (result.get("gpu_busy_fraction_by_device") or {}).items())),
        ("device stage busy (per device)", ", ".join(
            f"{d}: {f:.1%}" for d, f in (result.get("device_busy_fraction_by_device") or {}).items()) or "n/a"),
        ("partitions by device", ", ".join(f"{d}: {n}" for d, n in result["partitions_by_device"].items())),
        ("synthesis core-seconds / partition", "n/a" if result["synthesis_core_s"] is None
         else f"{result['synthesis_core_s']:.3f} ({result['config']['synthesis_threads']} thread(s))"),
        ("peak host memory (PSS tree + shm)", fmt_bytes(result["peak_host_bytes"])),
        ("  peak USS per process", ", ".join(f"{name} {fmt_bytes(v)}"
                                              for name, v in sorted(result["peak_uss_by_process"].items()))),
        ("  of which shm (peak)", f"{fmt_bytes(result['peak_shm_bytes'])}, "
                                  f"{result['peak_live_segments']} live segment(s) max"),
        ("host memory bound (first-job calib.)", _bound_row(result["memory_bound"])),
        ("peak device memory", fmt_bytes(result["peak_device_bytes"])),
        ("proofs verified", f"{result['proofs_verified']} / {result['proofs_total']}"),
    ]
    width = max(len(k) for k, _ in rows)
    head = (f"cuzk-mp bench: {result['config']['circuit']} 2^{result['config']['log_n']}, "
            f"{result['config']['partitions']} partitions x {result['config']['jobs']} jobs, "
            f"{result['config']['backend']} backend, devices {result['config']['devices']}")
    return "\n".join([head, "-" * len(head)] + [f"{k:<{width}}  {v}" for k, v in rows])
