"""perf/gpu_msm_static.py reads ptxas's stall counts out of cuobjdump's SASS listing; perf/sass_digest.py
digests such listings per architecture and kernel."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import load_script

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


def test_stall_counts_come_from_each_instruction_s_control_word() -> None:
    mod = load_script(SCRIPT)
    stalls = mod.parse_stalls(LISTING)
    # 0x000fc800078e00ff >> 41 & 15 = 4; 0x000fe40000ffe4ff -> 2; 0x000fea0003800000 -> 5
    assert stalls == {"msm_accumulate": {0x0: 4, 0x10: 2}, "msm_reduce": {0x0: 5}}
    ins = mod.parse_sass(LISTING)["msm_accumulate"]
    counts = mod._counts(ins, stalls["msm_accumulate"])
    assert counts["instructions"] == 2 and counts["IMAD_WIDE"] == 1 and counts["stall_cycles"] == 6
    assert "stall_cycles" not in mod._counts(ins)


def test_sass_digests_are_per_architecture_and_see_operands_and_schedules() -> None:
    """perf/sass_digest.py: one digest per (file, architecture, function); the same listing under two
    architectures gives equal digests, and a changed operand or a changed control word (ptxas's
    schedule) changes only that function's digest."""
    mod = load_script(SCRIPT.parent / "sass_digest.py")
    two_archs = f"\narch = sm_80\n{LISTING}\narch = sm_90\n{LISTING}"
    d = mod.digests(two_archs, "msm.fatbin")
    assert sorted(d) == ["msm.fatbin|sm_80|msm_accumulate", "msm.fatbin|sm_80|msm_reduce",
                         "msm.fatbin|sm_90|msm_accumulate", "msm.fatbin|sm_90|msm_reduce"]
    assert d["msm.fatbin|sm_80|msm_accumulate"] == d["msm.fatbin|sm_90|msm_accumulate"]
    operand = mod.digests(two_archs.replace("R4, R5, RZ", "R4, R6, RZ", 1), "msm.fatbin")
    schedule = mod.digests(two_archs.replace("0x000fc800078e00ff", "0x000fca00078e00ff", 1), "msm.fatbin")
    for changed in (operand, schedule):
        diff = mod.compare(d, changed)
        assert diff == {"different": ["msm.fatbin|sm_80|msm_accumulate"], "only_before": [], "only_after": []}
    assert mod.compare(d, {k: v for k, v in d.items() if "reduce" not in k})["only_before"] == [
        "msm.fatbin|sm_80|msm_reduce", "msm.fatbin|sm_90|msm_reduce"]
