"""Shared helpers for the pipeline tests (no tests here): a result collector, the test key, oracles.

The synthetic circuit's dev key lives in ``.cache/pipeline-test-keys`` (git-ignored)
and is rebuilt by :func:`ensure_synthetic_key` only when the generator changes.
Proofs are checked against an independent verifier (the zkey's verification
key, pairing check in arkworks), public signals against the synthetic
generator's own witness.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from cuzk_mp.pipeline.types import JobResult, PartitionResult

REPO = Path(__file__).resolve().parent.parent
KEY_CACHE = REPO / ".cache" / "pipeline-test-keys"
LOG_N = 10  # the smallest porep-like circuit: fast on the 2-core CI machine


def prefix_for(tag: str) -> str:
    """A per-run shm prefix (so concurrent test runs on one machine never collide)."""
    return f"cuzk-t{tag}-{os.getpid()}"


class Collector:
    """Collects engine callbacks; :meth:`wait` blocks until a job is reported."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.jobs: dict[str, JobResult] = {}
        self.partitions: list[tuple[str, PartitionResult]] = []
        self.threads: set[str] = set()

    def job(self, result: JobResult) -> None:
        """on_job_done."""
        with self.cond:
            self.threads.add(threading.current_thread().name)
            self.jobs[result.job_id] = result
            self.cond.notify_all()

    def partition(self, job_id: str, result: PartitionResult) -> None:
        """on_partition_done."""
        with self.cond:
            self.threads.add(threading.current_thread().name)
            self.partitions.append((job_id, result))

    def wait(self, job_id: str, timeout: float = 180.0) -> JobResult:
        """The job's result, once reported (AssertionError after ``timeout``)."""
        with self.cond:
            assert self.cond.wait_for(lambda: job_id in self.jobs, timeout), f"job {job_id} not done in {timeout} s"
            return self.jobs[job_id]


def synthetic_key() -> tuple[Path, Path]:
    """(zkey, r1cs) of porep-like 2^LOG_N in the test key cache, keyed by snarkjs when it can be.

    With the node tools installed, the zkey comes from snarkjs ``groth16 setup`` on
    the oracle's 2^10 ptau (plus one contribution): a key made outside cuzk-mp. It
    is put into the cache under the names :func:`ensure_synthetic_key` uses, next
    to the generator's r1cs, so the engine's own lookup finds it (the r1cs bytes
    match) and runs no setup. Without the tools, ensure_synthetic_key makes the
    key with cuzk-mp's dev setup, so the pipeline tests still run.
    """
    from cuzk_mp.circuits.synthetic import PorepLike
    from cuzk_mp.formats.r1cs import write_r1cs
    from cuzk_mp.pipeline.keys import ensure_synthetic_key, synthetic_key_paths

    from tests.oracle import _ORACLE, groth16_setup, tools_missing

    if tools_missing() is not None:
        return ensure_synthetic_key("porep-like", LOG_N, KEY_CACHE, "cpu")
    zkey, r1cs = synthetic_key_paths("porep-like", LOG_N, KEY_CACHE)
    KEY_CACHE.mkdir(parents=True, exist_ok=True)
    with open(KEY_CACHE / f"porep-like-{LOG_N}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with tempfile.TemporaryDirectory(dir=KEY_CACHE) as tmp:
            fresh = Path(tmp) / "c.r1cs"
            write_r1cs(fresh, PorepLike(LOG_N).r1cs())
            if not (zkey.exists() and r1cs.exists() and fresh.read_bytes() == r1cs.read_bytes()):
                made = groth16_setup(fresh, _ORACLE.ptau(), Path(tmp) / "k.zkey")
                os.replace(fresh, r1cs)
                os.replace(made, zkey)
    return ensure_synthetic_key("porep-like", LOG_N, KEY_CACHE, "cpu")


class ProofChecker:
    """Independent checks of pipeline output for the synthetic circuit."""

    def __init__(self, zkey_path: Path) -> None:
        from cuzk_mp.circuits.synthetic import PorepLike
        from cuzk_mp.formats.zkey import read_zkey
        from cuzk_mp.groth16.keys import prepare_vk, vk_from_zkey

        with read_zkey(zkey_path) as zkey:
            self.pvk = prepare_vk(vk_from_zkey(zkey))
            self.n_public = zkey.n_public
        self.circuit = PorepLike(LOG_N)

    def expected_public(self, seed: int, partition: int) -> list[int]:
        """w[1..n_public] of the generator's own witness."""
        from cuzk_mp.algebra.field import limbs_to_ints

        w = self.circuit.witness(seed, partition)
        return limbs_to_ints(w[1 : self.n_public + 1])

    def verifies(self, public: list[int], proof: Any) -> bool:
        """The pairing check with the zkey's verification key."""
        from cuzk_mp.groth16.verifier import verify

        return bool(verify(self.pvk, public, proof))


def wait_until(predicate: Any, timeout: float = 120.0, interval: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy; returns it (AssertionError on timeout)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")


def main(ctx: Any, payload: Any) -> None:
    """A stand-in child role (``module="tests.test_pipeline_support"``): reports what the bootstrap set up."""
    import sys

    from cuzk_mp.pipeline import messages as msg

    ctx.send(msg.Ready(os.getpid(), ctx.name, {
        "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "numba_threads": os.environ.get("NUMBA_NUM_THREADS"),
        "cupy_imported": int("cupy" in sys.modules), "payload": str(payload)}))
    ctx.stopping.wait(30)
