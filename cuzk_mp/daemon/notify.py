"""What systemd shows and waits for while the daemon starts: ``STATUS=`` and ``EXTEND_TIMEOUT_USEC=``.

A start can outlast any fixed ``TimeoutStartSec``: a synthetic circuit's first development
setup, or proving keys of tens of GiB read from disk. Before each such step the daemon calls
:func:`starting`, which shows the step in ``systemctl status`` and asks systemd for ``budget_s``
more seconds from now (``EXTEND_TIMEOUT_USEC``): a step that overruns its own budget still
fails the start, so a hung start is not kept alive forever. :func:`key_load_budget_s` is a
budget for reading a key of a given size. Outside systemd (no ``$NOTIFY_SOCKET``) every call
is a no-op; the datagram itself is sent by :func:`cuzk_mp.daemon.ops.sd_notify`.
"""

from __future__ import annotations

import math

from .ops import sd_notify

MIN_STEP_S = 60.0  # the least extension asked for a step
KEY_READ_BYTES_PER_S = 50 * 2**20  # a slow disk under load: budgets stay generous


def starting(step: str, budget_s: float) -> bool:
    """Show ``step`` as the unit's status and allow it ``budget_s`` seconds (at least MIN_STEP_S).

    Returns whether systemd got the message (False outside systemd).
    """
    usec = math.ceil(max(budget_s, MIN_STEP_S) * 1e6)
    return sd_notify(f"STATUS={_one_line(step)}\nEXTEND_TIMEOUT_USEC={usec}")


def key_load_budget_s(nbytes: int) -> float:
    """Seconds to allow for reading (and checking) a proving key of ``nbytes``."""
    return MIN_STEP_S + nbytes / KEY_READ_BYTES_PER_S


def _one_line(text: str) -> str:
    """sd_notify's fields are newline-separated: a status must stay on one line."""
    return " ".join(text.split())
