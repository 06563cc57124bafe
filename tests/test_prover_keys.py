"""A prover's resident keys (KeyCache): the budget evicts older unused keys, never the one a partition
is about to use, a key whose circuit's files changed is closed once its last user lets it go, and
neither a key's load nor its close holds up the other circuits' acquires and releases.

The backend and the key files are doubles: what is tested is the cache's bookkeeping (which keys are
open, what the engine is told), not a key's upload. A test holds a load or a close at a gate to
see what the other threads can do meanwhile; every wait has a limit, so a cache that blocks fails
the test instead of hanging it. Seeded random runs (threads acquiring, releasing, preloading and
evicting a few circuits while loads and closes sleep or fail) check what no interleaving may break:
users counted right, each key closed once and never in use, "gone" and "loaded" in order, the last
word on each circuit the key resident.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cuzk_mp.errors import InputError
from cuzk_mp.pipeline import messages as msg
from cuzk_mp.pipeline import key_cache
from cuzk_mp.pipeline.circuits import CircuitTable

PROMPT_S = 1.0  # what "at once" allows a call that must not wait for another key's load or close
WAIT_S = 10.0  # the longest a test waits for anything else


class _Ctx:
    log = logging.getLogger("test-keys")

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send(self, m: Any) -> None:
        self.sent.append(m)


class _Gate:
    """Holds a fake load or close until the test opens it."""

    def __init__(self) -> None:
        self.entered, self.opened = threading.Event(), threading.Event()

    def pass_(self) -> None:
        self.entered.set()
        assert self.opened.wait(WAIT_S), "gate never opened"

    def reached(self) -> None:
        assert self.entered.wait(WAIT_S), "gate never reached"


class _Handle:
    def __init__(self, name: str, nbytes: int, backend: _Backend) -> None:
        self.name, self.nbytes, self.backend = name, nbytes, backend

    def close(self) -> None:
        if (gate := self.backend.close_gates.get(self.name)) is not None:
            gate.pass_()
        self.backend.closed.append(self.name)
        if self.name in self.backend.fail_close:
            raise RuntimeError(f"{self.name}: the device failed to free it")


class _Backend:
    name = "gpu"

    def __init__(self) -> None:
        self.closed: list[str] = []
        self.loads: list[str] = []
        self.load_gates: dict[str, _Gate] = {}  # key file -> the gate its load waits at
        self.close_gates: dict[str, _Gate] = {}
        self.fail_once: set[str] = set()  # key files whose next load fails
        self.fail_close: set[str] = set()  # key files whose close raises (once it is done: it counts as closed)

    def load_key(self, zkey: Any, **kwargs: Any) -> _Handle:
        self.loads.append(zkey.name)
        if (gate := self.load_gates.get(zkey.name)) is not None:
            gate.pass_()
        if zkey.name in self.fail_once:
            self.fail_once.discard(zkey.name)
            raise InputError(f"{zkey.name}: not a zkey")
        return _Handle(zkey.name, zkey.nbytes, self)

    def stats(self) -> dict[str, float]:
        return {}

    def open_gates(self) -> None:
        for gate in [*self.load_gates.values(), *self.close_gates.values()]:
            gate.opened.set()


@pytest.fixture
def key_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """ "Key files" named NAME:BYTES: read_zkey gives a stand-in of that name and size."""
    import cuzk_mp.formats.zkey as zkey_mod

    def read_zkey(path: str, **kwargs: Any) -> SimpleNamespace:
        name, size = str(path).split(":")
        return SimpleNamespace(name=str(path), nbytes=int(size), domain_size=1 << 10, n_vars=1 << 10,
                               close=lambda: None)

    monkeypatch.setattr(zkey_mod, "read_zkey", read_zkey)
    monkeypatch.setattr(key_cache, "drop_coefficient_pages", lambda zkey: 0)


@pytest.fixture
def cache(key_files: None, request: pytest.FixtureRequest) -> key_cache.KeyCache:
    """A cache of budget 10 over the stand-in key files."""
    backend = _Backend()
    request.addfinalizer(backend.open_gates)  # a failed test leaves no thread at a gate
    return key_cache.KeyCache(_Ctx(), backend, budget=10)  # type: ignore[arg-type]


class _Call(threading.Thread):
    """``fn()`` in a thread of its own: the other threads of a prover process, here."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.fn, self.result, self.error = fn, None, None
        self.start()

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as exc:  # noqa: BLE001 - raised again by outcome()
            self.error = exc

    def outcome(self, timeout: float = WAIT_S) -> Any:
        self.join(timeout)
        assert not self.is_alive(), f"still waiting after {timeout} s"
        if self.error is not None:
            raise self.error
        return self.result


