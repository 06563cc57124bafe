"""Assembly of one CUDA translation unit from the package's kernel files.

A kernel ``.cu`` under ``kernels/`` includes headers with ``#include "rel/path"``
(relative to the including file). :func:`assemble` inlines them recursively, each
file once (``#pragma once`` semantics), and puts a ``#line`` marker before every
piece so compiler errors name the real file and line. The result is ONE source
string: its hash identifies a compiled module (CuPy's on-disk cache key and the
precompiled binaries' manifest, :func:`module_digest`), which headers reached
through ``-I`` would escape (a stale binary after a header edit).

Test and benchmark kernels live outside the package (``tests/gpu_emu/kernels``,
``perf/kernels``) with the same relative layout: ``root`` names such a folder,
searched before the package, so they include the package's headers unchanged.

No CuPy here: this module is plain text processing, tested without a GPU.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from ...errors import ConfigError

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')
_PRAGMA_ONCE = re.compile(r"^\s*#\s*pragma\s+once\s*$")
_KERNEL = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(')


def read_kernel_file(rel_path: str, root: Path | None = None) -> str:
    """Text of ``<root>/<rel_path>`` if that exists, else ``kernels/<rel_path>`` of the installed package."""
    if root is not None and (Path(root) / rel_path).is_file():
        return (Path(root) / rel_path).read_text(encoding="utf-8")
    node = resources.files(__package__).joinpath("kernels")
    for part in rel_path.split("/"):
        node = node.joinpath(part)
    try:
        return node.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        where = f" (nor under {root})" if root is not None else ""
        raise ConfigError(f"CUDA source kernels/{rel_path} is missing from cuzk_mp.backends.gpu{where}") from exc


def _inline(rel_path: str, seen: set[str], out: list[str], stack: tuple[str, ...], root: Path | None) -> None:
    if rel_path in seen:
        return
    seen.add(rel_path)
    base = posixpath.dirname(rel_path)
    out.append(f'#line 1 "{rel_path}"')
    for lineno, line in enumerate(read_kernel_file(rel_path, root).splitlines(), start=1):
        m = _INCLUDE.match(line)
        if m:
            child = posixpath.normpath(posixpath.join(base, m.group(1)))
            if child in stack:
                raise ConfigError(f"kernels/{rel_path}:{lineno}: include cycle through {child}")
            _inline(child, seen, out, stack + (rel_path,), root)
            out.append(f'#line {lineno + 1} "{rel_path}"')
        elif _PRAGMA_ONCE.match(line):
            out.append("")
        else:
            out.append(line)


def assemble(rel_path: str, root: Path | None = None) -> str:
    """The translation unit ``kernels/<rel_path>`` (or ``<root>/<rel_path>``) with every quoted include inlined once."""
    out: list[str] = []
    _inline(posixpath.normpath(rel_path), set(), out, (), root)
    return "\n".join(out) + "\n"


def define_items(defines: Mapping[str, Any] | None) -> tuple[tuple[str, str], ...]:
    """The ``-D`` knobs as sorted (name, value) strings; bools become 0/1. ConfigError on a bad name."""
    if not defines:
        return ()
    items = []
    for key, val in sorted(defines.items()):
        if not key.isidentifier():
            raise ConfigError(f"bad CUDA define name {key!r}")
        items.append((key, str(int(val)) if isinstance(val, bool) else str(val)))
    return tuple(items)


def module_digest(rel_path: str, defines: Mapping[str, Any] | None = None, root: Path | None = None) -> str:
    """sha256 of what a compiled module is made of: the assembled source and its ``-D`` knobs."""
    text = assemble(rel_path, root) + "".join(f"\n-D{k}={v}" for k, v in define_items(defines))
    return hashlib.sha256(text.encode()).hexdigest()


def kernel_names(rel_path: str, root: Path | None = None) -> list[str]:
    """The ``extern "C" __global__`` entry points of a translation unit, in source order."""
    return _KERNEL.findall(assemble(rel_path, root))
