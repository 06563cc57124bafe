"""Fq vector kernels against Python-int arithmetic mod q."""

from __future__ import annotations

import random

import numpy as np
import pytest

from cuzk_mp.algebra import fq
from cuzk_mp.algebra.field import FQ, Q_MOD

SEED = 20261130


def _values(n: int, seed: int = SEED) -> list[int]:
    """Edge values (0, 1, 2, q-1, q-2, R mod q, 2^383 mod q, (q-1)/2) then random ones."""
    rng = random.Random(seed)
    print(f"seed={seed}")
    edge = [0, 1, 2, Q_MOD - 1, Q_MOD - 2, FQ.r_mod, (1 << 383) % Q_MOD, Q_MOD >> 1]
    return edge + [rng.randrange(Q_MOD) for _ in range(n - len(edge))]


@pytest.fixture(scope="module")
def xy() -> tuple[list[int], list[int]]:
    xs = _values(300)
    ys = list(reversed(_values(300, SEED + 1)))
    return xs, ys


def test_roundtrip_ints(xy: tuple[list[int], list[int]]) -> None:
    xs, _ = xy
    assert fq.to_ints(fq.from_ints(xs)) == xs
    assert fq.to_ints(fq.from_ints(xs, mont=False), mont=False) == xs
    assert fq.to_ints(fq.from_ints(xs, mont=False), mont=True) == [x * pow(FQ.r, -1, Q_MOD) % Q_MOD for x in xs]


def test_mont_conversions(xy: tuple[list[int], list[int]]) -> None:
    xs, _ = xy
    std = fq.from_ints(xs, mont=False)
    m = fq.to_mont(std)
    assert fq.to_ints(m, mont=False) == [x * FQ.r % Q_MOD for x in xs]
    assert np.array_equal(fq.from_mont(m), std)


@pytest.mark.parametrize(
    "name, op",
    [("mul", lambda x, y: x * y), ("add", lambda x, y: x + y), ("sub", lambda x, y: x - y)],
)
def test_binary_ops(xy: tuple[list[int], list[int]], name: str, op) -> None:  # type: ignore[no-untyped-def]
    xs, ys = xy
    got = fq.to_ints(getattr(fq, name)(fq.from_ints(xs), fq.from_ints(ys)))
    assert got == [op(x, y) % Q_MOD for x, y in zip(xs, ys)]


def test_outputs_canonical(xy: tuple[list[int], list[int]]) -> None:
    xs, ys = xy
    for name in ("mul", "add", "sub"):
        assert fq.first_noncanonical(getattr(fq, name)(fq.from_ints(xs), fq.from_ints(ys))) == -1


def test_scale_and_const(xy: tuple[list[int], list[int]]) -> None:
    xs, _ = xy
    c = Q_MOD - 12345
    assert fq.to_ints(fq.scale(fq.from_ints(xs), c)) == [x * c % Q_MOD for x in xs]
    assert fq.to_ints(fq.const(7).reshape(1, 6)) == [7]


def test_inverse(xy: tuple[list[int], list[int]]) -> None:
    xs, _ = xy
    got = fq.to_ints(fq.inv(fq.from_ints(xs)))
    assert got == [pow(x, -1, Q_MOD) if x else 0 for x in xs]


def test_first_noncanonical() -> None:
    a = fq.from_ints([1, 2, 3], mont=False)
    assert fq.first_noncanonical(a) == -1
    a[1] = fq.from_ints([0], mont=False)[0]
    a[1] += np.array([int(v) for v in FQ.limbs], dtype=np.uint64)
    assert fq.first_noncanonical(a) == 1


def test_rejects_wrong_shape() -> None:
    with pytest.raises(ValueError, match=r"\(n, 6\)"):
        fq.mul(np.zeros((3, 4), dtype=np.uint64), np.zeros((3, 4), dtype=np.uint64))
