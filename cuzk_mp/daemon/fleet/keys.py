"""Which proving key an idle box loads for the fleet's backlog, and which keys it evicts for it.

A pure decision, so that the daemon can call it with what it knows (its resident keys in LRU
order, their sizes, the key budget) and what the fleet reports (backlog per circuit from
:meth:`Fleet.queue_depths`, holders per circuit from :meth:`Fleet.boxes`), and tests can check it
without a database. The rules:

1. A box whose own resident circuits have a backlog claims those first: it loads nothing.
2. Candidates are circuits this box can prove, not resident here, with a backlog. A circuit no
   live box holds comes first (its jobs wait for nobody otherwise); then the largest backlog per
   holder. A circuit already held elsewhere is taken on only when its backlog is at least
   ``min_backlog_per_holder`` per holder, so boxes do not all pile onto one small backlog.
3. The key must fit the budget: least recently used keys that are not in use and have no
   backlog are evicted until it does. If it cannot fit that way, nothing is done.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cuzk_mp.daemon.fleet.models import BoxInfo, QueueDepth

DEFAULT_MIN_BACKLOG_PER_HOLDER = 2
# A key load slower than this reads its key file slower than any healthy disk or network mount does.
LOAD_MIN_BYTES_PER_S = 16 << 20
# The least time a load holds its key, in stall timeouts: a small key, or one made on first use (its
# file's size still 0), may still take a while.
LOAD_LIMIT_STALLS = 2


@dataclass(frozen=True)
class KeyView:
    """This box's keys: ``resident`` least recently used first; sizes in bytes."""

    resident: tuple[str, ...]
    busy: frozenset[str]
    provable: frozenset[str]
    key_bytes: Mapping[str, int]
    budget_bytes: int


@dataclass(frozen=True)
class KeyDecision:
    """Load ``load`` (None: nothing) after evicting ``evict`` in order; ``reason`` for the log."""

    load: str | None
    evict: tuple[str, ...]
    reason: str


def backlog_by_circuit(depths: Iterable[QueueDepth]) -> dict[str, int]:
    """Jobs waiting for a box, per circuit (queued plus those on stalled boxes)."""
    out: dict[str, int] = {}
    for d in depths:
        out[d.circuit_id] = out.get(d.circuit_id, 0) + d.backlog
    return out


def load_limit_s(key_bytes: int, stall_timeout_s: float) -> float:
    """For how long a box's load of a key of ``key_bytes`` counts as holding that key for the backlog
    (:func:`holders_by_circuit`), from the moment it began: the time its file takes to read at
    :data:`LOAD_MIN_BYTES_PER_S` (34 minutes for a 32 GiB key), and at least :data:`LOAD_LIMIT_STALLS`
    stall timeouts (a minute at the default 30 s).

    A load that hangs (a read on a hard mount whose server is gone) never ends, while its box goes on
    heartbeating: counted for as long as the box is up, it kept every other idle box from loading that
    key, and a backlog that only that key serves waited for ever. Past the limit another box may load
    the key too: a load that is merely slow costs one more load, never a wrong result, and the loading
    box logs an error when its own load outlasts it."""
    return max(LOAD_LIMIT_STALLS * stall_timeout_s, key_bytes / LOAD_MIN_BYTES_PER_S)


def holders_by_circuit(boxes: Iterable[BoxInfo], *, exclude: str = "") -> dict[str, int]:
    """How many live boxes (other than ``exclude``) that claim jobs hold each circuit's key resident or
    are loading it.

    A load takes minutes for a large key: counted only once resident, every other idle box took the
    same small backlog for one that no box holds and loaded the key too. A box that stopped
    heartbeating (killed mid-load) is not live, so what it was loading counts for nothing. A box that
    heartbeats but claims nothing (paused for its shared inputs folder, its engine degraded: no free
    slot and no job running) is no holder: counted, it kept every other box from loading the key of a
    small backlog (rule 2) that no box would ever run, for as long as it stayed up. A loading box
    decided to load while idle with a free slot, which its row may not show yet (a box that holds no
    key has its free slots written at its next heartbeat), so only its pause is asked. A load past its
    limit (:func:`load_limit_s`, :attr:`.models.BoxInfo.load_overdue`) holds nothing: it may hang."""
    out: dict[str, int] = {}
    for b in boxes:
        if b.state != "up" or b.box == exclude or b.paused is not None:
            continue
        claims = b.free_slots > 0 or b.running > 0
        for c in {*(b.resident if claims else ()), *(() if b.load_overdue else b.loading)}:
            out[c] = out.get(c, 0) + 1
    return out


def plan_key_load(view: KeyView, backlog: Mapping[str, int], holders: Mapping[str, int], *,
                  min_backlog_per_holder: int = DEFAULT_MIN_BACKLOG_PER_HOLDER) -> KeyDecision:
    """The key an idle box should load for the fleet's backlog (see the module docstring)."""
    own = [c for c in view.resident if backlog.get(c, 0) > 0]
    if own:
        return KeyDecision(None, (), f"resident circuit {own[0]} has a backlog; claim it first")
    candidates = [c for c in view.provable
                  if c not in view.resident and backlog.get(c, 0) > 0
                  and backlog[c] >= min_backlog_per_holder * holders.get(c, 0)]
    if not candidates:
        return KeyDecision(None, (), "no backlog that needs another box")
    candidates.sort(key=lambda c: (holders.get(c, 0) > 0, -backlog[c] / (holders.get(c, 0) + 1), c))
    for c in candidates:
        evict = _make_room(view, view.key_bytes.get(c, 0), backlog)
        if evict is not None:
            who = f"{holders.get(c, 0)} other boxes hold it" if holders.get(c, 0) else "no live box holds it"
            return KeyDecision(c, evict, f"{backlog[c]} jobs of {c} wait and {who}")
    return KeyDecision(None, (), "no candidate key fits the budget without evicting a key in use")


def _make_room(view: KeyView, need: int, backlog: Mapping[str, int]) -> tuple[str, ...] | None:
    """LRU keys to evict so that ``need`` more bytes fit; None if impossible."""
    if need > view.budget_bytes:
        return None
    used = sum(view.key_bytes.get(c, 0) for c in view.resident)
    evict: list[str] = []
    for c in view.resident:  # least recently used first
        if used + need <= view.budget_bytes:
            break
        if c in view.busy or backlog.get(c, 0) > 0:
            continue
        evict.append(c)
        used -= view.key_bytes.get(c, 0)
    return tuple(evict) if used + need <= view.budget_bytes else None
