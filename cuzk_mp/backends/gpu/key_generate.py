"""Making a key resident from its sections' scalars, with the fixed-base kernels (the dev setup).

Why a module of its own: :meth:`_KeyGeneration.generate_key` makes the points s_i G on the
device instead of reading them from a key file, the sections' scalars made ahead on a helper thread;
the rows whose scalar is 0 (most of a PoRep-like key's B sections) get no kernel lane, and a large
key's sparse sections come packed from the kernels themselves. The plan, packing, multiples and
MSM objects that follow are :mod:`.key_load`'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import cupy
import numpy as np
from py_arkworks_bls12381 import G1Point, G2Point

from ...errors import InputError
from ...formats.zkey import ZKey
from ..base import G2_ROW_COST, WitnessRows, check_key_sections
from . import fixed_base
from .backend_state import GpuKey
from .key_load import SUPPORT_MAX_FRACTION, SUPPORT_SECTIONS, _KeyLoading
from .msm_geometry import DENSE_KEY_ROWS
from .plan import KeyShape, point_words

log = logging.getLogger("cuzk_mp.backends.gpu.backend")  # the backend's logger: its lines keep their name

GEN_CHUNK_ROWS = 1 << 22  # scalars uploaded at a time by generate_key (128 MiB)


class _KeyGeneration(_KeyLoading):
    """Keys made resident from their scalars (a base of :class:`.backend.GpuBackend`)."""

    def generate_key(self, head: ZKey, sections: Sequence[tuple[str, str, Callable[[], np.ndarray]]], *,
                     lasting: bool = True, witness_rows: WitnessRows | None = None, batch: int = 1) -> GpuKey:
        """Make a key resident from its sections' scalars instead of a file (the dev setup of
        :func:`cuzk_mp.groth16.setup_resident.setup_resident`): the same plan as :meth:`load_key`,
        then for each ``(section, "g1" | "g2", scalars())`` the fixed-base kernel writes s_i G
        straight into the section's device array (scalars uploaded GEN_CHUNK_ROWS at a time; each
        section's host scalars dropped once its points exist), then the same MSM objects. The sections'
        scalars are made in order on a helper thread, ahead of the kernels (the QAP columns, C's
        scaling and H's ratios are seconds of host work each at 2^27; their numba kernels let the GIL
        go): the host holds at most the scalars not yet turned into points. A key above
        DENSE_KEY_ROWS gets its sparse whole-witness sections packed as they are made: only the rows
        whose scalar is not 0 get a point (:func:`_fixed_base_support`), so the whole section (26 GB
        for the 2^27 PoRep-like B2) is never allocated nor gathered from."""
        check_key_sections([name for name, _, _ in sections])
        rows = KeyShape.of(head).rows()
        work = {name: rows[name] * (G2_ROW_COST if group == "g2" else 1) for name, group, _ in sections}
        pack = int(head.domain_size) > DENSE_KEY_ROWS
        known: dict[str, Any] = {}  # name -> int32 device rows with a point, of the sections made packable

        def generate(s: Any) -> dict[str, Any]:
            dev = {}
            t0 = time.perf_counter()
            done, total = 0, sum(work.values())
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="cuzk-gpu-keygen") as pool:
                # every section's scalars made in order on the helper thread, as far ahead of the kernels
                # as it gets, not one section ahead: a section whose scalars take longer than the last
                # one's points no longer leaves the device idle while the host catches up
                upcoming: list[Any] = [pool.submit(make) for _, _, make in sections]
                try:
                    for i, (name, group, _) in enumerate(sections):
                        scalars = upcoming[i].result()
                        upcoming[i] = None  # the future held the scalars: gone once their points are made
                        if pack and name in SUPPORT_SECTIONS:
                            dev[name], known[name] = _fixed_base_support(s, name, group, scalars, rows[name])
                        else:
                            dev[name] = _fixed_base_rows(s, name, group, scalars, rows[name])
                        del scalars
                        done += work[name]
                        log.info("key %s: section %s generated (%d points of %d rows); %.0f%% of the key in %.1f s",
                                 head.path or "", name, int(dev[name].shape[0]), rows[name],
                                 100.0 * done / max(total, 1), time.perf_counter() - t0)
                finally:
                    for f in upcoming:
                        if f is not None:
                            f.cancel()
            return dev

        return self._resident(head, lasting, generate, lambda: 0, witness_rows, known, batch)


def _section_fixed_base(name: str, group: str, scalars: np.ndarray, n: int) -> Any:
    """The fixed-base kernel of section ``name`` (``group`` "g1" or "g2"), its n host scalars checked."""
    if scalars.shape != (n, 4) or scalars.dtype != np.uint64:
        raise InputError(f"generate_key: section {name} scalars {scalars.dtype} {scalars.shape}, "
                         f"expected ({n}, 4) uint64")
    return fixed_base.FixedBase(G2Point() if group == "g2" else G1Point())


def _nonzero_chunks(scalars: np.ndarray, n: int) -> Iterator[tuple[int, Any, Any]]:
    """(first row, device chunk, its rows whose scalar is not 0) of n host scalars, GEN_CHUNK_ROWS at
    a time: a zero scalar's point is the point at infinity (all-zero words, as the zkey stores it)
    and needs no kernel lane, which would cost its warp as much as any other."""
    for lo in range(0, n, GEN_CHUNK_ROWS):
        chunk = cupy.asarray(scalars[lo : min(n, lo + GEN_CHUNK_ROWS)])
        yield lo, chunk, cupy.flatnonzero(chunk.any(axis=1))


def _fixed_base_rows(s: Any, name: str, group: str, scalars: np.ndarray, n: int) -> Any:
    """Section ``name``'s points s_i G (``group`` "g1" or "g2") on the device from its n host scalars,
    done when this returns; only the nonzero rows are run (:func:`_nonzero_chunks`: the B sections of
    a circuit like PoRep's are 0 on most wires, 55 % of the PoRep-like circuit's)."""
    fb = _section_fixed_base(name, group, scalars, n)
    out = cupy.zeros((n, point_words(name)), dtype=np.uint64)
    for lo, chunk, rows in _nonzero_chunks(scalars, n):
        if int(rows.shape[0]) == int(chunk.shape[0]):
            fb.run_device(chunk, out[lo : lo + int(chunk.shape[0])])
        elif int(rows.shape[0]):
            out[lo + rows] = fb.run_device(chunk[rows])
    s.synchronize()
    return out


def _fixed_base_support(s: Any, name: str, group: str, scalars: np.ndarray, n: int) -> tuple[Any, Any]:
    """Section ``name``'s points, packed (:meth:`.key_load._KeyLoading._pack`'s form) where it is sparse, and
    its rows with a point (those whose scalar is not 0, ascending int32): packed, only those rows'
    points, when they are at most SUPPORT_MAX_FRACTION of the n rows, else the whole section (zero
    rows at infinity). The nonzero scalars are gathered on the device as they are uploaded (n x 32 B
    at most, transient), so the whole section is allocated only where it is kept whole, and the rows
    come without a pass over the points (a 2^27 section's took seconds)."""
    fb = _section_fixed_base(name, group, scalars, n)
    kept = cupy.empty((n, 4), dtype=np.uint64)
    parts, m = [], 0
    for lo, chunk, rows in _nonzero_chunks(scalars, n):
        k = int(rows.shape[0])
        kept[m : m + k] = chunk[rows]
        parts.append((rows + lo).astype(np.int32))
        m += k
    rows = cupy.concatenate(parts) if parts else cupy.zeros(0, dtype=np.int32)
    packed = m <= SUPPORT_MAX_FRACTION * n
    if packed:
        out = cupy.empty((m, point_words(name)), dtype=np.uint64)
    else:
        out = cupy.zeros((n, point_words(name)), dtype=np.uint64)  # rows at infinity between the points
    for lo in range(0, m, GEN_CHUNK_ROWS):
        hi = min(m, lo + GEN_CHUNK_ROWS)
        if packed:
            fb.run_device(kept[lo:hi], out[lo:hi])
        else:
            out[rows[lo:hi]] = fb.run_device(kept[lo:hi])
    s.synchronize()
    return out, rows

