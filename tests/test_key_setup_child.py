"""The dev setup in its spawned child (how the GPU backend runs it) logs its progress at the engine's
level: a child process starts with logging unconfigured, where INFO lines would be dropped and a long
setup would look silent."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest

from cuzk_mp.circuits.synthetic_kinds import write_synthetic
from cuzk_mp.formats.zkey import read_zkey
from cuzk_mp.pipeline.keys import _setup


def test_setup_child_logs_its_steps(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    r1cs, _ = write_synthetic("porep-like", 10, tmp_path)
    zkey = tmp_path / "k.zkey"
    proc = mp.get_context("spawn").Process(target=_setup, args=(str(r1cs), str(zkey), "cpu", "INFO"))
    proc.start()
    proc.join(300)
    assert proc.exitcode == 0
    err = capfd.readouterr().err
    assert "(cuzk-key-setup pid=" in err and "INFO cuzk_mp.groth16.setup" in err, err[-2000:]
    assert "written in" in err  # the last line of setup_file
    with read_zkey(zkey) as z:
        assert z.domain_size == 1 << 10


def test_a_killed_builders_temporaries_are_removed_by_the_next_build(tmp_path: Path) -> None:
    """A key build killed mid-way leaves its temporary r1cs, zkey and output files in the cache (at
    2^27 ~100 GB): the next caller of that key removes them under the key's lock; an output
    temporary of a process that still runs (another key's build) stays."""
    import os
    import subprocess

    from cuzk_mp.pipeline.keys import ensure_synthetic_key

    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that no longer runs
    left = [tmp_path / ".porep-like-10.r1cs.abc123.tmp", tmp_path / ".porep-like-10.zkey.def456.tmp",
            tmp_path / f".cuzk-mp-{gone.pid}-0a1b2c3d.tmp"]
    live = tmp_path / f".cuzk-mp-{os.getpid()}-0a1b2c3d.tmp"
    for p in [*left, live]:
        p.write_bytes(b"x" * 100)
    zkey, r1cs = ensure_synthetic_key("porep-like", 10, tmp_path, backend="cpu")
    assert zkey.exists() and r1cs.exists()
    assert not any(p.exists() for p in left) and live.exists()


def test_a_synthetic_build_bigger_than_the_memory_is_refused_before_it_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A --log-n too big for the machine is exit 4 at once, naming the sizes: the build alone grew
    until the kernel's OOM killer ended it (a 2^28 key on a 23 GiB machine)."""
    import psutil

    from cuzk_mp.errors import ResourceError
    from cuzk_mp.pipeline.keys import ensure_synthetic_circuit_data, ensure_synthetic_key

    real = psutil.virtual_memory()
    monkeypatch.setattr(psutil, "virtual_memory", lambda: real._replace(available=100_000))  # < 2^10's build
    cache = tmp_path / "cache"
    with pytest.raises(ResourceError, match=r"building the r1cs of porep-like 2\^10 \(1016 wires\) needs ~318 KiB "
                                            r"of memory; 98 KiB are available: a smaller size"):
        ensure_synthetic_key("porep-like", 10, cache, backend="cpu")
    for child in (True, False):
        with pytest.raises(ResourceError, match=r"building the circuit data of dense-random 2\^10 \(1053 wires\)"):
            ensure_synthetic_circuit_data("dense-random", 10, cache, child=child)
    assert not cache.exists() or not any(p.suffix in (".zkey", ".r1cs", ".synth-abc") for p in cache.iterdir())


def _killed(level: str) -> None:
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


def test_a_builder_child_killed_by_sigkill_says_what_sends_it() -> None:
    from cuzk_mp.errors import CuzkError
    from cuzk_mp.pipeline.keys import _in_child

    with pytest.raises(CuzkError, match=r"^building x failed \(killed by SIGKILL: what the kernel's OOM killer sends "
                                        r"where memory runs out\); see the log above$"):
        _in_child("cuzk-test-child", _killed, (), "building x")


def _sleeps(level: str) -> None:
    import time

    time.sleep(120)


def test_an_interrupted_wait_for_a_builder_child_stops_the_child() -> None:
    """SIGINT or SIGTERM of the waiting process alone (a supervisor's, `timeout`'s): the child stops
    too, instead of the process waiting at its exit for a build nobody will use."""
    import os
    import signal
    import threading
    import time

    from cuzk_mp.pipeline.keys import _in_child

    timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            _in_child("cuzk-test-sleeper", _sleeps, (), "sleeping")
        left = [p for p in mp.active_children() if p.name == "cuzk-test-sleeper"]
        assert left == [], "the builder child outlived the interrupted wait"
        assert time.monotonic() - t0 < 30
    finally:
        timer.cancel()
        for p in mp.active_children():
            if p.name == "cuzk-test-sleeper":
                p.kill()
                p.join()


@pytest.mark.parametrize(("room", "code", "says"), [
    (64 << 10, 2, "CACHE/porep-like-10.r1cs: cannot write it: No space left on device (the file system of CACHE "
     "is full)"),
    (256 << 10, 4, "CACHE/porep-like-10.zkey: the key of 1016 wires takes ~572 KiB; 48 KiB are free on its file "
     "system"),
])
def test_a_daemon_whose_param_cache_is_full_names_the_key_file_and_the_folder(room: int, code: int, says: str,
                                                                             tmp_path: Path) -> None:
    """A daemon that makes a synthetic circuit's dev key in a param cache on a full file system (a
    small tmpfs in a private mount namespace: too small for the r1cs, then for the key) ends saying
    which cache file could not be written and which folder is full, where it named the hidden
    temporary (``.porep-like-10.zkey.XXXX.tmp``) the file is made in; no temporary is left there.
    Skipped, saying so, where no mount namespace can be made."""
    import os
    import sys

    from tests.helpers import config_text, on_small_tmpfs

    cache = tmp_path / "cache"
    cache.mkdir()
    config = tmp_path / "d.toml"
    config.write_text(config_text(tmp_path, cache, prefix=f"cuzk-full-{os.getpid()}",
                                  circuits='[circuits.syn]\nsynthetic = "porep-like"\nlog_n = 10\n'))
    proc = on_small_tmpfs(cache, room, f"{sys.executable} -m cuzk_mp daemon --config {config}; code=$?; "
                          f"ls -A {cache}; exit $code", timeout=300)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == code, (proc.returncode, proc.stderr[-3000:])
    assert says.replace("CACHE", str(cache)) in last and ".tmp" not in last, last
    assert proc.stdout.split() == ["porep-like-10.lock"], proc.stdout  # no temporary left
