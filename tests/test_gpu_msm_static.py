"""perf/gpu_msm_static.py reads ptxas's stall counts out of cuobjdump's SASS listing."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "perf" / "gpu_msm_static.py"

# Two instructions of an sm_90 listing as cuobjdump prints them: the instruction with the first
# 64-bit half of its encoding, then a line with the second half (the control word in its bits 41+).
LISTING = """
\t\tFunction : msm_accumulate
        /*0000*/                   IMAD.WIDE.U32 R2, R4, R5, RZ ;                 /* 0x0000000504027225 */
                                                                                  /* 0x000fc800078e00ff */
        /*0010*/               @P0 IADD3.X R6, R7, R8, RZ, P1, !PT ;              /* 0x0000000807060210 */
                                                                                  /* 0x000fe40000ffe4ff */
\t\tFunction : msm_reduce
        /*0000*/                   EXIT ;                                         /* 0x000000000000794d */
                                                                                  /* 0x000fea0003800000 */
"""


def _load():
    spec = importlib.util.spec_from_file_location("gpu_msm_static", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_stall_counts_come_from_each_instruction_s_control_word() -> None:
    mod = _load()
    stalls = mod.parse_stalls(LISTING)
    # 0x000fc800078e00ff >> 41 & 15 = 4; 0x000fe40000ffe4ff -> 2; 0x000fea0003800000 -> 5
    assert stalls == {"msm_accumulate": {0x0: 4, 0x10: 2}, "msm_reduce": {0x0: 5}}
    ins = mod.parse_sass(LISTING)["msm_accumulate"]
    counts = mod._counts(ins, stalls["msm_accumulate"])
    assert counts["instructions"] == 2 and counts["IMAD_WIDE"] == 1 and counts["stall_cycles"] == 6
    assert "stall_cycles" not in mod._counts(ins)
