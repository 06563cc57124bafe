"""A GpuBackend's in-flight and batch limits, from its resident keys' device plans together.

Why a module of its own: this is the backend's side of :mod:`.admission`. :class:`_DeviceLimits`
measures the device memory the backend may use (free memory plus what it holds), admits a new key's
plan beside the resident keys' (dropping the new key's precomputed multiples first where they would
cost partitions in flight), computes :attr:`in_flight_limit` and :attr:`batch_limit` again after a
key's load and after its close (freeing its domain's NTT tables where no other key uses them), and
hands out the staging places those limits allow.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import cupy

from . import memory
from .admission import DeviceAdmission, admit
from .backend_state import GpuKey, _BackendState
from .plan import DROP_ORDER, DevicePlan, ntt_table_bytes

log = logging.getLogger("cuzk_mp.backends.gpu.backend")  # the backend's logger: its lines keep their name


class _DeviceLimits(_BackendState):
    """The limits of a GpuBackend's partitions (a base of :class:`.backend.GpuBackend`)."""

    def _admission(self, new: DevicePlan | None = None) -> DeviceAdmission:
        """The resident keys' plans (and ``new``'s: a key about to be uploaded) together
        (:func:`.admission.admit`), against the device memory this backend may use: :attr:`device_bytes`,
        measured again here as the free memory plus what the backend holds now (its keys, NTT tables
        and staged partitions)."""
        with self._lock:
            keys = [k for k in self._keys if k.msms]
            held = sum(k.device_bytes for k in keys) + sum(p.nbytes for p in self._parts.values())
        built = self.ntt_engine.domain_sizes()
        held += sum(ntt_table_bytes(n) for n in built)
        self.device_bytes = max(self.device_bytes, memory.free_bytes()[0] + held)
        plans = [k.plan for k in keys if k.plan is not None] + ([new] if new is not None else [])
        domains = set(built) | {p.shape.domain_size for p in plans}
        return admit(plans, self.device_bytes, workers=self.workers,
                     tables=sum(ntt_table_bytes(n) for n in domains))

    def _beside(self, dplan: DevicePlan, replan: Callable[[str], DevicePlan],
                path: str) -> tuple[DevicePlan, DeviceAdmission]:
        """A key's plan ``dplan`` (made against the memory free now) and its admission beside the
        resident keys, its precomputed multiples dropped first, in :data:`.plan.DROP_ORDER`
        (``replan``: the key's plan with a comma list of the sections that keep theirs), while they
        cost partitions in flight: while the admission keeps smaller batches or fewer partitions in
        flight than with none of them (none is dropped where they save more MSM scratch than their
        tables take). The free memory they were sized against is the resident keys' room for their
        partitions; multiples are a speed-up only, and a key's own plan drops them before its
        batches and partitions in flight too. Only the new key's: the resident keys' are made, and
        dropping them would mean making them again when the room comes back."""
        together = self._admission(dplan)
        if not dplan.multiples or len(together.plans) == 1:
            return dplan, together
        bare = self._admission(replan("none"))
        dropped: list[str] = []
        for s in DROP_ORDER:
            if (together.fits, together.batch, together.in_flight) >= (bare.fits, bare.batch, bare.in_flight):
                break
            if s in dplan.multiples:
                dplan = replan(",".join(k for k in dplan.multiples if k != s) or "none")
                together = self._admission(dplan)
                dropped.append(s)
        if dropped:
            log.warning("key %s: without the precomputed multiples of %s, which would take the resident keys' "
                        "partitions in flight", path, ", ".join(dropped))
        return dplan, together

    def _key_closed(self, key: GpuKey) -> None:
        """After ``key`` is closed: its domain's NTT tables go where no resident key has that domain
        (kept, they would stay for the engine's life, one set per size the backend ever proved, and
        hold the remaining keys' limits down), then the limits are computed again without the key. A key of that domain
        being loaded at the same moment (tables built, key not yet registered) builds them again at
        its first H step; its admission counted them."""
        n = int(key.zkey.domain_size)
        with self._lock:
            shared = any(int(k.zkey.domain_size) == n for k in self._keys if k.msms)
        if not shared:
            with cupy.cuda.Device(self.device):
                self.ntt_engine.release(n)
        self._set_limits()

    def _set_limits(self) -> None:
        """:attr:`in_flight_limit` and :attr:`batch_limit` from the resident keys together (after a
        key's load, and after a key's close: its memory is free again). A stage waiting for a place
        sees the new limit at once."""
        together = self._admission()
        if together.plans:
            level = logging.INFO if together.fits else logging.WARNING
            log.log(level, "GPU %d: %s", self.device, together.summary())
        with self._slots:
            self.in_flight_limit = together.in_flight if together.plans else self.workers
            self.batch_limit = together.batch_limit
            self._slots.notify_all()

    def _take_stage_slot(self) -> list[int]:
        """Wait until fewer than :attr:`in_flight_limit` partitions are staged, unless the calling
        thread already holds one (a worker staging a batch never waits for itself); count one more."""
        held = getattr(self._staged_by, "held", None)
        if held is None:
            held = self._staged_by.held = [0]
        with self._slots:
            if held[0] == 0:
                self._slots.wait_for(lambda: self._staged_count < self.in_flight_limit)
            self._staged_count += 1
            held[0] += 1
        return held

    def _free_stage_slot(self, held: list[int] | None) -> None:
        if held is None:
            return
        with self._slots:
            self._staged_count -= 1
            held[0] -= 1
            self._slots.notify_all()
