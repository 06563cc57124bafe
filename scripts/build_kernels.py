#!/usr/bin/env python3
"""Build the GPU kernel binaries the package ships (cuzk_mp/backends/gpu/kernels/bin).

For every variant of ``cuzk_mp.backends.gpu.knobs.SHIPPED`` (a kernel file and its
``-D`` knobs) this assembles the translation unit, compiles it with nvcc into one
compressed fatbin holding machine code (SASS) for the variant's architectures, and
writes ``manifest.json``: per variant the digest of its assembled source and knobs
(what the loader and the CI check compare against), the fatbin's sha256 and size,
its kernels, and ptxas's register / spill / stack figures on sm_90.

    python3 scripts/build_kernels.py            # rebuild what is stale, in parallel
    python3 scripts/build_kernels.py --all      # rebuild everything
    python3 scripts/build_kernels.py --check    # no nvcc: exit 1 if a binary is stale

Needs nvcc (CUDA 13.0 here) but no GPU.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cuzk_mp.backends.gpu import knobs  # noqa: E402
from cuzk_mp.backends.gpu.source import assemble, define_items, kernel_names, module_digest  # noqa: E402

BIN = ROOT / "cuzk_mp" / "backends" / "gpu" / "kernels" / "bin"
MANIFEST = BIN / "manifest.json"
NVCC_FLAGS = ("-std=c++17", "-fatbin", "--compress-mode=size", "-Xptxas", "-v")
_PTXAS = re.compile(r"ptxas info\s*: Compiling entry function '(\w+)' for '(sm_\d+)'")
_PROPS = re.compile(r"Function properties for (\w+)")
_USED = re.compile(r"Used (\d+) registers")


def file_name(v: knobs.Variant) -> str:
    """Stable binary name of a variant: kernel file stem + a digest of its path and knobs."""
    tag = hashlib.sha256(repr((v.path, define_items(v.define_dict))).encode()).hexdigest()[:10]
    return f"{Path(v.path).stem}-{tag}.fatbin"


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
    """Whether a manifest entry matches the variant's current sources, knobs and archs and its file."""
    if entry is None or entry.get("source_sha256") != module_digest(v.path, v.define_dict):
        return False
    if tuple(entry.get("archs", ())) != v.archs or entry.get("flags") != list(NVCC_FLAGS):
        return False
    f = BIN / entry["file"]
    return f.is_file() and hashlib.sha256(f.read_bytes()).hexdigest() == entry.get("file_sha256")


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
    args = ap.parse_args()
    old = json.loads(MANIFEST.read_text()) if MANIFEST.is_file() else {"modules": []}
    entries = {_key(e["path"], e["defines"]): e for e in old["modules"]}
    todo = [v for v in knobs.SHIPPED if args.all or not entry_is_fresh(v, entries.get(_variant_key(v)))]
    if args.check:
        for v in todo:
            print(f"stale: {v.path} {v.define_dict}")
        raise SystemExit(1 if todo else 0)
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise SystemExit("nvcc not found")
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
    keep = {_variant_key(v) for v in knobs.SHIPPED}
    modules = [entries[k] for k in sorted(entries) if k in keep]
    for f in BIN.glob("*.fatbin"):
        if f.name not in {m["file"] for m in modules}:
            f.unlink()
    MANIFEST.write_text(json.dumps({"format": 1, "nvcc": version, "modules": modules}, indent=1) + "\n")
    total = sum(m["bytes"] for m in modules)
    print(f"{len(modules)} binaries, {total / 1e6:.2f} MB in {BIN.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
