"""The proving keys resident in one prover process: loaded on first use, shared, evicted.

A prover process (:mod:`.prover_proc`) proves partitions of any circuit the engine names; the key of
each is read from its zkey (its coefficient pages let go: synthesis never needs them) or generated
on the device from the circuit's data, uploaded to the backend once, and kept while partitions use
it. :class:`KeyCache` owns those keys, counts their users, keeps them least recently used first
within ``srs_budget_bytes``, and tells the engine what is resident (``KeyState``). The prover's
threads only acquire and release; this module is where a key's life is decided.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError
from . import messages as msg
from .memory import CircuitSize, batched
from .procs import ChildContext


@dataclass
class ResidentKey:
    """One key loaded into this process's backend, and how many partitions use it now."""

    ref: msg.CircuitRef
    zkey: Any
    handle: Any
    nbytes: int
    users: int = 0
    vk: bytes | None = None  # the verification key of a generated key (sent with every KeyState of it)
    rows: Any = None  # the circuit data, mapped while partitions arrive as w alone (stage_witness reads it)
    rows_lock: threading.Lock = field(default_factory=threading.Lock)

    def witness_rows(self) -> Any:
        """The circuit's coded rows for the device witness map (mapped on first use, one object for
        the key's life: the backend keeps their device copy for that object)."""
        with self.rows_lock:
            if self.rows is None:
                from .keys import open_device_circuit_data

                ref = self.ref
                if ref.witness_map != "device" or not (ref.circuit_data and ref.synthetic and ref.log_n):
                    raise InputError(f"circuit {ref.circuit_id}: a partition of w alone, but its witness map is "
                                     f"the host's")
                self.rows = open_device_circuit_data(ref.circuit_data, ref.synthetic, ref.log_n)
            return self.rows


