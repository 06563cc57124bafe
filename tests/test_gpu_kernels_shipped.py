"""The precompiled kernel binaries the package ships are the ones its sources make (no GPU, no nvcc).

scripts/build_kernels.py compiles every variant of ``knobs.SHIPPED`` into
``cuzk_mp/backends/gpu/kernels/bin`` and records, per variant, the digest of its
assembled source and knobs. A kernel edit without a rebuild would make the
loader fall back to NVRTC on every fresh machine (and the ~1 min G2 compile is
what the binaries exist to avoid): these tests fail first, naming the variant.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from cuzk_mp.backends.gpu import bin_sets, knobs
from cuzk_mp.backends.gpu.msm_params import MsmParams
from cuzk_mp.backends.gpu.source import define_items, kernel_names, module_digest

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "cuzk_mp" / "backends" / "gpu" / "kernels" / "bin"
MAX_TOTAL_BYTES = 16 << 20  # what the wheel may carry for the binaries (both sets)


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
        sub = e.get(bin_sets.CUDA12)
        if sub is None or sub["source_sha256"] != e["source_sha256"] or tuple(sub["archs"]) != v.archs:
            stale.append(f"{v.path} {v.define_dict}: no {bin_sets.CUDA12} set of these sources and archs")
        elif hashlib.sha256((BIN / sub["file"]).read_bytes()).hexdigest() != sub["file_sha256"]:
            stale.append(f"{v.path} {v.define_dict}: {sub['file']} not the one built")
        assert e["kernels"] == kernel_names(v.path)
    assert not stale, "stale kernel binaries (run scripts/build_kernels.py):\n" + "\n".join(stale)


def test_prover_modules_cover_every_supported_gpu() -> None:
    for e in _manifest()["modules"]:
        if e["group"] in ("prover", "setup"):
            assert tuple(e["archs"]) == knobs.ALL_ARCHS, e["file"]


def test_each_device_generation_takes_the_code_it_can_run() -> None:
    """The exact target where shipped, else the highest of the same major with a minor no higher
    (CUDA's cubin compatibility); a device of another major has no shipped code (NVRTC)."""
    shipped = knobs.ALL_ARCHS
    for device, want in [("sm_80", "sm_80"), ("sm_86", "sm_86"), ("sm_87", "sm_86"), ("sm_89", "sm_89"),
                         ("sm_90", "sm_90"), ("sm_100", "sm_100"), ("sm_103", "sm_100"), ("sm_120", "sm_120"),
                         ("sm_121", "sm_120"), ("sm_75", None), ("sm_110", None)]:
        assert knobs.sass_for(device, shipped) == want, device
    assert knobs.sass_for("sm_90", ("sm_80", "sm_86")) is None  # no newer major from older code
    assert knobs.sass_for("sm_86", ("sm_89",)) is None  # nor a higher minor
    with pytest.raises(ValueError, match="SASS target"):
        knobs.sass_for("compute_90", shipped)


def test_the_cuda12_set_holds_a_cubin_a_driver_before_cuda_13_reads() -> None:
    """Each variant's cuda12 zip holds one cubin per shipped target, for that target, in the ELF
    format of CUDA 12 (ABI version 7) up to sm_90; sm_100 and sm_120 come in version 8, which the
    drivers those boards need (12.8 and later) read. nvcc 13's own cubins are version 8 for all."""
    for e in _manifest()["modules"]:
        with zipfile.ZipFile(BIN / e[bin_sets.CUDA12]["file"]) as z:
            assert sorted(z.namelist()) == sorted(bin_sets.member_name(a) for a in knobs.ALL_ARCHS), e["file"]
        for arch in knobs.ALL_ARCHS:
            abi, target = bin_sets.cubin_target(bin_sets.read_cubin(BIN / e[bin_sets.CUDA12]["file"], arch))
            assert target == int(arch.removeprefix("sm_")), (e["file"], arch)
            assert abi == (7 if target < 100 else 8), (e["file"], arch, abi)
    with pytest.raises(ValueError, match="not a cubin"):
        bin_sets.cubin_target(b"\x7fELF\x01" + bytes(60))


def test_the_driver_picks_the_set_it_reads_first() -> None:
    both = {"file": "m.fatbin", bin_sets.CUDA12: {"file": "m.cuda12.zip"}}
    assert bin_sets.load_order(both, 13000) == [bin_sets.FATBIN, bin_sets.CUDA12]
    assert bin_sets.load_order(both, 13020) == [bin_sets.FATBIN, bin_sets.CUDA12]
    assert bin_sets.load_order(both, 12090) == [bin_sets.CUDA12, bin_sets.FATBIN]
    assert bin_sets.load_order(both, 12000) == [bin_sets.CUDA12, bin_sets.FATBIN]
    assert bin_sets.load_order({"file": "m.fatbin"}, 12040) == [bin_sets.FATBIN]
    assert bin_sets.load_order(both, 13000, "cuda12") == [bin_sets.CUDA12]
    assert bin_sets.load_order(both, 12000, "fatbin") == [bin_sets.FATBIN]
    assert bin_sets.load_order(both, 12000, "nvrtc") == []


def test_a_cubin_gets_a_file_named_by_its_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In the cache's kernels folder, reused while it holds the same bytes, rewritten where not;
    where the cache cannot be written, in a temp folder of this user's alone, and nowhere else."""
    data = b"\x7fELF" + bytes(range(256)) * 4
    first = bin_sets.cubin_file(data, tmp_path / "cache")
    assert first.parent == tmp_path / "cache" / "kernels" and first.read_bytes() == data
    assert bin_sets.cubin_file(data, tmp_path / "cache") == first
    first.write_bytes(b"something else")
    assert bin_sets.cubin_file(data, tmp_path / "cache") == first and first.read_bytes() == data
    assert bin_sets.cubin_file(data + b"!", tmp_path / "cache") != first
    (tmp_path / "file").write_bytes(b"")  # a cache "folder" that is a file
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    fallback = bin_sets.cubin_file(data, tmp_path / "file")
    assert fallback.parent == tmp_path / "tmp" / f"cuzk-mp-kernels-{os.getuid()}" and fallback.read_bytes() == data
    fallback.parent.chmod(0o777)  # a folder others may write: not used
    with pytest.raises(OSError, match="no folder could take a kernel binary"):
        bin_sets.cubin_file(data + b"?", tmp_path / "file")


def test_binaries_stay_small_and_nothing_else_is_shipped() -> None:
    files = {e["file"] for e in _manifest()["modules"]} | {e[bin_sets.CUDA12]["file"] for e in _manifest()["modules"]}
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


def test_the_loader_takes_the_set_the_driver_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """modules._shipped_module over a stand-in CuPy that records what it loads: on a CUDA 12 driver the
    cuda12 cubin of the device's target (written under the cache's kernels/), on CUDA 13 the fatbin;
    an sm_87 device takes sm_86's code, an sm_75 one none (NVRTC, saying why), and
    CUZK_GPU_BINARIES picks a set or none."""
    import importlib
    import types

    loaded: list[str] = []
    driver = [12040]

    class RawModule:
        def __init__(self, *, path: str) -> None:
            self.path = path

        def get_function(self, name: str) -> object:
            loaded.append(self.path)
            return object()

    class CudaError(Exception):
        pass

    cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(driverGetVersion=lambda: driver[0],
                                                               CUDARuntimeError=CudaError),
                                 driver=types.SimpleNamespace(CUDADriverError=CudaError))
    name = "cuzk_mp.backends.gpu.modules"
    import cuzk_mp.backends.gpu as gpu_pkg

    saved_module, saved_attr = sys.modules.get(name), gpu_pkg.__dict__.get("modules")
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(RawModule=RawModule, cuda=cuda))
    monkeypatch.setenv("CUZK_MP_CACHE", str(tmp_path))
    monkeypatch.delenv("CUZK_GPU_BINARIES", raising=False)
    sys.modules.pop(name, None)
    try:
        modules = importlib.import_module(name)
        v = next(v for v in knobs.SHIPPED if v.path == knobs.MSM_PATH)
        entry = modules.manifest_entry(v.path, v.define_dict)
        zipped = BIN / entry[bin_sets.CUDA12]["file"]

        def load(arch: str) -> tuple[object, str, str]:
            loaded.clear()
            mod, why = modules._shipped_module(v.path, v.define_dict, arch)
            return mod, why, loaded[-1] if loaded else ""

        mod, why, path = load("sm_90")
        assert mod is not None and why == "cuda12 sm_90" and Path(path).parent == tmp_path / "kernels"
        assert Path(path).read_bytes() == bin_sets.read_cubin(zipped, "sm_90")
        assert Path(load("sm_87")[2]).read_bytes() == bin_sets.read_cubin(zipped, "sm_86")
        mod, why, path = load("sm_75")
        assert mod is None and path == "" and "none of which runs on sm_75" in why
        driver[0] = 13000
        modules._driver_version.cache_clear()  # asked once a process: this stand-in's driver changes
        assert load("sm_90")[1:] == ("fatbin sm_90", str(BIN / entry["file"]))
        monkeypatch.setattr(modules, "device_arch", lambda: "sm_90")
        modules.get_module(v.path, v.define_dict)
        assert modules.origins() == "1 fatbin sm_90; CUDA driver 13.0"
        monkeypatch.setenv("CUZK_GPU_BINARIES", "cuda12")
        assert load("sm_90")[2].endswith(".cubin")
        assert load("sm_87")[1] == "cuda12 sm_86"
        monkeypatch.setenv("CUZK_GPU_BINARIES", "nvrtc")
        assert load("sm_90")[:2] == (None, "CUZK_GPU_BINARIES=nvrtc")
    finally:
        sys.modules.pop(name, None)
        if saved_module is not None:
            sys.modules[name] = saved_module
        if saved_attr is not None:
            gpu_pkg.modules = saved_attr
        else:
            gpu_pkg.__dict__.pop("modules", None)
