"""The circuits an engine proves, what a job's input must be, and where each proving key is resident.

Owns three things the engine keeps about circuits:

* the registered circuits: one :class:`~.messages.CircuitRef` per id, with the
  absolute paths the children open (a synthetic circuit's dev key is made once in
  the param cache, :func:`~.keys.ensure_synthetic_key`);
* the one validation of a job and its partition inputs (:meth:`CircuitTable.check_job`,
  called by ``Engine.submit``): nothing upstream checks them again, and a worker
  only parses what passed here; it also pins the job to its key file as it is then
  (:func:`pinned`), a read of that file the engine makes outside its lock;
* the resident-key table the prover processes report (:class:`~.messages.KeyState`),
  rendered as status rows (:meth:`CircuitTable.rows`).
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from ..circuits.synthetic_kinds import SYNTHETIC_KINDS
from ..errors import CuzkError, InputError
from ..groth16.circuit_data_file import FileIdentity, zkey_identity
from . import messages as msg
from .types import INPUT_KINDS, KEY_SOURCES, MAX_PARTITIONS, MAX_SEED, CircuitSpec, JobSpec, Priority

# Where a device-key circuit's a, b, c are made, per backend: the GPU makes them from w on the device
# (its witness map kernels), so synthesis writes w alone (a quarter of the ring's bytes, and ~15 % of
# the synthesis core-seconds: the witness without the matrix products); elsewhere the host does.
# WITNESS_MAP_ENV=host keeps the host's map on every backend (a comparison run).
DEVICE_WITNESS_MAP = {"gpu": "device"}
WITNESS_MAP_ENV = "CUZK_MP_WITNESS_MAP"
MAX_JOB_ID = 256  # a job id rides in the header of every ring segment


class KeyRow(msgspec.Struct):
    """A proving key and where it lives: resident in a prover process ("device" on a GPU, "host" on
    the CPU backend), or only on "disk" (``process`` None), or, for a key with no file that no prover
    has generated yet, "generated on load"."""

    circuit: str
    process: str | None
    tier: str | None  # None: the process failed to load it (see ``error``)
    bytes: int
    error: str | None


def witness_map(backend: str) -> str:
    """Where a device-key circuit's a, b, c are made on ``backend`` ("auto" resolved as the engine
    resolves it; :data:`DEVICE_WITNESS_MAP`, the env override)."""
    from ..backends import resolve_backend_name

    forced = os.environ.get(WITNESS_MAP_ENV, "")
    if forced not in ("", "host", "device"):
        raise InputError(f"{WITNESS_MAP_ENV}={forced!r}: expected host or device")
    if forced == "host":
        return "host"
    return DEVICE_WITNESS_MAP.get(resolve_backend_name(backend), "host")


class CircuitTable:
    """Registered circuits, job validation and resident keys (see the module docstring)."""

    def __init__(self, param_cache: Path, backend: str) -> None:
        self.param_cache = param_cache
        self.backend = backend
        self.refs: dict[str, msg.CircuitRef] = {}
        self._keys: dict[tuple[str, str], msg.KeyState] = {}  # (circuit, process) -> the key resident there
        self._errors: dict[tuple[str, str], msg.KeyState] = {}  # (circuit, process) -> its last failed load
        self._vks: dict[str, bytes] = {}  # circuit -> the verification key a prover reported for a generated key
        self._disk_bytes: dict[str, int] = {}  # circuit -> its key file's size when last read (no stat at status)

    # ---- circuits
    def make_ref(self, spec: CircuitSpec) -> msg.CircuitRef:
        """Validate a circuit and build its reference (synthetic: make its dev key once)."""
        cid = spec.circuit_id
        if not cid or spec.partitions < 1:
            raise InputError(f"circuit {cid!r}: needs a non-empty id and partitions >= 1 (got {spec.partitions})")
        if spec.key_source not in KEY_SOURCES:
            raise InputError(f"circuit {cid}: key_source must be one of {', '.join(KEY_SOURCES)}, "
                             f"got {spec.key_source!r}")
        if spec.key_source == "device" and spec.synthetic is None:
            raise InputError(f"circuit {cid}: key_source \"device\" is for synthetic circuits (a circom "
                             "circuit's key is its zkey file)")
        if spec.synthetic is not None:
            if spec.synthetic not in SYNTHETIC_KINDS or spec.log_n is None:
                raise InputError(f"circuit {cid}: synthetic must be one of {SYNTHETIC_KINDS} with log_n set")
            if spec.key_source == "device":
                return self._device_ref(cid, spec.synthetic, spec.log_n)
            from .keys import ensure_synthetic_key

            zkey, r1cs = ensure_synthetic_key(spec.synthetic, spec.log_n, self.param_cache, self.backend)
            self._disk_bytes[cid] = os.path.getsize(zkey)
            return msg.CircuitRef(cid, str(zkey), str(r1cs), None, spec.synthetic, spec.log_n)
        paths: dict[str, str | None] = {}
        for what, path, required in (("zkey", spec.zkey, True), ("r1cs", spec.r1cs, False), ("wasm", spec.wasm, False)):
            if path is None:
                if required:
                    raise InputError(f"circuit {cid}: {what} is required for a circom circuit")
                paths[what] = None
                continue
            if not Path(path).is_file():
                raise InputError(f"circuit {cid}: {what} file {path} does not exist")
            paths[what] = str(Path(path).resolve())
        self._disk_bytes[cid] = os.path.getsize(str(paths["zkey"]))
        return msg.CircuitRef(cid, str(paths["zkey"]), paths["r1cs"], paths["wasm"])

    def _device_ref(self, cid: str, kind: str, log_n: int) -> msg.CircuitRef:
        """A synthetic circuit whose INSECURE dev key the provers generate: its circuit data and its toxic
        waste made once in the param cache (every prover, and every later engine, generates the same key)."""
        from .keys import device_toxic_waste, ensure_synthetic_circuit_data

        data = ensure_synthetic_circuit_data(kind, log_n, self.param_cache)
        t = device_toxic_waste(kind, log_n, self.param_cache)
        ref = msg.CircuitRef(cid, "", None, None, kind, log_n, key_source="device", circuit_data=str(data),
                             toxic=[str(t.tau), str(t.alpha), str(t.beta), str(t.delta)],
                             witness_map=witness_map(self.backend))
        if self.refs.get(cid) != ref:  # another key under this id: what a prover said of the old one is stale
            self._vks.pop(cid, None)
        return ref

    def vk(self, circuit_id: str) -> bytes | None:
        """The verification key (snarkjs JSON) a prover reported for a key it generated (None if none did);
        it outlives the key's eviction (the next generation, from the same toxic waste, is the same key)."""
        return self._vks.get(circuit_id)

    def ref(self, circuit_id: str) -> msg.CircuitRef:
        """The registered circuit (InputError naming the registered ones if unknown)."""
        ref = self.refs.get(circuit_id)
        if ref is None:
            raise InputError(f"unknown circuit {circuit_id!r} (registered: {', '.join(sorted(self.refs)) or 'none'})")
        return ref

    # ---- jobs
    def check_job(self, job: JobSpec) -> msg.CircuitRef:
        """Validate a job against its registered circuit (see :func:`check_job`); the circuit's reference."""
        if not job.job_id or len(job.job_id) > MAX_JOB_ID or not job.job_id.isprintable():
            raise InputError(f"job {job.job_id!r}: a job id is 1-{MAX_JOB_ID} printable characters")
        ref = self.ref(job.circuit_id)
        check_job(job, ref)
        return self.pin(ref)

    def pin(self, ref: msg.CircuitRef) -> msg.CircuitRef:
        """:func:`pinned`, the key file's size kept for the status's rows: it reads the file, so the engine
        calls it outside its lock (a key on a hard mount whose server is gone never returns)."""
        out = pinned(ref)
        if out.zkey_id is not None:
            self._disk_bytes[ref.circuit_id] = out.zkey_id.size
        return out

    # ---- resident keys
    def on_key_state(self, process: str, m: msg.KeyState) -> None:
        """A prover process loaded, evicted or failed to load a key.

        A failed load (``error``) is kept apart from what is resident: it answers the preload that
        asked (:meth:`errors`) and says nothing of the process's key, which another thread of it may
        have loaded meanwhile (a partition's acquire, reported before or after the failure reaches
        here), or may still hold from before. A key loaded since a failure clears it."""
        if m.vk is not None:
            self._vks[m.circuit_id] = m.vk
        where = (m.circuit_id, process)
        if m.error is not None:
            self._errors[where] = m
        elif m.tier is None:
            self._keys.pop(where, None)
        else:
            self._keys[where] = m
            self._errors.pop(where, None)

    def forget(self, circuit_id: str, processes: list[str]) -> None:
        """Drop what these processes reported for a circuit (before asking them again)."""
        for name in processes:
            self._keys.pop((circuit_id, name), None)
            self._errors.pop((circuit_id, name), None)

    def reported(self, circuit_id: str, processes: list[str]) -> bool:
        """Whether every one of these processes has reported on the circuit's key (loaded it, or failed)."""
        return all((circuit_id, name) in self._keys or (circuit_id, name) in self._errors for name in processes)

    def errors(self, circuit_id: str, processes: list[str]) -> list[tuple[str, str]]:
        """(``process: error``, its :func:`cuzk_mp.errors.error_kind`) for each of these processes that
        failed to load the key and has not loaded it since."""
        return [(f"{name}: {ks.error}", ks.error_kind or "InternalError") for name in processes
                if (ks := self._errors.get((circuit_id, name))) is not None]

    def drop_process(self, process: str) -> None:
        """A prover process died: the keys it held are gone with it."""
        for table in (self._keys, self._errors):
            for key in [k for k in table if k[1] == process]:
                del table[key]

    def rows(self) -> list[KeyRow]:
        """Resident keys per prover process; registered circuits resident nowhere are tier "disk", with the
        key file's size as last read (at registration, a submit or a preload): the status reads no file, as
        on a hard mount whose server is gone a stat never returns, under the engine's lock."""
        failed = {where: ks for where, ks in self._errors.items() if where not in self._keys}
        rows = [KeyRow(cid, proc, ks.tier, ks.nbytes, ks.error)
                for (cid, proc), ks in sorted({**self._keys, **failed}.items())]
        resident = {cid for cid, _ in self._keys} | {cid for cid, _ in failed}
        for cid, ref in sorted(self.refs.items()):
            if cid not in resident and ref.key_source == "file":  # its size as last read: status reads no file
                rows.append(KeyRow(cid, None, "disk", self._disk_bytes.get(cid, 0), None))
            elif cid not in resident:  # a generated key exists only where a prover made it: nowhere yet
                rows.append(KeyRow(cid, None, "generated on load", 0, None))
        return rows


