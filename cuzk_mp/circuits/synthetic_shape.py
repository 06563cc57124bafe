"""The size rules every synthetic circuit shares, apart from the registry of kinds.

The circuits themselves (:mod:`.synthetic`, :mod:`.synthetic_dense`) check their shape here, and the
registry (:mod:`.synthetic_kinds`) builds them: keeping the rules in their own module keeps the
imports one-way (registry -> circuits -> shape).
"""

from __future__ import annotations

from ..errors import ConfigError

MIN_LOG_N = 10
MAX_LOG_N = 28  # 2^28 rows: wire ids stay far below 2^32 (u32 in r1cs and CSR indices)


def check_shape(kind: str, log_n: int, n_public: int) -> None:
    """The size rules every synthetic circuit shares (ConfigError naming the kind and the value)."""
    if not MIN_LOG_N <= log_n <= MAX_LOG_N:
        raise ConfigError(f"{kind}: log_n must be in [{MIN_LOG_N}, {MAX_LOG_N}], got {log_n}")
    if n_public < 1:
        raise ConfigError(f"{kind}: n_public must be >= 1 (the partition index), got {n_public}")
