"""The precompiled kernel binaries the package ships are the ones its sources make (no GPU, no nvcc).

scripts/build_kernels.py compiles every variant of ``knobs.SHIPPED`` into
``cuzk_mp/backends/gpu/kernels/bin`` and records, per variant, the digest of its
assembled source and knobs. A kernel edit without a rebuild would make the
loader fall back to NVRTC on every fresh machine (and the ~1 min G2 compile is
what the binaries exist to avoid): these tests fail first, naming the variant.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from cuzk_mp.backends.gpu import knobs
from cuzk_mp.backends.gpu.msm_params import MsmParams
from cuzk_mp.backends.gpu.source import define_items, kernel_names, module_digest

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "cuzk_mp" / "backends" / "gpu" / "kernels" / "bin"
MAX_TOTAL_BYTES = 12 << 20  # what the wheel may carry for the binaries


def _manifest() -> dict:
    import json

    return json.loads((BIN / "manifest.json").read_text())


def _key(path: str, defines: object) -> tuple:
    return path, tuple((str(k), str(v)) for k, v in defines)  # type: ignore[attr-defined]


def test_every_shipped_variant_has_a_fresh_binary() -> None:
    entries = {_key(e["path"], e["defines"]): e for e in _manifest()["modules"]}
    want = {_key(v.path, define_items(v.define_dict)): v for v in knobs.SHIPPED}
    assert set(entries) == set(want), "manifest and knobs.SHIPPED differ: run scripts/build_kernels.py"
    stale = []
    for k, v in want.items():
        e = entries[k]
        if e["source_sha256"] != module_digest(v.path, v.define_dict):
            stale.append(f"{v.path} {v.define_dict}: sources changed")
        f = BIN / e["file"]
        if not f.is_file() or hashlib.sha256(f.read_bytes()).hexdigest() != e["file_sha256"]:
            stale.append(f"{v.path} {v.define_dict}: {e['file']} missing or not the one built")
        if tuple(e["archs"]) != v.archs:
            stale.append(f"{v.path} {v.define_dict}: built for {e['archs']}, shipped for {v.archs}")
        assert e["kernels"] == kernel_names(v.path)
    assert not stale, "stale kernel binaries (run scripts/build_kernels.py):\n" + "\n".join(stale)


def test_prover_modules_cover_every_supported_gpu() -> None:
    for e in _manifest()["modules"]:
        if e["group"] in ("prover", "setup"):
            assert tuple(e["archs"]) == knobs.ALL_ARCHS, e["file"]


def test_binaries_stay_small_and_nothing_else_is_shipped() -> None:
    files = {e["file"] for e in _manifest()["modules"]}
    on_disk = {f.name for f in BIN.iterdir()} - {"manifest.json"}
    assert on_disk == files, f"files in kernels/bin without a manifest entry: {on_disk - files}"
    total = sum((BIN / f).stat().st_size for f in files)
    assert total <= MAX_TOTAL_BYTES, f"{total / 1e6:.1f} MB of kernel binaries"


def test_ptxas_reports_no_register_spills_in_the_hot_loops() -> None:
    """Registers and spills on sm_90 as the build recorded them: the G1 accumulation stays at
    4 blocks of 128 threads (<= 128 registers) and the NTT passes and H step do not spill."""
    figs = {(e["path"], tuple(map(tuple, e["defines"]))): e["ptxas_sm_90"] for e in _manifest()["modules"]}
    g1 = figs[(knobs.MSM_PATH, tuple(define_items(MsmParams().defines(False))))]
    assert g1["msm_accumulate"]["registers"] <= 128
    for path in (knobs.NTT_PATH, knobs.H_PATH):
        for kernel, f in figs[(path, ())].items():
            assert f["spill_stores"] == 0 and f["spill_loads"] == 0, (path, kernel, f)


def test_the_loader_finds_every_compiled_kernel() -> None:
    """The loader looks kernels up by the names of their ``extern "C"`` lines (kernel_names); those
    must be the entry points ptxas compiled (a kernel made by a macro would be looked up by the
    macro's parameter name and fail on the device)."""
    for e in _manifest()["modules"]:
        assert set(kernel_names(e["path"])) == set(e["ptxas_sm_90"]), e["path"]


def test_build_script_check_mode_agrees() -> None:
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_kernels.py"), "--check"],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
