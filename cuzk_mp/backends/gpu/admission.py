"""The device admission of a backend: how many partitions are on the device at once, and in what
batches, with every resident key and any keys' partitions in flight together.

A key's :class:`.plan.DevicePlan` counts that key alone: its resident memory and its own partitions
in flight, against the memory free when it was loaded. A prover keeps several keys resident, and
its workers stage partitions of any of them side by side (each worker its own key's, and a
worker's batch takes the READY small partitions of any key, grouped by key once staged). So the
limits the backend keeps to (``GpuBackend.in_flight_limit``, ``GpuBackend.batch_limit``) come from
:func:`admit` over every resident key's plan together:

* resident: each key's points, multiples, support rows and witness map, and the NTT tables once
  per domain size (the backend's NTT engine keeps one table per size, whichever keys use it, until
  the last key of that size closes);
* in flight: ``in_flight`` batches of any of the keys (:func:`.plan.in_flight_bytes`: the largest
  batch computing with the largest scratch, beside the largest staged ones), a batched key's
  batch being the common ``batch`` (the prover's cap is one number for all its keys), an unbatched
  key's one partition;
* the margin, as a key's plan.

They are computed again at every key load (before the upload: a key that cannot be resident
beside the others with even one partition in flight is refused then) and at every key's eviction
(more room then: larger batches, more partitions in flight).

When the keys together do not fit as asked, the admission falls back as a key's plan does, in the
same order and words: smaller batches first, then fewer partitions in flight. A key's plan drops its
precomputed multiples before either; beside other keys, the backend drops those of the key being
loaded first too (``GpuBackend._beside``: its plan sized them against the memory free then, which is
the resident keys' room for their partitions), never the resident keys' (built: dropping them would
mean building them again when the room comes back).

Pure Python (no CuPy), as :mod:`.plan`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .plan import DEFAULT_MARGIN, GIB, BatchLoad, DevicePlan, in_flight_bytes


@dataclass
class DeviceAdmission:
    """Every resident key's plan together, against the device memory the backend may use (``free``:
    free memory with none of these keys nor partitions on the device); see the module docstring.

    ``tables``: the NTT tables' bytes (one per domain size); ``batch``: the most partitions of a
    batched key a worker stages together, as fitted (``batch_max``: as asked, the keys' largest);
    ``steps``: each fallback taken, in order; ``choice``: them in words ("as configured" where none).
    """

    plans: tuple[DevicePlan, ...]
    tables: int
    free: int
    margin: int
    workers: int
    in_flight: int
    batch: int
    batch_max: int
    steps: list[str] = field(default_factory=list)
    choice: str = "as configured"

    def batch_of(self, plan: DevicePlan) -> int:
        """How many of ``plan``'s key's partitions a worker stages together: the common batch where
        the key's partitions are batched, else one."""
        return min(self.batch, plan.batch_max)

    @property
    def batch_limit(self) -> int | None:
        """The backend's ``batch_limit``: the common batch where some key's partitions are batched,
        else None (no cap: every partition goes alone anyway)."""
        return self.batch if any(p.batch_max > 1 for p in self.plans) else None

    @property
    def resident(self) -> int:
        """The keys' resident memory, their NTT tables counted once per domain size."""
        return sum(p.resident - p.ntt_tables for p in self.plans) + self.tables

    @property
    def in_flight_total(self) -> int:
        """The partitions in flight at their peak, of whichever keys (:func:`.plan.in_flight_bytes`)."""
        loads = [BatchLoad(self.batch_of(p), p.partition_total, p.staged_total, p.scratch_at(self.batch_of(p)))
                 for p in self.plans]
        return in_flight_bytes(loads, self.in_flight)

    @property
    def total(self) -> int:
        """Everything at once, the margin included."""
        return self.resident + self.in_flight_total + self.margin

    @property
    def fits(self) -> bool:
        """Whether the total is within the memory the backend may use."""
        return self.total <= self.free

    def summary(self) -> str:
        """One line, as a key's plan's: the parts in GiB, the total against the memory, the choice."""
        sizes = ", ".join(f"2^{p.shape.domain_size.bit_length() - 1}" for p in self.plans)
        largest = max((self.batch_of(p) * p.partition_total for p in self.plans), default=0)
        scratch = max((p.scratch_at(self.batch_of(p)) for p in self.plans), default=0)
        return (f"device plan of {len(self.plans)} resident key(s) ({sizes}): keys {self.resident / GIB:.1f} GiB"
                f" + {self.in_flight} partition(s) in flight of any key"
                + (f" in batches of {self.batch}" if self.batch_limit is not None and self.batch > 1 else "")
                + f" x {largest / GIB:.1f} GiB a batch at most + MSM scratch {scratch / GIB:.1f} GiB"
                f" + margin {self.margin / GIB:.1f} GiB = {self.total / GIB:.1f} GiB of {self.free / GIB:.1f} GiB"
                f" free: {'fits' if self.fits else 'does NOT fit'}; {self.choice}")

    def refusal(self) -> str:
        """The message of keys that do not fit together even with one partition in flight."""
        return (f"the resident proving keys together ({len(self.plans)}: domains "
                f"{', '.join(f'2^{p.shape.domain_size.bit_length() - 1}' for p in self.plans)}) need "
                f"{self.total / GIB:.2f} GiB of device memory with one partition of any of them in flight (keys "
                f"{self.resident / GIB:.2f} GiB, partitions and MSM scratch {self.in_flight_total / GIB:.2f} GiB, "
                f"margin {self.margin / GIB:.2f} GiB) but only {self.free / GIB:.2f} GiB is usable; evict a key "
                f"first, or prove this circuit on a device of its own")


def admit(plans: Sequence[DevicePlan], free: int, *, workers: int, tables: int | None = None,
          margin: int = DEFAULT_MARGIN) -> DeviceAdmission:
    """The admission of the keys of ``plans`` resident together, ``free`` bytes of device memory for
    them (see :class:`DeviceAdmission`), ``workers`` prover workers: the largest common batch (at most
    the keys' largest ``batch_max``), then the most partitions in flight (at most ``workers``), that fit.
    ``tables``: the NTT tables' bytes (None: each plan's domain's once). Never raises: where even
    one partition in flight does not fit, the result says so (``fits`` false) and the caller decides
    (a key's load refuses it; an eviction keeps one partition in flight)."""
    workers = max(1, int(workers))
    if tables is None:
        tables = sum({p.shape.domain_size: p.ntt_tables for p in plans}.values())
    batch_max = max((p.batch_max for p in plans), default=1)
    out = DeviceAdmission(tuple(plans), tables, free, margin, workers, workers, batch_max, batch_max)
    while not out.fits and out.batch > 1:
        out.batch -= 1
        out.steps.append(f"batches of {out.batch} partition(s) instead of {batch_max}")
    while not out.fits and out.in_flight > 1:
        out.in_flight -= 1
        out.steps.append(f"{out.in_flight} partition(s) in flight instead of {workers}")
    parts = [f"batches of {out.batch} partition(s) instead of {batch_max}"] if out.batch < batch_max else []
    parts += [f"{out.in_flight} partition(s) in flight instead of {workers}"] if out.in_flight < workers else []
    if parts:
        out.choice = "; ".join(parts)
    return out
