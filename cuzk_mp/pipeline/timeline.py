"""A partition's stages placed in time: which process ran each one, from when to when.

The child processes report each stage as a duration (:mod:`.types` lists them). The engine
knows, on its own clock, when it heard that an attempt's slot was published and when its proof
arrived, and it knows how each process runs its stages. The spans (:class:`~.types.StageSpan`)
are laid from those with the measured durations:

* prover process: ``staging``, ``device_wait``, ``device``, then ``finalize``. A prover's device
  stages are serialised by its device lock and its finalize stages by its one finalizer thread,
  and its proofs arrive in that order. So a partition that waited for the lock began its device
  stage when the one before it ended; one that found the device free began it as late as its
  proof's arrival allows (the arrival less finalize and device: a message is heard after it was
  sent); neither before its dispatch plus all it measured before its device stage. ``staging``
  and ``device_wait`` lead up to the device stage; a finalize begins once both its device stage
  and the finalize before it have ended;
* the ring: ``ring_wait`` on ``ring-slot-<n>``, the time the partition sat READY (what the prover
  measured from the publish to its take), ending where its staging began;
* synthesis worker, backwards from the publish (when the READY wait began, or when the engine
  heard of the publish if that was earlier): ``ring_wait`` (waiting for a free slot),
  ``shm_write``, ``synthesis`` (``witness`` is its first part, drawn inside it).

Every moment here is ``time.monotonic()``: the engine's readings (the dispatch, the publish heard
of, the proof's arrival) and so every span. It never steps, so a wall clock set back an hour (or a
day ahead) mid-run leaves each span with its partition and a prover's device stages serial (on the
wall clock a prover's last device end, kept from before the step, held every later span that far
ahead of its partition). On Linux the clock is system-wide (CLOCK_MONOTONIC), the same in every
process of the host: the children report durations, some of them differences of two processes'
readings (the queue wait: the engine's dispatch to the worker; the READY wait: the worker's publish
to the prover's take), sound on this one clock. Where a span is shown as a date, one wall-clock reading taken with a
monotonic one anchors the whole timeline (:func:`~.benchplot.timeline_section`).

A span is exact in length and placed to within the few milliseconds a message takes to be heard
(more on a machine whose cores the provers keep busy), mostly late: a chain placed from its
proof's arrival sits that much late, and so do the chains that waited for it; a lock hand-over
the OS scheduled late puts the next chain that much early. The READY wait and the stages before
it are also late by the unmeasured moment between a prover's take and its staging (mapping the
slot). A synthesis worker's first task of a circuit also loads the circuit, which its
``synthesis`` time includes (the load came before its slot wait; the span shows it at the end).
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
    floor = dispatched_at if dispatched_at is not None else float("-inf")
    end = max(published_at, floor)
    for stage in reversed(SYNTH_ORDER):
        if stage not in timings:
            continue
        start = max(end - float(timings[stage]), floor)
        spans.append(StageSpan(stage, worker, start, end))
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

    def spans(self, timings: Mapping[str, float], prover: str | None, slot: int | None, done_at: float,
              ready_wait: float | None = None, earliest: float | None = None) -> list[StageSpan]:
        """The prover's stages of one proved attempt (called in the order the proofs arrive; ``done_at``:
        when the proof was heard of), and the READY wait of ``ready_wait`` seconds in ``slot`` before them;
        ``earliest``: the soonest the device stage can have begun (the dispatch plus every stage before it)."""
        if prover is None or "device" not in timings:
            return []
        staging, wait = float(timings.get("staging", 0.0)), float(timings.get("device_wait", 0.0))
        device, finalize = float(timings["device"]), float(timings.get("finalize", 0.0))
        # the latest the device stage can have begun: the proof's message is heard after it was sent
        latest = done_at - finalize - device
        free = self._device_free.get(prover)
        if free is not None and wait > LOCK_WAIT_S and free <= latest:
            start = free  # it waited for the lock: it got it when the stage before it ended
        else:
            start = latest if free is None else max(latest, free)
        if earliest is not None:  # the lock's hand-over can lag on a busy machine: never before it could be
            start = max(start, earliest)
        end = start + device
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
            self._finalizer_free[prover] = f_start + finalize
            spans.append(StageSpan("finalize", prover, f_start, f_start + finalize))
        return spans
