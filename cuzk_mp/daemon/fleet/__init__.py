"""Many boxes, one queue: daemons on several machines share jobs through PostgreSQL.

Each daemon with a ``[fleet]`` section holds a :class:`~.queue.Fleet`: its clients' submits go
into the shared queue (the same ``request_id`` sent to any box makes one job), its engine claims
jobs of the circuits whose keys it holds resident, as many as it has free slots, and await,
status and cancel work for any job from any box. Large inputs stay out of the database (a
reference and a sha256, :mod:`.inputs`); results are small and live in it, written once.
A box that dies stops renewing its claims, and after ``stall_timeout`` another box takes them.

Why pgqueuer (and not procrastinate)
------------------------------------
Both are maintained PostgreSQL job queues with priorities, ``SELECT ... FOR UPDATE SKIP LOCKED``
claims, retries, LISTEN/NOTIFY and abort of a running job. What decided it is how each fits a
daemon whose engine pulls work while its set of resident keys and free slots keep changing:

* **One claim statement does it all.** pgqueuer's ``Queries.dequeue(batch_size, entrypoints,
  queue_manager_id, heartbeat_timeout)`` takes the entrypoints (one per circuit: key affinity)
  and the batch size (free slots) *per call*, claims in global priority order with SKIP LOCKED,
  and in the same statement re-picks jobs whose per-job heartbeat is older than the timeout:
  stalled-job recovery is part of claiming, not a separate sweeper. procrastinate's
  ``fetch_job`` claims one job per call, and stalled jobs (by worker heartbeat) must be found
  with ``get_stalled_jobs`` and re-queued with ``retry_job`` by some box's extra loop.
* **Heartbeats per claim.** ``update_heartbeat(job_ids)`` renews exactly the claims a box still
  holds, so a box can drop one claim (lost, aborted) and keep the others.
* **Abort reaches the box.** ``mark_job_as_cancelled`` removes the job and NOTIFYs its id on the
  library's channel, where the running box listens (procrastinate's abort is equivalent).
* **Transactions.** pgqueuer runs over a caller-supplied psycopg 3 connection, so ``enqueue``
  joins the transaction that writes the request-id row and the job row; procrastinate's
  connector takes its own pooled connections, so a defer cannot join ours through its API.

What neither library keeps, this package keeps in its own tables beside the library's in the
same database (:mod:`.schema`, created idempotently at connect): the request-id table
(pgqueuer's ``dedupe_key`` only holds while a job is queued or picked; ours holds after it
finished), the job's whole life with its result written once by a guarded update, and the boxes
with their resident keys. The queue itself (claiming, priorities, heartbeats, stall recovery,
retries, cancellation) is the library's.

Modules: ``config`` (the ``[fleet]`` section; no library import), ``models`` (the values
returned), ``schema`` (our tables), ``inputs`` (references + sha256), ``events`` (the LISTEN
connection), ``store`` (transactions and read-only views), ``submits`` (submit and wait for a
result), ``settles`` (a held job's result, failure or release, and a cancel from any box),
``queue`` (:class:`Fleet`: claims, heartbeats), ``retries`` (a failed job's retry goes to a box it
has not failed on), ``worker`` (a claim loop), ``keys`` (which key an idle box loads, and for how
long a load holds it), ``waits`` (waiting with a time limit without losing a cancel, and a call on a
thread that may never return), ``report`` (``cuzk-mp fleet status`` text and /metrics gauges),
``cli``. ``events``, ``store``, ``submits``, ``settles``, ``queue``, ``retries`` and ``worker`` need
the optional ``fleet`` extra; the others import without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cuzk_mp.daemon.fleet.queue import Fleet

__all__ = ["Fleet"]


def __getattr__(name: str) -> Any:
    """``Fleet`` is imported on first use: the queue library loads only when a fleet is configured."""
    if name == "Fleet":
        from cuzk_mp.daemon.fleet.queue import Fleet
        return Fleet
    raise AttributeError(name)
