"""A damaged proving key through the whole engine: which part the failure blames.

The porep-like 2^10 test key with its H points in reverse order (valid points, wrong places) is
registered twice on a CPU engine: with the circuit's r1cs, and without it. A satisfying witness
proves to a proof that fails its self-check either way. With the r1cs the synthesis worker checked
the witness, so the partition's error names the key alone; without it the witness is left in doubt
too (the messages of a one-shot ``groth16 prove`` with and without --r1cs).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from cuzk_mp.formats.wtns import wtns_bytes
from cuzk_mp.formats.zkey import read_zkey, write_zkey
from cuzk_mp.pipeline.engine import Engine
from cuzk_mp.pipeline.shm_names import shm_entries
from cuzk_mp.pipeline.types import CircuitSpec, EngineConfig, JobSpec, PartitionInput
from tests.helpers import KEY_CACHE, Collector, ProofChecker, prefix_for


def test_a_damaged_key_is_named_where_synthesis_checked_the_witness(
        tmp_path: Path, test_key: tuple[Path, Path], checker: ProofChecker) -> None:
    zkey_path, r1cs_path = test_key
    damaged = tmp_path / "damaged.zkey"
    with read_zkey(zkey_path) as zkey:
        write_zkey(damaged, dataclasses.replace(zkey, h=np.ascontiguousarray(zkey.h[::-1])))
    prefix = prefix_for("dmgkey")
    results = Collector()
    config = EngineConfig(backend="cpu", devices=[0], gpu_workers_per_device=1, partition_workers=1, ring_slots=2,
                          shm_prefix=prefix, param_cache=KEY_CACHE, start_timeout_s=120)
    engine = Engine(config, on_job_done=results.job, on_partition_done=results.partition).start()
    try:
        engine.register_circuit(CircuitSpec("with-r1cs", zkey=damaged, r1cs=r1cs_path))
        engine.register_circuit(CircuitSpec("without-r1cs", zkey=damaged))
        witness = wtns_bytes(checker.circuit.witness(3, 0))
        for circuit_id in ("with-r1cs", "without-r1cs"):
            engine.submit(JobSpec(circuit_id, circuit_id, [PartitionInput("wtns", witness)]))
        checked, unchecked = (results.wait(job_id).partitions[0] for job_id in ("with-r1cs", "without-r1cs"))
    finally:
        engine.stop(grace_s=10)
    assert shm_entries(prefix) == []
    assert checked.error_kind == unchecked.error_kind == "VerificationFailed"
    assert checked.error is not None and unchecked.error is not None
    assert ("the proof did not pass self-verification although the witness satisfies the r1cs: "
            "the proving key does not match this circuit or is damaged") in checked.error
    assert "give the .r1cs" not in checked.error
    assert "give the .r1cs to find the failing constraint" in unchecked.error
