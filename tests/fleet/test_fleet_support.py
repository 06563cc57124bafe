"""The fleet's configuration section, input references, and its status report, CLI and /metrics gauges."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hashlib
import http.server
import json
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from fleet_helpers import connect, instant_jobs, make_inputs

from cuzk_mp.daemon.config_file import parse_duration
from cuzk_mp.daemon.fleet import report
from cuzk_mp.daemon.fleet.config import FleetConfig, FleetSection, check_fleet, redact_dsn, resolve_fleet
from cuzk_mp.daemon.fleet.inputs import load_inputs, store_inputs
from cuzk_mp.daemon.metrics import DaemonMetrics, Scrape
from cuzk_mp.errors import ConfigError, InputError, ResourceError


def resolve(table: dict[str, object], base: Path = Path("/etc/cuzk")) -> FleetConfig | None:
    return resolve_fleet(msgspec.convert(table, FleetSection), source="cfg.toml", base=base,
                         duration=parse_duration)


def test_config_section_resolves_and_names_bad_keys() -> None:
    assert resolve({}) is None  # no dsn: this box runs alone
    cfg = resolve({"dsn": "postgresql://cuzk@db/fleet", "box": "gpu-1", "heartbeat_interval": "2s",
                   "stall_timeout": "1m", "inputs_dir": "inputs", "max_jobs": 2})
    assert cfg is not None
    assert (cfg.box, cfg.heartbeat_interval_s, cfg.stall_timeout_s, cfg.max_attempts, cfg.max_jobs) == (
        "gpu-1", 2.0, 60.0, 3, 2)
    assert cfg.inputs_dir == Path("/etc/cuzk/inputs")
    assert resolve({"dsn": "host=db dbname=fleet"}).box  # type: ignore[union-attr]  # host name by default
    with pytest.raises(msgspec.ValidationError, match="heartbeat"):
        msgspec.convert({"dsn": "x", "heartbeat": "1s"}, FleetSection)
    bad = [({"dsn": "mysql://db"}, "fleet.dsn"), ({"dsn": "postgresql://db", "box": "a b"}, "fleet.box"),
           ({"dsn": "postgresql://db", "heartbeat_interval": "10s", "stall_timeout": "20s"}, "fleet.stall_timeout"),
           ({"dsn": "postgresql://db", "max_attempts": 0}, "fleet.max_attempts"),
           ({"dsn": "postgresql://db", "max_jobs": -1}, "fleet.max_jobs"),
           ({"dsn": "postgresql://db", "stall_timeout": "soon"}, "fleet.stall_timeout")]
    for table, key in bad:
        with pytest.raises(ConfigError, match=f"cfg.toml: {key}"):
            resolve(table)


def test_dsn_passwords_never_reach_messages() -> None:
    assert redact_dsn("postgresql://cuzk:s3cret@db:5432/fleet") == "postgresql://cuzk:***@db:5432/fleet"
    assert "s3cret" not in redact_dsn("host=db password=s3cret dbname=fleet")
    with pytest.raises(ConfigError) as e:
        check_fleet(FleetConfig(dsn="mysql://u:s3cret@db/x", box="b"), "fleet")
    assert "s3cret" not in str(e.value)


def test_inputs_roundtrip_by_path_url_and_http(tmp_path: Path) -> None:
    data = b"witness bytes " * 1000
    ref = store_inputs(data, tmp_path)
    assert ref.sha256 == hashlib.sha256(data).hexdigest() and Path(ref.ref).name == f"{ref.sha256}.inputs"
    assert store_inputs(data, tmp_path) == ref  # content-addressed: stored once
    assert load_inputs(ref.ref, ref.sha256) == data
    assert load_inputs(Path(ref.ref).as_uri(), ref.sha256) == data
    handler = type("H", (http.server.SimpleHTTPRequestHandler,), {"log_message": lambda *a: None})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: handler(*a, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/{Path(ref.ref).name}"
        assert load_inputs(url, ref.sha256) == data
        with pytest.raises(InputError, match="HTTP 404"):
            load_inputs(url + ".missing", ref.sha256)
    finally:
        server.shutdown()


def test_an_inputs_reference_names_the_folder_as_configured_not_where_a_symlink_leads(tmp_path: Path) -> None:
    """Every box reads ``inputs_dir`` at the same path; behind it, each may hold a mount of its own or
    a symlink to wherever the share is mounted there. A reference spelled through this box's link
    target names a folder other boxes may not have: there the job failed for a missing file."""
    real, link = tmp_path / "nfs" / "inputs", tmp_path / "inputs"
    real.mkdir(parents=True)
    link.symlink_to(real)
    ref = store_inputs(b"witness bytes", link)
    assert ref.ref == str(link / f"{ref.sha256}.inputs")
    assert load_inputs(ref.ref, ref.sha256) == b"witness bytes"


def test_inputs_that_changed_or_are_missing_are_input_errors(tmp_path: Path) -> None:
    ref = store_inputs(b"original", tmp_path)
    Path(ref.ref).write_bytes(b"tampered")
    with pytest.raises(InputError, match="has sha256"):
        load_inputs(ref.ref, ref.sha256)
    with pytest.raises(InputError, match="larger than"):
        load_inputs(ref.ref, ref.sha256, max_bytes=4)
    with pytest.raises(InputError, match="no such file"):
        load_inputs(str(tmp_path / "gone"), ref.sha256)
    with pytest.raises(InputError, match="absolute path"):
        load_inputs("ftp://host/x", ref.sha256)
    with pytest.raises(ResourceError, match="cannot fetch"):
        load_inputs("http://127.0.0.1:9/x", ref.sha256, timeout_s=2)


def test_status_report_cli_and_metrics(fleet_dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cuzk_mp.daemon.fleet.cli import add_parser
    inputs = make_inputs(tmp_path, 3)

    async def main() -> tuple[list, list]:  # type: ignore[type-arg]
        a = await connect(fleet_dsn, "gpu-a")
        for inp in inputs:
            await a.submit(None, "x", inp.ref, inp.sha256)
        await a.claim(["x"], 1)
        await a.close()  # leaves, giving its claim back
        observer = await connect(fleet_dsn, "observer", register=False)
        boxes, depths = await observer.boxes(), await observer.queue_depths()
        await observer.close()
        return boxes, depths

    boxes, depths = asyncio.run(main())
    doc = report.document(boxes, depths)
    # its row lists x from its claim on, heartbeat or not
    assert [(b["box"], b["state"], b["resident"], b["running"]) for b in doc["boxes"]] == [("gpu-a", "left", ["x"], 0)]
    assert doc["queues"] == [{"circuit": "x", "priority": "NORMAL", "queued": 3, "running": 0, "stalled": 0}]

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["fleet", "status", "--dsn", fleet_dsn, "--json"])
    assert args.func(args) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["queues"] == doc["queues"]
    assert [(b["box"], b["state"], b["host"]) for b in shown["boxes"]] == [("gpu-a", "left", boxes[0].host)]
    args = parser.parse_args(["fleet", "status", "--dsn", fleet_dsn])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "gpu-a" in out and "NORMAL" in out
    args = parser.parse_args(["fleet", "status", "--dsn", "postgresql://nobody@127.0.0.1:9/x", "--timeout", "1"])
    assert args.func(args) == 3
    err = capsys.readouterr().err  # the driver's message and its tab-indented hint: one line
    assert err.startswith("cuzk-mp fleet status: ") and err.count("\n") == 1 and "\t" not in err, err
    missing = fleet_dsn.rsplit("/", 1)[0] + "/no_such_db"
    args = parser.parse_args(["fleet", "status", "--dsn", missing])
    assert args.func(args) == 2  # the server answered: the dsn is wrong, not the network
    assert 'database "no_such_db" does not exist' in capsys.readouterr().err

    text = DaemonMetrics().render(Scrape(extra=report.gauges(boxes, depths)))
    assert 'cuzk_fleet_queue_jobs{circuit="x",priority="NORMAL",state="queued"} 3' in text
    assert 'cuzk_fleet_boxes{state="left"} 1' in text and "# TYPE cuzk_fleet_box_up gauge" in text


def test_fleet_status_while_jobs_run(fleet_dsn: str, tmp_path: Path) -> None:
    inputs = make_inputs(tmp_path, 3)

    async def main() -> None:
        a = await connect(fleet_dsn, "gpu-a")
        for i, inp in enumerate(inputs):
            await a.submit(None, "xy"[i % 2], inp.ref, inp.sha256)
        await a.claim(["x"], 5)
        await a.heartbeat()
        [box] = await a.boxes()
        assert (box.state, box.resident, box.running, box.free_slots) == ("up", ("x",), 2, 5)
        depths = {(d.circuit_id, d.queued, d.running, d.stalled) for d in await a.queue_depths()}
        assert depths == {("x", 0, 2, 0), ("y", 1, 0, 0)}
        text = DaemonMetrics().render(Scrape(extra=report.gauges([box], await a.queue_depths())))
        assert 'cuzk_fleet_box_resident_key{box="gpu-a",circuit="x"} 1' in text
        assert 'cuzk_fleet_box_running_jobs{box="gpu-a"} 2' in text
        await a.close()

    asyncio.run(main())


def test_daemon_config_with_and_without_a_fleet(tmp_path: Path) -> None:
    from cuzk_mp.daemon.config import resolve as resolve_daemon
    alone = resolve_daemon({"fleet": {"dsn": ""}}, base=tmp_path, source="d.toml")
    assert alone.fleet is None
    cfg = resolve_daemon({"fleet": {"dsn": "postgresql://cuzk@db/fleet", "box": "gpu-1", "inputs_dir": "in"}},
                         base=tmp_path, source="d.toml")
    assert cfg.fleet is not None and (cfg.fleet.box, cfg.fleet.inputs_dir) == ("gpu-1", tmp_path / "in")
    with pytest.raises(ConfigError, match="d.toml: fleet.box"):
        resolve_daemon({"fleet": {"dsn": "postgresql://db/x", "box": "no spaces"}}, base=tmp_path, source="d.toml")
    with pytest.raises(ConfigError, match="unknown key `fleet.dns`"):
        resolve_daemon({"fleet": {"dns": "postgresql://db/x"}}, base=tmp_path, source="d.toml")


def test_stored_inputs_go_once_stale_and_named_by_no_job(fleet_dsn: str, tmp_path: Path) -> None:
    import os
    import time

    from cuzk_mp.daemon.fleet.inputs import stale_cutoff, stale_inputs
    kept, dropped, fresh = make_inputs(tmp_path, 3)
    for ref in (kept, dropped):
        os.utime(ref.ref, (time.time() - 100, time.time() - 100))
    assert sorted(map(str, stale_inputs(tmp_path, stale_cutoff(tmp_path, 50)))) == sorted([kept.ref, dropped.ref])
    assert store_inputs(Path(kept.ref).read_bytes(), tmp_path) == kept  # stored again: fresh again
    assert [str(p) for p in stale_inputs(tmp_path, stale_cutoff(tmp_path, 50))] == [dropped.ref]
    os.utime(kept.ref, (time.time() - 100, time.time() - 100))

    async def prune() -> int:
        a = await connect(fleet_dsn, "a")
        await a.submit(None, "x", kept.ref, kept.sha256)
        removed = await a.prune_inputs(tmp_path, 50)
        await a.close()
        return removed

    assert asyncio.run(prune()) == 1  # stale and named by no job: dropped alone
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(Path(r.ref).name for r in (kept, fresh))


def test_pruning_never_removes_the_inputs_of_a_job_being_queued(fleet_dsn: str, tmp_path: Path) -> None:
    """A submit of bytes stored before (an old file, or one whose mtime the shared folder still shows
    old) holds the inputs' lock from putting them in place to its job's commit: a prune that comes
    meanwhile waits, then finds the job naming the file and keeps it."""
    import os
    import threading
    import time

    from cuzk_mp.daemon.fleet.inputs import StagedInputs

    [old] = make_inputs(tmp_path, 1)
    os.utime(old.ref, (time.time() - 100, time.time() - 100))  # what a stale attribute cache shows
    placing, release = threading.Event(), threading.Event()

    class Held(StagedInputs):
        def place(self) -> bool:  # the file is there already; the submit waits here, under the lock
            placing.set()
            assert release.wait(10)
            return super().place()

    async def main() -> int:
        a, b = await connect(fleet_dsn, "a"), await connect(fleet_dsn, "b")
        submit = asyncio.create_task(a.submit(None, "x", old.ref, old.sha256, stage=lambda: Held(old, None)))
        await asyncio.to_thread(placing.wait, 10)
        prune = asyncio.create_task(b.prune_inputs(tmp_path, 50))
        await asyncio.sleep(0.5)
        assert not prune.done()  # it waits for the submit's lock
        release.set()
        await submit
        removed = await prune
        for f in (a, b):
            await f.close()
        return removed

    assert asyncio.run(main()) == 0 and Path(old.ref).exists()


def test_pruning_ages_stored_inputs_by_the_shared_folders_clock_not_the_boxs(
        fleet_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The files' mtimes are the shared folder's clock (its file server's): a pruning box whose own
    clock ran hours ahead took a store still being written and inputs stored a moment ago for stale
    (another box's submit then failed), and one whose clock ran behind kept old inputs for as long as
    it was off, the folder filling meanwhile. The age of a file is read on the folder's clock."""
    import os

    from cuzk_mp.daemon.fleet.inputs import INCOMING_PREFIX

    real_time = time.time
    fresh, old = make_inputs(tmp_path, 2)
    old_bytes = Path(old.ref).read_bytes()
    writing = tmp_path / f"{INCOMING_PREFIX}writing"  # another box's store in progress
    writing.write_bytes(b"the first bytes of a witness")

    async def main() -> list[int]:
        a = await connect(fleet_dsn, "a")
        removed = []
        for skew_s in (3 * 3600, -3 * 3600):  # this box's clock three hours ahead, then behind
            store_inputs(old_bytes, tmp_path)
            os.utime(old.ref, (real_time() - 7200, real_time() - 7200))  # two hours old on the folder's clock
            monkeypatch.setattr(time, "time", lambda s=skew_s: real_time() + s)
            try:
                removed.append(await a.prune_inputs(tmp_path, 3600))
            finally:
                monkeypatch.setattr(time, "time", real_time)
        await a.close()
        return removed

    assert asyncio.run(main()) == [1, 1]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([Path(fresh.ref).name, writing.name])


