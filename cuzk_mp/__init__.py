"""cuzk-mp: a Groth16 (BLS12-381) proving engine that snarkjs agrees with.

Layers, each importing only from the ones below it (DESIGN.md section 3):
``algebra`` -> ``formats`` -> ``circuits`` -> ``groth16`` -> ``backends`` ->
``pipeline`` -> ``daemon`` / ``cli``.
"""

__version__ = "0.1.0"
