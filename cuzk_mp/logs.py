"""Log formatting shared by every cuzk-mp process: plain text lines or JSON lines.

The daemon picks the format (``[logging] format``) and exports it as
``CUZK_MP_LOG_FORMAT`` (with the level as ``CUZK_MP_LOG_LEVEL``), so that the
engine's spawned children, which inherit the environment, log the same way.

The compilers' own loggers (:data:`LIBRARY_LOGGERS`: numba, with numba.cuda, and CuPy) stay at
WARNING, or the level asked when it is higher: at DEBUG numba writes a line per step of its
bytecode and SSA passes, hundreds of thousands for one proof on a cold cache, and would bury
cuzk-mp's own lines and the traceback that DEBUG is asked for. ``CUZK_MP_LIBRARY_LOG_LEVEL``
(a level name, inherited by the children as well) gives them that level instead.

Progress lines give elapsed and remaining time as :func:`duration_text` writes it. A command's result
goes to stdout through :func:`cuzk_mp.stdout.print_result`.

A command that fails ends with :func:`final_error`: one line on stderr, ``cuzk-mp: what went
wrong`` with any line breaks of the message folded into spaces, or, where the process logs JSON,
a JSON object like its log lines with the exit code added (``"exit_code"``). A file name of the
command's that holds a line break (or another control character) is shown quoted and escaped as
Python writes the string (:func:`shown_name`), never folded: the decision is to keep every existing
message as it is for the names that need no escape, and to make the others unambiguous.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
import time
from collections.abc import Iterable

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s (%(processName)s pid=%(process)d): %(message)s"
FORMATS = ("text", "json")
LIBRARY_LOGGERS = ("numba", "cupy")  # their child loggers (numba.core.ssa, numba.cuda...) follow them
LIBRARY_LEVEL_ENV = "CUZK_MP_LIBRARY_LOG_LEVEL"
LIBRARY_LEVEL = logging.WARNING


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, process, pid, msg (+ exc, + exit_code where the
    record carries one: :func:`final_error`)."""

    def __init__(self, process: str | None = None) -> None:
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        """The record as a JSON line."""
        obj = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "process": self.process or record.processName,
            "pid": record.process,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            obj["exc"] = self.formatException(record.exc_info)
        code = getattr(record, "exit_code", None)
        if code is not None:
            obj["exit_code"] = code
        return json.dumps(obj, ensure_ascii=False)


def configure(level: str, fmt: str, *, process: str | None = None, text_format: str = TEXT_FORMAT) -> None:
    """Send the root logger to stderr at ``level`` in ``fmt`` ("text" or "json")."""
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r} is not one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(process) if fmt == "json" else logging.Formatter(text_format))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(library_level(level))


def library_level(level: str) -> int:
    """The level of the compilers' loggers when cuzk-mp logs at ``level``: ``$CUZK_MP_LIBRARY_LOG_LEVEL``
    where it names a level, else ``level`` but never below WARNING."""
    levels = logging.getLevelNamesMapping()
    asked = os.environ.get(LIBRARY_LEVEL_ENV, "").strip().upper()
    if asked in levels:
        return levels[asked]
    return max(levels.get(level.upper(), LIBRARY_LEVEL), LIBRARY_LEVEL)


def library_level_problem() -> str | None:
    """What is wrong with ``$CUZK_MP_LIBRARY_LOG_LEVEL`` (None where it is unset or a level name)."""
    asked = os.environ.get(LIBRARY_LEVEL_ENV, "").strip()
    if not asked or asked.upper() in logging.getLevelNamesMapping():
        return None
    return f"{LIBRARY_LEVEL_ENV}={asked} is not a log level: the compilers' loggers stay at WARNING or above"


def shown_name(name: str | os.PathLike[str]) -> str:
    """A file name as the last line shows it: as it is, or, where it holds a control character (a line
    break, which :func:`final_error` would fold into a space and so name another file; a terminal's
    escape sequence), as Python writes the string: quoted, each such character escaped
    (``'vk\\nx.json'``)."""
    text = os.fspath(name)
    return repr(text) if any(c < " " or c == "\x7f" for c in text) else text


def final_error(code: int, message: str, *, prefix: str = "cuzk-mp", logger: str = "cuzk_mp.cli",
                names: Iterable[str | os.PathLike[str]] = ()) -> int:
    """Write the one line a failed command ends with on stderr and return ``code``: ``prefix: message``
    (line breaks and the blanks around them folded into one space), or where the process logs JSON
    lines (its root logger's handler, else, before any :func:`configure`, ``CUZK_MP_LOG_FORMAT``) a
    JSON log line at level error, from ``logger``, with ``"exit_code"``. ``names`` are the file names
    the message may hold (the command's path arguments): each one there, and its absolute form, is
    shown by :func:`shown_name` before the message's own line breaks are folded, so a name's line
    break stays apart from them. A stderr that cannot take the line (a full disk under ``2> log``)
    changes nothing of ``code``: an exception here would end the command with 1, a failed job's."""
    odd = {os.fspath(n) for n in names if shown_name(n) != os.fspath(n)}
    for name in list(odd):
        with contextlib.suppress(OSError):  # the working folder may be gone: its absolute form is unknown
            odd.add(os.path.abspath(name))
    for name in sorted(odd, key=len, reverse=True):
        message = message.replace(name, shown_name(name))
    text = re.sub(r"\s*[\r\n]+\s*", " ", message.strip())
    handlers = logging.getLogger().handlers
    formatter = next((h.formatter for h in handlers if isinstance(h.formatter, JsonFormatter)), None)
    if formatter is None and not handlers and child_format() == "json":
        formatter = JsonFormatter()
    if formatter is not None:
        record = logging.makeLogRecord({"name": logger, "levelno": logging.ERROR, "levelname": "ERROR",
                                        "msg": text, "exit_code": code})
        line = formatter.format(record)
    else:
        line = f"{prefix}: {text}"
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr full (`2> log` on a full disk) or closed: the code still answers
        pass
    return code


def export_for_children(level: str, fmt: str) -> None:
    """Make spawned children log at ``level`` in ``fmt`` (they inherit the environment)."""
    os.environ["CUZK_MP_LOG_LEVEL"] = level.upper()
    os.environ["CUZK_MP_LOG_FORMAT"] = fmt


def configure_child(name: str, level: str) -> None:
    """Logging of a spawned child process ``name``: its lines carry its name and pid, in the format the
    parent exported (:func:`export_for_children`)."""
    configure(level, child_format(), process=name,
              text_format=f"({name} pid={os.getpid()}) %(asctime)s %(levelname)s %(name)s: %(message)s")


def child_format() -> str:
    """The format a child should use (``CUZK_MP_LOG_FORMAT``, default text)."""
    fmt = os.environ.get("CUZK_MP_LOG_FORMAT", "text")
    return fmt if fmt in FORMATS else "text"


def fmt_bytes(n: float | None) -> str:
    """A size as reports and messages write it: ``59.00 GiB``, ``12.5 MiB``, ``3 KiB`` ("n/a" for None)."""
    if n is None:
        return "n/a"
    if abs(n) >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    return f"{n / 2**20:.1f} MiB" if abs(n) >= 2**20 else f"{n / 2**10:.0f} KiB"


def duration_text(seconds: float | None) -> str:
    """A progress line's time: ``1h02m03s`` / ``2m03s`` / ``4.5s``; ``?`` when unknown (None, NaN, inf)."""
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "?"
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(int(seconds + 0.5), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"
