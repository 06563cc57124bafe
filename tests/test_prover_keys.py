"""A prover's resident keys (KeyCache): the budget evicts older unused keys, never the one a partition
is about to use, and a key whose circuit's files changed is closed once its last user lets it go.

The backend and the key files are doubles: what is tested is the cache's bookkeeping (which keys are
open, what the engine is told), not a key's upload.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from cuzk_mp.pipeline import messages as msg
from cuzk_mp.pipeline import key_cache


class _Ctx:
    log = logging.getLogger("test-keys")

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send(self, m: Any) -> None:
        self.sent.append(m)


class _Handle:
    def __init__(self, name: str, nbytes: int, closed: list[str]) -> None:
        self.name, self.nbytes, self.closed_list = name, nbytes, closed

    def close(self) -> None:
        self.closed_list.append(self.name)


class _Backend:
    name = "gpu"

    def __init__(self) -> None:
        self.closed: list[str] = []

    def load_key(self, zkey: Any, **kwargs: Any) -> _Handle:
        return _Handle(zkey.name, zkey.nbytes, self.closed)

    def stats(self) -> dict[str, float]:
        return {}


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch) -> key_cache.KeyCache:
    """A cache of budget 10 whose "key files" are named NAME:BYTES."""
    import cuzk_mp.formats.zkey as zkey_mod

    def read_zkey(path: str, **kwargs: Any) -> SimpleNamespace:
        name, size = str(path).split(":")
        return SimpleNamespace(name=str(path), nbytes=int(size), domain_size=1 << 10, n_vars=1 << 10,
                               close=lambda: None)

    monkeypatch.setattr(zkey_mod, "read_zkey", read_zkey)
    monkeypatch.setattr(key_cache, "drop_coefficient_pages", lambda zkey: 0)
    return key_cache.KeyCache(_Ctx(), _Backend(), budget=10)  # type: ignore[arg-type]


def _states(cache: key_cache.KeyCache) -> list[tuple[str, str | None]]:
    return [(m.circuit_id, m.tier) for m in cache.ctx.sent if isinstance(m, msg.KeyState)]


def test_a_key_loaded_beyond_the_budget_is_not_evicted_before_its_partition_uses_it(
        cache: key_cache.KeyCache) -> None:
    a = cache.acquire(msg.CircuitRef("A", "a:6"))
    b = cache.acquire(msg.CircuitRef("B", "b:5"))  # 11 > 10 with A in use: B stays until released
    assert b.users == 1 and list(cache.keys) == ["A", "B"] and cache.backend.closed == []
    cache.release(b)  # over the budget, B unused now: it goes, A (in use) stays
    assert list(cache.keys) == ["A"] and cache.backend.closed == ["b:5"]
    cache.release(a)
    c = cache.acquire(msg.CircuitRef("C", "c:12"))  # alone above the budget: still used, then dropped
    assert c.users == 1 and list(cache.keys) == ["C"] and cache.backend.closed == ["b:5", "a:6"]
    cache.release(c)
    assert not cache.keys and cache.backend.closed == ["b:5", "a:6", "c:12"]
    assert _states(cache) == [("A", "device"), ("B", "device"), ("B", None), ("C", "device"), ("A", None),
                              ("C", None)]


def test_a_key_whose_files_changed_is_closed_when_its_last_user_lets_it_go(cache: key_cache.KeyCache) -> None:
    old = cache.acquire(msg.CircuitRef("A", "a1:3"))
    new = cache.acquire(msg.CircuitRef("A", "a2:4"))  # re-registered with other files while a partition runs
    assert new is not old and cache.keys["A"] is new and cache.backend.closed == []  # the old one still in use
    cache.release(old)
    assert cache.backend.closed == ["a1:3"] and cache.keys["A"] is new
    assert _states(cache) == [("A", "device"), ("A", "device")]  # the circuit keeps a key: no "None" in between
    cache.release(new)
    unused = cache.acquire(msg.CircuitRef("A", "a3:2"))  # the previous one unused: closed at once
    assert cache.backend.closed == ["a1:3", "a2:4"] and unused.users == 1
