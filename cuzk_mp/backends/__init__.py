"""Prover backends: the same interface on the CPU (numba + arkworks) and the GPU (CuPy)."""
