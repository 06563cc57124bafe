"""A shared inputs folder on a hard NFS mount whose server is gone: every read or write of it never
returns. The box gives such calls up (the share check's time limit, a cancel at its stop), and the
threads they are stuck on must not keep the daemon's process from exiting after its stop, nor take
the threads that the daemon's other work (engine status, key evictions, the journal) runs on."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from fleet_helpers import run_stopping_box

from cuzk_mp.daemon.fleet.inputs import store_inputs

# argv: dsn, share folder, what hangs. The box marks the folder with the real calls first, then every
# call of the chosen kind blocks for ever; the script prints "stopped" once the box's stop returned.
_HUNG_SHARE_BOX = """
import asyncio, sys, threading, types
from pathlib import Path
from fleet_helpers import FAST, connect, instant_jobs, make_inputs
from cuzk_mp.daemon.fleet import box as box_module, store as store_module
from cuzk_mp.daemon.fleet.box import FleetBox
from cuzk_mp.daemon.fleet.config import FleetConfig

dsn, share, what = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
entered = threading.Event()

def hung(*args, **kw):  # a call on the dead mount
    entered.set()
    threading.Event().wait()

async def main():
    engine, jobs = instant_jobs()
    engine.degraded, engine.preload, engine.evict = (lambda: False), (lambda cid: None), (lambda cid: True)
    cfg = types.SimpleNamespace(fleet=FleetConfig(dsn=dsn, box="a", inputs_dir=share, **FAST),
                                circuits={"x": object()}, engine=types.SimpleNamespace(srs_budget_bytes=None),
                                param_cache=None)
    box = FleetBox(cfg, engine, jobs)
    box._key_bytes = lambda: {"x": 1}
    box_module.SHARE_CHECK_S = 0.2  # a hung check is given up on at once
    if what == "marker":
        box_module.write_marker = hung
    await box.start(["x"])
    side = None
    if what == "inputs":
        [inp] = make_inputs(share, 1)
        box_module.load_inputs = box_module.share_problem = hung
        submitter = await connect(dsn, "s")
        await submitter.submit(None, "x", inp.ref, inp.sha256)
        await submitter.close()
    elif what == "prune":
        store_module.stale_cutoff = hung
        side = asyncio.ensure_future(box.prune(0.0))
    elif what == "stage":
        [inp] = make_inputs(share, 1)
        side = asyncio.ensure_future(box.fleet.submit(None, "x", inp.ref, inp.sha256, stage=hung))
    while not entered.is_set():
        await asyncio.sleep(0.05)
    if side is not None:
        side.cancel()
        await asyncio.wait({side})
    await box.stop(0.0)
    print("stopped", flush=True)

asyncio.run(main())
"""


@pytest.mark.parametrize("what", ["inputs", "marker", "prune", "stage"])
def test_a_box_whose_shared_folder_hangs_lets_its_process_exit_after_its_stop(
        fleet_dsn: str, tmp_path: Path, what: str) -> None:
    """A claimed job's inputs read and the share checks beside it, the marker's write at the box's
    start, a prune's listing of the folder, a submit's staging of its inputs: each hangs on the dead
    mount, the box stops, and its process exits."""
    share = tmp_path / "share"
    share.mkdir()
    run_stopping_box(_HUNG_SHARE_BOX, fleet_dsn, str(share), what, timeout_s=40)


@pytest.mark.parametrize("step", ["stage", "place"])
def test_a_submit_whose_shared_folder_hangs_is_refused_and_queues_nothing(
        fleet_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str) -> None:
    """The inputs' staging, or their placing inside the submit's transaction, hangs on the dead mount: the
    submit is refused after the storage wait (exit 3, "submit again later"), its transaction rolled back and
    no job queued, so the same request_id queues the job once the folder answers."""
    from fleet_helpers import connect

    from cuzk_mp.daemon import storage_waits
    from cuzk_mp.daemon.fleet import submits as submits_module
    from cuzk_mp.daemon.fleet.inputs import stage_inputs
    from cuzk_mp.errors import Unavailable

    monkeypatch.setattr(storage_waits, "ACCEPT_WAIT_S", 0.3)
    back = threading.Event()
    share = tmp_path / "share"
    share.mkdir()
    data = b"inputs of a job " * 64
    inp = store_inputs(data, share)

    def hung(*args: object) -> None:  # a call on the dead mount, until it answers again
        back.wait()

    if step == "place":
        monkeypatch.setattr(submits_module, "_place", hung)

    async def main() -> None:
        fleet = await connect(fleet_dsn, "s")
        try:
            async with asyncio.timeout(30):  # the submit's own wait ends it long before
                with pytest.raises(Unavailable, match=f"shared inputs folder did not answer within 0.3 s while "
                                                      f"{'storing' if step == 'stage' else 'putting'} the job's"):
                    await fleet.submit("r1", "x", inp.ref, inp.sha256,
                                       stage=hung if step == "stage" else (lambda: stage_inputs(data, share, inp)))
            back.set()
            ref = await fleet.submit("r1", "x", inp.ref, inp.sha256)
            assert not ref.duplicate and ref.state == "queued"  # the refused submit queued nothing
        finally:
            await fleet.close()

    asyncio.run(main())
