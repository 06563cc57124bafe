"""numba's compilations show in the log (cuzk_mp.algebra.jit): the first at INFO, each at DEBUG with
its time, a kernel's callees inside its own line, and nothing for code that is already compiled."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from numba.core import event

from cuzk_mp.algebra import jit


@pytest.fixture()
def fresh_log(monkeypatch: pytest.MonkeyPatch) -> jit.CompileLog:
    """A listener of its own in place of the module's, which has seen this process's earlier compilations."""
    listener = jit.CompileLog()
    monkeypatch.setattr(jit, "PROGRESS_S", 0.0)  # every compilation reports the count
    event.unregister("numba:compile", jit.compile_log)
    try:
        with event.install_listener("numba:compile", listener):
            yield listener
    finally:
        event.register("numba:compile", jit.compile_log)


def test_compilations_are_logged_once_each_with_callees_inside(fresh_log: jit.CompileLog,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    @jit.njit(cache=False)
    def inner(x):  # type: ignore[no-untyped-def]
        return x * 3

    @jit.njit(cache=False)
    def outer(a):  # type: ignore[no-untyped-def]
        s = 0
        for i in range(a.shape[0]):
            s += inner(a[i])
        return s

    caplog.set_level(logging.DEBUG, logger=jit.__name__)
    assert outer(np.arange(4, dtype=np.int64)) == 18
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == jit.__name__]
    name = f"{__name__}.test_compilations_are_logged_once_each_with_callees_inside.<locals>.outer"
    assert lines[0][0] == "INFO" and lines[0][1].startswith(f"compiling {name} with numba: its machine code is not in")
    assert "scripts/warm_caches.py" in lines[0][1]
    assert [m for lv, m in lines if lv == "DEBUG" and m.startswith("compiled ")] == [
        m for lv, m in lines if m.startswith(f"compiled {name} in ")]  # inner's compile is part of outer's
    assert fresh_log.compiled == 1 and fresh_log.seconds > 0
    assert ("INFO", f"numba: 1 kernel(s) compiled for this machine in {fresh_log.seconds:.0f} s so far") in lines

    caplog.clear()
    assert outer(np.arange(3, dtype=np.int64)) == 9  # the same types: no compilation, no line
    assert not [r for r in caplog.records if r.name == jit.__name__] and fresh_log.compiled == 1

    assert outer(np.arange(3, dtype=np.int32)) == 9  # new types: a second compilation, at DEBUG
    second = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == jit.__name__]
    assert ("DEBUG", f"compiling {name} with numba") in second
    assert not [m for lv, m in second if lv == "INFO" and "disk cache" in m]
    assert fresh_log.compiled == 2


def test_every_kernel_module_takes_its_decorators_from_jit() -> None:
    """The log covers the project's kernels only if they are declared with jit's njit."""
    import pathlib
    import re

    root = pathlib.Path(jit.__file__).parents[1]
    direct = [str(p.relative_to(root)) for p in root.rglob("*.py") if p.name != "jit.py"
              and re.search(r"^\s*from numba import .*\b(njit|jit|prange)\b", p.read_text(), re.M)]
    assert direct == []


def test_the_module_listener_counts_this_process_compilations() -> None:
    @jit.njit(cache=False)
    def twice(x):  # type: ignore[no-untyped-def]
        return x + x

    before = jit.compile_log.compiled
    assert twice(21) == 42
    assert jit.compile_log.compiled == before + 1
