"""The GPU backend's device-memory plan (cuzk_mp/backends/gpu/plan.py) for PoRep-like keys of
several sizes on a device with a given free memory: what stays resident, how many partitions fit in
flight, and the fallbacks taken. A computation of the plan, not a measurement of a device.

    python perf/device_plan.py [--free-gib 139] [--log-n 24 26 27] [--workers 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cuzk_mp.backends.gpu.plan import KeyShape, plan_device  # noqa: E402
from cuzk_mp.circuits.synthetic_kinds import synthetic_circuit  # noqa: E402
from cuzk_mp.errors import DeviceMemoryError  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--free-gib", type=float, default=139.0, help="usable device memory (an H200: 139)")
    ap.add_argument("--log-n", type=int, nargs="+", default=[24, 26, 27])
    ap.add_argument("--workers", type=int, default=2, help="partitions in flight wanted (gpu_workers_per_device)")
    ap.add_argument("--multiples", default="auto", help="none, auto or a list of sections")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    free = int(args.free_gib * (1 << 30))
    rows = []
    for log_n in args.log_n:
        c = synthetic_circuit("porep-like", log_n)
        shape = KeyShape(1 << log_n, c.n_wires, c.n_public)
        try:
            plan = plan_device(shape, free, workers=args.workers, multiples=args.multiples)
            row = {"log_n": log_n, **plan.as_dict()}
            print(f"2^{log_n}: {plan.summary()}")
        except DeviceMemoryError as exc:
            row = {"log_n": log_n, "refused": str(exc)}
            print(f"2^{log_n}: refused: {exc}")
        rows.append(row)
    if args.json:
        out = {"what": __doc__.splitlines()[0], "command": "python perf/device_plan.py " + " ".join(sys.argv[1:]),
               "free_bytes": free, "workers": args.workers, "multiples": args.multiples,
               "machine": {"note": "computed, no device involved", "python": platform.python_version()},
               "plans": rows}
        args.json.write_text(json.dumps(out, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
