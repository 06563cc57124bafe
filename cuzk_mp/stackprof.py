"""Where a process's threads spend their time: a sampling profiler of every Python thread.

A prover process is many threads in one interpreter (workers, staging copiers, finishers,
the finalizer): when it cannot keep a fast GPU fed, the question is which thread holds the
GIL doing what, and which ones wait. ``cProfile`` sees one thread and slows it; this samples
``sys._current_frames()`` of all threads every ``interval_s`` from a thread of its own and counts
each thread's stack (function names and files, first lines, not line numbers, so one function is
one entry). A stack whose innermost frame is a wait (a lock, a queue, an event, a CUDA
synchronisation) shows a thread that was blocked then; any other shows one that ran Python or a
call that releases the GIL.

Enabled by ``CUZK_MP_STACK_PROFILE=DIR`` for the pipeline's child processes (and the engine's
own process when the bench or the daemon runs with it, and a one-shot command of the CLI such as
``groth16 prove``): each writes ``DIR/<name>-<pid>.txt`` when
it exits, the stacks in the collapsed form flame-graph tools read (``thread;outer;...;inner count``)
after a summary of each thread's most frequent innermost frames. Sampling costs the sampled
process the GIL for ~50 us per sample: at the default 5 ms, about 1%.

For diagnosis runs only: while it walks a stack (microseconds) the sampler holds that thread's
frames, and a frame keeps its function's locals alive, so in that window a buffer they still
export cannot be released (a memory map closed right after its last view was dropped stays
mapped until the frame goes). Frames are never held between samples.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
from pathlib import Path

ENV = "CUZK_MP_STACK_PROFILE"
INTERVAL_S = 0.005
MAX_DEPTH = 48
TOP = 12  # innermost frames listed per thread in the summary


def _frame_name(code: object) -> str:
    return f"{getattr(code, 'co_qualname', getattr(code, 'co_name', '?'))} " \
           f"({os.path.basename(getattr(code, 'co_filename', '?'))}:{getattr(code, 'co_firstlineno', 0)})"


class StackSampler(threading.Thread):
    """Samples every other thread's stack until :meth:`stop`; :meth:`write` saves the counts."""

    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        super().__init__(name="cuzk-stack-sampler", daemon=True)
        self.interval_s = interval_s
        self.counts: collections.Counter[tuple[str, tuple[str, ...]]] = collections.Counter()
        self.samples = 0
        self._halt = threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        me = threading.get_ident()
        while not self._halt.wait(self.interval_s):
            names = {t.ident: t.name for t in threading.enumerate()}
            frames = sys._current_frames()
            f = None
            for tid in list(frames):
                if tid == me:
                    continue
                stack: list[str] = []
                f = frames.pop(tid)
                while f is not None and len(stack) < MAX_DEPTH:
                    stack.append(_frame_name(f.f_code))
                    f = f.f_back
                self.counts[(names.get(tid, str(tid)), tuple(reversed(stack)))] += 1
            frames.clear()  # hold no frame between samples: a frame keeps its function's locals alive
            del frames, f
            self.samples += 1

    def stop(self) -> None:
        """Stop sampling (returns once the sampler thread has ended)."""
        self._halt.set()
        if self.is_alive():
            self.join(timeout=1.0)

    def report(self) -> str:
        """The summary (per thread: samples, most frequent innermost frames) then the collapsed stacks."""
        by_thread: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        for (thread, stack), n in self.counts.items():
            by_thread[thread][stack[-1] if stack else "?"] += n
        lines = [f"# {self.samples} samples every {self.interval_s * 1e3:g} ms over "
                 f"{time.monotonic() - self.t0:.1f} s; per thread: samples, then its innermost frames"]
        for thread, leaves in sorted(by_thread.items(), key=lambda kv: -sum(kv[1].values())):
            total = sum(leaves.values())
            lines.append(f"# {thread}: {total}")
            lines += [f"#   {100.0 * n / total:5.1f}% {leaf}" for leaf, n in leaves.most_common(TOP)]
        lines += [f"{thread};{';'.join(stack)} {n}" for (thread, stack), n in self.counts.most_common()]
        return "\n".join(lines) + "\n"

    def write(self, folder: str | os.PathLike[str], name: str) -> Path:
        """Write :meth:`report` to ``folder/<name>-<pid>.txt``."""
        path = Path(folder) / f"{name}-{os.getpid()}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.report())
        return path


def start_from_env() -> StackSampler | None:
    """A running sampler when ``CUZK_MP_STACK_PROFILE`` names a folder, else None."""
    if not os.environ.get(ENV):
        return None
    sampler = StackSampler()
    sampler.start()
    return sampler


def finish(sampler: StackSampler | None, name: str) -> None:
    """Stop ``sampler`` (if any) and write its report into the folder ``CUZK_MP_STACK_PROFILE`` names."""
    if sampler is None:
        return
    sampler.stop()
    sampler.write(os.environ[ENV], name)
