"""The caps on unfinished jobs, ``[daemon] max_queued_jobs``, ``max_queued_input`` and
``max_jobs_per_owner``: their values and the one rule that refuses a submit beyond them.

This module owns the rule, not the figures it is applied to. It serves two kinds of queue:

* **A daemon alone** (:class:`~.jobs.JobTable`): until a job finishes, its input bytes stay in
  the daemon's memory, so the figures are the daemon's own unfinished journaled jobs, kept as
  running counters.
* **A fleet's shared queue** (:meth:`.fleet.submits.FleetSubmits.submit`): a box applies its own caps to
  the whole fleet's unfinished jobs, counted in the database in the submit's transaction. One
  queue feeds every box, so a client that floods it through one box starves the clients of every
  other box, and caps counted per box would let n boxes admit n times the cap. The input bytes are
  what the fleet's ``inputs_dir`` holds for those jobs, a directory every box shares.

Either way the rule is the same (:func:`check_caps`): a queue that holds no unfinished job takes
any job (the frame limit bounds it), otherwise a submit is refused when it would pass a cap,
with Unavailable (the client's exit 3: send it again later, under the same request id) naming
the cap, its key and value, and the figures now. Repeats of a job the queue has are answered
before the caps are looked at, so they are never refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from cuzk_mp.errors import Unavailable
from cuzk_mp.logs import fmt_bytes


@dataclass(frozen=True)
class QueueCaps:
    """The bounds on unfinished jobs (``[daemon]`` keys; 0: no cap): every client's jobs
    (``max_queued_jobs``), the input bytes they hold (``max_queued_input``), one owner's jobs
    (``max_jobs_per_owner``)."""

    max_jobs: int = 0
    max_input_bytes: int = 0
    max_per_owner: int = 0

    def __bool__(self) -> bool:
        """Whether any cap is set (a queue without one need not count)."""
        return bool(self.max_jobs or self.max_input_bytes or self.max_per_owner)


class Queued(NamedTuple):
    """Unfinished jobs (queued or running) and the input bytes they hold."""

    jobs: int
    input_bytes: int


def check_caps(caps: QueueCaps, held: Queued, mine: int, size: int, *, fleet: bool = False) -> None:
    """Unavailable naming the cap (its key and value) that a new job of ``size`` input bytes would
    pass, where the queue (the daemon's, or with ``fleet`` the fleet's) holds ``held`` and the
    submitting owner ``mine`` of those jobs; nothing when ``held`` is empty (a queue with no
    unfinished job takes any job)."""
    holder, jobs = "the fleet" if fleet else "the daemon", held.jobs
    if not jobs:
        return
    again = "; send it again once some jobs have finished"

    def unfinished(n: int) -> str:
        return f"{n} unfinished job{'' if n == 1 else 's'}"

    if caps.max_jobs and jobs >= caps.max_jobs:
        raise Unavailable(f"{holder} holds {unfinished(jobs)} (queued or running), its cap "
                          f"([daemon] max_queued_jobs = {caps.max_jobs}){again}")
    if caps.max_per_owner and mine >= caps.max_per_owner:
        where = " in the fleet" if fleet else ""
        raise Unavailable(f"this client has {unfinished(mine)} (queued or running){where}, its cap "
                          f"([daemon] max_jobs_per_owner = {caps.max_per_owner}){again}")
    if caps.max_input_bytes and held.input_bytes + size > caps.max_input_bytes:
        raise Unavailable(
            f"{holder} holds {unfinished(jobs)} with {fmt_bytes(held.input_bytes)} ({held.input_bytes} bytes) "
            f"of inputs and this job brings {fmt_bytes(size)} ({size} bytes): more than its cap ([daemon] "
            f"max_queued_input = {fmt_bytes(caps.max_input_bytes)}, {caps.max_input_bytes} bytes){again}")
