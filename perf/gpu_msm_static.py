"""Static cost report of the MSM kernels: ptxas registers/spills/stack, SASS counts, compile time.

No GPU needed: the module (``kernels/msm/msm.cu``, assembled exactly as the
prover compiles it, with the ``-D`` knobs of :class:`MsmParams` and any
extra ``-D``) is built with ``nvcc -arch=sm_90 -cubin -Xptxas -v -time``.
The report gives, per kernel, what ptxas says (registers, stack frame, spill
store/load bytes) and, when ``cuobjdump`` is on PATH (or ``$CUOBJDUMP``; pip
package ``nvidia-cuda-cuobjdump``), SASS instruction counts: the whole
function and the accumulation's main loop (the instructions between the
target of the function's widest backward branch and that branch: one bucket
step = key load, run change, point load, mixed addition with its rare
branches), and its hot path (``:hot``, see :func:`hot_path`) with the
bodies of the functions it calls; ``hot_code_bytes`` is the loop plus those
bodies, the code one bucket step runs through (16 bytes per instruction).
``IMAD`` counts every IMAD form (ptxas also issues moves and carry adds as
IMAD.MOV / IMAD.X), ``IMAD_WIDE`` the 32 x 32 -> 64 products alone (the
Montgomery work); ``LDL``/``STL`` are local-memory (spill, stack or
call-save) accesses; ``stall_cycles`` sums ptxas's stall counts (the cycles its
schedule makes one warp wait after each instruction: what a lone warp takes to
issue the path, memory waits aside).

Usage::

    python perf/gpu_msm_static.py [--g2] [--min-blocks B] [--nthreads T]
        [-D NAME=VALUE ...] [--json FILE] [--sass FILE]
    python perf/gpu_msm_static.py --variants --json FILE   # the G1 and G2 modules

cicc (NVVM) and ptxas seconds come from nvcc's ``-time`` table.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(1, str(Path(__file__).resolve().parent))

from cuzk_mp.backends.gpu.knobs import MSM_PATH  # noqa: E402
from cuzk_mp.backends.gpu.msm_params import MsmParams  # noqa: E402
from cuzk_mp.backends.gpu.source import assemble  # noqa: E402
# The level-1 kernels whose bucket step is reported (SASS loop and hot path).
ACC_KERNELS = ("msm_accumulate",)


def _code_key(kernel: str) -> str:
    """The report key of a level-1 kernel's hot code size (msm_accumulate's keeps its first name)."""
    return "hot_code_bytes" if kernel == "msm_accumulate" else f"hot_code_bytes:{kernel}"

_FUNC = re.compile(r"Function properties for (\S+)")
_ENTRY = re.compile(r"Compiling entry function '(\S+)'")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")
_SASS = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
_WORD = re.compile(r"/\* (0x[0-9a-f]{16}) \*/\s*$")


def parse_ptxas(text: str) -> dict[str, dict[str, int]]:
    """ptxas -v lines -> {function: {regs, stack, spill_st, spill_ld}} (device functions have no regs)."""
    out: dict[str, dict[str, int]] = {}
    cur = None
    for line in text.splitlines():
        m = _FUNC.search(line) or _ENTRY.search(line)
        if m:
            cur = m.group(1)
            out.setdefault(cur, {})
            continue
        if cur is None:
            continue
        m = _STACK.search(line)
        if m:
            out[cur].update(stack=int(m.group(1)), spill_st=int(m.group(2)), spill_ld=int(m.group(3)))
        m = _REGS.search(line)
        if m:
            out[cur]["regs"] = int(m.group(1))
    return out


def sass_listing(binary: Path) -> str | None:
    """``cuobjdump -sass`` of a cubin or fatbin (``$CUOBJDUMP``, else the one on PATH); None where there
    is no cuobjdump."""
    cuobjdump = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not cuobjdump:
        return None
    return subprocess.run([cuobjdump, "-sass", str(binary)], capture_output=True, text=True, check=True).stdout


def parse_sass(text: str) -> dict[str, list[tuple[int, str, str]]]:
    """cuobjdump -sass text -> {function: [(address, opcode, operands)]}; a predicated
    instruction's operands end with " @P"."""
    funcs: dict[str, list[tuple[int, str, str]]] = {}
    cur: list[tuple[int, str, str]] | None = None
    for line in text.splitlines():
        if "Function :" in line:
            cur = funcs.setdefault(line.split("Function :")[1].strip(), [])
            continue
        m = _SASS.match(line)
        if m and cur is not None:
            cur.append((int(m.group(1), 16), m.group(3), m.group(4) + (" @P" if m.group(2) else "")))
    return funcs


