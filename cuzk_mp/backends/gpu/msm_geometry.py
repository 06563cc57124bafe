"""The MSM geometry that needs no device: window sizes, segment sizes, streams, and which key
sections get precomputed multiples.

Why a module of its own: the backend, the device plan and the MSM objects must agree on these
choices (a window size sets both a pass's sort keys and the memory the plan counts for them), and
the benches and the floors model reason with them on machines without a GPU. No CuPy here.
"""

from __future__ import annotations

from ...errors import ConfigError


SECTIONS = ("a", "b1", "b2", "c", "h")
MULTIPLES_ENV = "CUZK_GPU_MSM_MULTIPLES"
# Device memory kept free for partitions in flight and MSM / NTT scratch when the multiples
# tables are planned: a fixed part plus this much per domain row (3 partitions of a, b, c, w
# ~400 B, two concurrent MSMs' sort keys and their sort's scratch ~650 B, NTT tables, slack).
RESERVE_FIXED = 4 << 30
RESERVE_PER_ROW = 1536


# Keys up to this domain size skip the 0/1 split: every scalar goes through the Pippenger windows
# (a zero costs a sort key per window, a one a single addition, as in the split), so staging waits
# for nothing (no index lists come back to the host), a proof's MSM is one chain of kernels instead
# of the ones' chain then Pippenger's, and k proofs' MSMs of one section run as ONE batched pass
# (:meth:`.msm._Msm.launch_batch`). Above it the sort of the zeros' keys costs more than the split,
# and the backend may pack a key's sparse B sections (key_load.SUPPORT_SECTIONS; the bench's plan
# line says so).
DENSE_KEY_ROWS = 1 << 16

# Keys up to this domain size run each MSM of a pass on its own stream of a per-thread pool of
# MSM_STREAMS (their short, latency-bound kernels side by side); larger keys keep to a thread's two
# streams, G2 on one and the rest in order on the other (each MSM fills the device).
SMALL_KEY_ROWS = 1 << 18
MSM_STREAMS = 8


def batches_msms(domain_size: int, vectors: int, packed: bool) -> bool:
    """Whether the backend runs ``vectors`` MSMs of one key section as ONE batched pass
    (:meth:`.msm._Msm.launch_batch`; else one MSM each): more than one, a key of at most
    :data:`DENSE_KEY_ROWS` rows (dense plans), the section not packed to a support. One rule for the
    backend's ``msm_batch`` and the device plan's scratch."""
    return vectors > 1 and domain_size <= DENSE_KEY_ROWS and not packed


def msm_stream_of(domain_size: int, section: str, i: int) -> str:
    """Which of a thread's streams the i-th MSM of ``section`` in a pass of a key of ``domain_size``
    rows runs on: "main" (a large key's G1 MSMs), "side" (its G2 MSM) or "pool<j>" (a small key's).
    One rule for the backend (which stream it enqueues on) and the device plan (MSMs on one stream
    run one after another and reuse its pool blocks; on distinct streams their scratch is alive
    together)."""
    if domain_size > SMALL_KEY_ROWS:
        return "side" if section == "b2" else "main"
    return f"pool{(SECTIONS.index(section) + len(SECTIONS) * i) % MSM_STREAMS}"


def grid_rounds_for(n: int, n_buckets: int, most: int) -> int:
    """Grid batch-affine rounds for n sorted entries over n_buckets buckets: each round halves
    every run, so log2 of the mean run (at most ``most``); the XYZZ level 1 sums what is left."""
    mean = n / max(1, min(n_buckets, n))
    return max(0, min(most, int(mean).bit_length() - 1))


SCALAR_BITS = 256  # windows cover 256 bits: the Booth carry out of bit 254 still fits


