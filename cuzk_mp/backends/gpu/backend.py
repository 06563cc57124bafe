"""GpuBackend: the Backend protocol on one CUDA device (the recipe lives in groth16/prover.py).

Device state it owns: the key's point sections (zkey sections 5..9, uploaded
straight from the key file's mapping, optionally with precomputed multiples,
wrapped in resident :class:`.msm.MsmG1` / :class:`.msm.MsmG2`), the NTT tables
(:class:`.ntt.GpuNtt`), two CUDA streams per calling thread, and each staged
partition's a, b, c, w buffers and scalar plan until :meth:`GpuBackend.release`.
Before a key's upload, its device-memory plan (:mod:`.plan`) sets how much of that
fits (which multiples: none that would take the resident keys' partitions in flight; after
the upload, the plan counts the tables really made), and the plans of every resident key
together (:mod:`.admission`, again whenever a key is closed) how many staged partitions of
any keys at once (:meth:`GpuBackend.stage` waits for a free place) and how many a worker
stages together (:attr:`GpuBackend.batch_limit`, which the prover keeps to), or a
DeviceMemoryError before any byte is uploaded.

Streams and waits. Every thread that calls the backend gets a ``main`` stream
(staging, H, the G1 MSMs) and a ``side`` stream (the G2 MSM), both non-blocking,
so one thread's staging overlaps another's compute and nothing waits for the
whole device. A small key's MSMs (domain up to 2^18) each take a stream of a
per-thread pool instead: their kernels are short chains of dependent additions
on few threads, so the five MSMs of a proof, and those of a batch, run side by
side rather than one after another; events order each after its inputs. :meth:`stage` copies a partition through pinned bounce buffers and
classifies the witness's scalars (0 / 1 / other, the only host wait of a
partition before its results); :meth:`stage_witness` copies w alone and makes a, b, c
from it on the device (:mod:`.witness_map`, the key keeping the circuit's coded rows
there). :meth:`h_values` and :meth:`msm` only enqueue:
G2 starts first on the side stream (after an event that marks the staged data
ready), the G1 MSMs and the H step follow on the main stream, and each
:meth:`msm` returns a Future that a finisher thread completes when that MSM's
result copy has landed (its host part, Horner over the window sums, runs there).

Timings: ``last_timings`` holds ms per stage of the last released partition from
CUDA events (h2d, ntt_h, msm_a, msm_b1, msm_b2, msm_c, msm_h, total = first event
to last, with G2 overlapping the rest); ``busy_seconds`` is the union of the partitions'
spans (two in flight overlap: counted once; the pipeline's GPU-busy fraction). :meth:`stats` says what the backend
holds on the host and the device.

Its parts, each a base of :class:`GpuBackend` over the state that :mod:`.backend_state` sets up
(the resident keys, the staged partitions, each thread's streams): :mod:`.key_load` (a key file
made resident: plan, upload, packing, multiples, MSM objects), :mod:`.key_generate` (a key made
from its sections' scalars), :mod:`.device_limits` (the in-flight and batch limits of the resident
keys together), :mod:`.staging` (a partition's copies and scalar plan) and :mod:`.proving` (the
witness map, the H step, the MSMs and a partition's release). This module keeps the primitives
(NTT, H, one-off MSMs and fixed-base runs), :meth:`GpuBackend.stats` and :meth:`GpuBackend.close`.
"""

from __future__ import annotations

from typing import Any

import cupy
import numpy as np
from py_arkworks_bls12381 import G1Point, G2Point

from ...errors import InputError
from . import fixed_base, key_generate, key_load, memory, proving, staging
from . import msm as gmsm
from .backend_state import GpuKey, GpuStaged

# with the modules of its parts, whose names the emulated backend's tests patch (tests/gpu_emu)
__all__ = ["GpuBackend", "GpuKey", "GpuStaged", "key_generate", "key_load", "proving", "staging"]


