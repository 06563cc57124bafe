"""A partition's stages placed in time: which process ran each one, from when to when.

The child processes report each stage as a duration (:mod:`.types` lists them). The engine
knows, on its own clock, when it heard that an attempt's slot was published by its synthesis
worker and taken by a prover process, and it knows how a process runs its stages. The spans
(:class:`~.types.StageSpan`) are laid from those with the measured durations:

* synthesis worker, backwards from the publish: ``ring_wait`` (waiting for a free slot),
  ``shm_write``, ``synthesis`` (``witness`` is its first part, drawn inside it);
* prover process: ``staging``, ``device_wait``, ``device``, then ``finalize``. A prover's device
  stages are serialised by its device lock and its finalize stages by its one finalizer thread,
  and proofs arrive in that order; so a partition that waited for the lock started its device
  stage when the one before it ended, and a finalize starts when both its device stage and the
  finalize before it have ended. Only a chain that found the device free is placed from the
  take itself (``staging`` and ``device_wait`` lead up to the device stage either way);
* the ring: ``ring_wait`` on ``ring-slot-<n>``, the time the partition sat READY, ending where
  its staging began (its length is what the prover measured).

Where the take anchors a chain, it is the time the engine received the prover's message: a few
milliseconds late on a busy machine, so such spans may sit that much late. A synthesis worker's
first task of a circuit also loads the circuit, which its ``synthesis`` time includes (the load
came before its slot wait; the span shows it at the end).
"""

from __future__ import annotations

from collections.abc import Mapping

from .types import StageSpan

SYNTH_ORDER = ("ring_wait", "shm_write", "synthesis")  # as a synthesis worker runs them
LOCK_WAIT_S = 1e-3  # a device_wait longer than this waited for the lock, not just took it


def synthesis_spans(timings: Mapping[str, float], worker: str | None, published_at: float,
                    dispatched_at: float | None = None) -> list[StageSpan]:
    """The synthesis worker's stages, ending at ``published_at`` (none begins before ``dispatched_at``)."""
    if worker is None:
        return []
    spans: list[StageSpan] = []
    end = published_at
    floor = dispatched_at if dispatched_at is not None else float("-inf")
    for stage in reversed(SYNTH_ORDER):
        if stage not in timings:
            continue
        start = max(end - float(timings[stage]), floor)
        spans.append(StageSpan(stage, worker, start, max(start, end)))
        if stage == "synthesis" and "witness" in timings:
            spans.append(StageSpan("witness", worker, start, min(start + float(timings["witness"]), end)))
        end = start
    spans.reverse()
    return spans


class ProverClocks:
    """When each prover process's device and finalizer were last free (see the module docstring)."""

    def __init__(self) -> None:
        self._device_free: dict[str, float] = {}
        self._finalizer_free: dict[str, float] = {}

    def spans(self, timings: Mapping[str, float], prover: str | None, slot: int | None, taken_at: float | None,
              ready_wait: float | None = None) -> list[StageSpan]:
        """The prover's stages of one proved attempt (in the order the proofs arrive), and the READY
        wait of ``ready_wait`` seconds in ``slot`` before them."""
        if prover is None or taken_at is None or "device" not in timings:
            return []
        staging, wait = float(timings.get("staging", 0.0)), float(timings.get("device_wait", 0.0))
        device_free = self._device_free.get(prover)
        start = taken_at + staging + wait
        if device_free is not None and (start < device_free or (wait > LOCK_WAIT_S and device_free >= start - wait)):
            start = device_free  # it waited for (or, placed from a late take, would overlap) the one before
        end = start + float(timings["device"])
        self._device_free[prover] = end
        spans = []
        staged = start - wait - staging
        if slot is not None and ready_wait is not None and ready_wait > 0:
            spans.append(StageSpan("ring_wait", f"ring-slot-{slot}", staged - ready_wait, staged))
        if "staging" in timings:
            spans.append(StageSpan("staging", prover, staged, staged + staging))
        if "device_wait" in timings:
            spans.append(StageSpan("device_wait", prover, start - wait, start))
        spans.append(StageSpan("device", prover, start, end))
        if "finalize" in timings:
            f_start = max(end, self._finalizer_free.get(prover, end))
            f_end = f_start + float(timings["finalize"])
            self._finalizer_free[prover] = f_end
            spans.append(StageSpan("finalize", prover, f_start, f_end))
        return spans