def choose_window(m: int) -> int:
    """Window bits for m scalars without precomputed multiples: floor(log2 m) - 4 in [5, 22],
    lowered while one bit fewer needs no more windows.

    A window's cost is m sort keys and mixed additions plus its 2^(c-1) buckets' reduction, so
    a c whose window count c - 1 also gives (17 and 16: 16 windows; 21 and 20: 13; 23 and 22:
    12) only doubles the buckets. Measured on the H200 (random G1, checked,
    perf/results/gpu-msm-windows-h200.json): 2^25 scalars 207.5 ms at c = 20 against 215.7 at
    21 and 219.1 at 22; 2^26 398.2 at 22 against 415.6 at 21; 2^27 771.0 at 22 against 810.7.
    22 caps the bucket memory: at 2^26+ scalars a sort batch holds at most 4 windows
    (``MsmParams.max_entries``), 4 x 2^21 XYZZ buckets: 1.6 GB for G1, 3.2 GB for G2.
    """
    c = min(max(m.bit_length() - 1 - 4, 5), 22)
    while c > 5 and window_count(c - 1) == window_count(c):
        c -= 1
    return c


def window_count(c: int) -> int:
    """Signed c-bit windows needed for scalars below 2^255 (digits.cuh)."""
    return -(-SCALAR_BITS // c)


def choose_multiples_window(n: int) -> int:
    """Window bits for precomputed multiples of n points: the c in [8, 24] that minimises
    the model n W(c) + 3 * 2^c (mixed additions of the accumulation, plus the one shared
    bucket set's reduction: 2^(c-1) buckets x 2 full additions at ~1.5 mixed ones each).
    2^24 points: 22 (12 windows; 13 at c = 20 without multiples), 2^20: 19, 2^16: 16."""
    return min(range(8, 25), key=lambda c: (n * window_count(c) + 3 * (1 << c), c))


def ones_segment(n1: int, resident: int | None, seg: int) -> int:
    """Entries per thread for the sum of the n1 ones: the fewest whole waves of
    ``resident`` threads with at most ``seg`` entries each.

    With a fixed seg the last wave can be nearly empty (G2 at 2^24 PoRep-like:
    6.7 M ones / 64 = 105 k threads = 3.1 waves of 33.8 k, so ~22 % of the ones
    time idles); one segment per thread and wave costs nothing extra. ``resident``
    None (no occupancy figure, e.g. the CPU emulator) keeps ``seg``.
    """
    if not resident:
        return seg
    waves = max(1, -(-n1 // (resident * seg)))
    return max(1, -(-n1 // (waves * resident)))


def plan_multiples(section_bytes: dict[str, int], free: int, domain_size: int,
                   choice: str | None = None) -> dict[str, int]:
    """Which sections get precomputed multiples, and their window bits.

    ``choice``: "none", "auto" (default) or a comma list of sections. "auto" takes
    sections in the order h, b2, a, b1, c while the tables ((W - 1) more copies of
    the section) leave ``RESERVE_FIXED + RESERVE_PER_ROW * domain_size`` free.
    ``section_bytes``: bytes of each section's points; ``free``: device bytes free
    once the sections are resident.
    """
    choice = (choice or "").strip().lower() or "auto"
    if choice in ("none", "0", "off"):
        return {}
    rows = {name: b // (192 if name == "b2" else 96) for name, b in section_bytes.items()}
    windows = {name: choose_multiples_window(max(1, r)) for name, r in rows.items() if r}
    if choice != "auto":
        picked = [s.strip() for s in choice.split(",") if s.strip()]
        unknown = [s for s in picked if s not in SECTIONS]
        if unknown:
            raise ConfigError(f"{MULTIPLES_ENV}={choice!r}: unknown sections {unknown} (use none, auto or "
                             f"a comma list of {', '.join(SECTIONS)})")
        return {s: windows[s] for s in picked if s in windows}
    budget = free - RESERVE_FIXED - RESERVE_PER_ROW * domain_size
    out: dict[str, int] = {}
    for name in ("h", "b2", "a", "b1", "c"):
        if name not in windows:
            continue
        extra = (window_count(windows[name]) - 1) * section_bytes[name]
        if extra <= budget:
            out[name] = windows[name]
            budget -= extra
    return out
