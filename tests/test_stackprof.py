"""The sampling profiler sees every thread: a busy one in its own function, a blocked one in its wait."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from cuzk_mp import stackprof


def _spin_here(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(1000))


def test_samples_name_the_busy_and_the_waiting_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stop = threading.Event()
    busy = threading.Thread(target=_spin_here, args=(stop,), name="busy-one")
    idle = threading.Thread(target=stop.wait, name="idle-one")
    monkeypatch.setenv(stackprof.ENV, str(tmp_path))
    sampler = stackprof.start_from_env()
    assert sampler is not None
    busy.start()
    idle.start()
    time.sleep(0.3)
    stop.set()
    busy.join()
    idle.join()
    stackprof.finish(sampler, "test")
    (out,) = tmp_path.glob("test-*.txt")
    text = out.read_text()
    assert sampler.samples >= 10
    assert "# busy-one:" in text and "_spin_here (test_stackprof.py" in text
    idle_lines = [line for line in text.splitlines() if line.startswith("idle-one;")]
    assert idle_lines and all("wait" in line.rsplit(";", 1)[-1] for line in idle_lines)
    monkeypatch.delenv(stackprof.ENV)
    assert stackprof.start_from_env() is None
