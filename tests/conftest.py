"""Fixtures shared by the test modules (the helpers they are built on are in tests/helpers.py)."""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import helpers
from tests.helpers import ProofChecker, synthetic_key
from tests.oracle import oracle  # noqa: F401 - the snarkjs/circom oracle's session fixture, for every module
from tests.gpu_emu import kind  # noqa: F401 - "emu" or "gpu": the kernel tests run on both (tests/gpu_emu)


@pytest.fixture(autouse=True)
def _root_log_level_as_it_was() -> Iterator[None]:
    """A test that runs ``cli.main`` in-process sets the root logger's level (INFO for ``setup``) and
    gives it a handler on the stderr of that moment (the test's capture, closed when it ends): put
    the level back and take that handler away, so that no later test captures records another
    test's verb let through, and no later record goes to a closed stream ("--- Logging error ---")."""
    root = logging.getLogger()
    level = root.level
    before = list(root.handlers)
    yield
    root.setLevel(level)
    for handler in list(root.handlers):
        if handler not in before and type(handler) is logging.StreamHandler:  # logs.configure's, not pytest's
            root.removeHandler(handler)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A fresh folder with a short path, removed afterwards: a unix socket's path holds 107 bytes,
    and pytest's ``tmp_path`` grows with the test's name (and, with xdist, the worker's folder)."""
    folder = Path(tempfile.mkdtemp(prefix="cz", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def test_key() -> tuple[Path, Path]:
    """(zkey, r1cs) of the porep-like 2^10 test circuit, made once per machine in .cache/."""
    return synthetic_key()


@pytest.fixture(scope="session")
def checker(test_key: tuple[Path, Path]) -> ProofChecker:
    """An independent checker of proofs and public signals of the test circuit."""
    return ProofChecker(test_key[0])


@pytest.fixture
def emu() -> object:
    """The GPU backend module over the fake CuPy (tests/gpu_emu/backend.py; its device's size:
    :func:`tests.gpu_emu.backend.fake_device`)."""
    from tests import gpu_emu

    if not gpu_emu.available():
        pytest.skip("no host C++ compiler for the kernel emulator")
    from tests.gpu_emu.backend import load_backend

    return load_backend()


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    return helpers.free_port()
