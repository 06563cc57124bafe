"""Log formatting shared by every cuzk-mp process: plain text lines or JSON lines.

The daemon picks the format (``[logging] format``) and exports it as
``CUZK_MP_LOG_FORMAT`` (with the level as ``CUZK_MP_LOG_LEVEL``), so that the
engine's spawned children, which inherit the environment, log the same way.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s (%(processName)s pid=%(process)d): %(message)s"
FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, process, pid, msg (+ exc)."""

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
        return json.dumps(obj, ensure_ascii=False)


def configure(level: str, fmt: str, *, process: str | None = None, text_format: str = TEXT_FORMAT) -> None:
    """Send the root logger to stderr at ``level`` in ``fmt`` ("text" or "json")."""
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r} is not one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(process) if fmt == "json" else logging.Formatter(text_format))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


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
