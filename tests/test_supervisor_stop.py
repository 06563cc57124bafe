"""The supervisor's shutdown: a child that exits on the stop message is never taken for one
that ignored SIGTERM, even when another thread reaps it first (the engine's event thread
reaps every child whose sentinel fires, at the same moment stop_all waits for it)."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import threading
import time

from cuzk_mp.pipeline.procs import ChildHandle, ChildSpec
from cuzk_mp.pipeline.supervisor import Child, Supervisor

_CTX = mp.get_context("spawn")


def _child(seconds: float) -> tuple[Child, ChildHandle]:
    parent_conn, child_conn = _CTX.Pipe(duplex=True)
    death_r, death_w = _CTX.Pipe(duplex=False)
    proc = _CTX.Process(target=time.sleep, args=(seconds,), daemon=True)
    proc.start()
    child_conn.close()
    death_r.close()
    spec = ChildSpec("prover", 0, "time", {}, None)
    handle = ChildHandle(spec, proc, parent_conn, death_w, time.monotonic(), ready=True)
    return Child(spec, handle), handle


def test_child_reaped_by_another_thread_is_not_killed(caplog: object) -> None:
    child, handle = _child(0.2)
    pid = handle.pid
    reaped: list[int] = []
    # the event thread's part: it reaps the exited child before stop_all looks (then waitpid in
    # stop_all finds nothing, as when the two race for it)
    thief = threading.Thread(target=lambda: reaped.append(os.waitpid(pid, 0)[0]))
    thief.start()
    thief.join(10)
    with caplog.at_level(logging.WARNING, logger="cuzk_mp.pipeline.supervisor"):  # type: ignore[attr-defined]
        t0 = time.monotonic()
        Supervisor({"cuzk-prover-0": child}).stop_all(deadline_s=10.0)
        took = time.monotonic() - t0
    assert reaped == [pid]
    assert took < 5.0, f"stop_all took {took:.1f} s for a child that had exited"
    messages = [r.getMessage() for r in caplog.records]  # type: ignore[attr-defined]
    assert not [m for m in messages if "SIGTERM" in m or "SIGKILL" in m], messages
    handle.close()


def test_child_that_stays_gets_sigterm() -> None:
    child, handle = _child(60.0)
    t0 = time.monotonic()
    Supervisor({"cuzk-prover-0": child}).stop_all(deadline_s=0.5)
    assert time.monotonic() - t0 < 5.0  # SIGTERM ends time.sleep at once
    assert not handle.proc.is_alive()
    assert handle.proc.exitcode == -15
    handle.close()


def test_a_child_keeps_the_latest_cancelled_ids_only() -> None:
    """A daemon that runs for months cancels many attempts: a child keeps the latest ids, enough for the
    attempts it can hold, not every id it was ever sent."""
    from cuzk_mp.pipeline.procs import CANCELLED_KEPT, CancelledIds

    ids = CancelledIds()
    ids.update(range(CANCELLED_KEPT + 10))
    assert 0 not in ids and 9 not in ids and 10 in ids and CANCELLED_KEPT + 9 in ids
    ids.update([5])
    assert 5 in ids and 10 not in ids  # the oldest made room
