"""A child role that dies before READY, every time (exit code 3): a process in a crash loop."""

from __future__ import annotations

import os
from typing import Any


def main(ctx: Any, payload: Any) -> None:
    """Exit at once, as a process whose start-up always fails would."""
    os._exit(3)
