"""The GPU backend: CUDA kernels run through CuPy, from the shipped binaries or NVRTC.

The kernels load from the precompiled binaries shipped in ``kernels/bin`` (nvcc 13's
fatbins, or NVRTC 12.9's cubins on a driver older than CUDA 13: :mod:`.bin_sets`) where
one fits the device and the current sources; NVRTC compiles them at run time only
where none does (and for kernel files outside the package).

This package is where cuzk-mp uses ``cupy``, and only in the modules that launch
kernels (``modules``, ``ntt``, ``msm``, ``backend``...); the one other import is
the probe in :func:`cuzk_mp.backends.gpu_available`. Importing the package itself,
or :mod:`.source`, does not touch CUDA, so a CPU-only process (or a forked child)
can read the kernel sources safely.

Layout: ``kernels/`` holds the CUDA sources (package data: common/ ff/ ntt/ h/
ec/ msm/ fixed_base/ witness/) and the shipped binaries (``bin/``), :mod:`.source`
assembles a translation unit, :mod:`.modules` loads its shipped binary (or
compiles it with NVRTC) and caches the module, :mod:`.ntt` runs NTTs and the H step,
:mod:`.msm` / :mod:`.fixed_base` the curve work, :mod:`.memory` checks device
memory, and :class:`.backend.GpuBackend` implements
:class:`cuzk_mp.backends.base.Backend` (its parts: :mod:`.backend_state`, :mod:`.device_limits`,
:mod:`.key_load`, :mod:`.key_generate`, :mod:`.staging`, :mod:`.proving`).
"""

import os

# Hardware work queues of the CUDA context (read when it is created, so before any kernel module
# loads): with the default 8, the ~10 streams of a prover thread (main, side, the small MSMs' pool)
# share queues, and two streams on one queue run one after the other: in a lone 2^12 proof traced on
# the H200 the C MSM started only when the G2 MSM it did not depend on had ended. 32 is the most
# CUDA allows; an operator's own setting wins. Measured in the daemon on an H100 (2^16 jobs): finalize
# 4.5 ms against 7.7 with 8; the context's creation ~0.4 s longer, once a process
# (perf/results/lasting-connections-h100-2026-12-07.json). A one-shot process makes its context with the
# driver's default instead (:func:`.early_context.start_primary_context`): there the context's creation
# is on every command's critical path (0.584 s a warm 2^16 one-shot with 8, 0.871 with 32).
CONNECTIONS_ENV = "CUDA_DEVICE_MAX_CONNECTIONS"
CONNECTIONS_SET_BY_CALLER = CONNECTIONS_ENV in os.environ
os.environ.setdefault(CONNECTIONS_ENV, "32")
