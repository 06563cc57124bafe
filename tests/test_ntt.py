"""CPU NTT: round trips and the odd-coset H step against naive polynomial evaluation."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cuzk_mp.algebra import fr, ntt
from cuzk_mp.algebra.field import R_MOD, coset_shift, fr_root_of_unity

field_elems = st.integers(min_value=0, max_value=R_MOD - 1)


def _vectors(max_log: int = 6) -> st.SearchStrategy[list[int]]:
    return st.integers(min_value=0, max_value=max_log).flatmap(
        lambda k: st.lists(field_elems, min_size=1 << k, max_size=1 << k))


def _eval(coefs: list[int], x: int) -> int:
    acc = 0
    for c in reversed(coefs):
        acc = (acc * x + c) % R_MOD
    return acc


@settings(max_examples=40, deadline=None)
@given(_vectors())
def test_ntt_is_evaluation_at_roots(xs: list[int]) -> None:
    n = len(xs)
    w = fr_root_of_unity(n.bit_length() - 1)
    assert fr.to_ints(ntt.ntt(fr.from_ints(xs))) == [_eval(xs, pow(w, k, R_MOD)) for k in range(n)]


@settings(max_examples=40, deadline=None)
@given(_vectors(9))
def test_round_trip(xs: list[int]) -> None:
    a = fr.from_ints(xs)
    assert fr.to_ints(ntt.intt(ntt.ntt(a))) == xs
    assert fr.to_ints(ntt.ntt(ntt.intt(a))) == xs


@settings(max_examples=25, deadline=None)
@given(_vectors(5), st.randoms(use_true_random=False))
def test_coset_h_matches_naive(xs: list[int], rnd) -> None:  # type: ignore[no-untyped-def]
    n = len(xs)
    k = n.bit_length() - 1
    ys = [rnd.randrange(R_MOD) for _ in range(n)]
    zs = [rnd.randrange(R_MOD) for _ in range(n)]  # an arbitrary c: the identity holds for any c
    ca, cb, cc = (fr.to_ints(ntt.intt(fr.from_ints(v))) for v in (xs, ys, zs))
    w, g = fr_root_of_unity(k), coset_shift(k)
    pts = [g * pow(w, j, R_MOD) % R_MOD for j in range(n)]
    want = [(_eval(ca, x) * _eval(cb, x) - _eval(cc, x)) % R_MOD for x in pts]
    got = fr.to_ints(ntt.coset_h(fr.from_ints(xs), fr.from_ints(ys), fr.from_ints(zs)), mont=False)
    assert got == want


def test_coset_is_the_odd_points_of_the_double_domain() -> None:
    for k in (1, 5, 20, 31):
        w2 = fr_root_of_unity(k + 1)
        assert coset_shift(k) == w2
        assert pow(w2, 2, R_MOD) == fr_root_of_unity(k)
    assert coset_shift(32) == 25