class KeyCache:
    """Resident keys of one prover process, least recently used first."""

    def __init__(self, ctx: ChildContext, backend: Any, budget: int | None, batch: int = 1,
                 ring_slots: int | None = None) -> None:
        self.ctx = ctx
        self.backend = backend
        self.budget = budget
        self.batch, self.ring_slots = batch, ring_slots  # the prover's batch cap, the ring's slots
        self.keys: OrderedDict[str, ResidentKey] = OrderedDict()
        self.evicting: set[str] = set()  # evict asked while in use: dropped when the last user releases it
        self.lock = threading.Lock()

    def acquire(self, ref: msg.CircuitRef) -> ResidentKey:
        """The resident key for ``ref`` (loaded on first use); pair with :meth:`release`."""
        with self.lock:
            key = self.keys.get(ref.circuit_id)
            if key is not None and key.ref != ref:  # the circuit's files changed: the old key goes once unused
                self.keys.pop(ref.circuit_id)
                if key.users == 0:
                    self._close(key)
                key = None
            if key is None:
                key = self._load(ref)
            self.evicting.discard(ref.circuit_id)
            self.keys.move_to_end(ref.circuit_id)
            key.users += 1
            self._shrink()  # once the key is in use: the budget takes older unused keys, never this one
            return key

    def release(self, key: ResidentKey) -> None:
        """One user fewer; evicts beyond the budget once nobody uses a key."""
        with self.lock:
            key.users -= 1
            cid = key.ref.circuit_id
            if key.users == 0 and self.keys.get(cid) is not key:  # replaced by a key of the circuit's new files
                self._close(key, announce=False)
            elif key.users == 0 and cid in self.evicting:
                self.evicting.discard(cid)
                self._drop(cid)
            self._shrink()

    def preload(self, ref: msg.CircuitRef) -> None:
        """Load without using (engine ``preload``); always answers with a ``KeyState``."""
        key = self.acquire(ref)
        self.ctx.send(msg.KeyState(ref.circuit_id, self.tier, key.nbytes, vk=key.vk))
        self.release(key)

    @property
    def tier(self) -> str:
        """Where resident keys live: "device" (GPU backend) or "host"."""
        return "device" if self.backend.name == "gpu" else "host"

    def evict(self, circuit_id: str) -> None:
        """Drop a key now, or as soon as its last user (a partition finalizing) releases it."""
        with self.lock:
            key = self.keys.get(circuit_id)
            if key is None:
                return
            if key.users == 0:
                self._drop(circuit_id)
            else:
                self.evicting.add(circuit_id)

    def batch_of(self, ref: msg.CircuitRef, domain_size: int, n_vars: int) -> int:
        """The most partitions of a circuit a worker stages together (:func:`.memory.batched`: the
        prover's batch where its ring segments are small enough to batch, else one; at most the
        ring's slots), what the backend plans the key's device memory for. The rule is the
        pipeline's (the ring's segment sizes, :data:`~.types.BATCH_MAX_BYTES`): the backend gets the
        number alone. A circuit whose partitions come as w alone is judged by w's segment."""
        size = CircuitSize(domain_size, n_vars, 0, 0, abc=ref.witness_map != "device")
        return batched(size, self.batch, self.ring_slots)

    def _load(self, ref: msg.CircuitRef) -> ResidentKey:
        t0 = time.perf_counter()
        vk: bytes | None = None
        if ref.key_source == "device":
            zkey, handle = self._generate(ref)
            vk = vk_json(zkey)
            what = "generated the INSECURE dev key"
        else:
            from ..formats.zkey import read_zkey

            zkey = read_zkey(ref.zkey)
            dropped = drop_coefficient_pages(zkey)  # before the upload: the load's peak stays one section chunk
            handle = self.backend.load_key(zkey, batch=self.batch_of(ref, zkey.domain_size, zkey.n_vars))
            what = f"loaded key ({dropped / 2**30:.2f} GiB of coefficient pages let go)"
        key = ResidentKey(ref, zkey, handle, int(getattr(handle, "nbytes", 0)), vk=vk)
        self.keys[ref.circuit_id] = key
        seconds = time.perf_counter() - t0
        self.ctx.log.info("%s %s (%d bytes) in %.2f s", what, ref.circuit_id, key.nbytes, seconds)
        self.ctx.send(msg.KeyState(ref.circuit_id, self.tier, key.nbytes, vk=vk, load_s=seconds))
        self.ctx.send(msg.Stats(dict(self.backend.stats())))  # what the backend now holds of its keys
        return key

    def _generate(self, ref: msg.CircuitRef) -> tuple[Any, Any]:
        """A synthetic circuit's dev key generated into the backend from its circuit data and the
        engine's toxic waste (:func:`cuzk_mp.groth16.setup_resident.setup_resident`)."""
        from ..groth16.setup import ToxicWaste
        from ..groth16.setup_resident import setup_resident
        from .keys import open_device_circuit_data

        assert ref.circuit_data and ref.toxic and ref.synthetic and ref.log_n, "CircuitTable makes device refs whole"
        data = open_device_circuit_data(ref.circuit_data, ref.synthetic, ref.log_n)
        try:
            made = setup_resident(data, self.backend, ToxicWaste(*(int(x) for x in ref.toxic)),
                                  name=f"{ref.circuit_id} ({ref.synthetic} 2^{ref.log_n})",
                                  witness_map=ref.witness_map == "device",
                                  batch=self.batch_of(ref, data.counts.domain_size, data.counts.n_vars))
        finally:
            data.close()
        return made.head, made.handle

    def _shrink(self) -> None:
        if self.budget is None:
            return
        for cid in list(self.keys):
            if sum(k.nbytes for k in self.keys.values()) <= self.budget:
                return
            if self.keys[cid].users == 0:
                self._drop(cid)

    def _drop(self, circuit_id: str) -> None:
        self._close(self.keys.pop(circuit_id))

    def _close(self, key: ResidentKey, announce: bool = True) -> None:
        """Free a key no partition uses; ``announce``: tell the engine the circuit has no key here now
        (not for a replaced key: its circuit's new key is resident)."""
        key.handle.close()
        key.zkey.close()
        if key.rows is not None:
            key.rows.close()
        if announce:
            self.ctx.send(msg.KeyState(key.ref.circuit_id, None, 0))


def vk_json(zkey: Any) -> bytes:
    """The snarkjs verification_key.json of a key's head, as bytes."""
    from ..formats.snarkjs_json import vk_to_json
    from ..groth16.keys import vk_from_zkey

    return json.dumps(vk_to_json(vk_from_zkey(zkey))).encode()


def drop_coefficient_pages(zkey: Any) -> int:
    """Let go of the pages of the key's section 4 (the A and B coefficients); the bytes released.

    Reading a zkey validates every coefficient, which faults the whole section in (2.8 GB of a
    2^24 PoRep-like key, 11 GB at 2^26), but a prover never reads it again: synthesis evaluates
    the matrices from its own compact circuit data. The pages are file pages of a read-only
    mapping, so dropping them loses nothing (a later read would fault them in from the file).
    """
    from ..backends.gpu.hostmem import release_pages

    return release_pages(zkey.coefs) if zkey.coefs is not None else 0
