"""``python -m cuzk_mp``: the ``cuzk-mp`` command (:func:`cuzk_mp.cli.run`).

The engine starts its worker processes with multiprocessing's spawn method, which imports the
parent's main module again in every child (as ``__mp_main__``): the guard below keeps a child
from running the command line a second time.
"""

from .cli import run

if __name__ == "__main__":
    run()
