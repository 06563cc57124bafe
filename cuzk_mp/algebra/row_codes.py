"""The reserved codes of coded sparse rows: :data:`CODE_ONE` for +1, :data:`CODE_MINUS_ONE` for -1.

In a module of their own so that the rows (:mod:`.coded_sparse`, which needs no numba) and their
kernels (:mod:`.coded_sparse_kernels`) both read them without the one importing the other.
"""

CODE_ONE = 0
CODE_MINUS_ONE = 1
