"""The bench's host memory bound checked against a recorded peak, and how its table row says it.

On recorded numbers (no process started): a peak at or under the bound calibrated on the first job
is a margin; a peak over it by no more than the tolerance for allocator noise is "over by X (within
the Y tolerance)", never a margin; beyond that it is exceeded. The JSON's check and the table's row
say the same thing, and the model's own bound, which the daemon's budget relies on, has no tolerance.
"""

from __future__ import annotations

from typing import Any

from cuzk_mp.logs import fmt_bytes
from cuzk_mp.pipeline.benchreport import _bound_row
from cuzk_mp.pipeline.benchsummary import BOUND_TOLERANCE, memory_bound
from cuzk_mp.pipeline.memory import CircuitSize

MiB = 1 << 20
CONFIG = {"ring_slots": 2, "partition_workers": 1, "synthesis_threads": 1, "devices": [0], "backend": "cpu",
          "gpu_workers": 1}


def _bound(peak_over_first_job_bound: int, model_over: int = -1) -> dict[str, Any]:
    """memory_bound of a small run whose whole-run peak is the first-job bound plus the given bytes
    (``model_over``: the model's bound moved so the peak is that far over it; < 0: well under)."""
    idle = {"engine": 50 * MiB, "cuzk-synth-0": 40 * MiB, "cuzk-prover-0": 60 * MiB}
    first = {"engine": 52 * MiB, "cuzk-synth-0": 45 * MiB, "cuzk-prover-0": 70 * MiB}
    circuit = CircuitSize(domain_size=1024, n_vars=1000, key_bytes=2 * MiB, data_bytes=MiB)

    def run(peak: int, data_bytes: int) -> dict[str, Any]:
        mem = {"idle_pss": idle, "peak_pss_first_job": first, "peak_pss_by_process": first,
               "peak_host_bytes": peak, "peak_shm_bytes": 0, "timeline": [], "peak_uss_by_process": {},
               "peak_anon_by_process": {}, "idle_uss": {}, "idle_anon": {}}
        raw = {"circuit": CircuitSize(circuit.domain_size, circuit.n_vars, circuit.key_bytes, data_bytes),
               "memory": mem, "runs": []}
        return memory_bound(raw, CONFIG)

    bound = run(0, circuit.data_bytes)["bound_bytes"]
    peak = bound + peak_over_first_job_bound
    if model_over < 0:
        return run(peak, circuit.data_bytes)
    model = run(peak, circuit.data_bytes)["model_bound_bytes"]
    return run(peak, circuit.data_bytes - (model - peak) - model_over)  # the model's fixed part counts the data


def test_a_peak_under_the_bound_is_a_margin() -> None:
    b = _bound(-3 * MiB)
    assert b["bound_check"] == "held" and b["margin_bytes"] == 3 * MiB and b["model_bound_check"] == "held"
    assert f"(margin {fmt_bytes(3 * MiB)};" in _bound_row(b)


def test_a_peak_just_above_the_bound_is_over_it_within_the_tolerance() -> None:
    b = _bound(66 << 10)
    assert b["margin_bytes"] == -(66 << 10)
    assert b["tolerance_bytes"] == int(BOUND_TOLERANCE * b["bound_bytes"]) > 66 << 10
    assert b["bound_check"] == "within tolerance"
    row = _bound_row(b)
    assert f"over by 66 KiB (within the {fmt_bytes(b['tolerance_bytes'])} tolerance)" in row
    assert "margin -" not in row


def test_a_peak_beyond_the_tolerance_is_exceeded() -> None:
    b = _bound(3 * MiB)
    assert 0 < b["tolerance_bytes"] < 3 * MiB and b["bound_check"] == "exceeded"
    row = _bound_row(b)
    assert f"EXCEEDED by {fmt_bytes(3 * MiB)} (beyond the {fmt_bytes(b['tolerance_bytes'])} tolerance)" in row
    assert "margin -" not in row


def test_the_models_bound_has_no_tolerance() -> None:
    b = _bound(-3 * MiB, model_over=1 << 10)
    assert b["model_margin_bytes"] == -(1 << 10) and b["model_bound_check"] == "exceeded"
    assert "model's bound" in _bound_row(b) and "EXCEEDED by 1 KiB)" in _bound_row(b)