def pinned(ref: msg.CircuitRef) -> msg.CircuitRef:
    """The reference a job is proved with: a key file's reference with the file's identity now
    (``CircuitRef.zkey_id``); InputError naming the file where it is gone or not a zkey.

    Decision: a zkey replaced under its path (a new setup, a copy over it, in place or renamed
    over) is picked up job by job, never within a job: every partition of a job is proved with
    the key its identity names (synthesis and the provers check it, :func:`key_changed`), and
    the job is reported done only if the file still is that key when its last proof arrives
    (``Scheduler.on_proof``), so its proofs verify with the verification key read from the file
    at that moment (what the daemon serves). A job that straddles a change fails, its partitions
    naming the file; sent again it is proved with the new key. The identity is :func:`key_identity`:
    one header read per job, no hash of a multi-GB file."""
    if ref.key_source != "file" or not ref.zkey:
        return ref
    try:
        ident = key_identity(ref.zkey)
    except InputError as exc:  # a synthetic circuit's dev key is no file the operator named: say what it is
        if ref.synthetic is None or os.path.lexists(ref.zkey):
            raise
        raise InputError(f"{exc}: the INSECURE development key of synthetic circuit {ref.circuit_id}, made in "
                         "[srs] param_cache at the daemon's start, is gone (the cache removed?); restart the "
                         "daemon to make it again") from None
    return msgspec.structs.replace(ref, zkey_id=ident)