def _prompt(fn: Callable[[], Any]) -> Any:
    """``fn()``, which must return within PROMPT_S whatever the other threads hold."""
    return _Call(fn).outcome(PROMPT_S)


def _until(cond: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < deadline, "condition never met"
        time.sleep(0.005)


def _waiters(cache: key_cache.KeyCache, circuit_id: str) -> int:
    pending = cache.loading.get(circuit_id)
    return 0 if pending is None else pending.waiters


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


def test_a_resident_key_is_acquired_and_released_while_another_circuits_key_loads(
        cache: key_cache.KeyCache) -> None:
    a = cache.acquire(msg.CircuitRef("A", "a:3"))
    gate = cache.backend.load_gates["b:4"] = _Gate()
    loading = _Call(lambda: cache.acquire(msg.CircuitRef("B", "b:4")))
    gate.reached()  # B's key is uploading
    _prompt(lambda: cache.release(a))  # A's finished proof is answered meanwhile
    again = _prompt(lambda: cache.acquire(msg.CircuitRef("A", "a:3")))  # and A's next partition staged
    assert again is a and a.users == 1
    _prompt(lambda: cache.release(again))
    _prompt(lambda: cache.preload(msg.CircuitRef("A", "a:3")))
    gate.opened.set()
    b = loading.outcome()
    assert b.users == 1 and list(cache.keys) == ["A", "B"] and cache.backend.loads == ["a:3", "b:4"]


def test_a_keys_close_holds_up_no_other_keys_acquire_or_release(cache: key_cache.KeyCache) -> None:
    for ref in (msg.CircuitRef("A", "a:3"), msg.CircuitRef("B", "b:4")):
        cache.release(cache.acquire(ref))
    gate = cache.backend.close_gates["a:3"] = _Gate()
    closing = _Call(lambda: cache.evict("A"))
    gate.reached()  # A's close is synchronizing the device
    b = _prompt(lambda: cache.acquire(msg.CircuitRef("B", "b:4")))
    _prompt(lambda: cache.release(b))
    assert list(cache.keys) == ["B"] and cache.backend.closed == []
    gate.opened.set()
    closing.outcome()
    assert cache.backend.closed == ["a:3"] and _states(cache)[-1] == ("A", None)


def test_acquires_of_a_key_being_loaded_share_its_one_load(cache: key_cache.KeyCache) -> None:
    a = cache.acquire(msg.CircuitRef("A", "a:3"))
    gate = cache.backend.load_gates["x:4"] = _Gate()
    first = _Call(lambda: cache.acquire(msg.CircuitRef("X", "x:4")))
    gate.reached()
    second = _Call(lambda: cache.acquire(msg.CircuitRef("X", "x:4")))
    _prompt(lambda: cache.release(a))
    _until(lambda: _waiters(cache, "X") == 2)  # the second waits for the first's load
    gate.opened.set()
    x1, x2 = first.outcome(), second.outcome()
    assert x1 is x2 and x1.users == 2 and cache.keys["X"] is x1 and not cache.loading
    assert cache.backend.loads == ["a:3", "x:4"] and _states(cache) == [("A", "device"), ("X", "device")]


def test_a_failed_load_fails_its_waiting_acquires_and_the_next_acquire_loads_again(
        cache: key_cache.KeyCache) -> None:
    a = cache.acquire(msg.CircuitRef("A", "a:3"))
    cache.backend.fail_once.add("x:4")
    gate = cache.backend.load_gates["x:4"] = _Gate()
    first = _Call(lambda: cache.acquire(msg.CircuitRef("X", "x:4")))
    gate.reached()
    second = _Call(lambda: cache.acquire(msg.CircuitRef("X", "x:4")))
    _prompt(lambda: cache.release(a))
    _until(lambda: _waiters(cache, "X") == 2)
    gate.opened.set()
    for call in (first, second):
        with pytest.raises(InputError, match="not a zkey"):
            call.outcome()
    assert not cache.loading and list(cache.keys) == ["A"] and not cache.evicting
    x = cache.acquire(msg.CircuitRef("X", "x:4"))  # the file fixed: loaded this time
    assert x.users == 1 and cache.keys["X"] is x and cache.backend.loads == ["a:3", "x:4", "x:4"]
    assert _states(cache) == [("A", "device"), ("X", "device")]


def test_a_key_evicted_while_it_loads_goes_once_its_waiting_acquire_releases_it(
        cache: key_cache.KeyCache) -> None:
    gate = cache.backend.load_gates["x:4"] = _Gate()
    loading = _Call(lambda: cache.acquire(msg.CircuitRef("X", "x:4")))
    gate.reached()
    _prompt(lambda: cache.evict("X"))
    gate.opened.set()
    x = loading.outcome()
    assert x.users == 1 and cache.keys["X"] is x and cache.backend.closed == []  # its partition uses it
    cache.release(x)
    assert not cache.keys and cache.backend.closed == ["x:4"]
    assert _states(cache) == [("X", "device"), ("X", None)]


def test_a_key_loaded_again_while_its_evicted_copy_closes_is_announced_after_the_close(
        cache: key_cache.KeyCache) -> None:
    a = cache.acquire(msg.CircuitRef("A", "a:3"))
    cache.release(cache.acquire(msg.CircuitRef("X", "x:4")))
    gate = cache.backend.close_gates["x:4"] = _Gate()
    closing = _Call(lambda: cache.evict("X"))
    gate.reached()
    reload = _Call(lambda: cache.acquire(msg.CircuitRef("X", "x:4")))
    _prompt(lambda: cache.release(a))
    _until(lambda: _waiters(cache, "X") == 1)
    time.sleep(0.1)
    assert cache.backend.loads == ["a:3", "x:4"]  # the load waits for the close (its memory, its "gone")
    gate.opened.set()
    closing.outcome()
    x = reload.outcome()
    assert x.users == 1 and cache.backend.closed == ["x:4"] and cache.backend.loads == ["a:3", "x:4", "x:4"]
    assert _states(cache) == [("A", "device"), ("X", "device"), ("X", None), ("X", "device")]


def test_an_acquire_of_other_files_waits_for_the_load_then_replaces_its_key(cache: key_cache.KeyCache) -> None:
    gate = cache.backend.load_gates["x1:3"] = _Gate()
    first = _Call(lambda: cache.acquire(msg.CircuitRef("X", "x1:3")))
    gate.reached()
    second = _Call(lambda: cache.acquire(msg.CircuitRef("X", "x2:4")))  # re-registered meanwhile
    gate.opened.set()
    old, new = first.outcome(), second.outcome()
    assert old.users == 1 and new.users == 1 and cache.keys["X"] is new and cache.backend.closed == []
    cache.release(old)
    assert cache.backend.closed == ["x1:3"] and _states(cache) == [("X", "device"), ("X", "device")]


def test_a_replaced_key_whose_successor_failed_to_load_is_announced_gone(cache: key_cache.KeyCache) -> None:
    """The circuit's files change while its key is in use and the new files fail to load: when the
    old key's last user lets it go, the engine hears that the circuit has no key here."""
    old = cache.acquire(msg.CircuitRef("X", "x1:3"))
    cache.backend.fail_once.add("x2:4")
    with pytest.raises(InputError):
        cache.acquire(msg.CircuitRef("X", "x2:4"))
    cache.release(old)
    assert cache.backend.closed == ["x1:3"] and not cache.keys
    assert _states(cache) == [("X", "device"), ("X", None)]


def test_a_replaced_key_let_go_while_its_successor_loads_is_announced_gone_if_that_load_fails(
        cache: key_cache.KeyCache) -> None:
    """As above, but the old key's last user lets it go while the new files still load: the load's
    failure is when the engine learns that the circuit has no key here."""
    old = cache.acquire(msg.CircuitRef("X", "x1:3"))
    cache.backend.fail_once.add("x2:4")
    gate = cache.backend.load_gates["x2:4"] = _Gate()
    loading = _Call(lambda: cache.acquire(msg.CircuitRef("X", "x2:4")))
    gate.reached()
    _prompt(lambda: cache.release(old))  # closed, and nothing said: the new key's load would say it
    assert cache.backend.closed == ["x1:3"] and _states(cache) == [("X", "device")]
    gate.opened.set()
    with pytest.raises(InputError):
        loading.outcome()
    assert not cache.keys and not cache.loading and _states(cache) == [("X", "device"), ("X", None)]


def test_a_replaced_key_in_use_when_its_successors_load_fails_is_announced_gone_when_let_go(
        cache: key_cache.KeyCache) -> None:
    """Replaced twice, by files that fail to load: the engine hears "gone" once, when the last of the
    circuit's replaced keys still in use is let go."""
    first = cache.acquire(msg.CircuitRef("X", "x1:3"))
    second = cache.acquire(msg.CircuitRef("X", "x2:2"))
    cache.backend.fail_once.add("x3:4")
    with pytest.raises(InputError):
        cache.acquire(msg.CircuitRef("X", "x3:4"))
    cache.release(first)
    assert _states(cache) == [("X", "device"), ("X", "device")]  # the second key still works for its user
    cache.release(second)
    assert not cache.keys and cache.backend.closed == ["x1:3", "x2:2"]
    assert _states(cache) == [("X", "device"), ("X", "device"), ("X", None)]


def test_a_failed_close_of_a_replaced_key_fails_that_acquire_and_the_next_one_loads(
        cache: key_cache.KeyCache) -> None:
    cache.release(cache.acquire(msg.CircuitRef("A", "a1:3")))
    cache.backend.fail_close.add("a1:3")
    with pytest.raises(RuntimeError, match="failed to free"):
        cache.acquire(msg.CircuitRef("A", "a2:4"))  # the old key's close, before the new one loads, fails
    a2 = _prompt(lambda: cache.acquire(msg.CircuitRef("A", "a2:4")))  # not left waiting for that load
    assert a2.users == 1 and cache.keys["A"] is a2 and cache.backend.loads == ["a1:3", "a2:4"]
    assert not cache.loading and cache.closing == 0


def test_a_failed_close_the_budget_decided_after_a_load_gives_that_acquires_use_back(
        cache: key_cache.KeyCache) -> None:
    cache.release(cache.acquire(msg.CircuitRef("A", "a:6")))
    cache.backend.fail_close.add("a:6")
    with pytest.raises(RuntimeError, match="failed to free"):
        cache.acquire(msg.CircuitRef("B", "b:5"))  # 11 > 10: A goes once B is in, and its close fails
    assert list(cache.keys) == ["B"] and cache.keys["B"].users == 0  # B is resident, used by nobody
    cache.evict("B")
    assert not cache.keys and cache.backend.closed == ["a:6", "b:5"]


def test_a_key_whose_close_fails_is_gone_for_the_engine_too(cache: key_cache.KeyCache) -> None:
    cache.release(cache.acquire(msg.CircuitRef("A", "a:3")))
    cache.backend.fail_close.add("a:3")
    with pytest.raises(RuntimeError, match="failed to free"):
        cache.evict("A")
    assert not cache.keys and _states(cache) == [("A", "device"), ("A", None)]
    a = cache.acquire(msg.CircuitRef("A", "a:3"))  # loaded again
    assert a.users == 1 and _states(cache) == [("A", "device"), ("A", None), ("A", "device")]


@pytest.mark.parametrize("resident, preloaded, replacing", [("x1:3", "x1:3", "x2:4"), ("x1:3", "x2:4", "x1:3")])
def test_a_preload_reports_no_key_that_was_replaced_before_its_report(
        cache: key_cache.KeyCache, resident: str, preloaded: str, replacing: str) -> None:
    """A preload answers with a KeyState once its acquire has returned. Another thread's acquire of the
    circuit's other files (re-registered, to newer files or back to older ones) may replace the key
    right then: it loads and reports its own key, and what the engine was told last must still
    describe the key resident here, not the one the preload acquired. The preload finds its key
    resident (first case) or loads it itself (second case)."""
    cache.release(cache.acquire(msg.CircuitRef("X", resident)))
    acquire = cache.acquire

    def replaced_once_acquired(ref: msg.CircuitRef) -> key_cache.ResidentKey:
        key = acquire(ref)
        if ref.zkey == preloaded:  # the preload's acquire has returned: another thread replaces its key
            cache.release(_Call(lambda: acquire(msg.CircuitRef("X", replacing))).outcome())
        return key

    cache.acquire = replaced_once_acquired  # type: ignore[method-assign]
    _prompt(lambda: cache.preload(msg.CircuitRef("X", preloaded)))
    here = cache.keys["X"]
    assert here.ref.zkey == replacing and here.users == 0 and cache.backend.closed[-1] == preloaded
    told = [m for m in cache.ctx.sent if isinstance(m, msg.KeyState) and m.circuit_id == "X"]
    assert (told[-1].tier, told[-1].nbytes) == ("device", here.nbytes), f"told last: {told[-1]}"


def _believed(cache: key_cache.KeyCache, asked: int = 0) -> tuple[list[tuple[str | None, int]], list[str]]:
    """What the engine makes of the KeyStates sent (from the ``asked``-th on, as after its ``forget``):
    the keys it believes resident in this process, and the errors its preload reports."""
    table = CircuitTable(Path("."), "gpu")
    for m in cache.ctx.sent[asked:]:
        if isinstance(m, msg.KeyState):
            table.on_key_state("p", m)
    rows = [(r.tier, r.bytes) for r in table.rows() if r.process == "p" and r.tier is not None]
    return rows, [text for text, _ in table.errors("X", ["p"])]


def test_a_failed_preload_answers_with_its_error_and_the_key_loaded_meanwhile_stays_resident(
        cache: key_cache.KeyCache) -> None:
    """The engine waits for each prover's word on a preload: a failed one answers with its error. But
    another thread's acquire may load the circuit's key (the file fixed) between the preload's failed
    load and its answer; the error that follows that load's report must not make the engine believe
    the circuit has no key here while it has."""
    cache.backend.fail_once.add("x:4")
    with pytest.raises(InputError, match="not a zkey"):
        _prompt(lambda: cache.preload(msg.CircuitRef("X", "x:4")))
    assert _states(cache) == [("X", None)] and cache.ctx.sent[-1].error_kind == "InputError"
    assert _believed(cache) == ([], ["p: InputError: x:4: not a zkey"])
    asked = len(cache.ctx.sent)
    acquire = cache.acquire

    def loaded_by_another_thread_once_failed(ref: msg.CircuitRef) -> key_cache.ResidentKey:
        try:
            return acquire(ref)
        except InputError:
            cache.release(_Call(lambda: acquire(ref)).outcome())
            raise

    cache.backend.fail_once.add("x:4")
    cache.acquire = loaded_by_another_thread_once_failed  # type: ignore[method-assign]
    with pytest.raises(InputError, match="not a zkey"):
        _prompt(lambda: cache.preload(msg.CircuitRef("X", "x:4")))
    told = [(m.tier, m.error_kind) for m in cache.ctx.sent[asked:] if isinstance(m, msg.KeyState)]
    assert told == [("device", ""), (None, "InputError")], told  # the load's report, then the preload's answer
    assert _believed(cache, asked) == ([("device", 4)], ["p: InputError: x:4: not a zkey"])
    assert cache.keys["X"].users == 0


def test_a_failed_preload_answers_with_its_error_when_a_load_started_since_fails_too(
        cache: key_cache.KeyCache) -> None:
    """Another thread's acquire may start a load of the circuit between the preload's failed load and
    its answer. Where that load fails too it tells the engine nothing: the preload's error is still the
    answer the engine waits for (without one, its preload waits out its whole timeout)."""
    acquire = cache.acquire
    other: dict[str, Any] = {}

    def another_load_started_once_failed(ref: msg.CircuitRef) -> key_cache.ResidentKey:
        try:
            return acquire(ref)
        except InputError:
            gate = cache.backend.load_gates["x:4"] = _Gate()
            cache.backend.fail_once.add("x:4")
            other["call"] = _Call(lambda: acquire(ref))
            gate.reached()  # that load runs while the preload answers
            threading.Timer(0.2, gate.opened.set).start()
            raise

    cache.backend.fail_once.add("x:4")
    cache.acquire = another_load_started_once_failed  # type: ignore[method-assign]
    with pytest.raises(InputError, match="not a zkey"):
        _Call(lambda: cache.preload(msg.CircuitRef("X", "x:4"))).outcome()
    with pytest.raises(InputError, match="not a zkey"):
        other["call"].outcome()
    told = [m for m in cache.ctx.sent if isinstance(m, msg.KeyState) and m.circuit_id == "X"]
    assert [(m.tier, m.error_kind) for m in told] == [(None, "InputError")], f"told: {told}"
    assert "X" not in cache.keys and "X" not in cache.loading


def test_a_preload_pinned_to_a_replaced_file_fails_and_the_resident_key_stays_resident(
        cache: key_cache.KeyCache, monkeypatch: pytest.MonkeyPatch) -> None:
    """A preload pinned to a key file that changed again before the prover checked it fails with the
    file's change, while the file's current key (loaded for the jobs accepted since) stays resident: the
    engine gets the error as the preload's answer and still believes that key resident."""
    from cuzk_mp.groth16.circuit_data_file import FileIdentity
    from cuzk_mp.pipeline import circuits

    was, now = FileIdentity(4, 1, b"old"), FileIdentity(4, 2, b"new")
    monkeypatch.setattr(circuits, "key_changed",
                        lambda ref: "zkey x:4 changed on disk" if ref.zkey_id == was else None)
    cache.release(cache.acquire(msg.CircuitRef("X", "x:4", zkey_id=now)))
    with pytest.raises(InputError, match="changed on disk"):
        _prompt(lambda: cache.preload(msg.CircuitRef("X", "x:4", zkey_id=was)))
    assert _believed(cache) == ([("device", 4)], ["p: InputError: zkey x:4 changed on disk"])


def test_a_partition_of_a_job_pinned_to_a_replaced_key_file_keeps_the_files_current_key(
        cache: key_cache.KeyCache, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job accepted before its zkey was replaced (pinned to the old identity) that still has a partition
    to prove once a newer job's key is resident: that partition fails (InputError naming the change), and
    the resident key, the file's now, stays for the jobs that use it: no close, no second load."""
    from cuzk_mp.groth16.circuit_data_file import FileIdentity
    from cuzk_mp.pipeline import circuits

    was, now = FileIdentity(3, 1, b"old"), FileIdentity(3, 2, b"new")
    monkeypatch.setattr(circuits, "key_changed",
                        lambda ref: "zkey x:3 changed on disk" if ref.zkey_id == was else None)
    current = msg.CircuitRef("X", "x:3", zkey_id=now)
    cache.release(cache.acquire(current))
    with pytest.raises(InputError, match="changed on disk"):
        cache.acquire(msg.CircuitRef("X", "x:3", zkey_id=was))
    assert cache.keys["X"].ref == current and cache.backend.closed == [] and cache.backend.loads == ["x:3"]
    assert not cache.loading and "X" not in cache.replaced
    cache.release(cache.acquire(current))
    assert cache.backend.loads == ["x:3"] and _states(cache) == [("X", "device")]


# ---- at random: threads acquire, release, preload and evict while loads and closes sleep or fail


class _Flaky(Exception):
    pass


class _FlakyHandle:
    def __init__(self, name: str, nbytes: int, backend: _FlakyBackend) -> None:
        self.name, self.nbytes, self.backend = name, nbytes, backend
        self.closes = 0
        self.held = 0  # the test's own count of threads holding the key (from acquire's return to release)

    def close(self) -> None:
        be = self.backend
        with be.lock:
            self.closes += 1
            if self.held or self.closes > 1:
                be.errors.append(f"{self.name}: close {self.closes} while {self.held} thread(s) held it")
        be.nap()
        if be.chance(be.p_close_fail):
            raise _Flaky(f"close {self.name}")


class _FlakyBackend:
    """Loads and closes that sleep up to a few ms or raise at random; records what the cache must never
    do (two loads at once, a key closed twice or while a thread holds it) in ``errors``."""

    name = "gpu"

    def __init__(self, seed: int, p_load_fail: float, p_close_fail: float) -> None:
        self.rng, self.lock = random.Random(seed), threading.Lock()
        self.p_load_fail, self.p_close_fail = p_load_fail, p_close_fail
        self.handles: list[_FlakyHandle] = []
        self.errors: list[str] = []
        self.loading = 0

    def chance(self, p: float) -> bool:
        with self.lock:
            return self.rng.random() < p

    def nap(self) -> None:
        with self.lock:
            seconds = self.rng.choice([0.0, 0.0, 0.0005, 0.002])
        time.sleep(seconds)

    def load_key(self, zkey: Any, **kwargs: Any) -> _FlakyHandle:
        with self.lock:
            self.loading += 1
            if self.loading > 1:
                self.errors.append(f"{zkey.name}: loaded beside another load")
        try:
            self.nap()
            if self.chance(self.p_load_fail):
                raise _Flaky(f"load {zkey.name}")
            with self.lock:
                self.handles.append(_FlakyHandle(zkey.name, zkey.nbytes, self))
                return self.handles[-1]
        finally:
            with self.lock:
                self.loading -= 1

    def stats(self) -> dict[str, float]:
        return {}


class _ThreadsCtx(_Ctx):
    """Also knows which KeyStates a load sent (the one its thread sent just before a Stats) from
    those preload sent for a key it found resident."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.last: dict[int, int] = {}  # thread -> index of the KeyState it sent last
        self.loads: set[int] = set()

    def send(self, m: Any) -> None:
        with self.lock:
            me = threading.get_ident()
            if isinstance(m, msg.Stats) and me in self.last:
                self.loads.add(self.last.pop(me))
            elif isinstance(m, msg.KeyState):
                self.last[me] = len(self.sent)
            self.sent.append(m)


def _stress(seed: int) -> list[str]:
    """One random run; what went wrong (nothing, for a sound cache)."""
    rng = random.Random(seed)
    backend = _FlakyBackend(seed, rng.choice([0.0, 0.1, 0.3]), rng.choice([0.0, 0.1, 0.3]))
    cache = key_cache.KeyCache(_ThreadsCtx(), backend, rng.choice([None, rng.randint(3, 12)]))  # type: ignore[arg-type]
    replaced = rng.random() < 0.5  # B's and C's files change under them
    refs = {cid: [msg.CircuitRef(cid, f"{cid}{n}:{size}") for n, size in enumerate(rng.sample(range(1, 7), files))]
            for cid, files in zip("ABC"[:rng.randint(1, 3)], (1, 1 + replaced, 1 + replaced))}  # sizes: which key
    errors = backend.errors

    def use(keys: list[key_cache.ResidentKey], r: random.Random) -> None:
        with backend.lock:
            for k in keys:
                if k.handle.closes:
                    errors.append(f"{k.handle.name}: acquired after its close")
                k.handle.held += 1
        time.sleep(r.choice([0.0, 0.0, 0.0005, 0.002]))
        for k in r.sample(keys, len(keys)):
            with backend.lock:
                k.handle.held -= 1
            try:
                cache.release(k)
            except _Flaky:
                pass

    def thread(i: int) -> None:
        r = random.Random(seed * 10 + i)
        for _ in range(r.randint(5, 20)):
            cid = r.choice(list(refs))
            try:
                op = r.random()
                if op < 0.6:  # a worker's batch: up to 3 partitions, any circuits
                    keys = []
                    for _ in range(r.choice([1, 1, 2, 3])):
                        try:
                            keys.append(cache.acquire(r.choice(refs[r.choice(list(refs))])))
                        except _Flaky:
                            pass
                    use(keys, r)
                elif op < 0.8:
                    cache.preload(r.choice(refs[cid]))
                else:
                    cache.evict(cid)
            except _Flaky:
                pass
            except BaseException as exc:  # noqa: BLE001 - what went wrong, reported below
                errors.append(f"thread {i}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=thread, args=(i,), daemon=True) for i in range(rng.randint(2, 5))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + WAIT_S
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        return [*errors, "threads still waiting: a deadlock"]
    if cache.loading or cache.evicting or cache.closing:
        errors.append(f"left: loading {list(cache.loading)}, evicting {cache.evicting}, closing {cache.closing}")
    resident = {id(k.handle) for k in cache.keys.values()}
    errors += [f"{k.handle.name}: resident with {k.users} users, {k.handle.closes} closes"
               for k in cache.keys.values() if k.users or k.handle.closes]
    errors += [f"{h.name}: gone from the cache, closed {h.closes} times" for h in backend.handles
               if id(h) not in resident and h.closes != 1]
    ctx = cache.ctx
    assert isinstance(ctx, _ThreadsCtx)
    for cid, mine in refs.items():
        states = [(i, m) for i, m in enumerate(ctx.sent) if isinstance(m, msg.KeyState) and m.circuit_id == cid]
        told = "".join("G" if m.tier is None else "L" for i, m in states
                       if m.error is None and (m.tier is None or i in ctx.loads))  # a failed preload's error aside
        if told.startswith("G") or "GG" in told:
            errors.append(f"{cid}: told {told} (L: a load, G: gone)")
        if len(mine) == 1 and "LL" in told:  # one key at a time: loads and closes alternate
            errors.append(f"{cid}: told {told} (L: a load, G: gone)")
        table = CircuitTable(Path("."), "gpu")  # the engine's side: what it believes resident, told in this order
        for _, m in states:
            table.on_key_state("p", m)
        believed = [(r.tier, r.bytes) for r in table.rows() if r.process == "p" and r.tier is not None]
        here = cache.keys.get(cid)
        if believed != ([] if here is None else [("device", here.nbytes)]):
            errors.append(f"{cid}: told {told}, the engine believes {believed}, resident: {here and here.ref.zkey}")
    return errors


def test_keys_stay_counted_closed_once_and_announced_in_order_under_random_threads(key_files: None) -> None:
    for seed in range(100):
        errors = _stress(seed)
        assert not errors, f"seed {seed}: {errors}"
