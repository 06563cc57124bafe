"""A command's result on stdout, and what a stdout that cannot take it means.

Every verb that prints its result (``groth16 verify``'s line, ``client``'s JSON) goes through
:func:`print_result`, so one exit code answers a full disk under ``> result.txt`` everywhere: exit 2,
an output that cannot be written, never exit 1, which is a failed job's or an invalid proof's.
"""

from __future__ import annotations

import sys

from .errors import OutputError


def print_result(text: str) -> None:
    """A command's result on stdout, out now. A stdout that cannot take it (``> result.txt`` on a full
    disk, ``> /dev/full``) is an output that cannot be written (OutputError naming stdout, exit 2), not
    a bare OSError (exit 1, a failed job's or an invalid proof's code). A process started without a
    stdout (``>&-``: Python's is None) writes nothing, as print() has it. A reader that closed its end
    early (BrokenPipeError) is left to the caller: the command has nothing more to say."""
    stream = sys.stdout
    if stream is None:
        return
    try:
        stream.write(text)
        stream.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise OutputError("stdout", exc.strerror or str(exc)) from exc