class GpuBackend(proving._Proving, staging._Staging, key_generate._KeyGeneration):
    """The Backend protocol on CUDA device ``device`` (see the module docstring)."""

    name = "gpu"
    h_early = True  # h_values and msm only enqueue: the H chain starts right after G2
    witness_on_device = True  # stage_witness: a, b, c made on the device from w

    def stats(self) -> dict[str, float]:
        """What the backend holds: ``busy_seconds``; ``device_key_bytes`` (resident points and
        their multiples); ``device_witness_map_bytes`` (the circuits' coded rows kept on the device
        for the witness map); ``host_key_resident_bytes`` (pages of the loaded keys' files this process
        still maps); ``host_key_released_bytes`` (section pages dropped after upload);
        ``host_pinned_bytes`` (staging buffers). Cheap (every proof reports it): the resident bytes
        are those :meth:`refresh_host_stats` last read."""
        keys = [k for k in self._keys if k.msms]
        return {
            "busy_seconds": float(self.busy_seconds),
            "device_key_bytes": float(sum(k.nbytes + k.multiples_bytes for k in keys)),
            "device_witness_map_bytes": float(sum(k.witness_map[1].nbytes for k in keys if k.witness_map)),
            "host_key_resident_bytes": float(self._host_key_rss),
            "host_key_released_bytes": float(sum(k.host_released for k in keys)),
            "host_pinned_bytes": float(self._pinned_bytes),
        }

    # ---- primitives
    def _upload(self, a: np.ndarray) -> Any:
        arr = np.ascontiguousarray(a, dtype=np.uint64)
        if arr.ndim != 2 or arr.shape[1] != 4:
            raise InputError(f"expected an (n, 4) uint64 Fr array, got {arr.dtype} {arr.shape}")
        memory.ensure_free(arr.nbytes, "an Fr vector")
        return cupy.asarray(arr)

    def ntt(self, values: np.ndarray, inverse: bool = False) -> np.ndarray:
        """Natural-order NTT (or the 1/n-scaled inverse) of a Montgomery Fr vector."""
        s = self.stream()
        with cupy.cuda.Device(self.device), s:
            d = self._upload(values)
            self.ntt_engine.ntt_in_place(d, inverse=inverse, stream=s)
            out = cupy.asnumpy(d, stream=s)
            s.synchronize()
            return out

    def coset_h(self, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
        """Standard-form H scalars: odd-coset values of A*B - C."""
        s = self.stream()
        with cupy.cuda.Device(self.device), s:
            da, db, dc = (self._upload(x) for x in (a, b, c))
            self.ntt_engine.coset_h_in_place(da, db, dc, stream=s)
            out = cupy.asnumpy(da, stream=s)
            s.synchronize()
            return out

    def msm_g1(self, points: np.ndarray, scalars: np.ndarray) -> G1Point:
        """G1 MSM over zkey-layout points."""
        with cupy.cuda.Device(self.device), self.stream():
            return gmsm.msm_g1(points, scalars)

    def msm_g2(self, points: np.ndarray, scalars: np.ndarray) -> G2Point:
        """G2 MSM over zkey-layout points."""
        with cupy.cuda.Device(self.device), self.stream():
            return gmsm.msm_g2(points, scalars)

    def fixed_base_g1(self, base: G1Point, scalars: np.ndarray) -> np.ndarray:
        """[s_i * base] in zkey layout (batch fixed-base kernels)."""
        with cupy.cuda.Device(self.device), self.stream():
            return fixed_base.fixed_base_g1(base, scalars)

    def fixed_base_g2(self, base: G2Point, scalars: np.ndarray) -> np.ndarray:
        """[s_i * base] in zkey layout (batch fixed-base kernels)."""
        with cupy.cuda.Device(self.device), self.stream():
            return fixed_base.fixed_base_g2(base, scalars)

    def close(self) -> None:
        """Stop the helper threads and return CuPy's idle pool blocks to the driver."""
        self._finisher.shutdown(wait=True)
        self._copier.shutdown(wait=True)
        with cupy.cuda.Device(self.device):
            cupy.get_default_memory_pool().free_all_blocks()

