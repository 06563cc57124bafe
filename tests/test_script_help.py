"""The Python scripts of scripts/ and perf/ answer --help with their usage and exit 0, doing nothing
else (gen_constants.py leaves the header alone, warm_caches.py runs no warm-up); the GPU benchmarks
do so without CuPy too, and run without a GPU stack they say in one line what they need (exit 2)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import load_script

REPO = Path(__file__).resolve().parents[1]
HEADER = REPO / "cuzk_mp" / "backends" / "gpu" / "kernels" / "ff" / "bls12_381.cuh"


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, str(REPO / script), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("script", ["scripts/gen_constants.py", "scripts/warm_caches.py", "perf/gpu_bench.py",
                                    "perf/gpu_msm_bench.py"])
def test_help(script: str) -> None:
    before = HEADER.stat().st_mtime_ns
    proc = _run(script, "--help")
    assert proc.returncode == 0, proc.stderr
    name = Path(script).name
    assert proc.stdout.startswith(f"usage: {name}"), proc.stdout
    assert "warm_caches:" not in proc.stdout + proc.stderr and "wrote " not in proc.stdout
    assert HEADER.stat().st_mtime_ns == before


def test_pipeline_summary_help() -> None:
    for flag in ("-h", "--help"):
        proc = _run("perf/pipeline_summary.py", flag)
        assert proc.returncode == 0 and "pipeline_summary.py runs DIR MODE" in proc.stdout, proc.stderr
    assert _run("perf/pipeline_summary.py", "bogus").returncode == 2


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed")
@pytest.mark.parametrize("script", ["perf/gpu_bench.py", "perf/gpu_msm_bench.py"])
def test_gpu_bench_without_cupy(script: str) -> None:
    proc = _run(script)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and f"{Path(script).name} needs CuPy and a CUDA GPU" in proc.stderr, proc.stderr


@pytest.mark.parametrize(("script", "args"), [("scripts/wait-ready.sh", ["--connect", "unix:///nowhere.sock"]),
                                              ("scripts/batch-prove.sh", ["--circuit", "c", "--out", "OUT", "IN"])])
def test_the_shell_scripts_say_at_once_that_cuzk_mp_cannot_run(script: str, args: list[str], tmp_path: Path) -> None:
    """Without cuzk-mp on PATH (and $CUZK_MP unset) no retry can help: exit 2 at once, naming it, instead
    of polling for the whole timeout or marking every input pending."""
    (tmp_path / "IN").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "CUZK_MP"} | {"PATH": "/usr/bin:/bin"}
    proc = subprocess.run(["bash", str(REPO / script), *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 2 and "cannot run 'cuzk-mp': not found" in proc.stderr, proc.stderr
    assert not (tmp_path / "OUT").exists()


def test_the_gpu_bench_names_its_file_by_the_gpu() -> None:
    """perf/gpu_bench.py writes gpu-h200.json, the file the GPU targets are read from, on an H200
    alone: a run on another card gets a file of its own model."""
    mod = load_script(REPO / "perf" / "device_run.py")
    assert mod.result_name("NVIDIA H200") == "gpu-h200.json"
    assert mod.result_name("NVIDIA H200 NVL") == "gpu-h200.json"
    assert mod.result_name("NVIDIA H100 80GB HBM3") == "gpu-h100-80gb-hbm3.json"
    assert mod.result_name("NVIDIA RTX 5000 Ada Generation") == "gpu-rtx-5000-ada-generation.json"