def test_a_prune_whose_removal_outlives_its_lock_leaves_a_new_jobs_inputs_in_place(
        fleet_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A prune removes a stale file under its inputs' lock, but the removal hangs (a hard mount whose
    server went quiet) for longer than the pruning box's stall timeout: the server ends that box's
    transaction, idle for so long, and frees the lock. A submit of the same bytes meanwhile finds the
    file there and queues its job under the lock; then the removal goes through. The job's inputs must
    still be in place: a file taken from its name while the lock may have been lost is put back."""
    import os
    import time

    from cuzk_mp.daemon.fleet.inputs import stage_inputs

    [old] = make_inputs(tmp_path, 1)
    data = Path(old.ref).read_bytes()
    os.utime(old.ref, (time.time() - 100, time.time() - 100))
    taking, queued = threading.Event(), threading.Event()

    def slow(real: Any) -> Any:  # the file's removal (or its rename to another name) hangs until the job is queued
        def op(src: Any, *args: Any, **kw: Any) -> Any:
            if os.fspath(src) == old.ref and not taking.is_set():
                taking.set()
                assert queued.wait(20)
            return real(src, *args, **kw)
        return op

    for name in ("unlink", "remove", "rename", "replace"):
        monkeypatch.setattr(os, name, slow(getattr(os, name)))

    async def main() -> None:
        a = await connect(fleet_dsn, "a")
        b = await connect(fleet_dsn, "b", stall_timeout_s=1.5)  # its transactions end once idle for 1.5 s
        prune = asyncio.create_task(b.prune_inputs(tmp_path, 50))
        assert await asyncio.to_thread(taking.wait, 10)
        await a.submit(None, "x", old.ref, old.sha256, stage=lambda: stage_inputs(data, tmp_path, old))
        queued.set()
        with contextlib.suppress(ResourceError):  # the prune's transaction was ended under it
            await prune
        for f in (a, b):
            await f.close()

    asyncio.run(main())
    assert load_inputs(old.ref, old.sha256) == data
    assert [p.name for p in tmp_path.iterdir()] == [Path(old.ref).name]  # nothing left beside it


def test_a_file_a_prune_set_aside_is_left_to_it_by_another_boxs_prune(
        fleet_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Box b's prune takes a stale file from its name, but the rename hangs past b's stall timeout: the
    server ends b's transaction and frees the lock, and a job is queued with the file meanwhile (its
    client's own reference: nothing refreshes the file's mtime, as where the shared folder's attribute
    cache shows the old one). The rename goes through; before b's failed transaction puts the file
    back, box a prunes the folder. The set-aside file is b's alone: a leaves it, b puts it back, and
    the job's inputs are in place."""
    import os
    import time

    [old] = make_inputs(tmp_path, 1)
    data = Path(old.ref).read_bytes()
    os.utime(old.ref, (time.time() - 100, time.time() - 100))
    taking, queued, renamed, pruned = (threading.Event() for _ in range(4))
    real_rename = os.rename

    def rename(src: Any, dst: Any) -> None:  # b's rename hangs until the job is queued, and a prunes after it
        if os.fspath(src) != old.ref or taking.is_set():
            return real_rename(src, dst)
        taking.set()
        assert queued.wait(20)
        real_rename(src, dst)
        renamed.set()
        assert pruned.wait(20)

    monkeypatch.setattr(os, "rename", rename)

    async def main() -> None:
        a = await connect(fleet_dsn, "a")
        b = await connect(fleet_dsn, "b", stall_timeout_s=1.5)  # its transactions end once idle for 1.5 s
        prune = asyncio.create_task(b.prune_inputs(tmp_path, 50))
        assert await asyncio.to_thread(taking.wait, 10)
        await asyncio.sleep(2.5)  # the server ends b's transaction, idle for its stall timeout
        await a.submit(None, "x", old.ref, old.sha256)
        queued.set()
        assert await asyncio.to_thread(renamed.wait, 10)
        try:
            assert await a.prune_inputs(tmp_path, 50) == 0
        finally:
            pruned.set()
        with pytest.raises(ResourceError):  # b's transaction was ended under it
            await prune
        for f in (a, b):
            await f.close()

    asyncio.run(main())
    assert load_inputs(old.ref, old.sha256) == data
    assert [p.name for p in tmp_path.iterdir()] == [Path(old.ref).name]  # nothing left beside it


