"""Log formats: JSON lines parse, the daemon's choice reaches spawned children, and the compilers' loggers stay
quiet at DEBUG."""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing as mp
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cuzk_mp import logs

REPO = Path(__file__).resolve().parents[1]


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


@pytest.mark.parametrize("level", ["debug", "INFO", "warning"])
def test_compiler_loggers_stay_at_warning(level: str, monkeypatch: pytest.MonkeyPatch,
                                          root_logger_restored: None) -> None:
    """At DEBUG numba writes a line per step of its compiler passes (numba.core.ssa, byteflow, ...):
    cuzk-mp's own DEBUG lines pass, the compilers' stay out, their warnings still show."""
    monkeypatch.delenv(logs.LIBRARY_LEVEL_ENV, raising=False)
    logs.configure(level, "text")
    assert logging.getLogger("cuzk_mp.test").isEnabledFor(logging.getLevelNamesMapping()[level.upper()])
    for name in ("numba.core.ssa", "numba.core.byteflow", "numba.cuda.cudadrv.driver", "cupy"):
        assert not logging.getLogger(name).isEnabledFor(logging.INFO), name
        assert logging.getLogger(name).isEnabledFor(logging.WARNING), name


def test_compiler_loggers_follow_a_higher_level_and_the_variable(monkeypatch: pytest.MonkeyPatch,
                                                                 root_logger_restored: None) -> None:
    monkeypatch.delenv(logs.LIBRARY_LEVEL_ENV, raising=False)
    logs.configure("error", "text")
    assert not logging.getLogger("numba.core.ssa").isEnabledFor(logging.WARNING)
    monkeypatch.setenv(logs.LIBRARY_LEVEL_ENV, "debug")
    logs.configure("warning", "text")
    assert logging.getLogger("numba.core.ssa").isEnabledFor(logging.DEBUG)
    assert logs.library_level_problem() is None
    monkeypatch.setenv(logs.LIBRARY_LEVEL_ENV, "loud")
    logs.configure("debug", "text")
    assert not logging.getLogger("numba.core.ssa").isEnabledFor(logging.INFO)
    assert "is not a log level" in (logs.library_level_problem() or "")


def test_a_cold_numba_compile_at_debug_writes_none_of_numbas_lines(tmp_path: Path) -> None:
    """DEBUG with a cold numba cache: stderr has no numba.* line, unless the variable asks for them."""
    code = ("from cuzk_mp import logs; logs.configure('DEBUG', 'text'); "
            "import numba; f = numba.njit(lambda n: sum([i for i in range(n) if i % 3])); f(10)")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    env.pop(logs.LIBRARY_LEVEL_ENV, None)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert " numba." not in proc.stderr, proc.stderr[:2000]
    env[logs.LIBRARY_LEVEL_ENV] = "DEBUG"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and " numba.core." in proc.stderr, proc.stderr[:2000]


def test_duration_text_for_progress_lines() -> None:
    from cuzk_mp.logs import duration_text

    assert [duration_text(x) for x in (4.54, 59.9, 123.4, 3723.0, None, float("nan"), float("inf"))] == \
        ["4.5s", "59.9s", "2m03s", "1h02m03s", "?", "?", "?"]


def test_final_error_shows_a_names_control_characters_and_folds_the_messages_own(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """final_error's ``names``: a name with a line break or an escape character is shown quoted and
    escaped (relative, and in the absolute form a message may give it), a plain name as it is; the
    message's own line breaks are folded into one space as before."""
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    monkeypatch.delenv("CUZK_MP_LOG_FORMAT", raising=False)
    odd, plain = "a\nb.json", "c.json"
    message = f"{odd}: bad\n\tand {os.path.abspath(odd)} too; {plain} fine\n"
    assert logs.final_error(2, message, names=[odd, Path(plain), Path("\x1b[31mred")]) == 2
    absolute = repr(os.path.abspath(odd))
    assert capsys.readouterr().err == f"cuzk-mp: 'a\\nb.json': bad and {absolute} too; c.json fine\n"
    assert logs.shown_name("x\x1b[2Jy") == "'x\\x1b[2Jy'" and logs.shown_name(Path("é z")) == "é z"


def test_final_error_answers_with_its_code_where_stderr_cannot_take_its_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk under both a command's outputs and its stderr (``2> client.log`` beside them): the
    line cannot be written, and the exit code is still the one it would have said, never the 1 of an
    exception that escaped it (a failed job's code, which a script acts on). Text and JSON lines alike."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    full = open("/dev/full", "w")
    monkeypatch.setattr(sys, "stderr", full)
    try:
        assert logs.final_error(2, "out/proof_0.json: cannot write it: No space left on device") == 2
        monkeypatch.setenv("CUZK_MP_LOG_FORMAT", "json")
        assert logs.final_error(3, "cannot reach the daemon") == 3
    finally:
        with contextlib.suppress(OSError):
            full.close()
