"""Stopping a circom witness generator that never ends (a hostile or buggy wasm loops for ever).

A one-shot ``wtns calculate`` stops on SIGTERM and SIGINT as it does anywhere else (exit 143 / 130,
no output file), and a start function that loops (at load) is stopped by a signal too; in process,
``abort`` stops it with a Cancelled naming the file and the calculator serves the next witness. In the
engine, a job whose wasm loops does not hold its synthesis worker: a cancel frees the worker at once
(no kill, no restart), ``task_timeout`` fails the job with a message naming it while another job of
the engine finishes, and stopping the engine does not wait for the wasm.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cuzk_mp.errors import Cancelled

from tests.helpers import (ENV, KEY_CACHE, LOG_N, PY, Collector, circom_generator, prefix_for, small_circom_key,
                           status_of, wait_until)

# The generator's log(): "looping" on the one-shot command's stdout just before the loop, so the test
# knows the wasm runs (getMessageChar walks "looping\0\n\0" from address 128, one call a character).
_SAYS_LOOPING = {
    "imports": '(import "runtime" "writeBufferMessage" (func $say))',
    "more": '(global $at (mut i32) (i32.const 128)) (data (i32.const 128) "looping\\00\\0a\\00")',
    "message_char": "(result i32) (local $c i32) (local.set $c (i32.load8_u (global.get $at))) "
                    "(global.set $at (i32.add (global.get $at) (i32.const 1))) (local.get $c)",
}
_LOOP = "(call $say) (call $say) (loop $again (br $again))"


def _looping(folder: Path, where: str = "init") -> Path:
    """A generator that loops for ever in ``init`` (the witness; it says "looping" first) or in its start
    function (where it can say nothing: the exports it would read the message from are not there yet)."""
    if where == "start":
        return circom_generator(folder, "loop-start", start="(loop $again (br $again))")
    return circom_generator(folder, "loop-init", **_SAYS_LOOPING, init=f"(param i32) {_LOOP}")


@pytest.mark.parametrize(("sig", "code", "says"), [(signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                                   (signal.SIGINT, 130, "interrupted")])
def test_a_signal_stops_a_one_shot_witness_computation(tmp_path: Path, sig: int, code: int, says: str) -> None:
    (tmp_path / "input.json").write_text("{}")
    out = tmp_path / "w.wtns"
    proc = subprocess.Popen([*PY, "wtns", "calculate", str(_looping(tmp_path)), str(tmp_path / "input.json"),
                             str(out)], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "looping\n"  # the wasm runs its loop now
        t0 = time.monotonic()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=5)
        took = time.monotonic() - t0
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == code, err
    assert f"cuzk-mp: {says}" in err and "Traceback" not in err, err
    assert took < 2.0, f"stopped {took:.1f} s after the signal"
    assert not out.exists()


_ALARM_AT_LOAD = """
import signal, sys, time
from cuzk_mp.circuits.circom import WitnessCalculator

class Alarm(Exception):
    pass

def ring(signum, frame):
    raise Alarm()

signal.signal(signal.SIGALRM, ring)
signal.setitimer(signal.ITIMER_REAL, 0.3)
t0 = time.monotonic()
try:
    WitnessCalculator(sys.argv[1])
except Alarm:
    print(f"stopped {time.monotonic() - t0:.2f}")
"""


def test_a_signal_stops_a_generator_that_loops_at_load(tmp_path: Path) -> None:
    """A start function that never ends (run when the calculator reads the header) is stopped as the
    witness is: the signal handler's own exception, raised where the calculator is made."""
    proc = subprocess.run([sys.executable, "-c", _ALARM_AT_LOAD, str(_looping(tmp_path, "start"))], env=ENV,
                          capture_output=True, text=True, timeout=10)
    assert proc.returncode == 0 and proc.stdout.startswith("stopped "), proc.stdout + proc.stderr
    assert float(proc.stdout.split()[1]) < 1.5, proc.stdout


def test_abort_stops_a_witness_and_the_calculator_goes_on(tmp_path: Path) -> None:
    """``abort`` turning true stops the looping wasm: a Cancelled naming the file (not an InputError:
    nothing was wrong with the input), within a tick; the same calculator then stops the next witness
    the same way (the interruption of one run does not stick to the next), and every instance is let go."""
    import gc

    from cuzk_mp.circuits.circom import WAIT_TICK_S, WitnessCalculator

    calc = WitnessCalculator(_looping(tmp_path))
    for _ in range(2):
        deadline = time.monotonic() + 0.3
        with pytest.raises(Cancelled, match=r"loop-init\.wasm: witness generation stopped before it finished"):
            calc.calculate({}, on_log=lambda line: None, abort=lambda: time.monotonic() > deadline)
        assert time.monotonic() - deadline < 10 * WAIT_TICK_S
    good = WitnessCalculator(circom_generator(tmp_path, "good"))
    assert good.calculate({}, abort=lambda: False).tolist() == [[1, 0, 0, 0]]
    gc.collect()
    assert sum(type(o).__name__ == "_Instance" for o in gc.get_objects()) == 0