def parse_stalls(text: str) -> dict[str, dict[int, int]]:
    """cuobjdump -sass text -> {function: {address: stall count}}: the cycles ptxas makes a warp
    wait after each instruction (4 bits of the control word, bits 41-44 of an instruction's
    second 64-bit half on sm_70 and later). Their sum over a path is what ptxas's own schedule
    charges ONE warp to issue it, fixed latencies and pipe rates included, memory waits not: set
    beside the path's pipe work it says how many warps a scheduler needs to keep the pipe busy."""
    out: dict[str, dict[int, int]] = {}
    cur: dict[int, int] | None = None
    pending: int | None = None
    for line in text.splitlines():
        if "Function :" in line:
            cur = out.setdefault(line.split("Function :")[1].strip(), {})
            pending = None
            continue
        m = _SASS.match(line)
        if m:
            pending = int(m.group(1), 16)
            continue
        w = _WORD.search(line)
        if w and pending is not None and cur is not None:
            cur[pending] = (int(w.group(1), 16) >> 41) & 0xF
            pending = None
    return out


def _counts(ins: list[tuple[int, str, str]], stalls: dict[int, int] | None = None) -> dict[str, int]:
    ops = Counter(op.split(".")[0] for _, op, _ in ins)
    wide = sum(1 for _, op, _ in ins if op.startswith("IMAD.WIDE"))
    out = {"instructions": len(ins), "IMAD": ops["IMAD"], "IMAD_WIDE": wide, "IADD3": ops["IADD3"],
           "LDL": ops["LDL"], "STL": ops["STL"], "LDG": ops["LDG"], "LDS": ops["LDS"], "STS": ops["STS"],
           "other": len(ins) - sum(ops[k] for k in ("IMAD", "IADD3", "LDL", "STL", "LDG", "LDS", "STS"))}
    if stalls:
        out["stall_cycles"] = sum(stalls.get(a, 0) for a, _, _ in ins)
    return out