def key_identity(zkey: str | os.PathLike[str]) -> FileIdentity:
    """What tells one key from another at a path: the file's size and a digest of its header section
    (the circuit-data cache's identity without the mtime). The header holds the key's alpha, beta,
    gamma and delta points, which differ for every setup and every contribution; the mtime is left
    out because a ``touch`` or a copy of the same bytes is the same key, and counting it a change would
    reload a key of up to a hundred GB and fail the jobs in flight for nothing. Read with ``pread``:
    a key copied over in place meanwhile gives a FormatError, never SIGBUS."""
    ident = zkey_identity(zkey)
    return FileIdentity(ident.size, 0, ident.digest)


def key_digest(ident: FileIdentity | None) -> str | None:
    """How replies name the key a job's proofs were made with, or a served vk's key: the
    hex digest of its key file's header (:func:`key_identity`; the header holds the setup's
    points). Equal digests: the vk verifies those proofs. None for a key with no file (generated)."""
    return None if ident is None else ident.digest.hex()


def key_changed(ref: msg.CircuitRef) -> str | None:
    """Why the zkey file of a pinned reference is no longer the key the job was accepted with
    (None while it is, or for a reference with no pinned file): the message a partition fails with."""
    if ref.zkey_id is None:
        return None
    try:
        now = key_identity(ref.zkey)
    except CuzkError as exc:
        return f"zkey {ref.zkey} changed on disk since the job was accepted ({exc}); submit the job again"
    if now == ref.zkey_id:
        return None
    was = ref.zkey_id
    return (f"zkey {ref.zkey} changed on disk since the job was accepted (size {was.size} -> {now.size}, "
            f"header digest {was.digest.hex()[:12]} -> {now.digest.hex()[:12]}): "
            "its proofs would not verify with the new verification key; submit the job again (it is proved "
            "with the new key)")