def test_abort_stops_a_generator_that_loops_while_inputs_are_set(tmp_path: Path) -> None:
    """Input values are set inside wasm, a chunk a call (circom_loops): a generator that loops for ever
    in ``setInputSignal`` of a value in the second chunk is stopped there by ``abort`` as anywhere else."""
    from cuzk_mp.circuits.circom import WAIT_TICK_S, WitnessCalculator
    from cuzk_mp.circuits.circom_loops import CHUNK_VALUES

    n = 2 * CHUNK_VALUES
    path = circom_generator(tmp_path, "loop-set", inputs=n, set_input=(
        f"(if (i32.eq (local.get 2) (i32.const {CHUNK_VALUES + 5})) (then (loop $again (br $again))))"))
    calc = WitnessCalculator(path)
    deadline = time.monotonic() + 0.3
    with pytest.raises(Cancelled, match=r"loop-set\.wasm: witness generation stopped before it finished"):
        calc.calculate({"a": np.arange(n)}, abort=lambda: time.monotonic() > deadline)
    assert time.monotonic() - deadline < 10 * WAIT_TICK_S
    good = WitnessCalculator(circom_generator(tmp_path, "echo", inputs=n))
    assert good.calculate({"a": np.arange(n)}, abort=lambda: False)[1:, 0].tolist() == list(range(n))

# ---- the engine (CPU backend): a circom circuit whose wasm loops, beside the synthetic test circuit

def _partition_state(engine: Any, job_id: str) -> str | None:
    job = next((j for j in status_of(engine)["jobs"] if j["job_id"] == job_id), None)
    return job["partitions"][0]["state"] if job else None


def _synth_processes(engine: Any) -> list[dict[str, Any]]:
    return [p for p in status_of(engine)["processes"] if p["name"].startswith("cuzk-synth")]


@contextmanager
def _engine(tmp_path: Path, name: str, **config: Any) -> Iterator[tuple[Any, Collector]]:
    """A CPU engine with the circuits "loop" (circom, its wasm loops in the witness) and "porep"."""
    from cuzk_mp.pipeline.engine import Engine
    from cuzk_mp.pipeline.shm_names import shm_entries
    from cuzk_mp.pipeline.types import CircuitSpec, EngineConfig

    prefix, results = prefix_for(name), Collector()
    fields = {"backend": "cpu", "devices": [0], "gpu_workers_per_device": 1, "partition_workers": 1,
              "ring_slots": 2, "shm_prefix": prefix, "param_cache": KEY_CACHE, "start_timeout_s": 120, **config}
    engine = Engine(EngineConfig(**fields), on_job_done=results.job, on_partition_done=results.partition).start()
    try:
        zkey, r1cs = small_circom_key(tmp_path)  # copies: the engine writes its circuit data beside the key
        engine.register_circuit(CircuitSpec("loop", zkey=zkey, r1cs=r1cs, wasm=_looping(tmp_path)))
        engine.register_circuit(CircuitSpec("porep", synthetic="porep-like", log_n=LOG_N))
        yield engine, results
    finally:
        engine.stop(grace_s=0)
    assert shm_entries(prefix) == []


def _jobs(*names: str) -> list[Any]:
    from cuzk_mp.pipeline.types import JobSpec, PartitionInput

    return [JobSpec(n, "loop", [PartitionInput("json", b"{}")]) if n.startswith("loop")
            else JobSpec(n, "porep", [PartitionInput("synthetic", seed=1)]) for n in names]


def test_a_cancel_frees_the_worker_of_a_looping_wasm(tmp_path: Path) -> None:
    """The one synthesis worker runs the looping wasm; the job's cancel stops it there: the job is
    cancelled, the same worker (never killed, never restarted) then synthesizes the next job, which
    proves."""
    with _engine(tmp_path, "wcancel") as (engine, results):
        engine.preload("porep")
        loop, porep = _jobs("loop-1", "porep-1")
        engine.submit(loop)
        wait_until(lambda: _partition_state(engine, "loop-1") == "synthesizing", timeout=30)
        pid = _synth_processes(engine)[0]["pid"]
        engine.submit(porep)
        assert engine.cancel("loop-1")
        assert results.wait("loop-1", timeout=10).state == "cancelled"
        assert results.wait("porep-1", timeout=30).state == "done"
        assert [(p["pid"], p["restarts"]) for p in _synth_processes(engine)] == [(pid, 0)]


def test_task_timeout_fails_a_job_whose_wasm_loops(tmp_path: Path) -> None:
    """task_timeout is the wall-clock limit of a witness too: the worker that runs the looping wasm past
    it is killed and restarted, the job fails with a message naming the limit, and a job of the other
    worker meanwhile proves."""
    with _engine(tmp_path, "wtimeout", partition_workers=2, task_timeout_s=1, max_attempts=1) as (engine, results):
        engine.preload("porep")
        loop, porep = _jobs("loop-1", "porep-1")
        engine.submit(loop)
        engine.submit(porep)
        assert results.wait("porep-1", timeout=30).state == "done"
        failed = results.wait("loop-1", timeout=30)
        assert failed.state == "failed" and failed.partitions[0].error_kind == "WorkerDied", failed
        assert "more than task_timeout (1 s)" in (failed.error or ""), failed.error


def test_stopping_the_engine_does_not_wait_for_a_looping_wasm(tmp_path: Path) -> None:
    """The engine's stop message reaches the worker while its wasm loops: the worker stops the wasm
    and exits by itself, so the stop takes seconds at most, not the SIGTERM and SIGKILL of a worker that
    does not answer (10 s, then 5 s)."""
    with _engine(tmp_path, "wstop") as (engine, _):
        engine.submit(_jobs("loop-1")[0])
        wait_until(lambda: _partition_state(engine, "loop-1") == "synthesizing", timeout=30)
        t0 = time.monotonic()
        engine.stop(grace_s=0)
        took = time.monotonic() - t0
    assert took < 5.0, f"the engine took {took:.1f} s to stop"
