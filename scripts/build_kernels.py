#!/usr/bin/env python3
"""Build the GPU kernel binaries the package ships (cuzk_mp/backends/gpu/kernels/bin).

For every variant of ``cuzk_mp.backends.gpu.knobs.SHIPPED`` (a kernel file and its
``-D`` knobs) this assembles the translation unit, compiles it with nvcc into one
compressed fatbin holding machine code (SASS) for the variant's architectures, and
writes ``manifest.json``: per variant the digest of its assembled source and knobs
(what the loader and the CI check compare against), the fatbin's sha256 and size,
its kernels, and ptxas's register / spill / stack figures on sm_90.

Each variant also gets a second set, for drivers older than CUDA 13 (``cuzk_mp.backends.gpu.bin_sets``):
one cubin per architecture from NVRTC 12.9, in a zip (LZMA), recorded under the entry's ``cuda12``.

    python3 scripts/build_kernels.py            # rebuild what is stale, in parallel
    python3 scripts/build_kernels.py --all      # rebuild everything
    python3 scripts/build_kernels.py --check    # no nvcc: exit 1 if a binary is stale

Needs nvcc (CUDA 13.0 here) and NVRTC 12.9's library, but no GPU: the library comes from the pip
package ``nvidia-cuda-nvrtc-cu12==12.9.86`` (installed beside the build's Python, or
``pip install --target DIR`` and ``--nvrtc12 DIR/nvidia/cuda_nvrtc/lib/libnvrtc.so.12``).
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cuzk_mp.backends.gpu import bin_sets, knobs  # noqa: E402
from cuzk_mp.backends.gpu.source import assemble, define_items, kernel_names, module_digest  # noqa: E402
from cuzk_mp.formats.atomic import atomic_output  # noqa: E402

BIN = ROOT / "cuzk_mp" / "backends" / "gpu" / "kernels" / "bin"
MANIFEST = BIN / "manifest.json"
NVCC_FLAGS = ("-std=c++17", "-fatbin", "--compress-mode=size", "-Xptxas", "-v")
_PTXAS = re.compile(r"ptxas info\s*: Compiling entry function '(\w+)' for '(sm_\d+)'")
_PROPS = re.compile(r"Function properties for (\w+)")
_USED = re.compile(r"Used (\d+) registers")


def file_name(v: knobs.Variant, suffix: str = ".fatbin") -> str:
    """Stable binary name of a variant: kernel file stem + a digest of its path and knobs."""
    tag = hashlib.sha256(repr((v.path, define_items(v.define_dict))).encode()).hexdigest()[:10]
    return f"{Path(v.path).stem}-{tag}{suffix}"


CUDA12_SUFFIX = f".{bin_sets.CUDA12}.zip"


def gencode(archs: tuple[str, ...]) -> list[str]:
    """-gencode options: SASS for each arch, from one PTX per major generation (compute_80 for
    sm_80/86/89, compute_90, compute_100), so cicc runs once per generation."""
    groups: dict[str, list[str]] = {}
    for arch in archs:
        digits = arch.split("_")[1]
        groups.setdefault(f"compute_{digits[:-1]}0", []).append(arch)
    return [f"-gencode=arch={virt},code=[{','.join(real)}]" for virt, real in groups.items()]


def ptxas_figures(log: str, arch: str = "sm_90") -> dict[str, dict[str, int]]:
    """{kernel: {registers, spill_stores, spill_loads, stack}} from ``-Xptxas -v`` for one arch
    (the properties of called ``__noinline__`` functions, listed after each entry, are skipped)."""
    out: dict[str, dict[str, int]] = {}
    current, props = None, None
    for line in log.splitlines():
        m = _PTXAS.search(line)
        if m:
            current = m.group(1) if m.group(2) == arch else None
            continue
        p = _PROPS.search(line)
        if p:
            props = p.group(1)
            continue
        if current is None:
            continue
        fig = out.setdefault(current, {})
        if "bytes stack frame" in line and props == current:
            nums = [int(x) for x in re.findall(r"(\d+) bytes", line)]
            fig["stack"], fig["spill_stores"], fig["spill_loads"] = nums[0], nums[1], nums[2]
        u = _USED.search(line)
        if u:
            fig["registers"] = int(u.group(1))
    return out


def figures(v: knobs.Variant, nvcc: str) -> dict[str, dict[str, int]]:
    """ptxas figures of a variant on sm_90 alone (a cubin, no fatbin): refreshes a manifest entry."""
    with tempfile.TemporaryDirectory() as tmp:
        cu = Path(tmp) / (Path(v.path).stem + ".cu")
        cu.write_text(assemble(v.path))
        cmd = [nvcc, "-std=c++17", "-cubin", "-arch=sm_90", "-Xptxas", "-v",
               *(f"-D{k}={val}" for k, val in define_items(v.define_dict)), "-o", str(Path(tmp) / "m.cubin"), str(cu)]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode:
            raise SystemExit(f"nvcc failed on {v.path} {v.define_dict}:\n{res.stderr[-4000:]}")
    return ptxas_figures(res.stdout + res.stderr)


def entry_is_fresh(v: knobs.Variant, entry: dict | None) -> bool:
    """Whether a manifest entry's fatbin matches the variant's current sources, knobs and archs and its file."""
    if entry is None or entry.get("source_sha256") != module_digest(v.path, v.define_dict):
        return False
    if tuple(entry.get("archs", ())) != v.archs or entry.get("flags") != list(NVCC_FLAGS):
        return False
    return _file_matches(entry)


def cuda12_is_fresh(v: knobs.Variant, entry: dict | None) -> bool:
    """Whether the cuda12 set of an entry whose fatbin is fresh (:func:`entry_is_fresh`, which the
    callers have checked) was built from the same sources (the entry's digest), for the variant's
    archs, with NVRTC 12.9, and its file is the one recorded."""
    sub = (entry or {}).get(bin_sets.CUDA12)
    return (entry is not None and sub is not None and tuple(sub.get("archs", ())) == v.archs
            and sub.get("nvrtc") == bin_sets.NVRTC12_VERSION and sub.get("source_sha256") == entry["source_sha256"]
            and _file_matches(sub))


def _file_matches(rec: dict) -> bool:
    f = BIN / rec["file"]
    return f.is_file() and hashlib.sha256(f.read_bytes()).hexdigest() == rec.get("file_sha256")


def find_nvrtc12(given: str | None) -> Path | None:
    """libnvrtc.so.12: ``given``, else $CUZK_NVRTC12, else the pip package nvidia-cuda-nvrtc-cu12's."""
    if given or os.environ.get("CUZK_NVRTC12"):
        return Path(given or os.environ["CUZK_NVRTC12"])
    spec = importlib.util.find_spec("nvidia.cuda_nvrtc") if importlib.util.find_spec("nvidia") else None
    for root in (spec.submodule_search_locations or []) if spec else []:
        lib = Path(root) / "lib" / "libnvrtc.so.12"
        if lib.is_file():
            return lib
    return None


def _nvrtc_check(lib: ctypes.CDLL, rc: int, what: str, prog: ctypes.c_void_p | None = None) -> None:
    if rc == 0:
        return
    log = ""
    if prog is not None:
        n = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        buf = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetProgramLog(prog, buf)
        log = buf.value.decode(errors="replace")[-4000:]
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    raise SystemExit(f"NVRTC {what} failed: {lib.nvrtcGetErrorString(rc).decode()}\n{log}")


def nvrtc_version(lib_path: Path) -> str:
    """"12.9" for NVRTC 12.9's library."""
    lib = ctypes.CDLL(str(lib_path))
    major, minor = ctypes.c_int(), ctypes.c_int()
    _nvrtc_check(lib, lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return f"{major.value}.{minor.value}"


def nvrtc_cubin(lib_path: Path, source: str, arch: str, defines: list[str]) -> bytes:
    """One cubin of ``source`` for ``arch`` by the NVRTC library at ``lib_path`` (in this process)."""
    lib = ctypes.CDLL(str(lib_path))
    prog = ctypes.c_void_p()
    _nvrtc_check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"module.cu", 0, None, None),
                 "nvrtcCreateProgram")
    try:
        opts = [f"-arch={arch}".encode(), b"-std=c++17", *(d.encode() for d in defines)]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        _nvrtc_check(lib, lib.nvrtcCompileProgram(prog, len(opts), arr), f"compile for {arch}", prog)
        n = ctypes.c_size_t()
        _nvrtc_check(lib, lib.nvrtcGetCUBINSize(prog, ctypes.byref(n)), "nvrtcGetCUBINSize")
        buf = ctypes.create_string_buffer(n.value)
        _nvrtc_check(lib, lib.nvrtcGetCUBIN(prog, buf), "nvrtcGetCUBIN")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
    data = buf.raw
    target = bin_sets.cubin_target(data)[1]
    if target != int(arch.removeprefix("sm_")):
        raise SystemExit(f"NVRTC's cubin for {arch} names target {target}")
    return data