def check_pinned(ref: msg.CircuitRef) -> None:
    """InputError (the partition fails, not retried) where the zkey file is no longer the key the job
    was accepted with (:func:`key_changed`): never prove a job's partition with another key."""
    changed = key_changed(ref)
    if changed is not None:
        raise InputError(changed)


def check_job(job: JobSpec, ref: msg.CircuitRef) -> None:
    """The one validation of a job and each partition's input against its circuit (InputError naming
    the job, the partition and what is wrong)."""
    if not isinstance(job.priority, Priority):
        raise InputError(f"job {job.job_id}: priority {job.priority!r} is not one of "
                         f"{', '.join(p.name for p in Priority)}")
    if not job.partitions:
        raise InputError(f"job {job.job_id}: a job needs at least one partition")
    if len(job.partitions) > MAX_PARTITIONS:
        raise InputError(f"job {job.job_id}: {len(job.partitions)} partitions, at most {MAX_PARTITIONS}")
    for i, p in enumerate(job.partitions):
        _check_partition(f"job {job.job_id} partitions[{i}]", p.kind, p.data, p.seed, ref)


def _check_partition(where: str, kind: str, data: bytes, seed: int, ref: msg.CircuitRef) -> None:
    """One partition's input against its circuit (the rules of docs/engine.md, "Inputs")."""
    if kind not in INPUT_KINDS:
        raise InputError(f"{where}: input kind {kind!r} is not one of {', '.join(INPUT_KINDS)}")
    if kind == "synthetic":
        if ref.synthetic is None:
            raise InputError(f"{where}: circuit {ref.circuit_id!r} is a circom circuit; send kind \"json\" "
                             "(inputs for its wasm) or \"wtns\"")
        if not 0 <= seed <= MAX_SEED:
            raise InputError(f"{where}.seed: must be in 0..2^63-1, got {seed}")
        if data:  # it would be kept (and journaled) for nothing
            raise InputError(f"{where}.data: a synthetic partition takes a seed, no data ({len(data)} bytes given)")
    elif kind == "json":
        if ref.wasm is None:
            raise InputError(f"{where}: circuit {ref.circuit_id!r} has no wasm to compute a witness from input "
                             "JSON; send kind \"wtns\"" + (" or \"synthetic\"" if ref.synthetic else ""))
        from ..circuits.circom import parse_input_json

        try:
            parse_input_json(data, f"{where}.data")
        except (ValueError, RecursionError) as exc:  # numbers or nesting Python's JSON reader refuses
            raise InputError(f"{where}.data: input JSON cannot be read: {type(exc).__name__}: {exc}") from None
    elif not data.startswith(b"wtns"):
        raise InputError(f"{where}.data: not a .wtns file (it does not start with 'wtns')")
