"""Circuits: where witnesses come from.

``circom``: circom 2.x ``.wasm`` witness generators run in-process through wasmtime,
byte-identical to ``snarkjs wtns calculate``. (The synthetic PoRep-shaped generator lives
beside it in ``synthetic``.)
"""

from cuzk_mp.circuits.circom import WitnessCalculator, calculate_witness_file

__all__ = ["WitnessCalculator", "calculate_witness_file"]
