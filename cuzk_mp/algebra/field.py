"""Constants of BLS12-381 and conversions between Python ints and limb arrays.

Everything here is plain Python/numpy (no JIT): moduli, Montgomery constants,
roots of unity, generators, and ``ints <-> (n, L) uint64`` conversions. The
numba kernels live in :mod:`cuzk_mp.algebra.fr` and :mod:`cuzk_mp.algebra.fq`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

# Scalar field Fr: r = 0x73ed...0001 (255 bits); 2-adicity of r-1 is 32.
R_MOD = 0x73EDA753299D7D483339D80809A1D80553BDA402FFFE5BFEFFFFFFFF00000001
# Base field Fq: q = 0x1a01...aaab (381 bits).
Q_MOD = int(
    "1a0111ea397fe69a4b1ba7b6434bacd764774b84f38512bf6730d2a0f6b0f6241eabfffeb153ffffb9feffffffffaaab",
    16,
)
FR_LIMBS = 4
FQ_LIMBS = 6
FR_BYTES = 32
FQ_BYTES = 48
G1_BYTES = 2 * FQ_BYTES
G2_BYTES = 4 * FQ_BYTES

FR_TWO_ADICITY = 32
# 5 is the smallest quadratic non-residue mod r; snarkjs (ffjavascript) derives Fr.w[k] from it.
FR_NONRESIDUE = 5
# snarkjs uses Fr.shift = 25 (= 5^2) as the coset generator only when k = 32.
FR_SHIFT = 25

# BLS parameter z = -0xd201000000010000 (curve family parameter).
BLS_X = -0xD201000000010000

G1_GEN = (
    0x17F1D3A73197D7942695638C4FA9AC0FC3688C4F9774B905A14E3A3F171BAC586C55E83FF97A1AEFFB3AF00ADB22C6BB,
    0x08B3F481E3AAA0F1A09E30ED741D8AE4FCF5E095D5D00AF600DB18CB2C04B3EDD03CC744A2888AE40CAA232946C5E7E1,
)
G2_GEN = (
    (
        0x024AA2B2F08F0A91260805272DC51051C6E47AD4FA403B02B4510B647AE3D1770BAC0326A805BBEFD48056C8C121BDB8,
        0x13E02B6052719F607DACD3A088274F65596BD0D09920B61AB5DA61BBDC7F5049334CF11213945D57E5AC7D055D042B7E,
    ),
    (
        0x0CE5D527727D6E118CC9CDC6DA2E351AADFD9BAA8CBDD3A76D429A695160D12C923AC9CC3BACA289E193548608B82801,
        0x0606C4A02EA734CC32ACD2B02BC28B99CB3E287E85A763AF267492AB572E99AB3F370D275CEC1DA1AAA9075FF05F79BE,
    ),
)
# Curve equations: G1: y^2 = x^3 + 4 over Fq; G2: y^2 = x^3 + 4(1 + u) over Fq2 = Fq[u]/(u^2 + 1).
G1_B = 4
G2_B = (4, 4)


class MontParams:
    """Montgomery parameters of one prime field with 64-bit limbs."""

    def __init__(self, modulus: int, nlimbs: int) -> None:
        self.modulus = modulus
        self.nlimbs = nlimbs
        self.nbytes = 8 * nlimbs
        self.r = 1 << (64 * nlimbs)  # Montgomery radix R = 2^(64 L)
        self.r_mod = self.r % modulus  # 1 in Montgomery form
        self.r2 = pow(self.r, 2, modulus)  # (R^2 mod p): to_mont(x) = mont_mul(x, R^2)
        self.r3 = pow(self.r, 3, modulus)
        self.inv = (-pow(modulus, -1, 1 << 64)) % (1 << 64)  # -p^-1 mod 2^64
        self.r_inv = pow(self.r, -1, modulus)  # R^-1 mod p (from_mont_int)
        self.limbs = int_to_limbs(modulus, nlimbs)
        self.one_limbs = int_to_limbs(self.r_mod, nlimbs)  # 1 in Montgomery form, as limbs

    def to_mont_int(self, x: int) -> int:
        """x * R mod p (a single element, Python ints)."""
        return (x * self.r) % self.modulus

    def from_mont_int(self, x: int) -> int:
        """x * R^-1 mod p (a single element, Python ints)."""
        return (x * self.r_inv) % self.modulus


def fq2_mul_int(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    """(a0 + a1 u)(b0 + b1 u) in Fq2 = Fq[u]/(u^2 + 1), Python ints."""
    return ((a[0] * b[0] - a[1] * b[1]) % Q_MOD, (a[0] * b[1] + a[1] * b[0]) % Q_MOD)


def fq2_inv_int(a: tuple[int, int]) -> tuple[int, int]:
    """1 / (a0 + a1 u) = (a0 - a1 u) / (a0^2 + a1^2); a != 0 (the norm is nonzero: -1 is a non-square mod q)."""
    t = pow((a[0] * a[0] + a[1] * a[1]) % Q_MOD, -1, Q_MOD)
    return (a[0] * t % Q_MOD, -a[1] * t % Q_MOD)


def int_to_limbs(x: int, nlimbs: int) -> np.ndarray:
    """One non-negative int as a ``(nlimbs,) uint64`` little-endian limb vector."""
    return np.frombuffer(x.to_bytes(8 * nlimbs, "little"), dtype="<u8").copy()


def ints_to_limbs(xs: Iterable[int], nlimbs: int) -> np.ndarray:
    """Non-negative ints (each < 2^(64 nlimbs)) as an ``(n, nlimbs) uint64`` array."""
    nb = 8 * nlimbs
    buf = b"".join(int(x).to_bytes(nb, "little") for x in xs)
    return np.frombuffer(buf, dtype="<u8").reshape(-1, nlimbs).copy()


def limbs_to_ints(a: np.ndarray) -> list[int]:
    """An ``(n, L) uint64`` array (or one ``(L,)`` row) back to Python ints."""
    arr = np.ascontiguousarray(a, dtype="<u8")
    if arr.ndim == 1:
        arr = arr.reshape(1, -1)
    nb = 8 * arr.shape[1]
    buf = arr.tobytes()
    return [int.from_bytes(buf[i : i + nb], "little") for i in range(0, len(buf), nb)]


FR = MontParams(R_MOD, FR_LIMBS)
FQ = MontParams(Q_MOD, FQ_LIMBS)


def fr_root_of_unity(log_n: int) -> int:
    """The 2^log_n-th root of unity snarkjs calls ``Fr.w[log_n]`` (standard form).

    ``w[32] = 5^((r-1)/2^32)`` and ``w[k] = w[32]^(2^(32-k))``.
    """
    if not 0 <= log_n <= FR_TWO_ADICITY:
        raise ValueError(f"no 2^{log_n}-th root of unity in Fr (2-adicity is {FR_TWO_ADICITY})")
    w32 = pow(FR_NONRESIDUE, (R_MOD - 1) >> FR_TWO_ADICITY, R_MOD)
    return pow(w32, 1 << (FR_TWO_ADICITY - log_n), R_MOD)


def coset_shift(log_n: int) -> int:
    """The coset generator snarkjs uses for the H polynomial of a 2^log_n domain.

    It is w[log_n + 1] (the odd coset of the 2n-th roots) for log_n < 32, and
    ``Fr.shift`` = 25 when log_n = 32 (snarkjs ``groth16_prove.js``).
    """
    return fr_root_of_unity(log_n + 1) if log_n < FR_TWO_ADICITY else FR_SHIFT


def log2_exact(n: int) -> int:
    """log2 of a power of two; ValueError otherwise."""
    if n <= 0 or n & (n - 1):
        raise ValueError(f"{n} is not a power of two")
    return n.bit_length() - 1


def domain_log_size(n_rows: int) -> int:
    """The smallest k with 2^k >= n_rows (snarkjs ``cirPower``), at least 1."""
    return max(1, (n_rows - 1).bit_length())


def as_limb_array(a: np.ndarray | Sequence[int], nlimbs: int) -> np.ndarray:
    """Accept either an ``(n, nlimbs) uint64`` array or a sequence of ints."""
    if isinstance(a, np.ndarray):
        if a.dtype != np.uint64 or a.ndim != 2 or a.shape[1] != nlimbs:
            raise ValueError(f"expected an (n, {nlimbs}) uint64 array, got {a.dtype} {a.shape}")
        return a
    return ints_to_limbs(a, nlimbs)


def first_not_below(a: np.ndarray, bound_limbs: np.ndarray, chunk: int = 1 << 18) -> int:
    """Index of the first row of ``a`` (``(n, L) uint64``) that is >= the bound, else -1.

    Used to reject non-canonical field elements (>= the modulus) in inputs. One pass over the
    top limb in chunks (a row whose top limb is below the bound's is below it); only the rare
    rows whose top limb reaches the bound's are compared in full. ~40 ms for 2^24 Fr rows on
    one core, with no numba (the one-shot GPU proof checks its witness with it).
    """
    n, nl = a.shape
    top = bound_limbs[nl - 1]
    for lo in range(0, n, chunk):
        cand = np.flatnonzero(a[lo:lo + chunk, nl - 1] >= top)
        if cand.size == 0:
            continue
        rows = a[lo + cand]
        ge = np.zeros(cand.size, dtype=bool)
        eq = np.ones(cand.size, dtype=bool)
        for limb in range(nl - 1, -1, -1):
            col = rows[:, limb]
            ge |= eq & (col > bound_limbs[limb])
            eq &= col == bound_limbs[limb]
        hit = np.flatnonzero(ge | eq)
        if hit.size:
            return lo + int(cand[hit[0]])
    return -1
