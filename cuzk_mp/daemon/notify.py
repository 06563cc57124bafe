"""What systemd shows and waits for while the daemon starts: ``STATUS=`` and ``EXTEND_TIMEOUT_USEC=``.

A start can outlast any fixed ``TimeoutStartSec``: a synthetic circuit's first development
setup, or proving keys of tens of GiB read from disk. Before each such step the daemon calls
:func:`starting`, which shows the step in ``systemctl status`` and asks systemd for ``budget_s``
more seconds from now (``EXTEND_TIMEOUT_USEC``): a step that overruns its own budget still
fails the start, so a hung start is not kept alive forever. :func:`read_budget_s` and
:func:`setup_budget_s` are budgets for reading a file of a given size (a key, the journal's
write-ahead log) and for a development setup. Outside systemd (no ``$NOTIFY_SOCKET``) every call
is a no-op; the datagram itself is sent by :func:`cuzk_mp.daemon.ops.sd_notify`.

Once serving, the daemon tells systemd it is alive (``WATCHDOG=1``, where the unit sets ``WatchdogSec=``:
:func:`watchdog_interval_s`) and what it is doing (``STATUS=``) from its asyncio loop, every
:data:`STATUS_INTERVAL_S` at most: a loop that hangs (a bug that blocks it) stops the pings, and
systemd kills the daemon and starts it again (``Restart=``), its journal resuming the jobs.
"""

from __future__ import annotations

import math
import os

from .ops import sd_notify

MIN_STEP_S = 60.0  # the least extension asked for a step
STATUS_INTERVAL_S = 30.0  # how often a serving daemon's STATUS= line is refreshed (and its watchdog pinged, at least)
READ_BYTES_PER_S = 50 * 2**20  # a slow disk under load: budgets stay generous
# A development setup computes about 8 G1-row equivalents per domain row (C, A, B1, H and B2
# at three times the cost); 110k such rows/s were measured at 2^17 on 2 CPU cores: 20x slack.
SETUP_ROWS_PER_S = 5_000.0


def starting(step: str, budget_s: float) -> bool:
    """Show ``step`` as the unit's status and allow it ``budget_s`` seconds (at least MIN_STEP_S).

    Returns whether systemd got the message (False outside systemd).
    """
    usec = math.ceil(max(budget_s, MIN_STEP_S) * 1e6)
    return sd_notify(f"STATUS={_one_line(step)}\nEXTEND_TIMEOUT_USEC={usec}")


def read_budget_s(nbytes: int) -> float:
    """Seconds to allow for reading (and checking) a file of ``nbytes``: a proving key, the journal's
    write-ahead log."""
    return MIN_STEP_S + nbytes / READ_BYTES_PER_S


def setup_budget_s(log_n: int) -> float:
    """Seconds to allow for a synthetic circuit's first development setup at 2^log_n rows."""
    return MIN_STEP_S + 8 * (1 << log_n) / SETUP_ROWS_PER_S


def watchdog_interval_s() -> float | None:
    """How often to send ``WATCHDOG=1``: half of systemd's watchdog timeout (``$WATCHDOG_USEC``, set where
    the unit has ``WatchdogSec=``) when it is meant for this process (``$WATCHDOG_PID``, where set, names
    it: the engine's worker processes inherit the variables), else None."""
    usec, pid = os.environ.get("WATCHDOG_USEC", ""), os.environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0 or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 2e6


def _one_line(text: str) -> str:
    """sd_notify's fields are newline-separated: a status must stay on one line."""
    return " ".join(text.split())