def build_cuda12(v: knobs.Variant, lib_path: Path) -> dict:
    """The cuda12 set of one variant (its cubins one process each); its manifest record."""
    source = assemble(v.path)
    defines = [f"-D{k}={val}" for k, val in define_items(v.define_dict)]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=len(v.archs)) as ex:
        cubins = list(ex.map(nvrtc_cubin, [lib_path] * len(v.archs), [source] * len(v.archs), v.archs,
                             [defines] * len(v.archs)))
    took = time.perf_counter() - t0
    out = BIN / file_name(v, CUDA12_SUFFIX)
    with atomic_output(out) as f, zipfile.ZipFile(f, "w", compression=zipfile.ZIP_LZMA) as z:
        for arch, data in zip(v.archs, cubins):
            info = zipfile.ZipInfo(bin_sets.member_name(arch), date_time=(2026, 1, 1, 0, 0, 0))  # reproducible
            info.compress_type = zipfile.ZIP_LZMA
            z.writestr(info, data)
    data = out.read_bytes()
    return {"archs": list(v.archs), "nvrtc": bin_sets.NVRTC12_VERSION, "file": out.name, "bytes": len(data),
            "file_sha256": hashlib.sha256(data).hexdigest(), "source_sha256": module_digest(v.path, v.define_dict),
            "build_s": round(took, 1)}


