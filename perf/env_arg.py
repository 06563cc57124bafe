"""The ``NAME=VALUE`` argument of the perf scripts that run processes with a variable added
(``--env``, ``--against``): one parser, so every script refuses a malformed one the same way."""

from __future__ import annotations

import argparse


def env_variable(kv: str) -> tuple[str, str]:
    """``NAME=VALUE`` as its pair, for argparse's ``type=``; anything else is refused by name."""
    name, eq, value = kv.partition("=")
    if not eq or not name:
        raise argparse.ArgumentTypeError(f"{kv!r}: give a variable as NAME=VALUE")
    return name, value
