"""Every exit code of the ``cuzk-mp`` commands, in one place.

The one-shot verbs, the daemon and client verbs, the fleet verbs and the warm-daemon starter all
answer with these; :data:`EXIT_CODES` is the table ``cuzk-mp --help`` prints (and the README's).
A module of its own, importing nothing, so that a one-shot command's start does not load the
daemon's modules (asyncio, multiprocessing, ssl) to learn a number.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INPUT = 2
EXIT_UNREACHABLE = 3
EXIT_RESOURCES = 4
EXIT_JOURNAL_DAMAGED = 65  # sysexits.h EX_DATAERR
EXIT_INTERNAL = 70  # sysexits.h EX_SOFTWARE
EXIT_ALREADY_RUNNING = 75  # sysexits.h EX_TEMPFAIL
EXIT_TIMEOUT = 124  # as timeout(1)
EXIT_HANGUP = 129  # 128 + SIGHUP
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it
EXIT_TERMINATED = 143  # 128 + SIGTERM

EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "success (groth16 verify: the proof is valid)"),
    (EXIT_FAILED, "failed: a proof did not verify, a job failed or was cancelled, a worker died"),
    (EXIT_INPUT, "bad input: usage, a missing or malformed file, an output that cannot be written, an unsatisfied "
                 "witness, a bad config"),
    (EXIT_UNREACHABLE, "the daemon could not be reached, or takes no requests now: starting, shutting down, at its "
                       "connection cap or a cap on unfinished jobs (client verbs); fleet status: the fleet's database "
                       "could not be reached"),
    (EXIT_RESOURCES, "not enough memory (host, shared memory or GPU) or disk (a full journal) for what was asked; "
                     "daemon: its fleet's database did not answer at start"),
    (EXIT_JOURNAL_DAMAGED, "daemon: its journal is damaged or missing; nothing was changed (the message says how "
                           "to start afresh)"),
    (EXIT_INTERNAL, "internal error: a bug; rerun with --log-level DEBUG for the traceback"),
    (EXIT_ALREADY_RUNNING, "daemon: another daemon runs with this journal, socket or shm prefix; nothing was "
                           "changed"),
    (EXIT_TIMEOUT, "client await/prove timed out (the job goes on in the daemon)"),
    (EXIT_HANGUP, "hung up (SIGHUP: the terminal closed; the daemon ignores it): cleaned up as on SIGINT"),
    (EXIT_INTERRUPTED, "interrupted (SIGINT)"),
    (EXIT_TERMINATED, "terminated (SIGTERM; the daemon drains instead and exits 0): cleaned up as on SIGINT"),
)
