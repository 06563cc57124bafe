"""Field and curve arithmetic for BLS12-381 on the CPU, and the shared data layouts.

Elements of Fr are rows of ``(n, 4) uint64`` arrays, elements of Fq rows of
``(n, 6) uint64`` arrays, little-endian 64-bit limbs. Montgomery form is the
working form; the GPU backend uses the very same layout.
"""
