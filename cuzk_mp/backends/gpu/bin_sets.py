"""The two sets of shipped kernel binaries, and which one a CUDA driver loads (no CuPy here).

``scripts/build_kernels.py`` builds every shipped variant twice:

- **fatbin**: one compressed fatbin from nvcc 13 (the manifest's ``nvcc``), SASS for every target of
  :data:`.knobs.ALL_ARCHS`. Every device figure of the project was measured with these. CUDA
  promises nvcc 13's code to drivers of CUDA 13 and later only (its compatibility package aside),
  and nvcc 13 writes every cubin in ELF ABI version 8, which CUDA 12 drivers before 12.8 do not know;
- **cuda12**: one cubin per target from NVRTC 12.9, kept in a zip (LZMA), for drivers older than CUDA
  13: the code such a machine's own NVRTC (CuPy's ``cupy-cuda12x``) would compile, without the
  compile (seconds for G1, a minute or more for the G2 modules). NVRTC 12.9 writes ABI version 7
  for sm_80 to sm_90 (every CUDA 12 driver reads it) and 8 for sm_100 and sm_120 (whose drivers,
  12.8 and later, read it).

:func:`load_order` says which set to try first; :func:`cubin_file` gives a cuda12 cubin a file of its
own (CuPy loads modules from files and caches them by path, so the path is named by the content).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...errors import OutputError
from ...formats.atomic import atomic_output
from ...paths import default_cache_dir

CUDA13_DRIVER = 13000  # cudaDriverGetVersion of the first driver that runs CUDA 13 code
FATBIN, CUDA12 = "fatbin", "cuda12"  # the sets; CUDA12 is also the manifest entry's key of its set
NVRTC12_VERSION = "12.9"  # the NVRTC the cuda12 set is built with (scripts/build_kernels.py checks it)


def member_name(arch: str) -> str:
    """The cuda12 zip's member holding ``arch``'s cubin."""
    return f"{arch}.cubin"


def cubin_target(data: bytes) -> tuple[int, int]:
    """(ELF ABI version, SASS target) of a cubin: (7, 90) for an sm_90 cubin from NVRTC 12.9, (8, 90)
    from nvcc 13. The target sits in e_flags' low byte in ABI 7 and in its second byte in ABI 8."""
    if len(data) < 52 or data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError("not a 64-bit ELF file, so not a cubin")
    abi, flags = data[8], int.from_bytes(data[48:52], "little")
    return abi, (flags & 0xFF) if abi < 8 else (flags >> 8) & 0xFF


def load_order(entry: Mapping[str, Any], driver_version: int, mode: str = "auto") -> list[str]:
    """The sets of a manifest entry to try, in order (each where the entry has it). ``mode`` "auto"
    (env CUZK_GPU_BINARIES, :func:`.env_knobs.binaries_mode`): the fatbin first on a driver that
    runs CUDA 13 code, the cuda12 set first below it, the other one after, in case; "fatbin" or
    "cuda12": that one alone; "nvrtc": none."""
    sets = [FATBIN] + ([CUDA12] if CUDA12 in entry else [])
    if mode != "auto":
        return [s for s in sets if s == mode]
    return sets if driver_version >= CUDA13_DRIVER else sets[::-1]


def read_cubin(archive: Path, arch: str) -> bytes:
    """``arch``'s cubin from a cuda12 zip (KeyError where it has none)."""
    with zipfile.ZipFile(archive) as z:
        return z.read(member_name(arch))


def cubin_file(data: bytes, cache: Path | None = None) -> Path:
    """A file holding ``data``, named by its sha256, under ``<cache>/kernels`` (default: the
    package's cache folder, :func:`~cuzk_mp.paths.default_cache_dir`), or, where that cannot be
    written, in a folder of the temp folder that only this user may write. An existing file of that
    name is reused when it holds the same bytes; a new one is written by
    :func:`~cuzk_mp.formats.atomic.atomic_output`, so a racing process reads a whole one."""
    name = hashlib.sha256(data).hexdigest()[:32] + ".cubin"
    own = Path(tempfile.gettempdir()) / f"cuzk-mp-kernels-{os.getuid()}"
    folders = [(cache or default_cache_dir()) / "kernels", own]
    last: OSError | OutputError | None = None
    for i, folder in enumerate(folders):
        path = folder / name
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            if i > 0:  # a shared temp folder: only a folder of our own, closed to others
                st = folder.lstat()
                if not folder.is_dir() or folder.is_symlink() or st.st_uid != os.getuid() or st.st_mode & 0o022:
                    raise OSError(f"{folder} is not a folder of this user's alone")
            if path.is_file() and path.read_bytes() == data:
                return path
            with atomic_output(path) as f:
                f.write(data)
            return path
        except (OSError, OutputError) as exc:
            last = exc
    raise OSError(f"no folder could take a kernel binary ({', '.join(map(str, folders))}): {last}")


__all__ = [
    "CUDA12",
    "CUDA13_DRIVER",
    "FATBIN",
    "NVRTC12_VERSION",
    "cubin_file",
    "cubin_target",
    "load_order",
    "member_name",
    "read_cubin",
]
