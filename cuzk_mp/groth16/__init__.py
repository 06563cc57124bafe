"""Groth16 exactly as snarkjs does it: witness map, prover recipe, verifier, dev setup."""
