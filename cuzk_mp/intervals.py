"""How long something was busy when its busy spans overlap: the union of intervals.

A GPU prover keeps two partitions on the device at once, on separate streams, so one partition's
first kernels run while the other's last MSM finishes; the bench places each partition's device
stage on the wall clock, where neighbours overlap by the messages' lateness. Summing such spans
counts each overlap twice and reports a device "busy" for more than 100 % of the time. Both the
GPU backend's kernel-busy counter and the bench's device-stage fraction measure the union instead.
"""

from __future__ import annotations

import bisect


class IntervalUnion:
    """Disjoint ``[lo, hi)`` intervals, merged as spans are added; :attr:`covered` is the total
    length of their union. Only the ``keep`` latest intervals are held (a long-running prover adds
    one span a partition): the length of one forgotten stays counted, but a span reaching back over it
    would count that part again, so ``keep`` must exceed how many disjoint spans a new one can reach
    back across (a few partitions in flight: the default leaves a wide margin)."""

    def __init__(self, keep: int = 256) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.keep = keep
        self.covered = 0.0
        self._lo: list[float] = []  # starts of the held intervals, ascending
        self._hi: list[float] = []  # their ends (the intervals are disjoint: also ascending)

    def add(self, lo: float, hi: float) -> float:
        """Add the span ``[lo, hi)``; returns the length it newly covers (0 for an empty or
        already covered span)."""
        if not hi > lo:
            return 0.0
        # held intervals touching [lo, hi]: those with hi_k >= lo and lo_k <= hi
        first = bisect.bisect_left(self._hi, lo)
        last = bisect.bisect_right(self._lo, hi)
        overlap = sum(min(hi, self._hi[k]) - max(lo, self._lo[k]) for k in range(first, last))
        new = (hi - lo) - overlap
        if first < last:
            lo, hi = min(lo, self._lo[first]), max(hi, self._hi[last - 1])
        self._lo[first:last] = [lo]
        self._hi[first:last] = [hi]
        if len(self._lo) > self.keep:
            del self._lo[0], self._hi[0]
        self.covered += new
        return new


def union_length(spans: "list[tuple[float, float]]") -> float:
    """Total length of the union of ``spans`` (``(lo, hi)`` pairs, any order, overlapping or not)."""
    union = IntervalUnion(keep=max(1, len(spans)))
    for lo, hi in spans:
        union.add(lo, hi)
    return union.covered
