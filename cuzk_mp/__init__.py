"""cuzk-mp: a Groth16 (BLS12-381) proving engine that snarkjs agrees with.

Layers, each importing only from the ones below it (docs/architecture.md):
``algebra`` / ``formats`` <- ``circuits`` <- ``backends`` <- ``groth16`` <-
``pipeline`` <- ``daemon`` / ``cli``.
"""

__version__ = "0.1.0"
