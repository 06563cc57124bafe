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