def main_loop(ins: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
    """Instructions of the widest loop: [target of the widest backward BRA, that BRA], among the
    kernel's own code (before its first callee: a callee's out-of-line blocks, e.g. the
    convergence fallback of a shuffle with a computed mask, also branch backwards)."""
    calls = [_call_target(op, args) for _, op, args in ins]
    end = min((t for t in calls if t is not None), default=1 << 62)
    best = (0, 0)
    for addr, op, args in ins:
        tgt = _branch_target(op, args)
        if tgt is not None and tgt < addr < end and addr - tgt > best[1] - best[0]:
            best = (tgt, addr)
    return [i for i in ins if best[0] <= i[0] <= best[1]]


def _branch_target(op: str, args: str) -> int | None:
    m = re.search(r"0x([0-9a-f]+)\s*$", args.replace(" @P", "").strip()) if op.startswith("BRA") else None
    return int(m.group(1), 16) if m else None


def _call_target(op: str, args: str) -> int | None:
    m = re.search(r"0x([0-9a-f]+)\s*$", args.replace(" @P", "").strip()) if op.startswith("CALL") else None
    return int(m.group(1), 16) if m else None


def hot_path(loop: list[tuple[int, str, str]], func: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
    """The loop's path with the most carry IMADs (then the fewest instructions), back edge excluded.

    That is one bucket step whose mixed addition takes the general branch (no
    flush, no negation, no exceptional case): the common step of a large MSM.
    A call weighs what its callee does (:func:`with_callees`); the path returned
    holds the call sites only.
    A predicated (``@P``) branch or exit also falls through.
    """
    addrs = [a for a, _, _ in loop]
    leaders = {addrs[0]}
    for a, op, args in loop:
        tgt = _branch_target(op, args)
        if op.startswith(("BRA", "EXIT", "CALL", "RET")):
            leaders.add(a + 16)
        if tgt is not None and tgt >= addrs[0]:
            leaders.add(tgt)
    blocks: list[list[tuple[int, str, str]]] = []
    for ins in loop:
        if ins[0] in leaders or not blocks:
            blocks.append([])
        blocks[-1].append(ins)
    start = {b[0][0]: k for k, b in enumerate(blocks)}
    best: list[tuple[int, int, list[int]] | None] = [None] * len(blocks)
    for k in range(len(blocks) - 1, -1, -1):  # forward edges only: a DAG in address order
        a, op, args = blocks[k][-1]
        succ = [] if k == len(blocks) - 1 else [k + 1]
        tgt = _branch_target(op, args)
        guarded = args.endswith(" @P")
        if op.startswith("BRA") and not guarded:
            succ = []
        if tgt is not None and tgt > a and tgt in start:
            succ.append(start[tgt])
        if op.startswith("EXIT") and not guarded:
            succ = []
        imad = sum(1 for _, o, _ in with_callees(blocks[k], func) if o.startswith("IMAD") and ".X" in o)
        tails = [best[s] for s in succ if best[s] is not None]
        if k == len(blocks) - 1:
            tails = [(0, 0, [])]
        if not tails:
            continue
        t = max(tails, key=lambda x: (x[0], -x[1]))
        best[k] = (t[0] + imad, t[1] + len(blocks[k]), [k, *t[2]])
    path = best[0][2] if best[0] else []
    return [ins for k in path for ins in blocks[k]]


def with_callees(path: list[tuple[int, str, str]], func: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
    """``path`` with each ``CALL.REL`` replaced by the callee's straight line up to its first RET
    (recursively): the instructions one pass executes when the callees do not branch."""
    index = {a: k for k, (a, _, _) in enumerate(func)}
    out: list[tuple[int, str, str]] = []
    for ins in path:
        out.append(ins)
        a, op, args = ins
        m = re.search(r"0x([0-9a-f]+)\s*$", args.replace(" @P", "").strip()) if op.startswith("CALL") else None
        if m and int(m.group(1), 16) in index:
            body = []
            for callee in func[index[int(m.group(1), 16)]:]:
                body.append(callee)
                if callee[1].startswith("RET"):
                    break
            out.extend(with_callees(body, func) if len(body) < len(func) else body)
    return out


def compile_report(g2: bool, params: MsmParams, extra: dict[str, str] | None = None,
                   sass_out: Path | None = None) -> dict[str, Any]:
    """Build the module with nvcc (``params.defines(g2)`` plus ``extra``), return ptxas
    figures, SASS counts and compile seconds."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise SystemExit("nvcc not found on PATH")
    defs = {**{k: str(v) for k, v in params.defines(g2).items()}, **(extra or {})}
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin, times = Path(tmp, "msm.cu"), Path(tmp, "msm.cubin"), Path(tmp, "time.csv")
        src.write_text(assemble(MSM_PATH))
        cmd = [nvcc, "-arch=sm_90", "-std=c++17", "-cubin", "-Xptxas", "-v", "-time", str(times),
               *(f"-D{k}={v}" for k, v in sorted(defs.items())), "-o", str(cubin), str(src)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode:
            raise SystemExit(f"nvcc failed ({' '.join(cmd)}):\n{res.stderr[-4000:]}")
        shown = [c for c in cmd[1:-3] if c not in ("-time", str(times))]
        report: dict[str, Any] = {"command": " ".join(["nvcc", *shown, "-o msm.cubin msm.cu"]),
                                  "defines": defs, "ptxas": parse_ptxas(res.stderr + res.stdout)}
        with times.open() as f:
            for row in csv.reader(f):
                if len(row) > 7 and row[1].strip() in ("cicc", "ptxas"):
                    report[f"{row[1].strip()}_s"] = round(float(row[6]) / 1e3, 1)
        text = sass_listing(cubin)
        if text is not None:
            if sass_out:
                sass_out.write_text(text)
            sass, stalls = parse_sass(text), parse_stalls(text)
            report["sass"] = {name: _counts(ins, stalls.get(name)) for name, ins in sass.items()}
            for kernel in ACC_KERNELS:
                if kernel not in sass:
                    continue
                loop = main_loop(sass[kernel])
                report["sass"][f"{kernel}:loop"] = _counts(loop, stalls.get(kernel))
                func = sass[kernel]
                path = hot_path(loop, func)
                report["sass"][f"{kernel}:hot"] = _counts(with_callees(path, func), stalls.get(kernel))
                report[_code_key(kernel)] = 16 * (len(loop) + len({i for i in with_callees(path, func)} - set(loop)))
    return report


def summary(rep: dict[str, Any]) -> str:
    """A few lines: ptxas per kernel, SASS of the accumulation loop, compile seconds."""
    lines = [rep["command"]]
    for name, p in sorted(rep["ptxas"].items()):
        if "regs" in p:
            lines.append(f"  {name:16} regs {p['regs']:3}  stack {p.get('stack', 0):5}  "
                         f"spill st/ld {p.get('spill_st', 0)}/{p.get('spill_ld', 0)}")
    for kernel in ACC_KERNELS:
        for name in (kernel, f"{kernel}:loop", f"{kernel}:hot"):
            if name in rep.get("sass", {}):
                c = rep["sass"][name]
                lines.append(f"  SASS {name:26} " + " ".join(f"{k} {v}" for k, v in c.items()))
        if _code_key(kernel) in rep:
            lines.append(f"  {kernel}: code of the loop and the callees it runs: {rep[_code_key(kernel)] // 1024} KB")
    lines.append(f"  cicc {rep.get('cicc_s')} s  ptxas {rep.get('ptxas_s')} s")
    return "\n".join(lines)


def main() -> None:
    """Compile one variant, print the summary, optionally write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--g2", action="store_true", help="the G2 module (default G1)")
    ap.add_argument("--nthreads", type=int, default=128, help="MsmParams.nthreads")
    ap.add_argument("--min-blocks", type=int, default=None, help="MsmParams.acc_min_blocks")
    ap.add_argument("-D", dest="defines", action="append", default=[], help="extra define K=V")
    ap.add_argument("--variants", action="store_true",
                    help="the G1 and the G2 module")
    ap.add_argument("--json", type=Path, default=None, help="write the full report here")
    ap.add_argument("--sass", type=Path, default=None, help="write the SASS listing here")
    args = ap.parse_args()
    defines = dict(d.split("=", 1) if "=" in d else (d, "1") for d in args.defines)
    if args.variants:
        reps = {"g1_default": compile_report(False, MsmParams(), defines)}
        print(summary(reps["g1_default"]), flush=True)
        reps["g2_default"] = compile_report(True, MsmParams(), defines)
        print("[g2] " + summary(reps["g2_default"]), flush=True)
        if args.json:
            args.json.write_text(json.dumps(_with_meta(reps), indent=1, sort_keys=True))
        return
    params = MsmParams(nthreads=args.nthreads, acc_min_blocks=args.min_blocks)
    rep = compile_report(args.g2, params, defines, args.sass)
    print(summary(rep))
    if args.json:
        args.json.write_text(json.dumps(_with_meta({"report": rep}), indent=1, sort_keys=True))


def _with_meta(reports: dict[str, Any]) -> dict[str, Any]:
    """The reports with the date, the nvcc release and a note that no GPU ran."""
    version = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    return {"date": datetime.date.today().isoformat(), "gpu": "none: static sm_90 cubin figures",
            "nvcc": next((v for v in version if "release" in v), None), "variants": reports}


if __name__ == "__main__":
    main()