def build(v: knobs.Variant, nvcc: str) -> dict:
    """Compile one variant; its manifest entry."""
    with tempfile.TemporaryDirectory() as tmp:
        cu = Path(tmp) / (Path(v.path).stem + ".cu")
        cu.write_text(assemble(v.path))
        out = BIN / file_name(v)
        cmd = [nvcc, *NVCC_FLAGS, *gencode(v.archs), *(f"-D{k}={val}" for k, val in define_items(v.define_dict)),
               "-o", str(out), str(cu)]
        t0 = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode:
            raise SystemExit(f"nvcc failed on {v.path} {v.define_dict}:\n{res.stderr[-4000:]}")
        took = time.perf_counter() - t0
    data = out.read_bytes()
    return {
        "path": v.path, "defines": [list(kv) for kv in define_items(v.define_dict)], "group": v.group,
        "archs": list(v.archs), "flags": list(NVCC_FLAGS), "file": out.name, "bytes": len(data),
        "file_sha256": hashlib.sha256(data).hexdigest(), "source_sha256": module_digest(v.path, v.define_dict),
        "kernels": kernel_names(v.path), "ptxas_sm_90": ptxas_figures(res.stdout + res.stderr),
        "build_s": round(took, 1),
    }


def _key(path: str, defines: list) -> tuple:
    return path, tuple(tuple(kv) for kv in defines)


