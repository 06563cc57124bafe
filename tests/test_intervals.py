"""The union of busy spans: overlaps counted once, any order, a bounded memory."""

import random

import pytest

from cuzk_mp.intervals import IntervalUnion, union_length


def _brute(spans: list[tuple[float, float]]) -> float:
    """Length of the union on an integer grid (spans have integer ends)."""
    cells = set()
    for lo, hi in spans:
        cells.update(range(int(lo), int(hi)))
    return float(len(cells))


def test_overlapping_spans_count_once() -> None:
    u = IntervalUnion()
    assert u.add(0, 10) == 10
    assert u.add(5, 15) == 5  # the second partition's first kernels beside the first's last
    assert u.add(2, 8) == 0  # inside what is covered
    assert u.add(15, 20) == 5  # touching: no overlap, merged
    assert u.add(30, 31) == 1
    assert u.add(-5, 40) == 45 - 21
    assert u.covered == 45
    assert u.add(3, 3) == 0 and u.add(7, 1) == 0  # empty or reversed spans add nothing


def test_random_spans_match_a_brute_force_union() -> None:
    rng = random.Random(11)
    for _ in range(200):
        spans = [(lo, lo + rng.randrange(0, 30)) for lo in (rng.randrange(0, 200) for _ in range(rng.randrange(1, 25)))]
        u = IntervalUnion()
        added = [u.add(lo, hi) for lo, hi in spans]
        assert u.covered == pytest.approx(_brute(spans))
        assert sum(added) == pytest.approx(u.covered)
        assert union_length(spans) == pytest.approx(_brute(spans))
        assert union_length(list(reversed(spans))) == pytest.approx(_brute(spans))


def test_a_busy_fraction_of_overlapping_partitions_stays_at_most_one() -> None:
    """Two partitions in flight: each spans 1.1 periods, so their sum is 110 % of the wall."""
    u = IntervalUnion(keep=4)
    for k in range(1000):
        u.add(k * 1.0, k * 1.0 + 1.1)
    assert u.covered == pytest.approx(1000.1)
    assert len(u._lo) <= 4


def test_keep_must_be_positive() -> None:
    with pytest.raises(ValueError, match="keep"):
        IntervalUnion(keep=0)
