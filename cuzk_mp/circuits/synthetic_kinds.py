"""The synthetic benchmark circuits by name: what ``synthetic = "..."`` and ``--circuit`` accept.

* ``porep-like`` (:class:`~cuzk_mp.circuits.synthetic.PorepLike`): Filecoin's PoRep partition
  circuit stand-in, 80% of the witness 0 or 1 (what the MSMs' 0/1 split is for);
* ``dense-random`` (:class:`~cuzk_mp.circuits.synthetic_dense.DenseRandom`): every witness value
  a full-width field element (full Pippenger passes everywhere).

Both have exactly ``2^log_n - n_public - 1`` constraints and share one interface (``n_wires``,
``n_public``, ``r1cs()``, ``witness(seed, partition)``, ``witness_into``, ``public_inputs``).
Imports are lazy: naming a kind costs nothing until a circuit is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Union

from ..errors import ConfigError
from .synthetic_shape import MAX_LOG_N, MIN_LOG_N, check_shape

if TYPE_CHECKING:
    from .synthetic import PorepLike
    from .synthetic_dense import DenseRandom

    SyntheticCircuit = Union[PorepLike, DenseRandom]

SYNTHETIC_KINDS = ("porep-like", "dense-random")
__all__ = ["MAX_LOG_N", "MIN_LOG_N", "SYNTHETIC_KINDS", "check_shape", "synthetic_circuit", "write_synthetic"]


def synthetic_circuit(kind: str, log_n: int) -> SyntheticCircuit:
    """The synthetic circuit ``kind`` at 2^log_n rows (ConfigError for an unknown kind or size)."""
    if kind == "porep-like":
        from .synthetic import PorepLike

        return PorepLike(log_n)
    if kind == "dense-random":
        from .synthetic_dense import DenseRandom

        return DenseRandom(log_n)
    raise ConfigError(f"synthetic circuit {kind!r} is not one of {', '.join(SYNTHETIC_KINDS)}")


def write_synthetic(kind: str, log_n: int, out_dir: Path, seed: int = 0, partition: int = 0) -> tuple[Path, Path]:
    """Write ``<kind>-<log_n>.r1cs`` and the witness of (seed, partition) as ``<kind>-<log_n>.wtns``:
    both or neither (the witness, whose arguments may be refused, is made before anything is written;
    a folder that cannot take them is an InputError; a .r1cs this call made goes again where its
    .wtns cannot be written, a full disk: one that was there had the same bytes, the circuit's)."""
    from ..errors import InputError
    from ..formats.r1cs import write_r1cs
    from ..formats.wtns import write_wtns
    from ..paths import folder_problem

    out_dir = Path(out_dir)
    problem = folder_problem(out_dir)
    if problem is not None:
        raise InputError(f"{out_dir}: {problem}")
    circuit = synthetic_circuit(kind, log_n)
    w = circuit.witness(seed, partition)
    out_dir.mkdir(parents=True, exist_ok=True)
    r1cs_path, wtns_path = out_dir / f"{kind}-{log_n}.r1cs", out_dir / f"{kind}-{log_n}.wtns"
    made = not r1cs_path.exists()
    write_r1cs(r1cs_path, circuit.r1cs())
    try:
        write_wtns(wtns_path, w)
    except BaseException:
        if made:
            r1cs_path.unlink(missing_ok=True)
        raise
    return r1cs_path, wtns_path
