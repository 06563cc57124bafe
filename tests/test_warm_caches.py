"""scripts/warm_caches.py's bytecode of installed packages: a package that came without ``.pyc``
files (an image built with ``pip install --no-compile`` or ``PYTHONDONTWRITEBYTECODE``) is compiled
once, so that no later process compiles it again at import; one this user cannot write is named."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers import load_script

SCRIPT = Path(__file__).parents[1] / "scripts" / "warm_caches.py"


def _script() -> ModuleType:
    return load_script(SCRIPT, "warm_caches_under_test")


@pytest.fixture()
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[ModuleType]]:
    """A package and a single-file module installed without bytecode, then imported (writing none)."""
    site = tmp_path / "site"
    (site / "wcpkg" / "sub").mkdir(parents=True)
    (site / "wcpkg" / "__init__.py").write_text("X = 1\n")
    (site / "wcpkg" / "sub" / "__init__.py").write_text("")
    (site / "wcpkg" / "sub" / "deep.py").write_text("Y = 2\n")
    (site / "wcpkg" / "unused.py").write_text("Z = 3\n")  # not imported: compiled with its package
    (site / "wcsingle.py").write_text("W = 4\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    names = ("wcpkg", "wcpkg.sub", "wcpkg.sub.deep", "wcsingle")
    importlib.invalidate_caches()
    try:
        mods = [importlib.import_module(n) for n in ("wcpkg", "wcpkg.sub.deep", "wcsingle")]
    finally:
        for name in names:  # the next test imports its own copies
            sys.modules.pop(name, None)
    sources = [site / "wcpkg" / "__init__.py", site / "wcpkg" / "sub" / "deep.py", site / "wcsingle.py"]
    assert not any(Path(importlib.util.cache_from_source(str(p))).exists() for p in sources)
    return site, mods


def test_packages_without_bytecode_are_compiled_once(installed: tuple[Path, list[ModuleType]]) -> None:
    site, mods = installed
    wc = _script()
    compiled, refused = wc.compile_dependencies([*mods, sys.modules["json"], sys.modules["cuzk_mp"]])
    assert (compiled, refused) == (5, [])  # wcpkg's four modules and wcsingle; not json's, not ours
    for src in ("wcpkg/__init__.py", "wcpkg/sub/__init__.py", "wcpkg/sub/deep.py", "wcpkg/unused.py",
                "wcsingle.py"):
        assert Path(importlib.util.cache_from_source(str(site / src))).exists(), src
    assert wc.compile_dependencies(mods) == (0, [])  # nothing left to do


def test_a_folder_this_user_cannot_write_is_named_not_fatal(installed: tuple[Path, list[ModuleType]],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    site, mods = installed
    wc = _script()
    monkeypatch.setattr(wc.os, "access", lambda path, mode: False)
    compiled, refused = wc.compile_dependencies(mods)
    assert compiled == 0 and sorted(refused) == sorted([str(site / "wcpkg"), str(site / "wcsingle.py")])
    assert not Path(importlib.util.cache_from_source(str(site / "wcsingle.py"))).exists()
