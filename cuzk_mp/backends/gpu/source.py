"""Assembly of one CUDA translation unit from the package's kernel files.

A kernel ``.cu`` under ``kernels/`` includes headers with ``#include "rel/path"``
(relative to the including file). :func:`assemble` inlines them recursively, each
file once (``#pragma once`` semantics), and puts a ``#line`` marker before every
piece so NVRTC errors name the real file and line. The result is ONE source
string: CuPy's on-disk cache key hashes the source text, and headers reached
through ``-I`` would not be hashed (a stale cubin after a header edit; see
reference/style.md, "CUDA sources for CuPy RawModule").

No CuPy here: this module is plain text processing, tested without a GPU.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from importlib import resources

from ...errors import ConfigError

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')
_PRAGMA_ONCE = re.compile(r"^\s*#\s*pragma\s+once\s*$")


def read_kernel_file(rel_path: str) -> str:
    """Text of ``kernels/<rel_path>`` from the installed package."""
    node = resources.files(__package__).joinpath("kernels")
    for part in rel_path.split("/"):
        node = node.joinpath(part)
    try:
        return node.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"CUDA source kernels/{rel_path} is missing from cuzk_mp.backends.gpu") from exc


def _inline(rel_path: str, seen: set[str], out: list[str], stack: tuple[str, ...]) -> None:
    if rel_path in seen:
        return
    seen.add(rel_path)
    base = posixpath.dirname(rel_path)
    out.append(f'#line 1 "{rel_path}"')
    for lineno, line in enumerate(read_kernel_file(rel_path).splitlines(), start=1):
        m = _INCLUDE.match(line)
        if m:
            child = posixpath.normpath(posixpath.join(base, m.group(1)))
            if child in stack:
                raise ConfigError(f"kernels/{rel_path}:{lineno}: include cycle through {child}")
            _inline(child, seen, out, stack + (rel_path,))
            out.append(f'#line {lineno + 1} "{rel_path}"')
        elif _PRAGMA_ONCE.match(line):
            out.append("")
        else:
            out.append(line)


def assemble(rel_path: str) -> str:
    """The translation unit ``kernels/<rel_path>`` with every quoted include inlined once."""
    out: list[str] = []
    _inline(posixpath.normpath(rel_path), set(), out, ())
    return "\n".join(out) + "\n"


def digest(rel_path: str) -> str:
    """sha256 of the assembled source (for logs and cache diagnostics)."""
    return hashlib.sha256(assemble(rel_path).encode()).hexdigest()
