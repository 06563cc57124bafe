"""Circuits: where witnesses come from.

``circom``: circom 2.x ``.wasm`` witness generators run in-process through wasmtime,
byte-identical to ``snarkjs wtns calculate``. ``synthetic_kinds``: the synthetic benchmark
circuits by name (``porep-like`` in ``synthetic``, ``dense-random`` in ``synthetic_dense``).

Nothing is imported here, so that naming a synthetic kind does not load wasmtime.
"""
