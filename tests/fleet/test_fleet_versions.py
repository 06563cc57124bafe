"""The fleet's database across versions: boxes are upgraded one at a time, so a database written by an
earlier release (with jobs queued, running and done) is migrated under its live rows, and a box of an
earlier release keeps reading what the newer boxes write.

The earlier releases are not installed here; their side is written out in this file. Their schema
(version 2: no ``input_bytes``, no ``stall_timeout_s``, no ``key_digest``, no ``failed_on``, no ``paused``,
no ``loading``, no ``loading_since``, no ``load_limit_s``) is made by removing what later versions added
from a database this one created, and their reading of a stored result is a JobReply decoded strictly: a
field they do not know makes the result unreadable to them (``REPLY_FIELDS_BEFORE_KEY_DIGEST``)."""

from __future__ import annotations

import asyncio
import time
import types
from pathlib import Path
from typing import Any, cast

import msgspec
from fleet_helpers import STALLING, connect, instant_jobs, make_inputs, query_one, worker

from cuzk_mp.daemon import protocol as P
from cuzk_mp.daemon.fleet.schema import SCHEMA_VERSION
from cuzk_mp.daemon.fleet.inputs import store_inputs
from tests.helpers import REPLY_FIELDS_BEFORE_KEY_DIGEST

# What the schema of the earlier releases lacks (version 2), removed from this version's tables.
TO_SCHEMA_2 = """
ALTER TABLE cuzk_fleet_jobs DROP COLUMN input_bytes;
ALTER TABLE cuzk_fleet_jobs DROP COLUMN IF EXISTS key_digest;
ALTER TABLE cuzk_fleet_jobs DROP COLUMN IF EXISTS failed_on;
ALTER TABLE cuzk_fleet_boxes DROP COLUMN stall_timeout_s;
ALTER TABLE cuzk_fleet_boxes DROP COLUMN IF EXISTS paused;
ALTER TABLE cuzk_fleet_boxes DROP COLUMN IF EXISTS loading;
ALTER TABLE cuzk_fleet_boxes DROP COLUMN IF EXISTS loading_since;
ALTER TABLE cuzk_fleet_boxes DROP COLUMN IF EXISTS load_limit_s;
DROP INDEX IF EXISTS cuzk_fleet_jobs_inputs;
DROP INDEX IF EXISTS cuzk_fleet_jobs_inputs_sha256;
DROP INDEX IF EXISTS cuzk_fleet_jobs_unfinished;
UPDATE cuzk_fleet_meta SET value = '2' WHERE key = 'schema_version';
"""


def _done_reply(key_digest: str | None = None) -> P.JobReply:
    return P.JobReply(id=0, job_id="", circuit_id="x", state="done", priority="NORMAL",
                      partitions=[P.PartitionOut(index=0, state="done", proof={"pi_a": ["1"]}, public=["7"])],
                      submitted_at=1.0, started_at=2.0, finished_at=3.0, key_digest=key_digest)


def test_a_database_of_an_earlier_release_migrates_under_its_live_rows(fleet_dsn: str, tmp_path: Path) -> None:
    """Queued, running (its box killed) and done jobs of the schema-2 release: after a box of this
    release joins, the done job's result is served, the queued job is claimed, and the running one
    is taken over once its claim lapses, the killed box recorded as one it failed on."""
    import psycopg

    from cuzk_mp.daemon.fleet.box import job_reply

    inputs = make_inputs(tmp_path, 3)

    async def main() -> None:
        old = await connect(fleet_dsn, "old")
        done = await old.submit("done", "x", inputs[0].ref, inputs[0].sha256)
        running = await old.submit("running", "x", inputs[1].ref, inputs[1].sha256)
        queued = await old.submit("queued", "x", inputs[2].ref, inputs[2].sha256)
        claimed = {c.job_id for c in await old.claim(["x"], 2)}
        assert claimed == {done.job_id, running.job_id}
        assert await old.complete(done.job_id, msgspec.msgpack.encode(_done_reply()))
        old.forget(running.job_id)  # its box is killed: the claim stays until it lapses
        await old.close()
        async with await psycopg.AsyncConnection.connect(fleet_dsn, autocommit=True) as conn:
            for statement in TO_SCHEMA_2.split(";"):
                if statement.strip():
                    await conn.execute(statement)

        new = await connect(fleet_dsn, "new", **STALLING)
        assert query_one(fleet_dsn, "SELECT value FROM cuzk_fleet_meta WHERE key = 'schema_version'") == (
            str(SCHEMA_VERSION),)
        reply = job_reply(await new.status(done.job_id), 1)
        assert reply.state == "done" and reply.partitions[0].public == ["7"] and reply.key_digest is None
        [c] = await new.claim(["x"], 2)
        assert c.job_id == queued.job_id and (await new.status(queued.job_id)).failed_on == ()
        deadline = time.monotonic() + 20
        while not (again := await new.claim(["x"], 1)):
            assert time.monotonic() < deadline, "the killed box's claim never lapsed"
            await asyncio.sleep(0.5)
        assert [a.job_id for a in again] == [running.job_id] and again[0].attempts == 1
        assert (await new.status(running.job_id)).failed_on == ("old",)
        await new.close()

    asyncio.run(main())


def test_a_result_this_release_writes_is_read_by_an_earlier_box(fleet_dsn: str, tmp_path: Path) -> None:
    """A done job's reply names its key (key_digest); the result a box of this release stores must
    still decode in a box of an earlier release (it answers for every job of the fleet), while this
    release's boxes answer with the key_digest."""
    from cuzk_mp.daemon.fleet.box import FleetBox, job_reply

    digest = "ab" * 16
    engine, jobs = instant_jobs(key_digest=digest)
    inp = store_inputs(msgspec.msgpack.encode([P.PartitionIn(kind="synthetic", seed=1)]), tmp_path)

    async def main() -> None:
        from cuzk_mp.daemon.config_file import parse_duration
        from cuzk_mp.daemon.fleet.config import FleetSection, resolve_fleet

        a = await connect(fleet_dsn, "a")
        ref = await a.submit("req", "x", inp.ref, inp.sha256)
        cfg = resolve_fleet(msgspec.convert({"dsn": fleet_dsn, "box": "a"}, FleetSection), source="cfg.toml",
                            base=Path("/etc/cuzk"), duration=parse_duration)
        box = FleetBox(cast(Any, types.SimpleNamespace(fleet=cfg, circuits={"x": object()})), engine, jobs)
        stop = asyncio.Event()
        task = asyncio.create_task(worker(a, box._run, resident=lambda: ["x"], capacity=lambda: 1).run(stop))
        st = await a.await_result(ref.job_id, 20)
        stop.set()
        await task
        await a.close()
        assert st.state == "done" and st.result is not None
        stored = msgspec.msgpack.decode(st.result)
        assert set(stored) <= REPLY_FIELDS_BEFORE_KEY_DIGEST, set(stored) - REPLY_FIELDS_BEFORE_KEY_DIGEST
        reply = job_reply(st, 1)
        assert reply.state == "done" and reply.key_digest == digest and reply.partitions[0].public == ["7"]

    asyncio.run(main())
