"""The daemon over a real engine whose prover keeps dying before READY: /healthz turns 503 naming
the cause, GetStatus and the metrics say why, a Prove fails at once with the cause instead of
waiting for its timeout, and everything recovers once the process starts again."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

from cuzk_mp.daemon import config as C
from cuzk_mp.daemon.client import AsyncClient, synthetic_partitions
from cuzk_mp.daemon.server import Daemon
from tests.helpers import KEY_CACHE, check_proofs, parse_prometheus, prefix_for, shm_leftovers


def _healthz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


async def _until(predicate, timeout: float) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < end, "condition not met in time"
        await asyncio.sleep(0.2)


def test_crash_loop_is_reported_and_jobs_fail_with_the_cause(tmp_path: Path, free_port: int,
                                                            test_key: tuple) -> None:
    prefix = prefix_for("dloop")
    cfg = C.resolve({
        "daemon": {"listen": f"unix://{tmp_path}/d.sock", "status_listen": f"127.0.0.1:{free_port}",
                   "journal": str(tmp_path / "journal.sqlite")},
        "srs": {"param_cache": str(KEY_CACHE)},
        "memory": {"total_budget": "16GiB", "safety_margin": "1GiB"},
        "synthesis": {"partition_workers": 1}, "pipeline": {"ring_slots": 2, "shm_prefix": prefix},
        "gpus": {"backend": "cpu", "devices": [0], "gpu_workers_per_device": 1},
        "circuits": {"syn": {"synthetic": "porep-like", "log_n": 10}},
    }, base=tmp_path, source="test.toml")

    async def main() -> None:
        d = Daemon(cfg)
        await d.start()
        try:
            assert await asyncio.to_thread(_healthz, free_port) == (200, "ok\n")
            prover = d.engine.sup.children["cuzk-prover-0"]
            real_module, prover.spec.module = prover.spec.module, "tests.crashing_role"
            os.kill(prover.handle.pid, signal.SIGKILL)

            async def unhealthy() -> bool:
                return (await asyncio.to_thread(_healthz, free_port))[0] == 503

            await _until(unhealthy, 60)
            code, text = await asyncio.to_thread(_healthz, free_port)
            assert code == 503 and text.startswith("degraded: ") and "cuzk-prover-0" in text
            async with await AsyncClient.connect(str(cfg.listen)) as c:
                st = await c.status()
                assert st["daemon"]["state"] == "running" and st["engine"]["degraded"][0]["role"] == "prover"
                samples = parse_prometheus(await c.metrics())
                assert samples[("cuzk_degraded", (("role", "prover"),))] == 1
                t0 = time.monotonic()
                r = await c.prove("syn", synthetic_partitions(1), timeout_s=120)
                assert r.state == "failed" and not r.timed_out and time.monotonic() - t0 < 30
                assert r.error_kind == "WorkerDied" and "degraded" in (r.error or "")
                assert "cuzk-prover-0" in (r.partitions[0].error or "")
                prover.spec.module = real_module  # the next restart starts for real

                async def healthy() -> bool:
                    return (await asyncio.to_thread(_healthz, free_port))[0] == 200

                await _until(healthy, 120)
                ok = await c.prove("syn", synthetic_partitions(1), timeout_s=120)
                assert ok.state == "done"
                check_proofs(await c.verification_key("syn"), ok)
                samples = parse_prometheus(await c.metrics())
                assert samples[("cuzk_degraded", (("role", "prover"),))] == 0
                assert samples[("cuzk_engine_process_restarts_total", (("role", "prover"),))] >= 4
        finally:
            await d.stop()

    asyncio.run(main())
    assert shm_leftovers(prefix) == []