def test_a_file_set_aside_by_a_prune_that_never_ended_goes_long_after(
        fleet_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A box killed between setting a file aside and unlinking it leaves the file under its aside name:
    other prunes leave it for LEFTOVER_ASIDE_S (patched to 0 here: the leftover is old), then remove it."""
    from cuzk_mp.daemon.fleet import store
    from cuzk_mp.daemon.fleet.inputs import ASIDE_PREFIX

    leftover = tmp_path / f"{ASIDE_PREFIX}killed-box-0123"
    leftover.write_bytes(b"set aside")

    async def main() -> int:
        async with await connect(fleet_dsn, "a") as a:
            return await a.prune_inputs(tmp_path, 0)

    assert asyncio.run(main()) == 0 and leftover.exists()
    monkeypatch.setattr(store, "LEFTOVER_ASIDE_S", 0.0)
    assert asyncio.run(main()) == 1 and not leftover.exists()


def test_a_submit_holds_no_transaction_while_it_writes_its_inputs(fleet_dsn: str, tmp_path: Path) -> None:
    """Inputs of hundreds of megabytes take a while to write to a shared folder: a submit that wrote
    them inside its transaction held it open (and its inputs' lock) all that time, which the server
    ends once idle for the stall timeout. They are written before the transaction; inside it, they
    only take their place (one rename), under the lock, and pruning still never removes them."""
    from fleet_helpers import query_one

    from cuzk_mp.daemon.fleet.inputs import inputs_ref, stage_inputs

    data = b"inputs being written " * 1000
    inp = inputs_ref(data, tmp_path)
    seen: list[tuple[Any, ...]] = []

    def stage() -> Any:  # the write, slow: what the box's transactions and the inputs' lock look like now
        seen.append(query_one(fleet_dsn, "SELECT count(*) FILTER (WHERE state LIKE 'idle in transaction%'), "
                                         "(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = "
                                         "(SELECT oid FROM pg_database WHERE datname = current_database())) "
                                         "FROM pg_stat_activity WHERE application_name = 'cuzk-fleet a'"))
        return stage_inputs(data, tmp_path, inp)

    async def main() -> str:
        a = await connect(fleet_dsn, "a")
        ref = await a.submit(None, "x", inp.ref, inp.sha256, stage=stage)
        st = await a.status(ref.job_id)
        await a.close()
        return st.state

    assert asyncio.run(main()) == "queued"
    assert seen == [(0, 0)], "a transaction (and the inputs' lock) was held while the inputs were written"
    assert load_inputs(inp.ref, inp.sha256) == data
    assert [p.name for p in tmp_path.iterdir()] == [Path(inp.ref).name]  # no temporary left beside it


def test_pruning_keeps_the_inputs_of_a_queued_job_where_inputs_dir_is_reached_through_a_symlink(
        fleet_dsn: str, tmp_path: Path) -> None:
    """``[fleet] inputs_dir`` names a symlink (a mount linked into place, a /var on another disk):
    pruning lists the folder by that name, and a job's reference may spell the file's path through the
    link's target (as every reference did before it named the folder as configured). A job queued
    longer than ``result_ttl`` (no box holds its key yet) keeps its inputs however its reference
    spells the folder; the inputs of a job pruned with its result go."""
    import os
    import time

    real, link = tmp_path / "real", tmp_path / "inputs"
    real.mkdir()
    link.symlink_to(real)
    finished, waiting = make_inputs(link, 2)
    for path in real.iterdir():
        os.utime(path, (time.time() - 100, time.time() - 100))

    async def main() -> int:
        a = await connect(fleet_dsn, "a")
        ref = await a.submit(None, "x", str(link / Path(finished.ref).name), finished.sha256)
        [c] = await a.claim(["x"], 1)
        assert c.job_id == ref.job_id and await a.complete(c.job_id, b"proof")
        await a.prune(0.0)  # the finished job goes with its result
        await a.submit(None, "x", str(real / Path(waiting.ref).name), waiting.sha256)
        removed = await a.prune_inputs(link, 50)
        await a.close()
        return removed

    assert asyncio.run(main()) == 1
    assert [p.name for p in real.iterdir()] == [Path(waiting.ref).name]


def test_the_partial_file_of_a_store_that_never_ended_goes_once_stale(tmp_path: Path) -> None:
    """A box killed while it wrote a submit's inputs leaves its temporary file in the shared directory;
    pruning takes it once it is as old as stale inputs, never a store still being written."""
    import os
    import time

    from cuzk_mp.daemon.fleet.inputs import INCOMING_PREFIX, remove_stale_inputs, stale_cutoff, stale_inputs
    [stored] = make_inputs(tmp_path, 1)
    left, writing = tmp_path / f"{INCOMING_PREFIX}killed", tmp_path / f"{INCOMING_PREFIX}writing"
    for path in (left, writing):
        path.write_bytes(b"the first bytes of a witness")
    os.utime(left, (time.time() - 100, time.time() - 100))
    cutoff = stale_cutoff(tmp_path, 50)
    assert stale_inputs(tmp_path, cutoff) == [left]
    assert remove_stale_inputs(stale_inputs(tmp_path, cutoff), cutoff) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([Path(stored.ref).name, writing.name])


def test_a_job_is_found_by_its_request_id_and_only_by_its_client(fleet_dsn: str, tmp_path: Path) -> None:
    [inp] = make_inputs(tmp_path, 1)

    async def main() -> None:
        a, b = await connect(fleet_dsn, "a"), await connect(fleet_dsn, "b")
        ref = await a.submit("req-c", "x", inp.ref, inp.sha256, client="alice")
        for box in (a, b):
            for name in (ref.job_id, "req-c"):
                st = await box.status(name, "alice")
                assert (st.job_id, st.client, st.request_id) == (ref.job_id, "alice", "req-c")
                assert (await box.status(name, None)).job_id == ref.job_id  # an admin sees every job
                with pytest.raises(InputError, match="unknown job"):
                    await box.status(name, "bob")
        with pytest.raises(InputError, match="already in use"):
            await b.submit("req-c", "x", inp.ref, inp.sha256, client="bob")
        with pytest.raises(InputError, match="unknown job"):
            await b.cancel("req-c", "bob")
        with pytest.raises(InputError, match="unknown job"):
            await b.await_result("req-c", 0, "bob")
        [c] = await b.claim(["x"], 1)
        assert (c.job_id, c.client) == (ref.job_id, "alice") and c.submitted_at > 0
        waiter = asyncio.ensure_future(a.await_result("req-c", 30, "alice"))  # named by request_id
        await asyncio.sleep(0.2)
        assert await b.complete(c.job_id, b"proof")
        st = await asyncio.wait_for(waiter, 10)
        assert (st.job_id, st.state, st.result) == (ref.job_id, "done", b"proof")
        assert not await a.cancel("req-c", "alice")  # already ended
        for box in (a, b):
            await box.close()

    asyncio.run(main())


def test_job_replies_of_fleet_jobs_in_every_state() -> None:
    import msgspec

    from cuzk_mp.daemon import protocol as P
    from cuzk_mp.daemon.fleet.box import job_reply
    from cuzk_mp.daemon.fleet.models import JobStatus
    from cuzk_mp.pipeline.types import Priority

    def status(state: str, result: bytes | None = None, error: str | None = None) -> JobStatus:
        return JobStatus(job_id="j1", request_id=None, circuit_id="x", state=state, priority=Priority.HIGH,  # type: ignore[arg-type]
                         n_partitions=2, inputs_ref="/i", inputs_sha256="0" * 64, submitted_by="a", client="",
                         box="b", claims=1, attempts=0, submitted_at=1.0, started_at=2.0, finished_at=None,
                         result=result, error=error, error_kind="Cancelled" if state == "cancelled" else None)

    stored = P.JobReply(id=0, job_id="j1.1", circuit_id="x", state="done", priority="HIGH", submitted_at=1.0,
                        partitions=[P.PartitionOut(index=i, state="done", public=["7"]) for i in range(2)])
    done = job_reply(status("done", msgspec.msgpack.encode(stored)), 9)
    assert (done.id, done.job_id, done.state, [p.public for p in done.partitions]) == (9, "j1", "done", [["7"]] * 2)
    running = job_reply(status("running"), 3, timed_out=True)
    assert (running.state, running.timed_out, running.priority) == ("running", True, "HIGH")
    assert [p.state for p in running.partitions] == ["pending", "pending"]
    cancelled = job_reply(status("cancelled", error="cancelled"), 4)
    assert [p.state for p in cancelled.partitions] == ["cancelled"] * 2 and cancelled.error_kind == "Cancelled"
    with pytest.raises(ResourceError, match="cannot be read"):
        job_reply(status("done", b"\xc1 not msgpack"), 5)


def test_fleet_status_takes_the_stall_timeout_of_its_config(tmp_path: Path) -> None:
    """`fleet status --config FILE` judges boxes stale by that fleet's stall timeout (not the
    default 30 s), with the config's DSN or the one --dsn gives."""
    from cuzk_mp.daemon.fleet.cli import _dsn
    from tests.helpers import config_text

    cfg = tmp_path / "cuzk.toml"
    cfg.write_text(config_text(tmp_path, tmp_path / "keys", prefix="cuzk-fs-stall",
                               extra='[fleet]\ndsn = "postgresql://u@127.0.0.1:5/f"\nbox = "a"\n'
                                     'heartbeat_interval = "1s"\nstall_timeout = "6s"\n'))
    args = argparse.Namespace(dsn="", config=cfg)
    assert _dsn(args) == ("postgresql://u@127.0.0.1:5/f", {"stall_timeout_s": 6.0, "heartbeat_interval_s": 1.0})
    args = argparse.Namespace(dsn="postgresql://v@127.0.0.1:6/g", config=cfg)
    assert _dsn(args) == ("postgresql://v@127.0.0.1:6/g", {"stall_timeout_s": 6.0, "heartbeat_interval_s": 1.0})
    assert _dsn(argparse.Namespace(dsn="postgresql://w@h/x", config=None)) == ("postgresql://w@h/x", {})


def test_a_dsn_the_database_refuses_fails_the_start_as_a_config_error_before_the_engine(
        fleet_dsn: str, tmp_path: Path) -> None:
    """A missing database or role is a bad config (exit 2), found before the engine's long start and
    before the journal is made; a database nobody answers for stays an outage (exit 4)."""
    import socket

    from cuzk_mp.cli import exit_code
    from cuzk_mp.daemon.config import resolve as resolve_daemon
    from cuzk_mp.daemon.server import Daemon
    from cuzk_mp.exit_codes import EXIT_INPUT, EXIT_RESOURCES

    base = fleet_dsn.rsplit("/", 1)[0]
    host_port = base.split("@", 1)[1]
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = f"postgresql://cuzk@127.0.0.1:{s.getsockname()[1]}/fleet"
    cases = [(f"{base}/no_such_database", ConfigError, 'database "no_such_database" does not exist'),
             (f"postgresql://no_such_role@{host_port}/postgres", ConfigError, 'role "no_such_role" does not exist'),
             (closed, ResourceError, "cannot connect")]
    for dsn, kind, text in cases:
        with pytest.raises(kind, match=text):
            asyncio.run(connect(dsn, "gpu-a"))
        cfg = resolve_daemon({"daemon": {"listen": f"unix://{tmp_path}/d.sock"},
                              "srs": {"param_cache": str(tmp_path / "cache")},
                              "fleet": {"dsn": dsn, "box": "gpu-a", "inputs_dir": "in", "connect_timeout": "2s"},
                              "circuits": {"syn": {"synthetic": "porep-like", "log_n": 10}}},
                             base=tmp_path, source="d.toml")
        started: list[object] = []

        def engine(*args: object) -> object:
            started.append(args)
            raise AssertionError("the engine must not start")

        with pytest.raises(kind) as e:
            asyncio.run(Daemon(cfg, engine_factory=engine).start())
        assert text in str(e.value) and not started
        assert not cfg.journal_path.exists()
        assert exit_code(e.value)[0] == {ConfigError: EXIT_INPUT, ResourceError: EXIT_RESOURCES}[kind]


def test_a_box_whose_clock_is_off_the_databases_measures_latency_and_answers_on_one_clock(
        fleet_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This box's clock runs an hour ahead of the database's: the job's latency (the metric) is
    the database's queue wait plus the run on the box, and the reply carries the database's
    timestamps, not a finish an hour after the submit."""
    import time
    import types
    from typing import Any, cast

    from cuzk_mp.daemon import protocol as P
    from cuzk_mp.daemon.fleet.box import FleetBox, job_reply

    skew_s = 3600.0
    real_time = time.time
    observed: list[float] = []
    engine, jobs = instant_jobs(observe_job=lambda circuit, state, s: observed.append(s))
    inp = store_inputs(msgspec.msgpack.encode([P.PartitionIn(kind="synthetic", seed=1)]), tmp_path)

    async def main() -> None:
        a = await connect(fleet_dsn, "a")
        ref = await a.submit("req-skew", "x", inp.ref, inp.sha256)
        await asyncio.sleep(0.3)  # a queue wait the database measures
        monkeypatch.setattr(time, "time", lambda: real_time() + skew_s)
        [c] = await a.claim(["x"], 1)
        fleet_cfg = resolve({"dsn": fleet_dsn, "box": "a"})
        box = FleetBox(cast(Any, types.SimpleNamespace(fleet=fleet_cfg, circuits={"x": object()})), engine, jobs)
        out = await box._run(c)
        assert await a.complete(c.job_id, out.result, out.key_digest)
        st = await a.status(ref.job_id)
        await a.close()
        [latency] = observed
        assert 0.3 <= latency < 10, latency
        reply = job_reply(st, 1)
        assert (reply.state, reply.submitted_at, reply.started_at, reply.finished_at) == (
            "done", st.submitted_at, st.started_at, st.finished_at)
        assert reply.finished_at is not None and 0.3 <= reply.finished_at - reply.submitted_at < 10

    asyncio.run(main())


@pytest.mark.parametrize("step_s", [3600.0, -3600.0], ids=["ahead", "back"])
def test_a_claimed_jobs_latency_is_on_the_monotonic_clock_from_its_claim(
        fleet_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step_s: float) -> None:
    """The system clock is stepped an hour while the box loads a claimed job's inputs: the job's
    latency (the metric, the log line) is still the queue wait the database measured, the load, and
    the run, within the time the test saw pass on its own monotonic clock, never an hour more nor
    the queue wait and the load less."""
    import types
    from typing import Any, cast

    from cuzk_mp.daemon import protocol as P
    from cuzk_mp.daemon.fleet import box as box_module
    from cuzk_mp.daemon.fleet.box import FleetBox

    real_time, real_load = time.time, box_module.load_inputs
    observed: list[float] = []
    engine, jobs = instant_jobs(observe_job=lambda circuit, state, s: observed.append(s))
    inp = store_inputs(msgspec.msgpack.encode([P.PartitionIn(kind="synthetic", seed=1)]), tmp_path)
    load_s = 0.2

    def stepping_load(ref: str, sha256: str) -> bytes:
        time.sleep(load_s)  # the read takes a while, and the clock is stepped during it
        monkeypatch.setattr(time, "time", lambda: real_time() + step_s)
        return real_load(ref, sha256)

    monkeypatch.setattr(box_module, "load_inputs", stepping_load)

    async def main() -> None:
        a = await connect(fleet_dsn, "a")
        began = time.monotonic()
        await a.submit("req-step", "x", inp.ref, inp.sha256)
        await asyncio.sleep(0.3)  # a queue wait the database measures
        [c] = await a.claim(["x"], 1)
        fleet_cfg = resolve({"dsn": fleet_dsn, "box": "a"})
        box = FleetBox(cast(Any, types.SimpleNamespace(fleet=fleet_cfg, circuits={"x": object()})), engine, jobs)
        await box._run(c)
        took = time.monotonic() - began
        await a.close()
        [latency] = observed
        assert c.queued_s + load_s <= latency <= took, (latency, c.queued_s, took)

    asyncio.run(main())


def test_a_database_that_takes_the_connection_but_not_the_fleet_fails_the_connect_clearly(
        fleet_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The first connection succeeds, then the database refuses what a box does next: a read-only
    role (or a hot standby) cannot create the fleet's tables in a database that has none, a role
    without CREATE on the schema may not, and a role limited to one connection cannot open the
    LISTEN connection beside its pool.
    Each is the fleet's own error naming the server's reason (a daemon's start exits 4 or 2 on it,
    `fleet status` 3 or 2 with one line), never a driver's exception (a traceback, exit 70)."""
    import uuid

    import psycopg

    from cuzk_mp.cli import exit_code
    from cuzk_mp.daemon.fleet.cli import add_parser
    from cuzk_mp.exit_codes import EXIT_INPUT, EXIT_RESOURCES, EXIT_UNREACHABLE

    db = fleet_dsn.rsplit("/", 1)[1]
    tag = uuid.uuid4().hex[:8]
    read_only, no_create, one_conn = f"ro_{tag}", f"nc_{tag}", f"lim_{tag}"
    with psycopg.connect(fleet_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {read_only} LOGIN")  # type: ignore[arg-type]
        conn.execute(f"ALTER ROLE {read_only} SET default_transaction_read_only = on")  # type: ignore[arg-type]
        conn.execute(f"CREATE ROLE {no_create} LOGIN")  # type: ignore[arg-type]
        conn.execute(f"CREATE ROLE {one_conn} LOGIN CONNECTION LIMIT 1")  # type: ignore[arg-type]
        conn.execute(f"CREATE DATABASE {db}_lim OWNER {one_conn}")  # type: ignore[arg-type]
        conn.execute(f"CREATE DATABASE {db}_nc")  # type: ignore[arg-type]
        conn.execute(f"CREATE DATABASE {db}_ro")  # type: ignore[arg-type]
    base = fleet_dsn.rsplit("/", 1)[0]
    cases = [(f"{base}/{db}_ro".replace("cuzk@", f"{read_only}@"), ResourceError, "read-only transaction"),
             (f"{base}/{db}_nc".replace("cuzk@", f"{no_create}@"), ConfigError, "permission denied"),
             (f"{base}/{db}_lim".replace("cuzk@", f"{one_conn}@"), ResourceError, "too many connections")]
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    try:
        for dsn, kind, text in cases:
            with pytest.raises(kind, match=text) as e:
                asyncio.run(connect(dsn, "gpu-a"))
            assert exit_code(e.value)[0] == {ConfigError: EXIT_INPUT, ResourceError: EXIT_RESOURCES}[kind]
            args = parser.parse_args(["fleet", "status", "--dsn", dsn])
            assert args.func(args) == {ConfigError: EXIT_INPUT, ResourceError: EXIT_UNREACHABLE}[kind]
            err = capsys.readouterr().err
            assert err.startswith("cuzk-mp fleet status: ") and text in err and err.count("\n") == 1, err
    finally:
        with psycopg.connect(fleet_dsn, autocommit=True) as conn:
            for name in (f"{db}_lim", f"{db}_nc", f"{db}_ro"):
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")  # type: ignore[arg-type]
            for role in (read_only, no_create, one_conn):
                conn.execute(f"DROP ROLE IF EXISTS {role}")  # type: ignore[arg-type]


def test_a_box_whose_shared_inputs_folder_is_broken_gives_its_jobs_back_and_claims_again_once_it_is_back(
        fleet_dsn: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """``inputs_dir`` is a link to the shared folder; repointed to an empty folder, it is a share that
    is not mounted on this box. The job the box claims goes back to the queue (no attempt counted), the
    box claims nothing more and says why (one log line, its status document), its submits are refused;
    once the link leads to the share again it runs the jobs by itself. A job whose inputs file is gone
    from a healthy share still fails, once, naming the file."""
    import logging
    import os
    import types
    from typing import Any, cast

    from cuzk_mp.daemon import protocol as P
    from cuzk_mp.daemon.access import Identity
    from cuzk_mp.daemon.fleet.box import FleetBox
    from cuzk_mp.pipeline.types import Priority

    shared, empty, link = tmp_path / "share", tmp_path / "empty", tmp_path / "inputs"
    shared.mkdir()
    empty.mkdir()
    link.symlink_to(shared)

    def point(to: Path) -> None:
        tmp = tmp_path / "link.new"
        tmp.symlink_to(to)
        os.replace(tmp, link)

    engine, jobs = instant_jobs()
    engine.degraded = lambda: False  # type: ignore[attr-defined]
    engine.circuits = types.SimpleNamespace(check_job=lambda spec: None)  # type: ignore[attr-defined]
    jobs.circuits = {"x": cast(Any, types.SimpleNamespace(priority=Priority.NORMAL))}
    data = [msgspec.msgpack.encode([P.PartitionIn(kind="synthetic", seed=i)]) for i in range(3)]
    refs = [store_inputs(d, link) for d in data]
    cfg = resolve({"dsn": fleet_dsn, "box": "b", "inputs_dir": str(link), "heartbeat_interval": "0.2s",
                   "retry_delay": "0s"})
    assert cfg is not None
    box = FleetBox(cast(Any, types.SimpleNamespace(fleet=cfg, circuits={"x": object()})), engine, jobs)
    box._next_load = float("inf")  # no key loading for the backlog here

    def states() -> dict[str, tuple[str, int]]:
        import psycopg
        with psycopg.connect(fleet_dsn) as conn:
            return {r[0]: (r[1], r[2]) for r in conn.execute("SELECT job_id, state, attempts FROM cuzk_fleet_jobs")}

    async def until(check: Any, timeout_s: float = 15.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not check():
            assert asyncio.get_running_loop().time() < deadline, states()
            await asyncio.sleep(0.1)

    async def main() -> None:
        submitter = await connect(fleet_dsn, "a")
        await box.start(["x"])
        try:
            point(empty)  # the share is not mounted on box b any more
            ids = [(await submitter.submit(f"r{i}", "x", r.ref, r.sha256)).job_id for i, r in enumerate(refs)]
            await until(lambda: box.capacity() == 0)
            await asyncio.sleep(1.5)  # several claim rounds
            assert set(states().values()) == {("queued", 0)}, states()
            doc = await box.document()
            assert doc["capacity"] == 0 and "inputs_dir" in doc["paused"] and str(link) in doc["paused"], doc
            with pytest.raises(ResourceError, match="inputs_dir"):
                await box.submit(P.SubmitProof(id=1, circuit_id="x",
                                               partitions=[P.PartitionIn(kind="synthetic", seed=9)]),
                                 Identity(owner="", admin=True))
            assert not list(empty.iterdir())  # nothing stored where no other box sees it
            broken = [r for r in caplog.records if r.levelno >= logging.WARNING and "inputs_dir" in r.getMessage()]
            assert len(broken) == 1, [r.getMessage() for r in broken]
            await asyncio.sleep(0.5)  # a heartbeat records the pause: every box's fleet status shows it
            [b] = [b for b in await submitter.boxes() if b.box == "b"]
            assert b.paused is not None and "no .cuzk-fleet-inputs" in b.paused and b.free_slots == 0, b
            assert f"claims no jobs: {b.paused}" in report.text([b], [])
            assert {g[0]: g[2] for g in report.gauges([b], [])}["cuzk_fleet_box_paused"] == {(("box", "b"),): 1.0}

            point(shared)  # mounted again
            await until(lambda: all(s == ("done", 0) for s in states().values()))
            assert "paused" not in await box.document()
            await asyncio.sleep(0.5)
            assert [b.paused for b in await submitter.boxes() if b.box == "b"] == [None]

            gone = hashlib.sha256(b"never stored").hexdigest()
            lost = await submitter.submit("lost", "x", str(link / f"{gone}.inputs"), gone)
            await until(lambda: states()[lost.job_id][0] != "queued" and states()[lost.job_id][0] != "running")
            st = await submitter.status(lost.job_id)
            assert (st.state, st.error_kind, st.attempts) == ("failed", "InputError", 1), st
            assert st.error is not None and "no such file" in st.error and gone in st.error
            assert len(ids) == 3
        finally:
            await box.stop(0.0)
            await submitter.close()

    with caplog.at_level(logging.INFO, logger="cuzk_mp.daemon.fleet"):
        asyncio.run(main())


def test_the_shared_inputs_folders_marker_tells_a_broken_or_foreign_share(tmp_path: Path) -> None:
    """The marker check behind a box's pause: the fleet's own folder passes; a folder without the
    marker (not mounted here), one whose marker cannot be read (an I/O error, a stale handle) and one
    of another fleet are each named in one line."""
    from cuzk_mp.daemon.fleet.inputs import MARKER_NAME, share_problem, write_marker

    ours = tmp_path / "ours"
    write_marker(ours, "id-1")
    assert share_problem(ours, "id-1") is None
    assert [p.name for p in ours.iterdir()] == [MARKER_NAME]  # no partial file left beside it
    assert "no .cuzk-fleet-inputs in it" in (share_problem(tmp_path / "unmounted", "id-1") or "")
    assert "another fleet" in (share_problem(ours, "id-2") or "")
    unreadable = tmp_path / "unreadable"
    (unreadable / MARKER_NAME).mkdir(parents=True)  # reading it fails as an I/O error would
    problem = share_problem(unreadable, "id-1") or ""
    assert "cannot read its .cuzk-fleet-inputs" in problem and "\n" not in problem


_SHARE_PROBLEM = """
import resource, sys
from pathlib import Path
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from cuzk_mp.daemon.fleet.inputs import share_problem
print(share_problem(Path(sys.argv[1]), "id-1"))
"""


@pytest.mark.parametrize("kind, what", [("fifo", "a FIFO (a named pipe), not a regular file"),
                                        ("device", "a character device, not a regular file")])
def test_a_marker_that_is_no_regular_file_is_named_not_read(tmp_path: Path, kind: str, what: str) -> None:
    """The marker check (a box's start, every heartbeat) read the marker to its end: a FIFO there held a
    worker thread for ever (the box paused, saying only that the check took too long), a device was read
    until memory ran out. It is named in one line, as an unreadable marker is, without waiting on it."""
    import os
    import stat
    import subprocess
    import sys

    from cuzk_mp.daemon.fleet.inputs import MARKER_NAME

    share = tmp_path / "share"
    share.mkdir()
    marker = share / MARKER_NAME
    if kind == "fifo":
        os.mkfifo(marker)
    else:  # a device of its own, as /dev/zero: read to its end, it never ends
        try:
            os.mknod(marker, 0o600 | stat.S_IFCHR, os.makedev(1, 5))
            os.close(os.open(marker, os.O_RDONLY))
        except PermissionError:
            pytest.skip("making or opening a device node needs root and a file system that allows devices")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    try:
        proc = subprocess.run([sys.executable, "-c", _SHARE_PROBLEM, str(share)], env=env, capture_output=True,
                              text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the marker check did not end within 60 s")
    line = proc.stdout.strip()
    assert proc.returncode == 0 and line.startswith(f"[fleet] inputs_dir {share}: cannot read its {MARKER_NAME}: "), \
        (proc.returncode, proc.stdout, proc.stderr[-2000:])
    assert what in line and "\n" not in line


def test_the_daemons_early_dsn_check_finds_a_role_that_may_not_create_the_fleets_tables(fleet_dsn: str) -> None:
    """The check a daemon makes right after its instance lock, before the engine's long start: a
    role without CREATE on the schema of a database that has no fleet tables yet is a ConfigError
    naming ``fleet.dsn`` (exit 2), a read-only one a ResourceError (exit 4), as the join itself would
    say minutes later; a database whose tables are current needs no CREATE (a role that may write
    rows joins)."""
    import uuid

    import psycopg

    from cuzk_mp.daemon.fleet.store import check_joinable

    db = fleet_dsn.rsplit("/", 1)[1]
    tag = uuid.uuid4().hex[:8]
    read_only, no_create = f"ro_{tag}", f"nc_{tag}"
    with psycopg.connect(fleet_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {read_only} LOGIN")  # type: ignore[arg-type]
        conn.execute(f"ALTER ROLE {read_only} SET default_transaction_read_only = on")  # type: ignore[arg-type]
        conn.execute(f"CREATE ROLE {no_create} LOGIN")  # type: ignore[arg-type]
        conn.execute(f"CREATE DATABASE {db}_nc")  # type: ignore[arg-type]
    base = fleet_dsn.rsplit("/", 1)[0]
    empty_nc = f"{base}/{db}_nc".replace("cuzk@", f"{no_create}@")
    try:
        with pytest.raises(ConfigError, match=r"fleet\.dsn: .*permission denied.*CREATE"):
            asyncio.run(check_joinable(resolve({"dsn": empty_nc, "box": "a"})))  # type: ignore[arg-type]
        with pytest.raises(ResourceError, match="read-only transaction"):
            asyncio.run(check_joinable(resolve({"dsn": fleet_dsn.replace("cuzk@", f"{read_only}@"),
                                                "box": "a"})))  # type: ignore[arg-type]

        async def joined_then_checked() -> None:
            await (await connect(fleet_dsn, "a", register=False)).close()  # the tables, current
            with psycopg.connect(fleet_dsn, autocommit=True) as conn:
                conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public "  # type: ignore[arg-type]
                             f"TO {no_create}")
            await check_joinable(resolve({"dsn": fleet_dsn.replace("cuzk@", f"{no_create}@"),
                                          "box": "a"}))  # type: ignore[arg-type]
        asyncio.run(joined_then_checked())
    finally:
        with psycopg.connect(fleet_dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {db}_nc WITH (FORCE)")  # type: ignore[arg-type]
            conn.execute(f"DROP OWNED BY {no_create}")  # type: ignore[arg-type]
            for role in (read_only, no_create):
                conn.execute(f"DROP ROLE IF EXISTS {role}")  # type: ignore[arg-type]


def test_a_hung_read_of_the_shared_folder_pauses_the_box_without_piling_up_threads(
        fleet_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hard NFS mount whose server is gone: reading the marker never returns. The box is paused
    after the check's time limit, and later checks wait on that same read rather than each leave one
    more worker thread stuck (the daemon's other thread work shares that pool); once the read
    returns, the box claims again."""
    import threading
    import types
    from typing import Any, cast

    from cuzk_mp.daemon.fleet import box as box_module
    from cuzk_mp.daemon.fleet.box import FleetBox
    from cuzk_mp.daemon.fleet.inputs import share_problem

    release, reads = threading.Event(), []

    def hung(folder: Path, share_id: str) -> str | None:
        reads.append(folder)
        release.wait(30)
        return share_problem(folder, share_id)

    engine, jobs = instant_jobs()
    cfg = resolve({"dsn": fleet_dsn, "box": "b", "inputs_dir": str(tmp_path / "share")})
    assert cfg is not None
    box = FleetBox(cast(Any, types.SimpleNamespace(fleet=cfg, circuits={})), engine, jobs)

    async def main() -> None:
        box.fleet = await connect(fleet_dsn, "b", register=False)
        try:
            assert await box.check_share(tmp_path / "share") is None  # marks the folder
            monkeypatch.setattr(box_module, "share_problem", hung)
            monkeypatch.setattr(box_module, "SHARE_CHECK_S", 0.2)
            for _ in range(3):
                assert "took longer than 0.2 s" in (await box.check_share(tmp_path / "share") or "")
            assert len(reads) == 1 and box.paused is not None
            release.set()
            await asyncio.sleep(0.1)
            assert await box.check_share(tmp_path / "share") is None and box.paused is None
        finally:
            release.set()
            await box.fleet.close()

    asyncio.run(main())


def test_a_read_of_inputs_that_hangs_gives_the_job_back(
        fleet_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hard NFS mount whose server is gone: reading a claimed job's inputs never returns. The box
    renews the claims of the jobs it runs at every heartbeat, so it held this one for as long as the
    mount hung and no other box could run it. Once the read has taken the share check's time limit and
    the check finds the share broken too, the job goes back to the queue (ShareUnavailable: released,
    no attempt counted)."""
    import threading
    import types
    from typing import cast

    from cuzk_mp.daemon.fleet import box as box_module
    from cuzk_mp.daemon.fleet.box import FleetBox
    from cuzk_mp.daemon.fleet.inputs import ShareUnavailable

    share = tmp_path / "share"
    engine, jobs = instant_jobs()
    cfg = resolve({"dsn": fleet_dsn, "box": "b", "inputs_dir": str(share)})
    assert cfg is not None
    box = FleetBox(cast(Any, types.SimpleNamespace(fleet=cfg, circuits={"x": object()})), engine, jobs)
    hang = threading.Event()

    def hung(*_: object) -> None:
        hang.wait(30)  # then: the marker is fine, and the inputs' read was given up on

    async def main() -> float:
        box.fleet = await connect(fleet_dsn, "b")
        try:
            assert await box.check_share(share) is None  # marks the folder
            [inp] = make_inputs(share, 1)
            await box.fleet.submit(None, "x", inp.ref, inp.sha256)
            [c] = await box.fleet.claim(["x"], 1)
            monkeypatch.setattr(box_module, "load_inputs", hung)
            monkeypatch.setattr(box_module, "share_problem", hung)
            monkeypatch.setattr(box_module, "SHARE_CHECK_S", 0.2)
            t0 = time.monotonic()
            with pytest.raises(ShareUnavailable, match="took longer than 0.2 s"):
                await asyncio.wait_for(box._run(c), 10)
            return time.monotonic() - t0
        finally:
            hang.set()
            await box.fleet.close()

    assert asyncio.run(main()) < 2.0


def test_where_a_jobs_attempts_failed_is_shown(fleet_dsn: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The boxes a job failed on (``failed_on``) were in the database alone: ``fleet status`` (text and
    --json) lists the unfinished jobs that failed somewhere with those boxes, a fleet job's JobReply
    names them (and a reply without any encodes as before), and each box counts the failed runs of its
    own, by circuit and error kind, in ``cuzk_fleet_job_failures_total``."""
    import types
    from typing import cast

    from fleet_helpers import worker

    from cuzk_mp.daemon import protocol as P
    from cuzk_mp.daemon.cli import _summary
    from cuzk_mp.daemon.fleet.box import FleetBox, job_reply
    from cuzk_mp.daemon.fleet.cli import add_parser
    from cuzk_mp.errors import ProofError

    inputs = make_inputs(tmp_path, 3)

    async def main() -> tuple[list[Any], list[Any], Any]:
        a = await connect(fleet_dsn, "gpu-a", retry_delay_s=600.0)
        ids = [(await a.submit(None, "x", i.ref, i.sha256)).job_id for i in inputs[:2]]
        bad = {ids[0]: ProofError("the proof does not verify"), ids[1]: InputError("not a witness")}

        async def run_job(c):  # type: ignore[no-untyped-def]
            raise bad[c.job_id]

        w = worker(a, run_job, resident=lambda: ["x"], capacity=lambda: 2, poll_s=0.1)
        stop = asyncio.Event()
        task = asyncio.create_task(w.run(stop))
        while w.failed < 2 or w.running:
            await asyncio.sleep(0.05)
        stop.set()
        await task
        await a.submit(None, "x", inputs[2].ref, inputs[2].sha256)  # queued, never failed
        retrying = await a.retrying()
        statuses = [await a.status(j) for j in ids]
        await a.close()
        return retrying, statuses, w

    retrying, (retried, failed), w = asyncio.run(main())
    assert [(st.job_id, st.state, st.attempts, st.failed_on) for st in retrying] == [
        (retried.job_id, "queued", 1, ("gpu-a",))]
    assert (failed.state, failed.failed_on) == ("failed", ("gpu-a",))

    reply = job_reply(failed, 5)
    assert reply.failed_on == ["gpu-a"]
    assert P.decode_reply(P.encode(reply)) == reply
    assert _summary(reply)["failed_on"] == ["gpu-a"]  # what `client await` prints
    never = job_reply(dataclasses.replace(failed, failed_on=()), 5)
    assert b"failed_on" not in P.encode(never) and "failed_on" not in _summary(never)  # as before: left out

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["fleet", "status", "--dsn", fleet_dsn, "--json"])
    assert args.func(args) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["retrying"] == [{"job_id": retried.job_id, "circuit": "x", "state": "queued", "attempts": 1,
                                  "failed_on": ["gpu-a"], "error_kind": "ProofError",
                                  "error": "the proof does not verify"}]
    args = parser.parse_args(["fleet", "status", "--dsn", fleet_dsn])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    (line,) = [ln for ln in out.splitlines() if retried.job_id in ln]
    assert "gpu-a" in line and "ProofError" in line

    box = FleetBox(cast(Any, types.SimpleNamespace(fleet=FleetConfig(dsn=fleet_dsn, box="gpu-a"), circuits={})),
                   *instant_jobs())
    box.worker = w
    text = DaemonMetrics().render(Scrape(counts=box.counters()))
    assert 'cuzk_fleet_job_failures_total{box="gpu-a",circuit="x",kind="ProofError"} 1.0' in text
    assert 'cuzk_fleet_job_failures_total{box="gpu-a",circuit="x",kind="InputError"} 1.0' in text
    assert "# TYPE cuzk_fleet_job_failures_total counter" in text


def test_a_box_stops_when_its_share_check_swallowed_the_cancel(fleet_dsn: str, tmp_path: Path) -> None:
    """Python 3.11's asyncio.wait_for returns the result where the read it waits on ends as its task is
    cancelled, swallowing the cancel: the share check a stopping box cancels then went on checking every
    heartbeat interval, and the stop, waiting for it, never left the fleet (a SIGTERM drain hung)."""
    import types
    from typing import cast

    from cuzk_mp.daemon.fleet.box import FleetBox

    engine, jobs = instant_jobs()
    engine.degraded = lambda: False  # type: ignore[attr-defined]
    cfg = resolve({"dsn": fleet_dsn, "box": "b", "inputs_dir": str(tmp_path / "share"),
                   "heartbeat_interval": "0.2s"})
    assert cfg is not None
    box = FleetBox(cast(Any, types.SimpleNamespace(fleet=cfg, circuits={"x": object()})), engine, jobs)
    box._next_load = float("inf")  # no key loading for the backlog here

    async def main() -> None:
        await box.start(["x"])
        checking = asyncio.Event()

        async def swallowing(folder: Path) -> str | None:
            checking.set()
            with contextlib.suppress(asyncio.CancelledError):  # as wait_for does when the read just ended
                await asyncio.sleep(30)
            return None

        box.check_share = swallowing  # type: ignore[method-assign]
        await asyncio.wait_for(checking.wait(), 10)
        t0 = time.monotonic()
        await asyncio.wait_for(box.stop(0.0), 10)  # (its timeout's cancel ends the check: no error here)
        assert time.monotonic() - t0 < 5.0

    asyncio.run(main())


def _share_box(tmp_path: Path) -> Any:
    """A FleetBox with ``inputs_dir`` and a stand-in for its fleet (no database: the share id is given)."""
    import types
    from typing import cast

    from cuzk_mp.daemon.fleet.box import FleetBox

    cfg = FleetConfig(dsn="postgresql://cuzk@db/fleet", box="a", inputs_dir=tmp_path)
    box = FleetBox(cast(Any, types.SimpleNamespace(fleet=cfg, circuits={})), object(), object())
    box.fleet = cast(Any, types.SimpleNamespace(paused=None))
    return box


def test_a_cancel_that_comes_as_a_share_check_ends_is_not_lost(tmp_path: Path) -> None:
    """The box's stop (or a job's abort) cancels a check of the shared folder's marker in the moment the
    read on its thread ends: the check ends cancelled. Python 3.11's ``asyncio.wait_for`` over a shielded
    read returned the read's result there, and the check went on as if nothing had been asked."""
    box = _share_box(tmp_path)
    box._share_id = "share"
    read: Any = None

    def read_share(folder: Path, share_id: str) -> asyncio.Future[str | None]:
        nonlocal read
        read = asyncio.get_running_loop().create_future()
        return read

    box._read_share = read_share

    async def main() -> bool:
        task = asyncio.ensure_future(box.check_share(tmp_path))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not task.done() and read is not None
        read.set_result(None)
        task.cancel()
        await asyncio.wait({task})
        return task.cancelled()

    assert asyncio.run(main())


def test_a_cancel_that_comes_as_a_marker_write_ends_is_not_lost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first box of a fleet writes the shared folder's marker; a cancel that comes as that write ends
    on its thread ends the check cancelled, not with the marker's id as if nothing had been asked."""
    from cuzk_mp.daemon.fleet import box as box_module

    box = _share_box(tmp_path)
    write: Any = None
    real_on_share = box_module.on_share

    async def share_id(proposed: str | None = None) -> str | None:
        return proposed

    def on_share(fn: Any, *args: Any) -> Any:
        nonlocal write
        if fn is not box_module.write_marker:
            return real_on_share(fn, *args)
        write = asyncio.get_running_loop().create_future()
        return write

    box.fleet.share_id = share_id
    monkeypatch.setattr(box_module, "on_share", on_share)

    async def main() -> bool:
        task = asyncio.ensure_future(box._read_share_id(box.fleet))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not task.done() and write is not None
        write.set_result(None)
        task.cancel()
        await asyncio.wait({task})
        return task.cancelled()

    assert asyncio.run(main())


def test_a_failed_run_whose_record_waits_for_the_database_counts_once(fleet_dsn: str, tmp_path: Path) -> None:
    """A run fails while the database does not answer: the box tries to record the failure again a
    few times, and the run counts once in its failed runs, and once in its failures metric once recorded."""
    from fleet_helpers import worker

    from cuzk_mp.errors import ProofError

    [inp] = make_inputs(tmp_path, 1)

    async def main() -> Any:
        a = await connect(fleet_dsn, "gpu-a", retry_delay_s=600.0)
        job = await a.submit(None, "x", inp.ref, inp.sha256)
        real_fail, tries = a.fail, []

        async def fail(*args: Any, **kw: Any) -> Any:  # the database is away for the first two tries
            tries.append(args)
            if len(tries) <= 2:
                raise ResourceError("fleet: database postgresql://cuzk@db/fleet: OperationalError: gone")
            return await real_fail(*args, **kw)

        a.fail = fail  # type: ignore[method-assign]

        async def run_job(c):  # type: ignore[no-untyped-def]
            raise ProofError("the proof does not verify")

        w = worker(a, run_job, resident=lambda: ["x"], capacity=lambda: 1, poll_s=0.1)
        stop = asyncio.Event()
        task = asyncio.create_task(w.run(stop))
        while len(tries) < 3 or w.running:
            await asyncio.sleep(0.05)
        stop.set()
        await task
        st = await a.status(job.job_id)
        await a.close()
        return w, st

    w, st = asyncio.run(main())
    assert (st.state, st.attempts) == ("queued", 1)
    assert w.failed == 1 and dict(w.failures) == {("x", "ProofError"): 1}


def test_a_box_prunes_no_inputs_from_a_folder_that_is_not_its_fleets_share(fleet_dsn: str, tmp_path: Path) -> None:
    """A box whose ``inputs_dir`` leads to the shared folder of another fleet (its marker holds another
    id) or to a folder the share is not mounted on claims nothing there; its pruning must not remove
    what is stored there either: no job of its own fleet names those files, so every one of them older
    than ``result_ttl`` went, the other fleet's queued jobs' inputs with them."""
    import os
    import types
    from typing import cast

    from cuzk_mp.daemon.fleet.box import FleetBox
    from cuzk_mp.daemon.fleet.inputs import write_marker

    share = tmp_path / "share"
    write_marker(share, "another-fleet")
    [theirs] = make_inputs(share, 1)
    os.utime(theirs.ref, (time.time() - 100, time.time() - 100))
    cfg = FleetConfig(dsn=fleet_dsn, box="a", inputs_dir=share)
    engine, jobs = instant_jobs()
    box = FleetBox(cast(Any, types.SimpleNamespace(fleet=cfg, circuits={})), engine, jobs)

    async def main() -> None:
        box.fleet = await connect(fleet_dsn, "a")
        try:
            assert await box.fleet.share_id("this-fleet") == "this-fleet"
            await box.prune(50)
            assert load_inputs(theirs.ref, theirs.sha256)  # the other fleet's file is there
            assert box.paused is not None and "another fleet" in box.paused
        finally:
            await box.fleet.close()

    asyncio.run(main())