def _variant_key(v: knobs.Variant) -> tuple:
    return _key(v.path, [list(kv) for kv in define_items(v.define_dict)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all", action="store_true", help="rebuild every variant")
    ap.add_argument("--check", action="store_true", help="only check (no nvcc); exit 1 when something is stale")
    ap.add_argument("--figures", action="store_true",
                    help="only recompute the manifest's ptxas figures (sm_90 cubins; binaries untouched)")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2)), help="parallel nvcc processes")
    ap.add_argument("--nvrtc12", default=None,
                    help="NVRTC 12.9's libnvrtc.so.12 for the cuda12 set (default $CUZK_NVRTC12, else the pip "
                         "package nvidia-cuda-nvrtc-cu12's)")
    args = ap.parse_args()
    old = json.loads(MANIFEST.read_text()) if MANIFEST.is_file() else {"modules": []}
    entries = {_key(e["path"], e["defines"]): e for e in old["modules"]}
    todo = [v for v in knobs.SHIPPED if args.all or not entry_is_fresh(v, entries.get(_variant_key(v)))]
    if args.check:
        stale12 = [v for v in knobs.SHIPPED if v not in todo and not cuda12_is_fresh(v, entries.get(_variant_key(v)))]
        for v in todo:
            print(f"stale: {v.path} {v.define_dict}")
        for v in stale12:
            print(f"stale ({bin_sets.CUDA12} set): {v.path} {v.define_dict}")
        raise SystemExit(1 if todo or stale12 else 0)
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise SystemExit("nvcc not found")
    nvrtc12 = find_nvrtc12(args.nvrtc12)
    if nvrtc12 is None or not nvrtc12.is_file():
        where = nvrtc12 or "no --nvrtc12, $CUZK_NVRTC12 or nvidia-cuda-nvrtc-cu12"
        raise SystemExit(f"NVRTC 12.9 not found ({where}): "
                         "pip install --target DIR nvidia-cuda-nvrtc-cu12==12.9.86, then "
                         "--nvrtc12 DIR/nvidia/cuda_nvrtc/lib/libnvrtc.so.12")
    if nvrtc_version(nvrtc12) != bin_sets.NVRTC12_VERSION:
        raise SystemExit(f"{nvrtc12} is NVRTC {nvrtc_version(nvrtc12)}, not {bin_sets.NVRTC12_VERSION}")
    if args.figures:
        with ThreadPoolExecutor(max_workers=args.jobs) as ex:
            figs = list(ex.map(lambda v: figures(v, nvcc), knobs.SHIPPED))
        for v, f in zip(knobs.SHIPPED, figs):
            e = entries.get(_variant_key(v))
            if e is not None and entry_is_fresh(v, e):
                e["ptxas_sm_90"] = f
        MANIFEST.write_text(json.dumps({**old, "modules": [entries[k] for k in sorted(entries)]}, indent=1) + "\n")
        print("ptxas figures refreshed")
        return
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    version = version.strip().splitlines()[-1]
    BIN.mkdir(parents=True, exist_ok=True)
    print(f"building {len(todo)} of {len(knobs.SHIPPED)} variants with {version}", flush=True)
    with ThreadPoolExecutor(max_workers=args.jobs) as ex:
        for e in ex.map(lambda v: build(v, nvcc), todo):
            entries[_key(e["path"], e["defines"])] = e
            print(f"  {e['file']}  {e['path']} {dict(e['defines'])}: {e['bytes'] / 1e6:.2f} MB in {e['build_s']} s",
                  flush=True)
    todo12 = [v for v in knobs.SHIPPED if args.all or not cuda12_is_fresh(v, entries.get(_variant_key(v)))]
    print(f"building the {bin_sets.CUDA12} set of {len(todo12)} variants with NVRTC {bin_sets.NVRTC12_VERSION}",
          flush=True)
    for v in todo12:
        rec = build_cuda12(v, nvrtc12)
        entries[_variant_key(v)][bin_sets.CUDA12] = rec
        print(f"  {rec['file']}  {v.path} {v.define_dict}: {rec['bytes'] / 1e6:.2f} MB in {rec['build_s']} s",
              flush=True)
    keep = {_variant_key(v) for v in knobs.SHIPPED}
    modules = [entries[k] for k in sorted(entries) if k in keep]
    shipped = {m["file"] for m in modules} | {m[bin_sets.CUDA12]["file"] for m in modules}
    for old_file in [*BIN.glob("*.fatbin"), *BIN.glob("*.zip")]:
        if old_file.name not in shipped:
            old_file.unlink()
    MANIFEST.write_text(json.dumps({"format": 1, "nvcc": version, "modules": modules}, indent=1) + "\n")
    total = sum(m["bytes"] + m[bin_sets.CUDA12]["bytes"] for m in modules)
    print(f"{len(modules)} variants, {total / 1e6:.2f} MB of binaries in {BIN.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
