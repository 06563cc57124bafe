"""cuzk-mp: a Groth16 (BLS12-381) proving engine that snarkjs agrees with.

Layers, each importing only from the ones below it (docs/architecture.md):
``algebra`` / ``formats`` <- ``circuits`` <- ``backends`` <- ``groth16`` <-
``pipeline`` <- ``daemon`` / ``cli``.

``__version__`` is the one version string: the distribution's metadata reads it from here
(pyproject.toml ``[tool.setuptools.dynamic]``), so a source checkout on ``PYTHONPATH`` and an
installed package report the same version.
"""

__version__ = "0.1.0"
