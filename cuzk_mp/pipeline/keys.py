"""Development proving keys of synthetic circuits, made once and kept in the param cache.

Owns the files ``<cache>/<kind>-<log_n>.{r1cs,zkey}`` (kind: porep-like, dense-random) and their lock file.
``ensure_synthetic_key`` builds the circuit's r1cs, and when the cached r1cs
differs from it (first use, or the generator changed) runs the INSECURE dev
setup (:func:`cuzk_mp.groth16.setup.setup_file`) to make a matching zkey; a cached zkey that
does not read (cut short) is moved aside to ``<name>.zkey.damaged`` and made again.
Every file is written under a temporary name and renamed into place, so a
reader never sees half a key; an exclusive ``flock`` on ``<name>.lock`` makes
concurrent engines wait for one builder instead of racing.

With the GPU backend the setup runs in a spawned child process, so the engine
process itself never creates a CUDA context (its prover processes own the GPUs).

Keys with no file (``key_source = "device"``, :func:`ensure_synthetic_circuit_data`): the
param cache holds only the circuit's compact data, ``<kind>-<log_n>.device.synth-abc``, from
which every prover generates the key (:mod:`cuzk_mp.groth16.setup_resident`) and synthesis
evaluates the matrices. No r1cs is written, so what stands for the circuit in that file's header
(:func:`synthetic_identity`) is a digest of the kind, the size and the source of the synthetic
generators: a changed generator rebuilds the file. Decision: the digest covers the generator
modules (``cuzk_mp/circuits/synthetic*.py``), not the field arithmetic they call, which changes
no circuit. The toxic waste of such a key is kept beside it, ``<kind>-<log_n>.device.toxic``
(mode 0600; :func:`device_toxic_waste`), so every engine on this param cache, before and after a
restart, generates the same key: proofs a daemon made before it restarted still verify with the
verification key it serves after. Whoever can read that file can forge proofs for the key: it is
the INSECURE dev setup, as every key of this module is.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import multiprocessing as mp
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from ..circuits.synthetic_kinds import synthetic_circuit
from ..errors import CuzkError, FormatError, OutputError, ResourceError
from ..groth16.circuit_data_file import FileIdentity

if TYPE_CHECKING:
    from ..groth16.circuit_data_file import CircuitData, CircuitShape
    from ..groth16.setup import ToxicWaste
    from .types import CircuitSpec

log = logging.getLogger("cuzk_mp.pipeline.keys")
CHILD_BUILD_LOG_N = 22  # from this size the circuit data is built in a spawned child process
CHILD_STOP_WAIT_S = 5.0  # how long a builder child given up may take to end on SIGTERM before SIGKILL
# Peak host bytes a wire takes while a synthetic circuit is built, a little above what was measured
# (2^19 to 2^22 rows): its r1cs ~235 B (porep-like) and ~310 B (dense-random); its circuit data,
# which holds the r1cs and the coefficient section at once, ~470 B either kind
R1CS_BUILD_BYTES_PER_WIRE = 320
CIRCUIT_DATA_BUILD_BYTES_PER_WIRE = 480


def synthetic_key_paths(kind: str, log_n: int, cache_dir: Path) -> tuple[Path, Path]:
    """Where the (zkey, r1cs) of a synthetic circuit live in the cache."""
    stem = Path(cache_dir) / f"{kind}-{log_n}"
    return stem.with_suffix(".zkey"), stem.with_suffix(".r1cs")


def circuit_key_file(spec: CircuitSpec, cache_dir: Path) -> Path | None:
    """The zkey a circuit proves with: its file, or a synthetic circuit's dev key in the cache (where
    :func:`ensure_synthetic_key` makes it; it may not be made yet); None for a key the provers generate."""
    if spec.key_source == "device":
        return None
    if spec.synthetic is None:
        return None if spec.zkey is None else Path(spec.zkey)
    assert spec.log_n is not None
    return synthetic_key_paths(spec.synthetic, spec.log_n, Path(cache_dir).expanduser().resolve())[0]


def ensure_synthetic_key(kind: str, log_n: int, cache_dir: Path, backend: str = "auto") -> tuple[Path, Path]:
    """Make (once) and return the (zkey, r1cs) paths of a synthetic circuit's dev key."""
    from ..formats.r1cs import write_r1cs

    circuit = synthetic_circuit(kind, log_n)  # ConfigError for an unknown kind or size
    _check_build_memory(f"the r1cs of {kind} 2^{log_n}", circuit.n_wires, R1CS_BUILD_BYTES_PER_WIRE)

    cache_dir = Path(cache_dir).expanduser().resolve()
    cache_dir.mkdir(parents=True, exist_ok=True)
    zkey, r1cs = synthetic_key_paths(kind, log_n, cache_dir)
    with open(cache_dir / f"{kind}-{log_n}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _remove_dead_builders_files(cache_dir, (zkey, r1cs))
        fresh = _temp_path(r1cs)
        try:
            with _named_as(r1cs, fresh):
                write_r1cs(fresh, circuit.r1cs())
            if zkey.exists() and r1cs.exists() and _same_bytes(fresh, r1cs):
                if _readable_key(zkey):
                    return zkey, r1cs
                damaged = zkey.with_name(zkey.name + ".damaged")
                os.replace(zkey, damaged)
                log.warning("%s is the cached development key of %s 2^%d but cannot be read (see above): moved "
                            "to %s and made again (proofs made with the old key will not verify with the new "
                            "verification key)", zkey, kind, log_n, damaged.name)
            log.warning("making the INSECURE development key of %s 2^%d in %s (once)", kind, log_n, cache_dir)
            tmp_zkey = _temp_path(zkey)
            try:
                with _named_as(zkey, tmp_zkey):
                    _run_setup(fresh, tmp_zkey, backend, zkey)
                os.replace(fresh, r1cs)  # r1cs first: a zkey is only ever paired with its own r1cs
                os.replace(tmp_zkey, zkey)
            finally:
                tmp_zkey.unlink(missing_ok=True)
        finally:
            fresh.unlink(missing_ok=True)
    return zkey, r1cs


def _readable_key(zkey: Path) -> bool:
    """Whether a cached dev key reads as a zkey (its sections all there: a copy cut short, a disk
    that filled). Decision: a cached dev key that does not read is moved aside and made again, not
    refused: this module made it, it is a cache (a key the user passed, a .zkey circuit, never
    comes here), and the one fix a message could ask for is deleting the file. Its coefficient
    entries are not checked here (a pass over all of them; a key this module wrote and renamed into
    place whole is cut short, not rewritten)."""
    from ..formats.zkey import read_zkey

    try:
        with read_zkey(zkey, check_coefs=False):
            return True
    except FormatError as exc:
        log.warning("%s", exc)
        return False


def synthetic_identity(kind: str, log_n: int) -> FileIdentity:
    """What stands for a synthetic circuit with no files in its circuit data's header (see the module
    docstring): log_n, and a digest of the kind, the size and the generators' source."""
    from .. import circuits

    h = hashlib.blake2b(f"{kind}:{log_n}".encode(), digest_size=16)
    for src in sorted(Path(circuits.__file__).parent.glob("synthetic*.py")):
        h.update(src.name.encode())
        h.update(src.read_bytes())
    return FileIdentity(log_n, 0, h.digest())


def device_circuit_data_path(kind: str, log_n: int, cache_dir: Path) -> Path:
    """Where the circuit data of a synthetic circuit with a generated key lives in the param cache."""
    return Path(cache_dir) / f"{kind}-{log_n}.device.synth-abc"


def device_toxic_waste(kind: str, log_n: int, cache_dir: Path) -> ToxicWaste:
    """The toxic waste of a synthetic circuit's generated key: drawn once and kept in the param cache
    (see the module docstring); a file that does not hold four valid secrets is replaced."""
    from ..groth16.setup import ToxicWaste

    cache_dir = Path(cache_dir).expanduser().resolve()
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"{kind}-{log_n}.device.toxic"
    with open(cache_dir / f"{kind}-{log_n}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            values = [int(x) for x in path.read_text().split()]
            toxic = ToxicWaste(*values)
            toxic.check(log_n)
            return toxic
        except FileNotFoundError:
            pass
        except (ValueError, TypeError) as exc:
            log.warning("%s cannot be used (%s): drawing new toxic waste (keys made with the old one will not "
                        "verify with the new verification key)", path, exc)
        toxic = ToxicWaste.fresh(log_n)
        tmp = _temp_path(path)
        try:
            with _named_as(path, tmp):
                os.chmod(tmp, 0o600)
                tmp.write_text(f"{toxic.tau} {toxic.alpha} {toxic.beta} {toxic.delta}\n")
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return toxic


def open_device_circuit_data(path: str | Path, kind: str, log_n: int) -> CircuitData:
    """Map the circuit data :func:`ensure_synthetic_circuit_data` made (checked against the generator's
    identity and the circuit's sizes): what a prover generates a key from and a synthesis worker
    evaluates. FormatError naming the file and the defect where it is damaged, stale (a file changed
    since the engine made it) or of other sizes than the circuit's: the task that opened it fails,
    its process carries on."""
    from ..groth16.circuit_data_file import open_cache

    ident = synthetic_identity(kind, log_n)
    return open_cache(path, ident, ident, synthetic_shape(kind, log_n))


def synthetic_shape(kind: str, log_n: int) -> CircuitShape:
    """The sizes of the key a synthetic circuit's setup makes: what its circuit data must say."""
    from ..groth16.circuit_data_file import CircuitShape

    circuit = synthetic_circuit(kind, log_n)  # ConfigError for an unknown kind or size
    return CircuitShape.of_circuit(circuit.n_wires, circuit.n_public, circuit.n_constraints)


def ensure_synthetic_circuit_data(kind: str, log_n: int, cache_dir: Path, *, child: bool | None = None) -> Path:
    """Make (once per generator) and return the circuit data of a synthetic circuit whose key is
    generated in the provers: built from the generator's r1cs in memory, no r1cs or zkey file.

    The build holds the r1cs and the coefficient section at once (~2 GB at 2^22, ~65 GB at 2^27), so
    from 2^CHILD_BUILD_LOG_N rows (or with ``child``) it runs in a spawned child process: the engine's
    or the daemon's own process never grows by it. A valid file is only opened and checked here."""
    from ..groth16.circuit_data import open_or_build_from

    circuit = synthetic_circuit(kind, log_n)  # ConfigError for an unknown kind or size
    cache_dir = Path(cache_dir).expanduser().resolve()
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = device_circuit_data_path(kind, log_n, cache_dir)
    ident = synthetic_identity(kind, log_n)
    in_child = log_n >= CHILD_BUILD_LOG_N if child is None else child
    if in_child:
        try:
            open_device_circuit_data(path, kind, log_n).close()
            return path
        except (OSError, FormatError):
            pass  # missing, stale or damaged: the child builds it (moves a damaged one aside, says why in its log)
        _check_build_memory(f"the circuit data of {kind} 2^{log_n}", circuit.n_wires, CIRCUIT_DATA_BUILD_BYTES_PER_WIRE)
        _in_child("cuzk-circuit-data", _build_circuit_data, (kind, log_n, str(cache_dir)),
                  f"building the circuit data of {kind} 2^{log_n}")
        return path

    def make() -> object:
        _check_build_memory(f"the circuit data of {kind} 2^{log_n}", circuit.n_wires, CIRCUIT_DATA_BUILD_BYTES_PER_WIRE)
        log.warning("building the circuit data of %s 2^%d in %s (once per generator version)", kind, log_n,
                    cache_dir)
        return circuit.r1cs()

    open_or_build_from(path, ident, synthetic_shape(kind, log_n), make).close()  # type: ignore[arg-type]
    return path


def _check_build_memory(what: str, n_wires: int, bytes_per_wire: int) -> None:
    """ResourceError (exit 4), before the build, where building ``what`` needs more memory than is
    available (:func:`~cuzk_mp.groth16.setup.check_memory`)."""
    from ..groth16.setup import check_memory

    check_memory(n_wires * bytes_per_wire, f"building {what} ({n_wires} wires) needs",
                 advice=": a smaller size, or a machine with more")


def _build_circuit_data(kind: str, log_n: int, cache_dir: str, log_level: str) -> None:
    """The build of :func:`ensure_synthetic_circuit_data` in its spawned child (logging as the parent's)."""
    from ..logs import configure_child

    configure_child("cuzk-circuit-data", log_level)
    ensure_synthetic_circuit_data(kind, log_n, Path(cache_dir), child=False)


_OUTPUT_TMP = re.compile(r"\.cuzk-mp-(\d+)-[0-9a-f]+\.tmp")  # formats.atomic's temporaries: .cuzk-mp-<pid>-<hex>.tmp


def _remove_dead_builders_files(folder: Path, finals: tuple[Path, ...]) -> None:
    """Temporary files a killed builder of this key left (a 2^27 key's are ~100 GB): ours
    (``.<final>.*.tmp``; the caller holds the key's lock, so no builder of it runs now) and the
    output writer's (``.cuzk-mp-<pid>-*.tmp``) where that process is gone."""
    stale = [p for f in finals for p in folder.glob(f".{f.name}.*.tmp")]
    for p in folder.glob(".cuzk-mp-*.tmp"):
        m = _OUTPUT_TMP.fullmatch(p.name)
        if m is not None and not _pid_alive(int(m.group(1))):
            stale.append(p)
    for p in stale:
        log.info("removing %s, left by a key build that did not finish", p)
        p.unlink(missing_ok=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


def _temp_path(final: Path) -> Path:
    fd, name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.close(fd)
    return Path(name)


@contextmanager
def _named_as(final: Path, tmp: Path) -> Iterator[None]:
    """The errors of writing the cache file ``final`` through its temporary ``tmp`` (:func:`_temp_path`)
    name ``final``, the file the user knows, never the hidden ``.NAME.XXXX.tmp`` (removed by the
    caller), and a full disk names the folder whose file system is full."""
    hidden = os.fspath(tmp)
    try:
        yield
    except (OutputError, OSError) as exc:  # atomic_output's, naming the path it was given; or a write's here
        cause = exc.__cause__ if isinstance(exc, OutputError) else exc
        full = isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT)
        named = exc.path if isinstance(exc, OutputError) else exc.filename
        ours = str(named) == hidden if named is not None else full  # a write's here may name no file
        if not ours:
            raise
        problem = exc.problem if isinstance(exc, OutputError) else exc.strerror or str(exc)
        raise OutputError(final, problem + (f" (the file system of {final.parent} is full)" if full else "")
                          ) from exc
    except ResourceError as exc:  # the setup's room check, made before the key
        if hidden not in str(exc):
            raise
        raise ResourceError(str(exc).replace(hidden, os.fspath(final))) from exc


def _same_bytes(a: Path, b: Path) -> bool:
    if a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(1 << 20), fb.read(1 << 20)
            if x != y:
                return False
            if not x:
                return True


def _setup(r1cs: str, zkey: str, backend: str, log_level: str | None = None) -> None:
    """The setup itself; in a spawned child (``log_level`` given) logging is set up first, at the
    engine's level, so the setup's progress lines (INFO) reach the log as they would in-process."""
    from ..backends import get_backend
    from ..groth16.setup import setup_file

    if log_level is not None:
        from ..logs import configure_child

        configure_child("cuzk-key-setup", log_level)
    setup_file(r1cs, zkey, get_backend(backend))


def _run_setup(r1cs: Path, zkey: Path, backend: str, shown: Path) -> None:
    """The dev setup of ``r1cs`` into ``zkey``, in a spawned child on a GPU; ``shown``: the key file
    that messages name (``zkey`` is its temporary)."""
    from ..backends import resolve_backend_name

    resolved = resolve_backend_name(backend)
    if resolved == "cpu":
        _setup(str(r1cs), str(zkey), "cpu")
        return
    _in_child("cuzk-key-setup", _setup, (str(r1cs), str(zkey), resolved),
              f"dev setup of {shown} on the {resolved} backend")


def _in_child(name: str, target: Callable[..., None], args: tuple[object, ...], what: str) -> None:
    """Run ``target(*args, log_level)`` in a spawned child named ``name`` (logging at this process's level)
    and wait for it; CuzkError naming ``what`` when it fails."""
    level = os.environ.get("CUZK_MP_LOG_LEVEL") or logging.getLevelName(logging.getLogger().getEffectiveLevel())
    proc = mp.get_context("spawn").Process(target=target, args=(*args, level), name=name)
    proc.start()
    try:
        proc.join()
    except BaseException:
        # an interrupt or SIGTERM of this process alone (a terminal's Ctrl-C reaches the child too): the
        # child goes with it, else this process would wait at its exit for a build it gave up (minutes at 2^27)
        proc.terminate()
        proc.join(CHILD_STOP_WAIT_S)
        if proc.exitcode is None:
            proc.kill()
            proc.join()
        raise
    if proc.exitcode != 0:
        from .procs import describe_exit

        oom = ": what the kernel's OOM killer sends where memory runs out" if proc.exitcode == -9 else ""
        raise CuzkError(f"{what} failed ({describe_exit(proc.exitcode)}{oom}); see the log above")
