"""Log formats: JSON lines parse, and the daemon's choice reaches spawned children."""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
from collections.abc import Iterator

import pytest

from cuzk_mp import logs


def _child_logs(q: "mp.Queue[str]") -> None:
    import io

    from cuzk_mp import logs as child_logs

    stream = io.StringIO()
    child_logs.configure(os.environ["CUZK_MP_LOG_LEVEL"], child_logs.child_format(), process="cuzk-test-child")
    logging.getLogger().handlers[0].setStream(stream)  # type: ignore[attr-defined]
    logging.getLogger("cuzk_mp.test").info("hello from the child")
    q.put(stream.getvalue())


@pytest.fixture
def root_logger_restored() -> Iterator[None]:
    """The root logger's level and handlers as they were: ``configure`` replaces them, and a handler
    left on this test's captured stderr, or an INFO level, would leak into the tests after it."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:
        yield
    finally:
        root.setLevel(level)
        root.handlers[:] = handlers


def test_json_lines_and_inheritance(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                    root_logger_restored: None) -> None:
    monkeypatch.setenv("CUZK_MP_LOG_LEVEL", "WARNING")
    monkeypatch.setenv("CUZK_MP_LOG_FORMAT", "text")
    logs.configure("info", "json", process="cuzk-daemon")
    logging.getLogger("cuzk_mp.test").info("one %s", "line")
    line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert line["msg"] == "one line" and line["level"] == "info" and line["process"] == "cuzk-daemon"
    logs.export_for_children("info", "json")
    q: "mp.Queue[str]" = mp.get_context("spawn").Queue()
    p = mp.get_context("spawn").Process(target=_child_logs, args=(q,))
    p.start()
    out = q.get(timeout=60)
    p.join(60)
    rec = json.loads(out.strip())
    assert rec["msg"] == "hello from the child" and rec["process"] == "cuzk-test-child"
    with pytest.raises(ValueError, match="not one of"):
        logs.configure("info", "xml")
