"""What a one-call device script keeps around its sections: the rows it reports (one JSON file), its
logs, its time budget, sections that record a failure and let the others run, commands timed into a
log each, and the short table it prints last. perf/gpu_session.py and perf/gpu_small.py are such
scripts: the GPU machine is lent for a bounded time, so each measures what it can in one call."""

from __future__ import annotations

import datetime as _dt
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


class GpuStack:
    """``with GpuStack(__name__) as GPU_STACK:`` around a GPU script's imports of CuPy and the GPU
    backend: run as a script (``__main__``) on a machine without them, their ImportError is kept for
    :meth:`require` (so ``--help`` still works); imported as a module, it is raised as usual."""

    def __init__(self, module_name: str) -> None:
        self.script = module_name == "__main__"
        self.imported = True

    def __enter__(self) -> GpuStack:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        if kind is not None and issubclass(kind, ImportError) and self.script:
            self.imported = False
            return True
        return False

    def __bool__(self) -> bool:
        return self.imported

    def require(self, script: str) -> None:
        """Exit 2 with one line where this machine cannot run ``script``: no CuPy, no CUDA device CuPy
        sees, or the GPU backend's modules not importing."""
        from cuzk_mp.backends import gpu_unavailable_reason

        reason = gpu_unavailable_reason() or (None if self.imported else "the GPU backend's modules do not import")
        if reason:
            print(f"{script} needs CuPy and a CUDA GPU: {reason}", file=sys.stderr)
            sys.exit(2)


class DeviceRun:
    """Rows, logs and the time budget of one run; ``estimates`` are each section's seconds on the device."""

    def __init__(self, out: Path, budget_s: float, dry: bool, json_name: str,
                 estimates: Mapping[str, float], **rows: Any) -> None:
        self.out, self.budget_s, self.dry, self.json_name = out, budget_s, dry, json_name
        self.estimates = estimates
        self.t0 = time.perf_counter()
        self.rows: dict[str, Any] = {"date": _dt.date.today().isoformat(), "dry_run": dry, **rows}
        self.logs = out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.failed: list[str] = []

    def left(self) -> float:
        """Seconds of the budget left."""
        return self.budget_s - (time.perf_counter() - self.t0)

    def log(self, msg: str) -> None:
        """A line on stdout and in logs/session.log, with the seconds since the start."""
        line = f"[{time.perf_counter() - self.t0:6.1f} s] {msg}"
        print(line, flush=True)
        with open(self.logs / "session.log", "a") as f:
            f.write(line + "\n")

    def fail(self, what: str) -> None:
        """Record a failed check (the run goes on; the exit status says so)."""
        self.failed.append(what)
        self.log(f"CHECK FAILED: {what}")

    def check(self, key: str, ok: bool) -> None:
        """Record a check as row ``key`` (a failed one also in the failed list)."""
        self.rows[key] = bool(ok)
        if not ok:
            self.fail(key)

    def save(self) -> None:
        """Write the rows (and the failed checks) to ``out/json_name``."""
        self.rows["checks_failed"] = len(self.failed)
        self.rows["failed_checks"] = self.failed
        self.rows["session_s"] = time.perf_counter() - self.t0
        (self.out / self.json_name).write_text(json.dumps(self.rows, indent=1, sort_keys=True, default=str) + "\n")

    def section(self, name: str, fn: Callable[[], None]) -> None:
        """Run one section if its estimate fits the budget left (always in a dry run); a failure is
        recorded with its traceback in logs/<name>.error.log and the next section runs."""
        need = self.estimates.get(name, 30.0)
        if self.left() < need and not self.dry:
            self.rows[f"{name}_status"] = f"not run: {self.left():.0f} s left, ~{need:.0f} s needed"
            self.log(self.rows[f"{name}_status"])
            return
        self.log(f"section {name} ...")
        t0 = time.perf_counter()
        try:
            fn()
            self.rows[f"{name}_status"] = "ok"
        except Exception as exc:  # noqa: BLE001 - a failed section is recorded, the others still run
            self.rows[f"{name}_status"] = f"error: {type(exc).__name__}: {exc}"[:2000]
            (self.logs / f"{name}.error.log").write_text(traceback.format_exc())
            self.fail(f"{name}_section")
        self.rows[f"{name}_s"] = time.perf_counter() - t0
        self.log(f"section {name}: {self.rows[f'{name}_s']:.1f} s")
        self.save()

    def command(self, label: str, cmd: list[str], timeout: float, *, env: Mapping[str, str] | None = None,
                dry_factor: float = 5.0) -> tuple[float, str]:
        """Run ``cmd`` in the repository root; (seconds, stdout + stderr), logged to logs/<label>.log.
        A dry run's timeout is ``dry_factor`` times longer (its CPU box compiles numba on 2 shared cores)."""
        t0 = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout * (dry_factor if self.dry else 1),
                             cwd=ROOT, check=False, env={**os.environ, **(env or {})})
        took = time.perf_counter() - t0
        (self.logs / f"{label}.log").write_text(f"$ {' '.join(cmd)}\n--- rc {res.returncode} in {took:.2f} s\n"
                                                f"{res.stdout}\n{res.stderr}")
        if res.returncode:
            raise RuntimeError(f"{label} failed (rc {res.returncode}): {res.stderr[-800:]}")
        return took, res.stdout + res.stderr


def result_name(gpu: str) -> str:
    """perf/gpu_bench.py's result file for a GPU model: ``gpu-h200.json`` on an H200 (the file the GPU
    targets are read from), else ``gpu-<model>.json`` (``NVIDIA H100 80GB HBM3`` ->
    ``gpu-h100-80gb-hbm3.json``), so a run on another card never stands in for the H200's rows."""
    model = gpu.removeprefix("NVIDIA").strip().lower()
    if model.split(" ")[0] == "h200":
        return "gpu-h200.json"
    return "gpu-" + "-".join("".join(c if c.isalnum() else " " for c in model).split()) + ".json"


def cli(*args: str) -> list[str]:
    """The command line of ``cuzk-mp ARGS`` with this interpreter."""
    return [sys.executable, "-m", "cuzk_mp.cli", *args]


def table(rows: Mapping[str, Any], keys: Sequence[str]) -> str:
    """The rows named in ``keys`` (those present), then every section that did not end ok."""
    lines = [f"{'row':44} value"]
    for k in keys:
        if k in rows:
            v = rows[k]
            lines.append(f"{k:44} {v:.4g}" if isinstance(v, float) else f"{k:44} {v}")
    for k in sorted(rows):
        if k.endswith("_status") and rows[k] != "ok":
            lines.append(f"{k:44} {rows[k][:70]}")
    return "\n".join(lines)
