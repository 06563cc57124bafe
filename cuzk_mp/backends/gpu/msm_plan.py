"""Scalar plans of an MSM: which scalars are 0, 1 or other, and the sorted digits MSMs share.

Why a module of its own: a plan is made once per partition while staging (:func:`classify`; it
waits for the device) and then serves every MSM over the same scalars: A, B1, B2 and C share the
witness, a packed section takes its support's subset, and :class:`SharedSorts` lets those MSMs
reuse one digit pass and sort. The backend makes plans; the MSM objects (:mod:`.msm`) consume them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import cupy
import numpy as np

from ...errors import InputError
from .knobs import MSM_PATH
from .modules import get_module
from .msm_geometry import window_count
from .msm_host import _copy_to_host_async, _pinned_like
from .msm_params import MsmParams

@dataclass
class ScalarPlan:
    """Which of m scalars are 0, 1 or other (device index lists, ascending).

    ``ones`` / ``other``: int64 device arrays of the rows equal to 1 / of the other
    non-zero rows; ``other`` None means every row is "other" (a dense plan, no
    index list). ``cuts`` maps an offset k to (ones, others) among rows < k, so
    :meth:`tail` needs no host sync for those offsets.
    """

    m: int
    n1: int
    n2: int
    ones: Any
    other: Any
    cuts: dict[int, tuple[int, int]] = field(default_factory=dict)
    sorts: SharedSorts | None = None  # the sorted digits, shared by the MSMs of these scalars
    # name -> the plan of the same scalars over the rows a support keeps (see classify)
    subsets: dict[str, ScalarPlan] = field(default_factory=dict)
    # the (m, 4) scalars this plan is over when they are a packed copy of the classified vector
    # (a support's rows, in order: what the MSMs of a packed section take), else None
    scalars: Any = None

    def tail(self, k: int) -> ScalarPlan:
        """The plan of ``scalars[k:]`` (index arithmetic enqueued on the current stream; a host
        sync only for an offset that is not in ``cuts``)."""
        if k == 0:
            return self
        if not 0 <= k <= self.m:
            raise InputError(f"scalar offset {k} outside 0 .. {self.m}")
        if self.other is None:  # dense: every row is "other", none is 1
            return dense_plan(self.m - k)
        if k not in self.cuts:
            self.cuts[k] = (_count_below(self.ones, k), _count_below(self.other, k))
        j1, j2 = self.cuts[k]
        shift = np.int64(k)
        ones = self.ones[j1:] - shift if self.n1 > j1 else None
        return ScalarPlan(self.m - k, self.n1 - j1, self.n2 - j2, ones, self.other[j2:] - shift)


@dataclass
class _SortEntry:
    """One shared window batch: its keys and their order, the stream and event that made them,
    and how many users are still to come."""

    keys: Any
    perm: Any
    stream: Any
    made: Any
    left: int


class SharedSorts:
    """The sorted digit keys of one plan's scalars, made once for the MSMs that share them.

    A partition's A, B1 and B2 MSMs take the same scalars (w) and, with one window size, the
    same sort keys (digits.cuh: a key holds the digit and the window, never the point), so the
    digit pass and the sort of each window batch run once and the other sections reuse them.
    An entry is keyed by the sort signature (:meth:`_Msm.sort_signature`), the window batch and
    the scalars; ``users`` says how many MSMs will ask for a signature: after that many an entry
    is dropped, so its memory goes back to the pool as soon as the last one is enqueued. A user
    on another stream than the one that made the entry waits for it on the device (an event),
    and the maker's stream waits for that user's accumulation before the entry can be freed,
    since CuPy's pool reuses freed memory in the order of the stream that allocated it.
    """

    def __init__(self, users: dict[tuple[int, int, int], int]) -> None:
        self.users = users  # sort signature (_Msm.sort_signature) -> MSMs that will ask for it
        self._entries: dict[tuple[int, ...], _SortEntry] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_msms(cls, msms: list[Any], n2: int) -> SharedSorts:
        """The sharing of the MSMs ``msms`` over the same n2 tail scalars: users per signature,
        counting only passes that sort all their windows in one batch (an entry then holds what
        one MSM held anyway; a batched pass would keep every batch's keys alive at once: shared in
        two batches at 2^27 PoRep-like, the H200's device stage stayed at 2.25 s a partition while
        its peak device memory rose from 113 to 120 GiB)."""
        users: dict[tuple[int, int, int], int] = {}
        if n2 <= 0:  # every scalar 0 or 1 (a boolean witness): no pass sorts anything
            return cls(users)
        for m in msms:
            sig = m.sort_signature(n2)
            if sig[1] >= window_count(sig[0]):
                users[sig] = users.get(sig, 0) + 1
        return cls(users)

    def take(self, key: tuple[int, ...]) -> tuple[Any, Any] | None:
        """(keys, perm) of an entry made before, with this stream ordered after its making; None
        when there is none (the caller makes it and :meth:`put` s it)."""
        with self._lock:
            e = self._entries.get(key)
        if e is None:
            return None
        s = cupy.cuda.get_current_stream()
        if s.ptr != e.stream.ptr:
            s.wait_event(e.made)
        return e.keys, e.perm

    def put(self, key: tuple[int, ...], keys: Any, perm: Any) -> None:
        """Keep a freshly made (keys, perm) for the other users (nothing kept with one user)."""
        users = self.users.get(key[:3], 1)
        if users < 2:
            return
        s = cupy.cuda.get_current_stream()
        ev = cupy.cuda.Event(disable_timing=True)
        ev.record(s)
        with self._lock:
            self._entries[key] = _SortEntry(keys, perm, s, ev, users)

    def done(self, key: tuple[int, ...]) -> None:
        """One user's accumulation is enqueued: order the maker's stream after it (another
        stream's user), and drop the entry after its last user."""
        with self._lock:
            e = self._entries.get(key)
            if e is None:
                return
            s = cupy.cuda.get_current_stream()
            if s.ptr != e.stream.ptr:
                ev = cupy.cuda.Event(disable_timing=True)
                ev.record(s)
                e.stream.wait_event(ev)
            e.left -= 1
            if e.left <= 0:
                del self._entries[key]


def _count_below(idx: Any, k: int) -> int:
    return 0 if idx is None or int(idx.shape[0]) == 0 else int(cupy.searchsorted(idx, k))


def dense_plan(m: int) -> ScalarPlan:
    """Every scalar "other", in order (the H values: no 0/1 split, no index list)."""
    return ScalarPlan(m, 0, m, None, None)


NON_CANONICAL = "MSM scalars: a row has bit 255 set (expected canonical standard-form Fr elements)"


def _classify_rows(scalars: Any, nthreads: int) -> tuple[Any, Any]:
    """``msm_classify`` on the current stream: (per-row class 0 / 1 / 2 as uint8, a uint32[1] flag
    set when some row has bit 255 set), both on the device, nothing waited for."""
    m = int(scalars.shape[0])
    kernel = get_module(MSM_PATH, MsmParams().defines(False)).get_function("msm_classify")
    cls = cupy.empty(m, dtype=np.uint8)
    flag = cupy.zeros(1, dtype=np.uint32)
    if m:
        kernel((-(-m // nthreads),), (nthreads,), (scalars, cls, flag, np.uint64(m)))
    return cls, flag


def check_canonical(scalars: Any, stream: Any, nthreads: int = 128) -> np.ndarray:
    """Enqueue on ``stream`` the check :func:`classify` makes (no scalar has bit 255 set) without
    waiting: returns a pinned uint32[1] that holds nonzero once the stream reaches this point if
    some scalar fails (read it after a later event of that stream; :data:`NON_CANONICAL` says why)."""
    _, flag = _classify_rows(scalars, nthreads)
    host = _pinned_like(np.zeros(1, dtype=np.uint32))
    _copy_to_host_async(flag, host, stream)
    return host


def support_rows(d_points: Any) -> Any:
    """The ascending int32 device list of the rows of ``(n, words)`` points that are not the point
    at infinity (the zkey's all-zero rows). Why: a proving key's B points are infinity for every
    wire that no constraint's B side uses (55 % of the PoRep-like circuit's wires; Filecoin's
    circuit has 1.0 B entries a row), and an MSM entry whose point is infinity costs its lane as
    much as any other (the warp runs its neighbours' additions) and its point the memory of any
    other, so such a section keeps only these rows' points and its MSMs take only these rows'
    scalars (bellperson's density split)."""
    return cupy.flatnonzero(d_points.any(axis=1)).astype(np.int32)


def classify(scalars: Any, nthreads: int = 128, cuts: tuple[int, ...] = (),
             supports: dict[str, Any] | None = None) -> ScalarPlan:
    """The 0/1/other plan of ``(m, 4)`` device scalars on the current stream (waits for it:
    the index lists' lengths and the counts come back to the host).

    Raises InputError when a scalar has bit 255 set (not a canonical Fr element).
    ``cuts``: offsets whose :meth:`ScalarPlan.tail` is precomputed in the same sync.
    ``supports``: name -> ascending device row list (:func:`support_rows`, rows < m); the plan's
    ``subsets[name]`` is then the plan of those rows' scalars, packed: its ``scalars`` are
    ``scalars[rows]`` and its index lists count in that packed order.
    """
    m = int(scalars.shape[0])
    cls, flag = _classify_rows(scalars, nthreads)
    ones = cupy.flatnonzero(cls == 1)
    other = cupy.flatnonzero(cls == 2)
    ks = [k for k in cuts if 0 < k <= m]
    head = [cupy.count_nonzero(cls[:k] == v) for k in ks for v in (1, 2)]
    vals = [int(v) for v in cupy.asnumpy(cupy.stack([flag[0].astype(np.int64)] + head))] if head else \
        [int(cupy.asnumpy(flag)[0])]
    if vals[0]:
        raise InputError(NON_CANONICAL)
    subsets: dict[str, ScalarPlan] = {}
    for name, rows in (supports or {}).items():
        k = int(rows.shape[0])
        if k > m:
            raise InputError(f"support {name!r} keeps {k} rows of {m} scalars")
        kept = cls[rows]  # the classes in packed order
        ones_s, other_s = cupy.flatnonzero(kept == 1), cupy.flatnonzero(kept == 2)
        subsets[name] = ScalarPlan(k, int(ones_s.shape[0]), int(other_s.shape[0]), ones_s, other_s,
                                   scalars=scalars[rows])
        del kept
    plan = ScalarPlan(m, int(ones.shape[0]), int(other.shape[0]), ones, other, subsets=subsets)
    plan.cuts = {k: (vals[1 + 2 * i], vals[2 + 2 * i]) for i, k in enumerate(ks)}
    return plan
