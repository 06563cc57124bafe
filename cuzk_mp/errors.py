"""The one exception hierarchy of cuzk-mp.

``CuzkError`` is the root. ``InputError`` is the user's fault (a bad zkey, r1cs,
witness or request) and carries a message that names the file/section or the
field that is wrong. ``ProofError`` means a job failed but the process is fine.
``WorkerDied`` / ``GpuDead`` mean a process is gone and must be restarted by
its supervisor. Errors cross process and socket boundaries as data
(``kind`` + ``message``), never pickled: see :func:`error_kind` and
:func:`error_from_kind`.
"""

from __future__ import annotations

from .exit_codes import EXIT_HANGUP, EXIT_TERMINATED


class CuzkError(Exception):
    """Root of every error cuzk-mp raises on purpose."""


class InputError(CuzkError):
    """Bad user input: a malformed file, an unsatisfied witness, a bad request."""


class FormatError(InputError):
    """A binary or JSON file does not follow its format.

    The message names the file, the section and what is wrong.
    """

    def __init__(self, path: object, section: str | None, problem: str) -> None:
        where = f"{path}" + (f", section {section}" if section else "")
        super().__init__(f"{where}: {problem}")
        self.path = path
        self.section = section
        self.problem = problem


class OutputError(InputError):
    """An output file cannot be written (a folder in the way, no permission, a full disk).

    The message names the path as the user gave it and the reason."""

    def __init__(self, path: object, problem: str) -> None:
        super().__init__(f"{path}: cannot write it: {problem}")
        self.path = path
        self.problem = problem


class UnsatisfiedWitness(InputError):
    """The witness does not satisfy the circuit's constraints."""

    def __init__(self, constraint: int, message: str) -> None:
        super().__init__(message)
        self.constraint = constraint


class ConfigError(InputError):
    """A configuration file or value is invalid; the message names the key."""


class AuthError(InputError):
    """A request without the token the daemon requires, or beyond what its token may do."""


class ProofError(CuzkError):
    """A proof could not be produced (the job fails; the process carries on)."""


class VerificationFailed(ProofError):
    """A freshly made proof did not pass its own verification."""


class ResourceError(CuzkError):
    """Not enough memory (host, shm or device) for what was asked."""


class Unavailable(CuzkError):
    """The daemon cannot take the request now (it is starting or shutting down, or at its
    connection cap or a cap on unfinished jobs); the request may be sent again later or to another
    daemon (exit code 3)."""


class DeviceMemoryError(ResourceError):
    """A proving key and the partitions it needs in flight do not fit the GPU's free memory, even
    without precomputed multiples and with one partition in flight (the message names need, free
    and the largest domain that fits)."""


class WorkerDied(CuzkError):
    """A worker process exited unexpectedly; its supervisor restarts it."""


class GpuDead(WorkerDied):
    """A GPU process died or its device failed."""


class Cancelled(CuzkError):
    """The job was cancelled by a client."""


class Terminated(KeyboardInterrupt):
    """SIGTERM in a command other than the daemon (which drains on its own): raised in the main
    thread as SIGINT raises KeyboardInterrupt, so that the same cleanup runs (temporary files
    removed, an engine stopped); the command then exits 143."""

    exit_code = EXIT_TERMINATED
    what = "terminated (SIGTERM)"


class HungUp(Terminated):
    """SIGHUP in a command other than the daemon: the terminal or ssh session it ran in went away.
    Its default action would end the process on the spot, leaving a temporary output and an
    engine's ring in /dev/shm behind, so it stops as SIGTERM does; the command then exits 129
    (``nohup``, which ignores the signal, keeps a command running instead)."""

    exit_code = EXIT_HANGUP
    what = "hung up (SIGHUP)"


_KINDS: dict[str, type[CuzkError]] = {
    cls.__name__: cls
    for cls in (
        CuzkError, InputError, FormatError, OutputError, UnsatisfiedWitness, ConfigError, AuthError, ProofError,
        VerificationFailed, ResourceError, DeviceMemoryError, WorkerDied, GpuDead, Cancelled, Unavailable,
    )
}


def out_of_device_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is CuPy's out-of-memory error (a MemoryError subclass: GPU memory, not the host's)."""
    return isinstance(exc, MemoryError) and type(exc).__module__.split(".")[0] == "cupy"


def error_kind(exc: BaseException) -> str:
    """The wire name of an exception: its class name if ours (CuPy's out of memory: ``"ResourceError"``),
    else ``"InternalError"``."""
    if out_of_device_memory(exc):
        return "ResourceError"
    return type(exc).__name__ if type(exc).__name__ in _KINDS else "InternalError"


def is_input_kind(kind: str | None) -> bool:
    """Whether an error's wire name is an input error (the user's input, exit code 2)."""
    return bool(kind) and isinstance(error_from_kind(kind or "", ""), InputError)


def error_from_kind(kind: str, message: str) -> CuzkError:
    """Rebuild an exception from its wire form (``kind``, ``message``).

    Classes whose constructor takes structured arguments are rebuilt as their
    nearest plain base, with the message intact.
    """
    cls = _KINDS.get(kind, CuzkError)
    if cls in (FormatError, OutputError):
        cls = InputError
    if cls is UnsatisfiedWitness:
        exc: CuzkError = InputError(message)
        return exc
    return cls(message)
