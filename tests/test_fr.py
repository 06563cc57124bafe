"""Fr vector kernels against Python integers (random values and edge cases)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from cuzk_mp.algebra import fr
from cuzk_mp.algebra.field import R_MOD

EDGES = [0, 1, 2, R_MOD - 1, R_MOD - 2, (1 << 254) % R_MOD, (1 << 64) - 1, 1 << 64, R_MOD >> 1]


@pytest.fixture
def values() -> tuple[list[int], list[int]]:
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    xs = EDGES + [rng.randrange(R_MOD) for _ in range(500)]
    ys = list(reversed(EDGES)) + [rng.randrange(R_MOD) for _ in range(500)]
    return xs, ys


def test_arithmetic_matches_python_ints(values: tuple[list[int], list[int]]) -> None:
    xs, ys = values
    a, b = fr.from_ints(xs), fr.from_ints(ys)
    assert fr.to_ints(fr.mul(a, b)) == [x * y % R_MOD for x, y in zip(xs, ys)]
    assert fr.to_ints(fr.add(a, b)) == [(x + y) % R_MOD for x, y in zip(xs, ys)]
    assert fr.to_ints(fr.sub(a, b)) == [(x - y) % R_MOD for x, y in zip(xs, ys)]
    c = fr.from_ints(list(reversed(xs)))
    assert fr.to_ints(fr.mul_sub(a, b, c)) == [(x * y - z) % R_MOD for x, y, z in zip(xs, ys, reversed(xs))]
    assert fr.to_ints(fr.scale(a, 12345)) == [x * 12345 % R_MOD for x in xs]


def test_montgomery_round_trip(values: tuple[list[int], list[int]]) -> None:
    xs, _ = values
    std = fr.from_ints(xs, mont=False)
    assert fr.to_ints(fr.to_mont(std)) == xs
    assert fr.to_ints(fr.from_mont(fr.to_mont(std)), mont=False) == xs


def test_batch_inverse_and_powers(values: tuple[list[int], list[int]]) -> None:
    xs = [x for x in values[0] if x] * 5  # several chunks
    assert fr.to_ints(fr.batch_inverse(fr.from_ints(xs))) == [pow(x, -1, R_MOD) for x in xs]
    with pytest.raises(ValueError):
        fr.batch_inverse(fr.from_ints([3, 0, 5]))
    assert fr.to_ints(fr.powers(7, 5000, start=3)) == [3 * pow(7, i, R_MOD) % R_MOD for i in range(5000)]


def test_noncanonical_detection() -> None:
    good = fr.from_ints([1, 2, R_MOD - 1], mont=False)
    assert fr.first_noncanonical(good) == -1
    bad = np.concatenate([good, fr.from_ints([0], mont=False)])
    bad[3] = np.array([R_MOD & (2**64 - 1), (R_MOD >> 64) & (2**64 - 1), (R_MOD >> 128) & (2**64 - 1), R_MOD >> 192], dtype=np.uint64)
    assert fr.first_noncanonical(bad) == 3


def test_csr_matvec_against_python() -> None:
    from cuzk_mp.algebra.sparse import from_coo

    rng = random.Random(7)
    n_rows, n_cols, nnz = 50, 40, 300
    rows = [rng.randrange(n_rows) for _ in range(nnz)]
    cols = [rng.randrange(n_cols) for _ in range(nnz)]
    vals = [rng.randrange(R_MOD) for _ in range(nnz)]
    w = [rng.randrange(R_MOD) for _ in range(n_cols)]
    m = from_coo(np.array(rows), np.array(cols), fr.from_ints(vals, mont=False), n_rows, n_cols).to_r2_form()
    got = fr.to_ints(m.matvec(fr.from_ints(w, mont=False)))
    want = [0] * n_rows
    for r, c, v in zip(rows, cols, vals):
        want[r] = (want[r] + v * w[c]) % R_MOD
    assert got == want
