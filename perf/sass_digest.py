"""A digest of every kernel's machine code in a directory of fatbins, and the comparison of two.

Why: a change to the kernel sources that should leave the shipped kernels alone (a knob that is
compiled out, a kernel taken out of a module, a comment) is checked without a device: rebuild
(``scripts/build_kernels.py``), digest the binaries before and after, and compare. Equal digests
mean the same instructions, operands and stall counts (ptxas's schedule) on every architecture,
so the device's speed and results are those measured on the old binaries.

    python3 perf/sass_digest.py cuzk_mp/backends/gpu/kernels/bin --json before.json
    python3 perf/sass_digest.py cuzk_mp/backends/gpu/kernels/bin --compare before.json

Needs ``cuobjdump`` and ``nvdisasm`` on PATH (or ``$CUOBJDUMP``; pip packages
``nvidia-cuda-cuobjdump`` / ``nvidia-cuda-nvdisasm``), no GPU. The listing and its
parsing are ``gpu_msm_static``'s.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_msm_static import parse_sass, parse_stalls, sass_listing  # noqa: E402

_ARCH = re.compile(r"^\s*arch = (sm_\d+)\s*$", re.M)


def digests(text: str, name: str) -> dict[str, str]:
    """cuobjdump -sass text of one fatbin -> {"name|arch|function": sha256 of its instructions
    (address, opcode, operands, stall count)}; the text holds one section per architecture."""
    out: dict[str, str] = {}
    marks = list(_ARCH.finditer(text))
    for i, m in enumerate(marks):
        section = text[m.end():marks[i + 1].start() if i + 1 < len(marks) else len(text)]
        stalls = parse_stalls(section)
        for fn, ins in parse_sass(section).items():
            st = stalls.get(fn, {})
            body = "\n".join(f"{a:x} {op} {args} {st.get(a, '')}" for a, op, args in ins)
            out[f"{name}|{m.group(1)}|{fn}"] = hashlib.sha256(body.encode()).hexdigest()
    return out


def digest_dir(path: Path) -> dict[str, str]:
    """:func:`digests` of every ``*.fatbin`` in ``path``."""
    out: dict[str, str] = {}
    for f in sorted(path.glob("*.fatbin")):
        text = sass_listing(f)
        if text is None:
            raise SystemExit("cuobjdump not found (PATH or $CUOBJDUMP; pip nvidia-cuda-cuobjdump)")
        out.update(digests(text, f.name))
    return out


def compare(old: dict[str, str], new: dict[str, str]) -> dict[str, list[str]]:
    """Keys whose digest differs, keys only in ``old``, keys only in ``new``."""
    return {"different": sorted(k for k in old.keys() & new.keys() if old[k] != new[k]),
            "only_before": sorted(old.keys() - new.keys()), "only_after": sorted(new.keys() - old.keys())}


def main() -> None:
    """Digest a directory; write the digests or compare them with earlier ones (exit 1 if any differ)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path, help="a directory of .fatbin files")
    ap.add_argument("--json", type=Path, help="write the digests here")
    ap.add_argument("--compare", type=Path, help="compare with digests written earlier")
    args = ap.parse_args()
    new = digest_dir(args.dir)
    if args.json:
        args.json.write_text(json.dumps(new, indent=0, sort_keys=True))
    print(f"{len(new)} kernel bodies (file, architecture, function) in {args.dir}")
    if args.compare:
        diff = compare(json.loads(args.compare.read_text()), new)
        same = len(new) - len(diff["different"]) - len(diff["only_after"])
        print(f"identical: {same}; different: {len(diff['different'])}; only before: {len(diff['only_before'])}; "
              f"only after: {len(diff['only_after'])}")
        for kind, keys in diff.items():
            for k in keys:
                print(f"  {kind}: {k}")
        sys.exit(1 if diff["different"] or diff["only_after"] else 0)


if __name__ == "__main__":
    main()
