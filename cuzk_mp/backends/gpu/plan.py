"""The device-memory plan of a proving key: what it needs on the GPU, against what is free, before any upload.

A key that does not fit must fail at once with a message that says by how much, not with a CUDA
out-of-memory error half way through its upload or, worse, in the middle of a partition's MSM
after minutes of synthesis. :func:`plan_device` adds up, with the byte formulas the backend runs
with (the point and field sizes of :mod:`cuzk_mp.algebra.field`, the MSM geometry of
:mod:`.knobs`), the device memory of one key and the partitions a prover keeps in flight:

* resident, for the key's life: the point sections A, B1, B2 (G2), C and H as the zkey stores
  them (affine, Montgomery: 96 B per G1 point, 192 B per G2 point; IC stays on the host, the
  proof's assembly reads it there), the precomputed multiples of the sections
  :func:`.msm_geometry.plan_multiples` picks (W - 1 more copies of a section, W windows of its c), the
  row list of a packed key's support (4 B per kept row, one at most), and
  the H step's twiddle table (n/2 Fr elements), and, for a circuit whose partitions arrive as w
  alone, the coded A and B rows and coefficient tables its device witness map reads (uploaded by the
  first such partition, kept for the key's life: ``witness_map``);
* per partition in flight: a, b, c (domain_size x 32 B each), w (n_vars x 32 B), the witness's
  0/1/other index lists (8 B per witness row, kept from staging to release), for a key whose sparse
  B sections are packed (``KeyShape.packed``: they keep only the rows with a point) the scalars of
  those rows and their own index lists (40 B per kept row; a key not known to be packed is bounded
  by 8 B per witness row), and the classify pass's transient bytes;
* the compute scratch of the one pass that computes at a time (the prover's per-device lock; a
  worker's batch of partitions together): of every MSM alive at once (:func:`compute_scratch_bytes`:
  a large key's largest G1 MSM and its G2 MSM, side by side on two streams; a small key's MSMs
  each on a stream of their own, a batch's as one batched pass per section where the backend
  batches them, keys of at most :data:`.msm_geometry.DENSE_KEY_ROWS` rows): sort keys, the radix sort's
  pass buffers and positions, the previous window batch's positions, the bucket sets, the
  accumulation heads and the window sums (:func:`msm_scratch_bytes`), plus C's cut of the witness
  plan. The H step works in place over a, b, c and needs only the tables;
* for small keys whose MSMs run as CUDA graphs, the buffers those graphs keep (:func:`graph_bytes`).

Every MSM is planned dense (every scalar neither 0 nor 1, as in the dense-random circuit): the
bound holds whatever the witness.

How many partitions are on the device at once: each prover worker thread stages a batch (one
partition, or up to the prover's batch of small ones: ``batch``), holds it while it waits for the
device lock and computes it in one pass, and releases it when its MSMs are done, so
``gpu_workers_per_device`` batches at most (one computing, the others staged). A partition staged
as w alone (the device witness map) gets its a, b, c when it computes, so the peak is one whole
batch with the MSM scratch beside w-only staged ones, or, between two computations, every
partition whole with no MSM running (:attr:`DevicePlan.in_flight_total`). Which partitions are
batched (their ring segment's size against the prover's limit) is the pipeline's rule: the
backend gets the batch of each key as a number (``load_key``'s ``batch``). A plan counts its own
key's partitions; with several keys resident, their partitions in flight side by side, the limits
the backend keeps to come from every key's plan together (:mod:`.admission`).

The default accumulation "auto" keeps the G2 grid rounds (and their lists) where the plan fits
them as configured, and accumulates in XYZZ elsewhere (:data:`.env_knobs.ACCUMULATE_MODES`): a rule,
not a fallback (step 0b below taken silently: ``grid_off``, no step). On the H200 that is 2^24
(beside every multiple) and 2^26 (no multiples); above 2^26 rows it keeps XYZZ by rule
(:data:`GRID_AUTO_MAX_DOMAIN`: measured slower in the 2^27 pipeline, where the lists do fit beside two
partitions that come as w alone).

When it does not fit, the plan falls back automatically, in this order, and says so (the
``choice`` and ``steps`` fields; the backend logs them):

0. run the MSMs without CUDA graphs (small keys: a latency gain only);
0b. accumulate in XYZZ alone, without the grid batch-affine rounds' lists (``grid_off``): the
   rounds gain a few percent of the G2 MSM, a multiple's table far more. Their chunk is not made
   smaller instead: on the H200 the 2^27 key with half-size chunks (24 a G2 MSM, each paying its
   rounds' fixed latency) lost 5.6 % of device time to XYZZ (perf/results/gpu-session-h200-grid-g2.json);
1. drop precomputed multiples, the least useful section first (c, b1, a, b2, h: the reverse of
   the order they are picked in): they are a speed-up only, and at 2^26 and above one section's
   tables alone outweigh a partition (not those already made: the plan of a key after its upload
   counts the tables made, some having found no room on the device then);
2. smaller batches, down to one partition (``batches of j partition(s) instead of k``): a
   batch of small partitions shares one pass's launches and host calls, a throughput gain only;
   the backend's ``batch_limit`` then caps what the prover's workers take at once;
3. fewer partitions in flight, down to one (the next partition's upload no longer overlaps the
   compute: slower, but every proof still comes out);
4. refuse: :class:`~cuzk_mp.errors.DeviceMemoryError` names the need and the free memory and the
   largest domain size of this circuit's shape that would fit, before a byte is uploaded.

Pure Python (no CuPy): the CLI and CI compute plans on machines without a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ...algebra.field import FR_BYTES, G1_BYTES, G2_BYTES
from ...errors import DeviceMemoryError
from .env_knobs import large_sort_for
from .msm_geometry import SECTIONS, batches_msms, choose_window, msm_stream_of, plan_multiples, window_count
from .msm_params import GRAPH_RUNS, MsmParams, graph_batch_limit, msm_params_for, reduce_chunks

GIB = float(1 << 30)
# Left free on top of a plan: CuPy/cuBLAS workspaces, kernel launches, small per-call arrays (the
# MSM's result rows, the classify flags). memory.ensure_free keeps the same margin.
DEFAULT_MARGIN = 512 << 20
INDEX_BYTES = 8  # int64: the witness plan's index lists (cupy.flatnonzero) and the MSM's sorted positions
KEY_BYTES = 4  # uint32 sort key per (window, scalar) (msm_digits)
# Alive per sort key while a window batch sorts (kernels/msm/sort.cuh, msm_passes._MsmPasses._radix_sort): its
# key, one pass's input and output (a uint32 key and position each; the last pass writes the int64
# positions instead), the previous batch's positions, dropped only once the new ones are assigned,
# and the digit counts and offsets (under a byte a key: 2 x 512 x 4 B a tile of 4096 keys).
SORT_BYTES_PER_KEY = KEY_BYTES + 2 * (KEY_BYTES + KEY_BYTES) + INDEX_BYTES + 1
# cupy.argsort (MsmParams.large_sort "argsort"): the key, its copy and CUB's key and index double
# buffers, the int64 output, and the previous batch's positions.
ARGSORT_BYTES_PER_KEY = KEY_BYTES + KEY_BYTES + INDEX_BYTES + (KEY_BYTES + INDEX_BYTES) + INDEX_BYTES
# The counting sort (kernels/msm/sort.cuh, every pass a graph captures): the key and its position.
COUNTING_SORT_BYTES_PER_KEY = KEY_BYTES + INDEX_BYTES
# classify: one uint8 class per scalar, the classes of the support's rows (uint8), a boolean mask
# per class tested, and the prefix sum of cupy.flatnonzero (int64), transient while a partition stages.
CLASSIFY_BYTES_PER_ROW = 1 + 1 + 1 + INDEX_BYTES
SUPPORT_ROW_BYTES = 4  # int32 per kept row: the key's one support row list (key_load.SUPPORT_SECTIONS)
HEAD_KEY_BYTES = 4  # uint32 key of each accumulation head
# The fallbacks' order of multiples to drop: the reverse of plan_multiples' picking order.
DROP_ORDER = ("c", "b1", "a", "b2", "h")
NO_GRAPHS = "MSMs without CUDA graphs"  # the first fallback (small keys)
# "auto" keeps the G2 grid rounds off above this domain by rule, wherever their lists fit: in the
# 2^27 PoRep-like pipeline on the H200 they cost 7 % of device time against XYZZ (2.013 / 1.999 s a
# partition against 1.868 / 1.870 s, with 7 and with 4 synthesis threads a worker; one lone partition
# gained 2.8 %: perf/results/pipeline-h200-2^27-grid.json, gpu-partition-2^27-grid-h200.json); 2^26
# gained 3 % in its pipeline.
GRID_AUTO_MAX_DOMAIN = 1 << 26
NO_GRID = "bucket accumulation in XYZZ alone (no grid batch-affine lists)"  # the next


def point_bytes(section: str) -> int:
    """Bytes of one affine point of a key section as the device holds it (zkey layout)."""
    return G2_BYTES if section == "b2" else G1_BYTES


def point_words(section: str) -> int:
    """uint64 words of one affine point of a key section (the backend's ``(n, words)`` arrays)."""
    return point_bytes(section) // 8


@dataclass(frozen=True)
class KeyShape:
    """What the plan needs of a key: its domain, witness length and public signals."""

    domain_size: int
    n_vars: int
    n_public: int
    # (section, rows) of the sections packed to their support's rows (the backend's sparse B
    # sections, known once their points are on the device); empty: every section whole
    packed: tuple[tuple[str, int], ...] = ()

    @classmethod
    def of(cls, zkey: Any) -> KeyShape:
        """The shape of a loaded :class:`~cuzk_mp.formats.zkey.ZKey` (its header fields)."""
        return cls(int(zkey.domain_size), int(zkey.n_vars), int(zkey.n_public))

    def rows(self) -> dict[str, int]:
        """Points per section on the device: as the zkey stores them (A, B1, B2 n_vars; C the
        private signals; H domain_size) but for the packed sections' rows."""
        n = self.n_vars
        return {"a": n, "b1": n, "b2": n, "c": n - self.n_public - 1, "h": self.domain_size, **dict(self.packed)}

    @property
    def support(self) -> int:
        """Rows of the packed sections' support (they share one; 0: nothing packed)."""
        return max((r for _, r in self.packed), default=0)

    def section_bytes(self) -> dict[str, int]:
        """Device bytes of each section's points."""
        return {s: r * point_bytes(s) for s, r in self.rows().items()}

    def scaled(self, domain_size: int) -> KeyShape:
        """The same circuit shape at another domain size (n_vars and packed rows in proportion)."""
        ratio = domain_size / max(1, self.domain_size)
        return KeyShape(domain_size, max(self.n_public + 2, int(self.n_vars * ratio)), self.n_public,
                        tuple((s, int(r * ratio)) for s, r in self.packed))


def msm_scratch_bytes(n_scalars: int, g2: bool, params: MsmParams | None = None,
                      multiples_c: int | None = None, sort_bytes: int | None = None,
                      captured: bool = False, vectors: int = 1) -> int:
    """Device bytes one MSM run allocates beyond its points and scalars, at its peak, with every
    scalar "other" (the Pippenger path of :meth:`.msm._Msm._pippenger`; the sum of the ones uses
    less per scalar): windows of c bits (``multiples_c``, else the params' or
    :func:`.msm_geometry.choose_window`), batches of at most ``params.max_entries`` sort keys, each with
    the sort's bytes per key (``sort_bytes``; None: :data:`SORT_BYTES_PER_KEY`, the radix sort's, or
    :data:`ARGSORT_BYTES_PER_KEY` for ``params.large_sort`` "argsort"), its
    bucket sets (one per window of the batch without multiples; the shared set and the batch's
    with them), the accumulation heads and the first combine level (each later level replaces the
    one before it, which is then freed; in a captured graph (``captured``) every level stays); plus
    the bucket reduction's shares and the window sums. ``vectors``: a batched pass of that many
    scalar vectors of ``n_scalars / vectors`` each (a small key's prover batch): their windows and
    bucket sets are each vector's. An upper bound: the sort's buffers and the heads are counted as
    alive together."""
    p = params or MsmParams()
    if sort_bytes is None:
        sort_bytes = ARGSORT_BYTES_PER_KEY if p.large_sort == "argsort" else SORT_BYTES_PER_KEY
    m = max(1, int(n_scalars))
    k = max(1, int(vectors))
    xyzz = 2 * (G2_BYTES if g2 else G1_BYTES)
    c = multiples_c or p.window_bits or choose_window(max(1, m // k))
    windows = window_count(c)
    per_batch = max(1, min(windows, p.max_entries // m))
    entries = per_batch * m
    buckets = 1 << (c - 1)
    bucket_bytes = ((k + 1) * buckets if multiples_c else k * per_batch * buckets) * xyzz
    t = -(-entries // p.seg)
    heads = t
    while t > 1:
        t = -(-t // p.combine_seg)
        heads += t
        if not captured:  # the next level frees this one's input: two levels at a time at most
            break
    heads *= xyzz + HEAD_KEY_BYTES
    # the bucket reduction's shares: each bucket set cut in chunks, a partial sum a chunk
    # (.msm_passes._MsmPasses._window_sums)
    sets = k if multiples_c else k * per_batch
    _, per = reduce_chunks(sets, buckets, p)
    # and where a second reduction weights the chunks' sums, those sums (its buckets) as many again
    shares = sets * per * xyzz * (2 if per > 1 and p.second_reduction(sets * per) else 1)
    return (entries * sort_bytes + bucket_bytes + heads + shares + k * windows * xyzz
            + grid_list_bytes(entries, g2, p))


def grid_list_bytes(entries: int, g2: bool, params: MsmParams) -> int:
    """What the grid batch-affine rounds (``params.grid(g2)``) add for a window batch of
    ``entries`` sorted keys, one chunk of at most ``params.ga_chunk`` at a time: round 0's point rows
    and bucket ids, two output lists (points and bucket ids), and per slot (two entries) the pair
    count, two rounds' prefix sums and a prefix product (.msm_passes._MsmPasses._accumulate_grid; the chunk's
    heads are within the XYZZ heads counted beside)."""
    if not params.grid(g2):
        return 0
    aff = G2_BYTES if g2 else G1_BYTES
    c = min(params.ga_chunk, max(1, entries))
    slots = -(-c // 2)
    return c * (INDEX_BYTES + HEAD_KEY_BYTES + 2 * (aff + HEAD_KEY_BYTES)) + slots * (
        HEAD_KEY_BYTES + 2 * INDEX_BYTES + aff // 2)


def ntt_table_bytes(domain_size: int) -> int:
    """The H step's resident table: w^i for i < n/2 (the small sub-DFT and coset tables are
    kilobytes, inside the margin)."""
    return max(1, domain_size // 2) * FR_BYTES


def partition_bytes(shape: KeyShape) -> dict[str, int]:
    """Device bytes one staged partition holds from staging to release."""
    n, v, k = shape.domain_size, shape.n_vars, shape.support
    return {"a": n * FR_BYTES, "b": n * FR_BYTES, "c": n * FR_BYTES, "w": v * FR_BYTES,
            "w_plan": v * INDEX_BYTES, "w_support": k * FR_BYTES,
            "w_support_plan": (k if shape.packed else v) * INDEX_BYTES, "classify": v * CLASSIFY_BYTES_PER_ROW}


def graph_bytes(shape: KeyShape, multiples: dict[str, int], params: MsmParams) -> int:
    """What the key's captured MSM graphs may hold for its life when ``params.graphs``: per section,
    GRAPH_RUNS graphs of the largest dense pass the msm module captures (k vectors, k at most
    :func:`.msm_params.graph_batch_limit`), each its scratch and its input copy."""
    if not params.graphs:
        return 0
    total = 0
    for s, m in shape.rows().items():
        c = multiples.get(s) or params.window_bits or choose_window(max(1, m))
        k = graph_batch_limit(m, c)
        if k >= 1:
            run = msm_scratch_bytes(k * m, s == "b2", params, multiples.get(s), COUNTING_SORT_BYTES_PER_KEY,
                                    captured=True, vectors=k)
            total += GRAPH_RUNS * (run + k * m * FR_BYTES)
    return total


def compute_scratch_bytes(shape: KeyShape, multiples: dict[str, int], params: MsmParams | None = None,
                          g2_params: MsmParams | None = None, graph_params: MsmParams | None = None,
                          batch: int = 1) -> dict[str, int]:
    """Scratch of the pass that computes: a worker's ``batch`` partitions together (1: one). Each
    section's ``batch`` MSMs run as one batched pass where the backend batches them
    (:func:`.msm_geometry.batches_msms`: its scratch over ``batch`` vectors and their concatenated copy),
    else as one MSM each. MSMs on one stream (:func:`.msm_geometry.msm_stream_of`) run one after another and
    reuse that stream's pool blocks, so the largest counts; MSMs on distinct streams run side by side,
    each with its own: a large key's G1 MSMs on one stream and G2 on another (the largest G1 MSM and
    the G2 MSM), a small key's on a pool of streams (each section of a pass, and each partition of an
    unbatched one, a stream of its own). ``msm_g1`` / ``msm_g2``: the streams whose largest MSM is of
    that group. Plus C's cut of the witness plan (one alive per stream that runs C's MSMs) and the MSM
    graphs of ``graph_params`` (the small keys' geometry with ``graphs`` on; :func:`graph_bytes`)."""
    rows = shape.rows()
    k = max(1, int(batch))
    packed = {s for s, _ in shape.packed}
    alive: dict[str, tuple[int, bool]] = {}  # stream -> (its largest MSM's scratch, whether that is G2)
    c_streams: set[str] = set()
    for s in SECTIONS:
        g2, m, c = s == "b2", rows[s], multiples.get(s)
        p = (g2_params or params) if g2 else params
        if batches_msms(shape.domain_size, k, s in packed):
            runs = [(msm_stream_of(shape.domain_size, s, 0),
                     msm_scratch_bytes(k * m, g2, p, c, vectors=k) + k * m * FR_BYTES)]
        else:
            one = msm_scratch_bytes(m, g2, p, c)
            runs = [(msm_stream_of(shape.domain_size, s, i), one) for i in range(k)]
        for stream, need in runs:
            if s == "c":
                c_streams.add(stream)
            if need > alive.get(stream, (0, False))[0]:
                alive[stream] = (need, g2)
    out = {"msm_g1": sum(b for b, g2 in alive.values() if not g2), "msm_g2": sum(b for b, g2 in alive.values() if g2),
           "c_plan": len(c_streams) * rows["c"] * INDEX_BYTES}
    graphs = graph_bytes(shape, multiples, graph_params) if graph_params is not None else 0
    if graphs:
        out["msm_graphs"] = graphs
    return out


@dataclass(frozen=True)
class BatchLoad:
    """What one worker's batch of one key's partitions holds on the device: ``batch`` partitions of
    ``partition`` bytes whole and ``staged`` bytes while they wait, and the ``scratch`` of their pass."""

    batch: int
    partition: int
    staged: int
    scratch: int


def in_flight_bytes(loads: Sequence[BatchLoad], in_flight: int) -> int:
    """The device bytes of ``in_flight`` workers' batches at their peak together, each batch of any
    of ``loads`` (the resident keys' partitions: a worker's batch may be of any key): one batch
    computing (whole, its pass's scratch beside) with the others' staged, or, between two
    computations (the next batch's H steps while the last one is being released), every batch
    whole with no MSM running. The largest of each part is counted, whichever keys they are of:
    for one key, exactly its batch computing beside ``in_flight`` - 1 staged ones."""
    whole = max((x.batch * x.partition for x in loads), default=0)
    staged = max((x.batch * x.staged for x in loads), default=0)
    computing = whole + max((x.scratch for x in loads), default=0) + (in_flight - 1) * staged
    return max(computing, in_flight * whole)


@dataclass
class DevicePlan:
    """A key's device memory, part by part (bytes), against the free memory; see the module docstring.

    ``choice``: what the plan settled on in words ("as configured", "without multiples of h",
    "1 partition in flight", ...); ``steps``: each fallback taken, in order. ``batch``: the
    partitions a worker stages and computes together, as fitted (``batch_max``: as asked, the
    prover's batch for this key's partitions; 1 for a key whose partitions are not batched).
    """

    shape: KeyShape
    points: dict[str, int]
    multiples: dict[str, int]  # section -> window bits c of its precomputed multiples
    multiples_bytes: dict[str, int]  # section -> bytes of its tables beyond the points
    ntt_tables: int
    per_partition: dict[str, int]
    in_flight: int
    workers: int
    scratch: dict[str, int]
    margin: int
    free: int
    choice: str = "as configured"
    steps: list[str] = field(default_factory=list)
    graphs: bool = False  # the MSMs may run as CUDA graphs (their buffers are in ``scratch``)
    witness_map: int = 0  # the device witness map's coded rows and tables (0: the host makes a, b, c)
    grid_off: bool = False  # the grid rounds' lists did not fit: XYZZ accumulation alone (:meth:`msm_params`)
    grid_counted: bool = True  # the plan's MSM parameters had grid rounds (their lists are in the plan)
    large_sort: str = "radix"  # the large window batches' sort the plan counted (:func:`.env_knobs.large_sort_for`)
    batch: int = 1  # partitions a worker stages together, as fitted (the in-flight count is of workers)
    batch_max: int = 1  # ... as asked (plan_device's ``batch``)
    # the MSM parameters the scratch was counted with (the graphs' where they run as graphs): what
    # :meth:`scratch_at` counts another batch's scratch with
    params: MsmParams | None = field(default=None, repr=False)
    graph_params: MsmParams | None = field(default=None, repr=False)

    def msm_params(self, params: MsmParams) -> MsmParams:
        """``params`` as this plan fitted them: without the grid rounds where :attr:`grid_off`, or where
        the plan's own parameters (the key's domain's) had none: a section with more points than the
        domain (B2 of a key with more wires than rows) must not bring lists the plan never counted."""
        off = self.grid_off or not self.grid_counted
        params = replace(params, ga_rounds=0) if off and params.ga_rounds else params
        return replace(params, large_sort=self.large_sort) if params.large_sort != self.large_sort else params

    @property
    def points_total(self) -> int:
        """The key's points on the device."""
        return sum(self.points.values())

    @property
    def partition_total(self) -> int:
        """One partition in flight."""
        return sum(self.per_partition.values())

    @property
    def support_rows(self) -> int:
        """The row list of the packed sections' support (one per key at most)."""
        return self.shape.support * SUPPORT_ROW_BYTES

    @property
    def resident(self) -> int:
        """What stays for the key's life: points, multiples, the support's rows, NTT tables, the
        witness map's rows."""
        return (self.points_total + sum(self.multiples_bytes.values()) + self.support_rows + self.ntt_tables
                + self.witness_map)

    @property
    def staged_total(self) -> int:
        """One partition staged, waiting for the device: without a, b, c where the device witness map
        makes them when the partition computes (the backend's stage_witness), else all of it."""
        return self.partition_total - (sum(self.per_partition[k] for k in "abc") if self.witness_map else 0)

    def scratch_at(self, batch: int) -> int:
        """The compute scratch of a pass of ``batch`` of this key's partitions (the plan's own at its
        batch; another batch's counted with the same multiples and MSM parameters)."""
        if batch == self.batch:
            return sum(self.scratch.values())
        return sum(compute_scratch_bytes(self.shape, self.multiples, self.params, batch=batch,
                                         graph_params=self.graph_params if self.graphs else None).values())

    @property
    def in_flight_total(self) -> int:
        """The partitions at their peak together, ``in_flight`` workers' batches of ``batch`` each
        (:func:`in_flight_bytes` of this key's partitions alone)."""
        load = BatchLoad(self.batch, self.partition_total, self.staged_total, sum(self.scratch.values()))
        return in_flight_bytes([load], self.in_flight)

    @property
    def total(self) -> int:
        """Everything the plan needs at once, the margin included."""
        return self.resident + self.in_flight_total + self.margin

    @property
    def fits(self) -> bool:
        """Whether the total is within the free memory."""
        return self.total <= self.free

    def summary(self) -> str:
        """One line: the parts in GiB, the total against the free memory, the choice."""
        mult = ", ".join(f"{s} c={c}" for s, c in self.multiples.items()) or "none"
        packed = (f" ({', '.join(s for s, _ in self.shape.packed)} packed to {self.shape.support} rows of "
                  f"{self.shape.n_vars})" if self.shape.packed else "")
        return (f"device plan 2^{self.shape.domain_size.bit_length() - 1}: points {self.points_total / GIB:.1f} GiB"
                f"{packed}"
                f" + multiples {sum(self.multiples_bytes.values()) / GIB:.1f} GiB ({mult})"
                f" + NTT tables {self.ntt_tables / GIB:.1f} GiB"
                + (f" + witness map {self.witness_map / GIB:.1f} GiB" if self.witness_map else "")
                + f" + {self.in_flight} partition(s) in flight"
                + (f" in batches of {self.batch}" if self.batch > 1 else "")
                + f" x {self.partition_total / GIB:.1f} GiB"
                + (f" ({self.staged_total / GIB:.1f} GiB while staged)" if self.staged_total < self.partition_total
                   else "")
                + f" + MSM scratch {sum(self.scratch.values()) / GIB:.1f} GiB"
                f" + margin {self.margin / GIB:.1f} GiB = {self.total / GIB:.1f} GiB of {self.free / GIB:.1f} GiB"
                f" free: {'fits' if self.fits else 'does NOT fit'}; {self.choice}")

    def as_dict(self) -> dict[str, Any]:
        """JSON-able, with the totals."""
        return {"domain_size": self.shape.domain_size, "n_vars": self.shape.n_vars, "points": self.points,
                "packed": dict(self.shape.packed),
                "multiples": self.multiples, "multiples_bytes": self.multiples_bytes, "ntt_tables": self.ntt_tables,
                "per_partition": self.per_partition, "witness_map": self.witness_map, "in_flight": self.in_flight,
                "workers": self.workers, "batch": self.batch, "batch_max": self.batch_max,
                "scratch": self.scratch, "margin": self.margin, "total": self.total, "free": self.free,
                "fits": self.fits, "choice": self.choice, "steps": list(self.steps)}


def _build(shape: KeyShape, multiples: dict[str, int], in_flight: int, workers: int, free: int, margin: int,
           params: MsmParams | None, graph_params: MsmParams | None, witness_map: int = 0, batch: int = 1,
           batch_max: int = 1) -> DevicePlan:
    points = shape.section_bytes()
    extra = {s: (window_count(c) - 1) * points[s] for s, c in multiples.items()}
    return DevicePlan(shape, points, dict(multiples), extra, ntt_table_bytes(shape.domain_size),
                      partition_bytes(shape), in_flight, workers,
                      compute_scratch_bytes(shape, multiples, params, graph_params=graph_params, batch=batch),
                      margin, free, graphs=bool(graph_params and graph_params.graphs), witness_map=witness_map,
                      batch=batch, batch_max=batch_max, params=params, graph_params=graph_params)


def plan_device(shape: KeyShape, free: int, *, workers: int = 1, multiples: str | None = "none",
                margin: int = DEFAULT_MARGIN, params: MsmParams | None = None,
                graph_params: MsmParams | None = None, witness_map: int = 0, batch: int = 1,
                made: bool = False) -> DevicePlan:
    """The device plan of a key of ``shape`` with ``free`` usable device bytes, ``workers``
    prover workers (the prover's ``gpu_workers_per_device``) each staging a batch of ``batch``
    partitions at most (the prover's batch where the key's partitions are batched, else 1),
    falling back as the module docstring says. ``multiples``: the precomputed-multiples choice ("none", "auto" or a
    comma list of sections, as :func:`.msm_geometry.plan_multiples`; "auto" sizes them against the free
    memory left once the points are resident). ``graph_params``: the MSM geometry of a key whose
    MSMs run as CUDA graphs (their buffers are planned, and dropped first). ``witness_map``: the
    device bytes of the coded rows the key's device witness map will keep (0: none). ``params``:
    the MSM parameters (None: :func:`.msm_params.msm_params_for` the domain size, as the backend); the
    plan's :meth:`DevicePlan.msm_params` gives them back as it fitted them. ``made``: the multiples
    of ``multiples`` (a comma list) are on the device already (the key's plan after its upload, with
    the tables that were made): the fallbacks keep them. Raises DeviceMemoryError when even one
    partition without multiples (or with the ones made) does not fit."""
    workers = max(1, int(workers))
    batch_max = max(1, int(batch))
    given = params
    # what the backend's MSMs of this key take (the sort of large window batches by the key's domain)
    params = params or replace(msm_params_for(shape.domain_size), large_sort=large_sort_for(shape.domain_size))
    points = shape.section_bytes()
    chosen = plan_multiples(points, free - sum(points.values()) - witness_map, shape.domain_size, multiples)
    grid_off = False

    def _plan(mult: dict[str, int], in_flight: int, graphs: MsmParams | None, k: int = batch_max) -> DevicePlan:
        return _build(shape, mult, in_flight, workers, free, margin, params, graphs, witness_map, k, batch_max)

    if params.ga_rounds and params.ga_where_fits and shape.domain_size > GRID_AUTO_MAX_DOMAIN:
        grid_off = True  # "auto": a rule (measured), not a fallback
        params = replace(params, ga_rounds=0)
    plan = _plan(chosen, workers, graph_params)
    steps: list[str] = []
    if not plan.fits and plan.graphs:
        graph_params = None
        steps.append(NO_GRAPHS)
        plan = _plan(chosen, workers, graph_params)
    if not plan.fits and params.ga_rounds:
        grid_off = True
        if not params.ga_where_fits:  # "auto": a rule, not a fallback
            steps.append(NO_GRID)
        params = replace(params, ga_rounds=0)
        plan = _plan(chosen, workers, graph_params)
    for s in DROP_ORDER:
        if plan.fits or not chosen or made:
            break
        if s in chosen:
            chosen = {k: v for k, v in chosen.items() if k != s}
            steps.append(f"dropped the precomputed multiples of {s}")
            plan = _plan(chosen, workers, graph_params)
    j = batch_max
    while not plan.fits and j > 1:
        j -= 1
        plan = _plan(chosen, workers, graph_params, j)
        steps.append(f"batches of {j} partition(s) instead of {batch_max}")
    k = workers
    while not plan.fits and k > 1:
        k -= 1
        plan = _plan(chosen, k, graph_params, j)
        steps.append(f"{k} partition(s) in flight instead of {workers}")
    plan.steps = steps
    plan.grid_off = grid_off
    plan.large_sort = params.large_sort
    plan.grid_counted = bool(params.ga_rounds) or grid_off
    if steps:
        dropped = [s for s in DROP_ORDER if any(st.endswith(f"multiples of {s}") for st in steps)]
        parts = [st for st in steps if st in (NO_GRAPHS, NO_GRID)]
        parts += [f"without the precomputed multiples of {', '.join(dropped)}"] if dropped else []
        if plan.batch < batch_max:
            parts.append(f"batches of {plan.batch} partition(s) instead of {batch_max}")
        if plan.in_flight < workers:
            parts.append(f"{plan.in_flight} partition(s) in flight instead of {workers}")
        plan.choice = "; ".join(parts)
    if not plan.fits:
        raise DeviceMemoryError(refusal(plan, margin, given))
    return plan


def largest_fitting_domain(shape: KeyShape, free: int, margin: int = DEFAULT_MARGIN,
                           params: MsmParams | None = None, witness_map: int = 0) -> int | None:
    """The largest power-of-two domain of this circuit's shape (n_vars and the witness map's rows
    in proportion) whose key and one partition, without multiples, fit ``free`` bytes (None: not
    even 2^1). ``params`` None: each domain's own MSM parameters (:func:`.msm_params.msm_params_for`)
    without the grid rounds' lists, as with every fallback taken."""
    for lg in range(max(1, shape.domain_size.bit_length() - 1), 0, -1):
        wm = witness_map * (1 << lg) // max(1, shape.domain_size)
        p = params or replace(msm_params_for(1 << lg), ga_rounds=0, large_sort=large_sort_for(1 << lg))
        if _build(shape.scaled(1 << lg), {}, 1, 1, free, margin, p, None, wm).fits:
            return 1 << lg
    return None


def refusal(plan: DevicePlan, margin: int = DEFAULT_MARGIN, params: MsmParams | None = None) -> str:
    """The message of a key that does not fit even with every fallback: need vs free, the parts,
    and the largest domain that would fit."""
    best = largest_fitting_domain(plan.shape, plan.free, margin, params, plan.witness_map)
    wmap = f"witness map {plan.witness_map / GIB:.2f} GiB, " if plan.witness_map else ""
    kept = (f"the precomputed multiples of {', '.join(plan.multiples)} (made)" if plan.multiples
            else "no precomputed multiples")
    fit = (f"the largest domain of this circuit's shape that fits is 2^{best.bit_length() - 1} ({best} rows)"
           if best else "not even a 2-row domain of this shape fits")
    return (f"the proving key (domain 2^{plan.shape.domain_size.bit_length() - 1}, {plan.shape.n_vars} witness "
            f"rows) needs {plan.total / GIB:.2f} GiB of device memory with {kept} and one partition in flight "
            f"(points {plan.points_total / GIB:.2f} GiB, NTT tables {plan.ntt_tables / GIB:.2f} GiB, {wmap}"
            f"partition {plan.partition_total / GIB:.2f} GiB, MSM scratch "
            f"{sum(plan.scratch.values()) / GIB:.2f} GiB, margin {plan.margin / GIB:.2f} GiB) but only "
            f"{plan.free / GIB:.2f} GiB is free; {fit}")
