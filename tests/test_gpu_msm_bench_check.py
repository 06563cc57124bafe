"""perf/gpu_msm_bench.py checks each timed MSM against (sum_i s_i t_i) G of its bases t_i G, a sum it
remembers for the last scalar array: that memory must never answer for other scalars (run on the CPU
kernel emulator, as ``perf/gpu_session.py --dry-run`` binds it, in a process of its own)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SCRIPT = """
import sys
sys.path[:0] = ["perf", "."]
import gpu_session
gpu_session._dry_run_setup()
import gpu_msm_bench as mb

bases = object.__new__(mb.Bases)  # its t_i without making the points: expected() needs t_i and G alone
bases.g2, bases.gen, bases.t, bases._last = False, mb.G1Point(), mb.random_scalars(64, "random", 1), (None, b"", None)


def fresh(s):
    return bases.gen * mb.Scalar.from_le_bytes(mb.dot_mod_r(s, bases.t).to_bytes(32, "little"))


s = mb.random_scalars(64, "random", 2)
assert bases.expected(s) == fresh(s)
s[:] = mb.random_scalars(64, "porep", 3)  # other scalars at the same address (as the next array of a size may be)
assert bases.expected(s) == fresh(s), "the sum of the scalars that were there before"
t = mb.random_scalars(64, "porep", 4)
assert bases.expected(t) == fresh(t) and bases.expected(t) != fresh(s)
print("ok")
"""


def test_the_remembered_sum_never_answers_for_other_scalars() -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr
