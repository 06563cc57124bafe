"""The proving keys resident in one prover process: loaded on first use, shared, evicted.

A prover process (:mod:`.prover_proc`) proves partitions of any circuit the engine names; the key of
each is read from its zkey (its coefficient pages let go: synthesis never needs them) or generated
on the device from the circuit's data, uploaded to the backend once, and kept while partitions use
it. :class:`KeyCache` owns those keys, counts their users, keeps them least recently used first
within ``srs_budget_bytes``, and tells the engine what is resident (``KeyState``). The prover's
threads only acquire and release; this module is where a key's life is decided. A key's load or
close never holds up the other circuits' acquires and releases (see :class:`KeyCache`): a daemon
serving two circuits keeps proving one while the other's key loads.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError, error_kind
from . import messages as msg
from .circuits import check_pinned
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


class _Loading:
    """A key being loaded, outside the cache's lock: the acquires of the same CircuitRef that come
    meanwhile wait for it and share its outcome (the key, each of them one more user; or its error)."""

    def __init__(self, ref: msg.CircuitRef) -> None:
        self.ref = ref
        self.waiters = 1  # the acquires that get this load's key (its first users)
        self.done = threading.Event()
        self.key: ResidentKey | None = None
        self.error: BaseException | None = None


_Going = tuple[ResidentKey, bool]  # a key decided to go, and whether the engine is told (see _close)


class KeyCache:
    """Resident keys of one prover process, least recently used first.

    ``lock`` guards the bookkeeping alone (which keys are resident, loading or going, their users),
    never a key's load or close: a load takes 10-60 s (a zkey read and uploaded, or a dev key
    generated on the device) and a GPU key's close may synchronize the whole device, so while one
    circuit's key loads or a key closes, the other circuits' partitions still acquire their resident
    keys and release them (a finished proof is answered, the next partition staged). Loads run one
    at a time (``load_lock``: two uploads at once could each pass the device's memory check and
    together overrun it), each after the closes already decided are done (their memory is free
    again, and a circuit's "gone" KeyState is sent before its next "loaded" one). A close runs in
    the thread that decided it, once the lock is released. So the KeyStates of a circuit reach the
    engine in the order of what happened to its keys here, the last one describing what is resident
    (a load's while ``loading`` holds the circuit, a preload's and a failed load's "gone" under the
    lock: :meth:`preload`, :meth:`_load_shared`).
    """

    def __init__(self, ctx: ChildContext, backend: Any, budget: int | None, batch: int = 1,
                 ring_slots: int | None = None) -> None:
        self.ctx = ctx
        self.backend = backend
        self.budget = budget
        self.batch, self.ring_slots = batch, ring_slots  # the prover's batch cap, the ring's slots
        self.keys: OrderedDict[str, ResidentKey] = OrderedDict()
        self.loading: dict[str, _Loading] = {}  # circuit id -> its key's load in progress
        self.evicting: set[str] = set()  # evict asked while in use: dropped when the last user releases it
        self.told: set[str] = set()  # circuits the engine was last told have a key here (KeyState)
        self.replaced: dict[str, int] = {}  # circuit id -> its keys replaced by other files, still in use
        self.lock = threading.Lock()
        self.load_lock = threading.Lock()  # one load at a time in the process
        self.closing = 0  # keys decided to go whose close is not done yet
        self.closed = threading.Condition(self.lock)  # notified as each of them is

    def acquire(self, ref: msg.CircuitRef) -> ResidentKey:
        """The resident key for ``ref`` (loaded on first use); pair with :meth:`release`.

        A resident key is had at once, whatever else loads or closes. A key not resident is loaded
        by this call, after any other circuit's load (one at a time); an acquire of the same ref
        that comes while it loads waits for that load and gets its key too, or its error: each
        waiting partition fails with it, rather than each trying again in turn for as long as a
        load takes, and the next acquire after it loads again. An acquire of another ref of the
        circuit (its files changed) waits for the load, then replaces that key; one pinned to a key
        file that has since changed (a job accepted before the file was replaced) is an InputError
        instead, the resident key, the file's as it is now, kept for the jobs that use it."""
        cid = ref.circuit_id
        checked = ref.zkey_id is None  # a pinned ref is checked before it replaces a resident key
        while True:
            going: list[_Going] = []
            key: ResidentKey | None = None
            own = stale = False
            with self.lock:
                self.evicting.discard(cid)  # used again: an eviction asked before is off
                pending = self.loading.get(cid)
                if pending is None:
                    key = self.keys.get(cid)
                    stale = key is not None and key.ref != ref and not checked
                    if stale:
                        key = None
                    elif key is not None and key.ref != ref:  # the files changed: the old key goes once unused
                        if key.ref.zkey_id != ref.zkey_id and ref.zkey_id is not None and key.ref.zkey == ref.zkey:
                            self.ctx.log.info("zkey %s changed on disk (size/header): loading the new key for "
                                              "circuit %s", ref.zkey, cid)
                        self.keys.pop(cid)
                        if key.users == 0:
                            going.append(self._going(key))
                        else:
                            self.replaced[cid] = self.replaced.get(cid, 0) + 1
                        key = None
                    if key is not None:
                        self.keys.move_to_end(cid)
                        key.users += 1
                        going += self._shrink()  # the budget takes older unused keys, never this one
                    elif not stale:
                        pending = self.loading[cid] = _Loading(ref)
                        own = True
                elif pending.ref == ref:
                    pending.waiters += 1
            if stale:  # a job accepted before its key file was replaced: it fails, the file's key stays resident
                check_pinned(ref)
                checked = True
                continue
            if own:  # its closes (a replaced key) come first: their errors are the load's
                assert pending is not None
                return self._load_shared(pending, going)
            self._close_all(going)  # none in fact: after each call the keys fit the budget or all are used
            if key is not None:
                return key
            assert pending is not None
            pending.done.wait()
            if pending.ref != ref:  # another ref's load: look again (that key is replaced)
                continue
            if pending.error is not None:
                raise pending.error
            assert pending.key is not None
            return pending.key

    def release(self, key: ResidentKey) -> None:
        """One user fewer; evicts beyond the budget once nobody uses a key."""
        with self.lock:
            key.users -= 1
            cid = key.ref.circuit_id
            going: list[_Going] = []
            if key.users == 0 and self.keys.get(cid) is not key:  # replaced by a key of the circuit's new files:
                # the engine hears "gone" only where no newer key of the circuit is resident or coming (its
                # load failed) and no other replaced one is still in use, else that key's own "loaded"
                # stands, or the failed load (_load_shared) or the last replaced key's release says it
                self.replaced[cid] -= 1
                if not self.replaced[cid]:
                    del self.replaced[cid]
                going.append(self._going(key, announce=self._none_here(cid)))
            elif key.users == 0 and cid in self.evicting:
                self.evicting.discard(cid)
                going.append(self._drop(cid))
            going += self._shrink()
        self._close_all(going)

    def preload(self, ref: msg.CircuitRef) -> None:
        """Load without using (engine ``preload``); answers with a ``KeyState`` of the key, or, where
        another thread's acquire of the circuit's other files replaced it once the acquire here had
        returned, leaves the answer to that key (its load reports it; its failed load, to this key's
        release, which announces the circuit gone).

        The engine keeps the last KeyState of each circuit and process as what is resident there, so
        this one is sent under the lock, while the key is the circuit's key here: sent after that, it
        could follow the report of the key that replaced it and describe a key no longer here.

        A failed preload answers with its error, always (and raises it): the engine waits for an answer
        from every prover it asked. The engine keeps an error apart from what is resident
        (:meth:`~cuzk_mp.pipeline.circuits.CircuitTable.on_key_state`), so an error that arrives after
        the report of a key another thread loaded meanwhile, or while an older key is resident, does
        not make that key look gone."""
        try:
            key = self.acquire(ref)
        except Exception as exc:
            self.ctx.send(msg.KeyState(ref.circuit_id, None, 0, error=f"{type(exc).__name__}: {exc}",
                                       error_kind=error_kind(exc)))
            raise
        try:
            with self.lock:
                if self.keys.get(ref.circuit_id) is key:
                    self.ctx.send(msg.KeyState(ref.circuit_id, self.tier, key.nbytes, vk=key.vk))
        finally:
            self.release(key)

    @property
    def tier(self) -> str:
        """Where resident keys live: "device" (GPU backend) or "host"."""
        return "device" if self.backend.name == "gpu" else "host"

    def evict(self, circuit_id: str) -> None:
        """Drop a key now, or as soon as its last user (a partition finalizing) releases it. A key
        being loaded is in use by the acquires waiting for it: it goes once they release it (unless
        a later acquire of the circuit comes first, as for a resident key)."""
        with self.lock:
            key = self.keys.get(circuit_id)
            going: list[_Going] = []
            if circuit_id in self.loading or (key is not None and key.users > 0):
                self.evicting.add(circuit_id)
            elif key is not None:
                going.append(self._drop(circuit_id))
        self._close_all(going)

    def batch_of(self, ref: msg.CircuitRef, domain_size: int, n_vars: int) -> int:
        """The most partitions of a circuit a worker stages together (:func:`.memory.batched`: the
        prover's batch where its ring segments are small enough to batch, else one; at most the
        ring's slots), what the backend plans the key's device memory for. The rule is the
        pipeline's (the ring's segment sizes, :data:`~.types.BATCH_MAX_BYTES`): the backend gets the
        number alone. A circuit whose partitions come as w alone is judged by w's segment."""
        size = CircuitSize(domain_size, n_vars, 0, 0, abc=ref.witness_map != "device")
        return batched(size, self.batch, self.ring_slots)

    def _load_shared(self, pending: _Loading, going: list[_Going]) -> ResidentKey:
        """Load ``pending``'s key for the acquires waiting for it (after ``going``, the closes its
        owner decided, after other loads, and after the closes decided so far), then make it
        resident with them as its users. A failed load, or a failed close before it, leaves nothing
        behind but the error its acquires raise (were ``pending`` left in ``loading``, every later
        acquire of the circuit would wait for it forever), and the circuit's "gone" where the engine
        was last told of a key that a release let go while this load ran (it left the word to it)."""
        cid = pending.ref.circuit_id
        try:
            self._close_all(going)
            with self.load_lock:
                with self.closed:
                    self.closed.wait_for(lambda: self.closing == 0)
                key = self._load(pending.ref)
        except BaseException as exc:
            try:
                with self.lock:
                    del self.loading[cid]
                    self.evicting.discard(cid)  # nothing to evict
                    pending.error = exc
                    if self._none_here(cid):  # a replaced key let go while this loaded: its "gone" was left to us
                        self.told.discard(cid)
                        self.ctx.send(msg.KeyState(cid, None, 0))
            finally:
                pending.done.set()  # the waiters go, whatever the send did
            raise
        with self.lock:
            del self.loading[cid]
            key.users = pending.waiters
            self.keys[cid] = key
            self.told.add(cid)
            pending.key = key
            going = self._shrink()
        pending.done.set()
        try:
            self._close_all(going)
        except BaseException:
            self.release(key)  # the owner's acquire fails: its use goes with it (the waiters keep theirs)
            raise
        return key

    def _load(self, ref: msg.CircuitRef) -> ResidentKey:
        t0 = time.perf_counter()
        vk: bytes | None = None
        if ref.key_source == "device":
            zkey, handle = self._generate(ref)
            vk = vk_json(zkey)
            what = "generated the INSECURE dev key"
        else:
            from ..formats.zkey import read_zkey

            check_pinned(ref)
            zkey = read_zkey(ref.zkey)
            try:
                check_pinned(ref)  # the file mapped is the one checked before (not replaced meanwhile)
            except BaseException:
                zkey.close()
                raise
            dropped = drop_coefficient_pages(zkey)  # before the upload: the load's peak stays one section chunk
            handle = self.backend.load_key(zkey, batch=self.batch_of(ref, zkey.domain_size, zkey.n_vars))
            what = f"loaded key ({dropped / 2**30:.2f} GiB of coefficient pages let go)"
        key = ResidentKey(ref, zkey, handle, int(getattr(handle, "nbytes", 0)), vk=vk)
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

    def _none_here(self, cid: str) -> bool:
        """Whether the engine was last told of a key of ``cid`` here, and none is left to say otherwise: none
        resident, none loading, no replaced one in use (under the lock)."""
        return cid in self.told and cid not in self.keys and cid not in self.loading and cid not in self.replaced

    def _shrink(self) -> list[_Going]:
        """The unused keys the budget takes, least recently used first (under the lock)."""
        going: list[_Going] = []
        if self.budget is None:
            return going
        for cid in list(self.keys):
            if sum(k.nbytes for k in self.keys.values()) <= self.budget:
                break
            if self.keys[cid].users == 0:
                going.append(self._drop(cid))
        return going

    def _drop(self, circuit_id: str) -> _Going:
        return self._going(self.keys.pop(circuit_id))

    def _going(self, key: ResidentKey, announce: bool = True) -> _Going:
        """A key no longer in the cache, to close once the lock is released (under the lock: a load
        waits for it)."""
        self.closing += 1
        if announce:
            self.told.discard(key.ref.circuit_id)
        return key, announce

    def _close_all(self, going: list[_Going]) -> None:
        """Close the keys decided to go (outside the lock); each counts as closed even if its close
        raises, and the first such error is raised once all are done."""
        error: BaseException | None = None
        for key, announce in going:
            try:
                self._close(key, announce)
            except BaseException as exc:  # noqa: BLE001 - the others still close; raised below
                error = error or exc
            finally:
                with self.closed:
                    self.closing -= 1
                    self.closed.notify_all()
        if error is not None:
            raise error

    def _close(self, key: ResidentKey, announce: bool = True) -> None:
        """Free a key no partition uses; ``announce``: tell the engine the circuit has no key here now
        (not for a replaced key: its circuit's new key is resident), told even if the close raises:
        the key has left the cache all the same."""
        try:
            key.handle.close()
            key.zkey.close()
            if key.rows is not None:
                key.rows.close()
        finally:
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
