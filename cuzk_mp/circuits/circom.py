"""Circom 2.x witness generation in-process, through wasmtime.

Owns: the compiled wasmtime ``Module`` of one circom ``--wasm`` witness generator (compiled
once per :class:`WitnessCalculator`), and one fresh wasm instance per witness (nothing leaks
from one witness to the next). No processes, files or GPU state beyond that.

What it reproduces, byte for byte: ``snarkjs wtns calculate`` (snarkjs 0.7.x), which runs
circom_runtime 0.1.28's ``WitnessCalculatorCircom2`` (js/witness_calculator.js):

1. ``init(0)`` (no sanity checks: snarkjs passes no options).
2. For each top-level key of the input object, in order: hash the name with FNV-1a 64
   (``fnvHash`` in circom_runtime js/utils.js, over UTF-16 code units), ask
   ``getInputSignalSize(hi32, lo32)`` how many values it takes, flatten the (nested) array of
   values, reduce each with ``BigInt(v) mod p`` into [0, p), write it as ``n32`` little-endian
   u32 words into the shared read/write memory and call ``setInputSignal(hi32, lo32, i)`` (those
   per-value calls, and step 3's, run inside wasm: :mod:`cuzk_mp.circuits.circom_loops`).
   Setting the last input runs the whole circuit; circom's ``assert``/``===`` failures surface
   there through the ``runtime.exceptionHandler`` import, after ``printErrorMessage`` has
   delivered "Error in template T line: L" lines.
3. Check that ``getInputSize()`` values were set, then ``getWitness(i)`` for every witness
   index, reading the value back from the shared memory (standard form, LE).

Differences from snarkjs, on purpose (the results for accepted inputs are identical):
- values for a name that is not an input signal are an error naming it (circom's wasm reports
  size 0 for it, so snarkjs says "Too many values for input signal X"); an empty array under such
  a name sets nothing and is accepted, as snarkjs does: it is how a zero-length input array
  (``signal input x[0]``, a template built with n = 0) is given, and the wasm cannot tell the two apart;
- a JSON number that a JavaScript double cannot hold exactly (e.g. 2^64 + 1 unquoted) is an
  error asking for a string, where snarkjs silently rounds it to the nearest double;
- input JSON is read within limits (:func:`parse_input_json`): arrays nested at most
  ``MAX_INPUT_DEPTH`` deep, values of at most ``MAX_VALUE_CHARS`` characters, at most
  ``MAX_INPUT_BYTES`` in all; beyond them, and for JSON that is not JSON (NaN, invalid UTF-8),
  the error is an InputError naming the input, never an exception from deep inside Python.

The same as snarkjs, though JSON alone would say otherwise: a key ``__proto__`` is dropped (with a
warning). snarkjs copies the parsed input key by key (ffjavascript's ``unstringifyBigInts``), and
assigning ``__proto__`` sets the copy's prototype, so that key never reaches the wasm: a stray one
is ignored, and a circuit with an input signal of that name is refused by both (here saying why).

Stopping a generator that runs too long (one that loops for ever, hostile or buggy): while wasm
runs, the calling thread is inside native code, where Python runs no signal handler, so SIGTERM
and SIGINT would wait for the wasm to return. So every run of the wasm (the start function and
header calls at load, a whole witness) happens on the calculator's wasm thread (a daemon thread,
kept between runs), and the calling thread waits for it in ticks of ``WAIT_TICK_S``; the signal
handlers run in the waiting thread as anywhere else in Python. When that wait ends with an
exception (the handler's: ``Terminated``, ``KeyboardInterrupt``, a worker's ``SystemExit``) or the
caller's ``abort`` says so (``Cancelled``), it advances the engine's epoch (wasmtime's epoch
interruption: each store's deadline is one epoch after its start), the wasm traps at its next loop
head or function entry, and the exception goes on. One run at a time per calculator, so that the
engine-wide epoch stops that run alone. What it costs (~10% of the wasm's own time on a circuit
whose field operations are many small calls, the epoch checks): see ``WAIT_TICK_S``. A wall-clock
limit is the caller's: an ``abort`` of its own, or (the engine) ``task_timeout``, which kills the
process.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import Future, wait
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import wasmtime

from cuzk_mp.algebra.field import FR_BYTES, FR_LIMBS, R_MOD
from cuzk_mp.circuits.circom_loops import CHUNK_VALUES, HELPER_WAT, WASM_PAGE, encode_values
from cuzk_mp.circuits.circom_values import MAX_VALUE_CHARS, PackedValues, pack_values
from cuzk_mp.circuits.circom_values import js_bigint as js_bigint  # (this module's API too)
from cuzk_mp.errors import Cancelled, FormatError, InputError, ResourceError
from cuzk_mp.formats import json_bounds
from cuzk_mp.formats.atomic import open_regular, read_at_most
from cuzk_mp.formats.wtns import write_wtns

log = logging.getLogger(__name__)

WASM_MAGIC = b"\0asm"
LogSink = Callable[[str], None] | None  # where the lines of a circuit's log() calls go
Abort = Callable[[], bool] | None  # asked every WAIT_TICK_S while the wasm runs: True stops it (Cancelled)
_T = TypeVar("_T")

# How often the thread waiting for the wasm looks at its signals and its abort(): a signal or
# an abort stops the wasm within about this; the wait itself costs nothing while the wasm runs.
# What stopping costs a witness that is never stopped (the two calculators interleaved, one
# 2-core machine, fastest of 60/1000/2000 runs): the SHA-256 test circuit (29854 wires, every
# field operation a call) 44.4 -> 49.2 ms, all of it the epoch checks wasmtime compiles
# into every function entry and loop (+10% of the wasm's own time; 0.25% of the 1.8 s one-shot
# CPU `groth16 fullprove` of that circuit); the MiMC chain (994 wires) 1.07 -> 1.12 ms; a 4-wire
# circuit 0.327 -> 0.351 ms, the hand-over to the wasm thread and back. Fuel, the other way
# wasmtime stops wasm, cost +28% on SHA-256.
WAIT_TICK_S = 0.05


def _log_line(line: str) -> None:
    log.info("circom log: %s", line)


def _trap_text(exc: wasmtime.Trap | wasmtime.WasmtimeError) -> str:
    """A trap (or another wasmtime error) in one line: what trapped and in which function (wasmtime's
    text adds a backtrace)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    what = next((ln.split("wasm trap:", 1)[1].strip() for ln in lines if "wasm trap:" in ln),
                lines[0] if lines else "unknown trap")
    names = [f.func_name for f in getattr(exc, "frames", None) or [] if f.func_name]
    if not names:
        return what
    caller = f" (called from {names[1]})" if len(names) > 1 and names[1] != names[0] else ""
    return f"{what} in {names[0]}{caller}"

# runtime.exceptionHandler codes, as circom 2.2's generated witness_calculator.js names them.
CIRCOM_EXCEPTIONS = {
    1: "Signal not found",
    2: "Too many signals set",
    3: "Signal already set",
    4: "Assert Failed",
    5: "Not enough memory",
    6: "Input signal array access exceeds the size",
    7: "Out of bounds array access",
}

_FNV_OFFSET = 0xCBF29CE484222325  # FNV-1a 64 offset basis
_FNV_PRIME = 0x100000001B3  # FNV-1a 64 prime
_MASK64 = (1 << 64) - 1

# Limits of input JSON (what any real circuit's input stays far below).
MAX_INPUT_DEPTH = 32  # the input object plus nested arrays (one per signal dimension)
MAX_INPUT_BYTES = 256 << 20
# The one name snarkjs never passes on to the wasm (see the module docstring).
DROPPED_NAME = "__proto__"



def fnv1a_64(name: str) -> int:
    """FNV-1a 64 of ``name`` over its UTF-16 code units, as circom_runtime's ``fnvHash``."""
    h = _FNV_OFFSET
    for unit in memoryview(name.encode("utf-16-le", "surrogatepass")).cast("H"):
        h = ((h ^ unit) * _FNV_PRIME) & _MASK64
    return h


def flatten_values(value: object, name: str) -> list[object]:
    """The values of one input signal in circom order (nested arrays flattened row-major)."""
    if isinstance(value, Mapping):
        raise InputError(
            f"signal {name}: a value must be a number, a string or an array, not an object "
            "(the input is one flat object of the main component's input signals)")
    if isinstance(value, (list, tuple, np.ndarray)):
        out: list[object] = []
        for item in value:
            out.extend(flatten_values(item, name))
        return out
    return [value]


def load_input_json(path: str | Path) -> dict[str, object]:
    """Read a snarkjs input file: one JSON object mapping input signal names to values.

    A regular file over ``MAX_INPUT_BYTES`` is refused by its size, unread; a pipe or a device
    (``<(gen)``, /dev/stdin, a FIFO) has no size, so its read stops one byte past the limit
    (:func:`~cuzk_mp.formats.atomic.read_at_most`): read to its end, a writer that goes on would
    fill the host's memory before the limit is checked."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_INPUT_BYTES:
                raise FormatError(path, None, f"{size} bytes of input JSON, more than the limit of "
                                  f"{MAX_INPUT_BYTES}")
            data = read_at_most(f, MAX_INPUT_BYTES)
    except OSError as exc:
        raise InputError(f"{path}: cannot read the input file: {exc.strerror}") from exc
    if len(data) > MAX_INPUT_BYTES:
        raise FormatError(path, None, f"more than the limit of {MAX_INPUT_BYTES} bytes of input JSON")
    return parse_input_json(data, str(path))


def parse_input_json(data: bytes | str, name: str = "input.json") -> dict[str, object]:
    """Parse snarkjs input JSON (bytes or text) within the limits of this module.

    The one parser of circom inputs (``wtns calculate``, synthesis workers, and the daemon when
    it accepts a job). Every refusal is an InputError (FormatError for what is not JSON) that
    names ``name``: malformed or non-UTF-8 text, NaN/Infinity, nesting deeper than
    ``MAX_INPUT_DEPTH``, a number or string value longer than ``MAX_VALUE_CHARS``, a number a
    JavaScript double cannot hold, a value that is null or an object, a top level that is not
    an object.

    A long array (``circom_values.PACK_MIN_BYTES`` of JSON or more) of values it can read without
    a refusal is given packed (:func:`~cuzk_mp.circuits.circom_values.pack_values`): a numpy array,
    or PackedValues, flat, never a list of Python values; :meth:`WitnessCalculator.calculate` sets
    them as it would the list.
    """
    parsed = json_bounds.loads(data, name, max_depth=MAX_INPUT_DEPTH, max_number_chars=MAX_VALUE_CHARS,
                               max_bytes=MAX_INPUT_BYTES, parse_number=json_bounds.js_number,
                               parse_member=pack_values)
    if not isinstance(parsed, dict):
        raise FormatError(name, None, "the input must be a JSON object {signal: value, ...}")
    if DROPPED_NAME in parsed:
        del parsed[DROPPED_NAME]
        log.warning("%s: the name %s is not read (snarkjs drops it from input JSON)", name, DROPPED_NAME)
    _check_values(parsed, name)
    return parsed


def _check_values(inputs: dict[str, object], name: str) -> None:
    """Every value is a number, a string of at most MAX_VALUE_CHARS, a bool, or an array of them
    (recursion is bounded: the parser already refused nesting deeper than MAX_INPUT_DEPTH)."""

    def check(signal: str, values: list[object]) -> None:
        for value in values:
            kind = type(value)
            if kind is int or kind is float or kind is bool or kind is np.ndarray or kind is PackedValues:
                continue  # (the packed values of a long array: read and checked as they were packed)
            if kind is list:
                check(signal, value)  # type: ignore[arg-type]
            elif kind is str:
                if len(value) > MAX_VALUE_CHARS:  # type: ignore[arg-type]
                    raise InputError(f"{name}: signal {signal}: a value of {len(value)} characters, "  # type: ignore[arg-type]
                                     f"more than the limit of {MAX_VALUE_CHARS}")
            else:
                what = "null" if value is None else "an object" if kind is dict else kind.__name__
                raise InputError(f"{name}: signal {signal}: a value must be a number, a string or an "
                                 f"array, not {what}")

    for signal, value in inputs.items():
        if not signal.isascii():
            try:
                signal.encode("utf-8")
            except UnicodeEncodeError:
                raise InputError(f"{name}: signal name {signal!r} is not valid Unicode (a lone "
                                 "surrogate escape)") from None
        check(signal, [value])


class _CircomException(Exception):
    """Raised inside the runtime.exceptionHandler import; becomes an InputError outside."""

    def __init__(self, code: int, messages: str) -> None:
        super().__init__(code, messages)
        self.code = code
        self.messages = messages


_EXPORTS = ("getVersion", "getFieldNumLen32", "getRawPrime", "getWitnessSize", "getInputSize",
            "getSharedRWMemoryStart", "getMessageChar", "init", "getInputSignalSize",
            "setInputSignal", "getWitness")


class _Instance:
    """One wasm instance of the witness generator, with the host imports it calls back.

    Raises KeyError naming a missing export, InputError for an import no runtime provides.
    """

    def __init__(self, engine: wasmtime.Engine, module: wasmtime.Module,
                 helper_module: wasmtime.Module, on_log: LogSink = None) -> None:
        self.store = wasmtime.Store(engine)
        self.store.set_epoch_deadline(1)  # the engine's next epoch, which comes only to stop this run
        self.errors = ""
        self.log_line = ""
        self.on_log = on_log or _log_line
        hosts = {
            "exceptionHandler": self._exception, "printErrorMessage": self._print_error,
            "writeBufferMessage": self._write_buffer, "showSharedRWMemory": self._show_shared,
        }
        imports: list[wasmtime.Func] = []
        for imp in module.imports:
            if imp.module != "runtime" or imp.name not in hosts:
                raise InputError(f"it imports {imp.module}.{imp.name}, which no circom 2.x "
                                 "runtime provides")
            imports.append(wasmtime.Func(self.store, imp.type, hosts[imp.name]))
        exports = wasmtime.Instance(self.store, module, imports).exports(self.store)
        self.fn = {name: exports[name] for name in _EXPORTS}
        self.memory: wasmtime.Memory = exports["memory"]
        self.shared = self.call("getSharedRWMemoryStart")
        helper = wasmtime.Instance(self.store, helper_module,
                                   [self.memory, self.fn["getWitness"], self.fn["setInputSignal"]])
        helper_exports = helper.exports(self.store)
        self.fn["dumpWitness"], self.fn["setInputs"] = helper_exports["dumpWitness"], helper_exports["setInputs"]
        self.values: wasmtime.Memory = helper_exports["values"]

    def call(self, name: str, *args: int) -> int:
        """Call one exported function of the generator (or the dump helper)."""
        return self.fn[name](self.store, *args)  # type: ignore[no-any-return]

    def close(self) -> None:
        """Let the instance's store go now (idempotent). The store holds the host functions, which hold
        this object: a cycle through wasmtime's native references that Python's collector cannot see,
        so without this every instance (its ~4 GiB memory reservation and the pages it touched) stays."""
        self.fn = {}
        self.memory = self.values = None  # type: ignore[assignment]
        self.store = None  # type: ignore[assignment]

    def read_shared(self, nbytes: int) -> bytes:
        """The first ``nbytes`` of the shared read/write memory (one field element)."""
        return bytes(self.memory.read(self.store, self.shared, self.shared + nbytes))

    def set_inputs(self, h: int, first: int, data: bytes, n8: int) -> None:
        """Set the values ``first``.. of the input signal whose name hashes to ``h``: ``data``, ``n8``
        little-endian bytes each, at most ``CHUNK_VALUES`` of them (``setInputs`` in ``HELPER_WAT``)."""
        self.values.write(self.store, data, 0)
        self.call("setInputs", h >> 32, h & 0xFFFFFFFF, first, len(data) // n8, self.shared, n8)

    def dump_witness(self, count: int, n8: int) -> bytes:
        """All ``count`` witness values, ``n8`` bytes each, in one read (``dumpWitness`` in ``HELPER_WAT``)."""
        nbytes = count * n8
        dst = self.memory.data_len(self.store)
        try:
            self.memory.grow(self.store, -(-nbytes // WASM_PAGE))
        except wasmtime.WasmtimeError as exc:
            raise ResourceError(f"cannot grow the wasm memory by {nbytes} bytes to read the "
                                f"witness out: {exc}") from exc
        self.call("dumpWitness", dst, count, self.shared, n8)
        return bytes(self.memory.read(self.store, dst, dst + nbytes))

    def _message(self) -> str:
        chars = []
        while (c := self.call("getMessageChar")) != 0:
            chars.append(chr(c))
        return "".join(chars)

    def _exception(self, code: int) -> None:
        raise _CircomException(code, self.errors)

    def _print_error(self) -> None:
        self.errors += self._message() + "\n"

    def _write_buffer(self) -> None:
        msg = self._message()
        if msg == "\n":  # circom's log() ends every call with a lone "\n"
            self.on_log(self.log_line)
            self.log_line = ""
        else:
            self.log_line += (" " if self.log_line else "") + msg

    def _show_shared(self) -> None:
        n8 = 4 * self.call("getFieldNumLen32")
        value = int.from_bytes(self.read_shared(n8), "little")
        self.log_line += (" " if self.log_line else "") + str(value)


def _run_wasm(runs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None]) -> None:
    """A calculator's wasm thread: each run in turn, its outcome in its future, until ``None``."""
    while (item := runs.get()) is not None:
        future, run = item
        try:
            future.set_result(run())
        except BaseException as exc:  # noqa: BLE001 - the waiting thread raises it
            future.set_exception(exc)
        del item, future, run  # not kept while idle: an exception's traceback holds the run's frames


class WitnessCalculator:
    """A circom 2.x witness generator (``X_js/X.wasm``) for BLS12-381's scalar field.

    The module is compiled once here; :meth:`calculate` runs a fresh instance per witness,
    so one calculator can serve many witnesses, one at a time (callers in other threads wait
    their turn: a run is stopped through the engine, which all of them share). Attributes after
    construction: ``witness_size`` (wires), ``n_inputs`` (input values), ``prime`` (= r).
    """

    def __init__(self, wasm_path: str | Path, *, regular_only: bool = False) -> None:
        """``regular_only``: the file must be a regular one (:func:`~cuzk_mp.formats.atomic.open_regular`),
        for a daemon's worker, whose configured wasm can become a FIFO or a device under it: opened to be
        read to its end, a FIFO that no process writes would hold the worker, and every job behind it, for
        ever. A one-shot command reads the wasm from a pipe too (``<(cat X.wasm)``)."""
        self.path = Path(wasm_path)
        config = wasmtime.Config()
        config.epoch_interruption = True  # how a run is stopped (the module docstring)
        self._engine = wasmtime.Engine(config)
        self._one_run = threading.Lock()  # an epoch stops every store of the engine: one run at a time
        self._runs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] | None = None
        try:
            # read once (a pipe, <(cat X.wasm), has no second read), the rest only after its magic: binary
            # only (wasmtime would also parse WAT text), and nothing more of a file that is no wasm (/dev/zero)
            with (os.fdopen(open_regular(self.path, str(self.path))[0], "rb") if regular_only
                  else open(self.path, "rb")) as f:
                magic = f.read(len(WASM_MAGIC))
                if magic != WASM_MAGIC:
                    raise FormatError(self.path, None, "not a wasm module (it does not start with \\0asm): give "
                                      "the circuit's X_js/X.wasm")
                wasm = magic + f.read()
            self._module = wasmtime.Module(self._engine, wasm)
        except FileNotFoundError as exc:
            raise InputError(f"{self.path}: no such circom wasm file") from exc
        except IsADirectoryError as exc:
            raise InputError(f"{self.path}: a directory, not a circom wasm file") from exc
        except OSError as exc:  # a loop of links, a name too long, no permission, an I/O error
            raise InputError(f"{self.path}: cannot read: {exc.strerror or exc}") from exc
        except wasmtime.WasmtimeError as exc:
            first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
            raise FormatError(self.path, None, f"not a valid wasm module: {first}") from exc
        self._helper_module = wasmtime.Module(self._engine, HELPER_WAT)
        self._interruptible(self._read_header, None)  # its start function and header calls are the file's code

    def _read_header(self) -> None:
        inst = self._instantiate()
        try:
            self._check_header(inst)
        except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:  # a trap, or an export of another signature
            raise self._not_a_generator(_trap_text(exc)) from None
        finally:
            inst.close()

    def _not_a_generator(self, why: str) -> FormatError:
        """The file's error where its wasm is not circom's witness generator: ``why`` (an export
        missing or of another signature, a trap at load)."""
        return FormatError(self.path, None, f"not a circom 2.x witness generator: {why}")

    def _interruptible(self, run: Callable[[], _T], abort: Abort) -> _T:
        """``run()`` (which runs the wasm) on this calculator's wasm thread, while this thread waits for
        it in ticks of ``WAIT_TICK_S``: a signal handler's exception raised in the wait, or ``abort()``
        turning true (Cancelled), stops the wasm (the engine's next epoch) and is raised here once the
        run has ended. Otherwise what ``run()`` returned or raised."""
        with self._one_run:
            if self._runs is None:  # one thread, kept: wasmtime sets up each new thread for wasm (~0.15 ms)
                self._runs = queue.SimpleQueue()
                threading.Thread(target=_run_wasm, args=(self._runs,), name="circom-wasm", daemon=True).start()
                weakref.finalize(self, self._runs.put, None)  # the thread ends with its calculator
            future: Future[_T] = Future()
            self._runs.put((future, run))
            try:
                while True:
                    try:
                        future.exception(WAIT_TICK_S)  # a signal's Python handler runs here, and raises through it
                        break
                    except TimeoutError:
                        if abort is not None and abort():
                            raise Cancelled(f"{self.path}: witness generation stopped before it finished "
                                            "(cancelled)") from None
            except BaseException:
                self._engine.increment_epoch()  # the wasm traps at its next loop head or call
                while wait([future], WAIT_TICK_S).not_done:  # a store made after that epoch traps at the next
                    self._engine.increment_epoch()
                raise
        try:
            return future.result()
        finally:
            del future  # the exception it raises has this frame in its traceback: no cycle through it

    def __reduce__(self) -> tuple[type[WitnessCalculator], tuple[str]]:
        return (WitnessCalculator, (str(self.path),))

    def _instantiate(self, on_log: LogSink = None) -> _Instance:
        try:
            return _Instance(self._engine, self._module, self._helper_module, on_log)
        except KeyError as exc:
            raise self._not_a_generator(f"no export {exc.args[0]!r}") from exc
        except (InputError, wasmtime.WasmtimeError, wasmtime.Trap) as exc:  # a start function that traps too
            raise self._not_a_generator(_trap_text(exc)) from exc

    def _check_header(self, inst: _Instance) -> None:
        version = inst.call("getVersion")
        if version != 2:
            raise FormatError(self.path, None, f"circom major version {version}; only circom "
                              "2.x witness generators are supported")
        self.n32: int = inst.call("getFieldNumLen32")
        inst.call("getRawPrime")
        self.prime = int.from_bytes(inst.read_shared(4 * self.n32), "little")
        if self.prime != R_MOD or 4 * self.n32 != FR_BYTES:
            raise InputError(
                f"{self.path}: compiled for the prime {self.prime:#x}, not BLS12-381's scalar "
                "field r; recompile the circuit with circom's `-p bls12381`")
        self.witness_size: int = inst.call("getWitnessSize")
        self.n_inputs: int = inst.call("getInputSize")

    def calculate(self, inputs: Mapping[str, object], on_log: LogSink = None, abort: Abort = None) -> np.ndarray:
        """The full witness for ``inputs`` ({signal name: value or nested array of values, or the
        packed values :func:`parse_input_json` gives for a long array}).

        Returns an (witness_size, 4) uint64 array of standard-form Fr elements, w[0] = 1.
        Raises InputError, naming the wasm file, for unknown signals, wrong value counts,
        values that are not integers, and circuit assertion failures (with circom's
        "Error in template T line: L" messages). ``on_log`` takes each line of the circuit's
        ``log()`` calls (the one-shot CLI prints them, as snarkjs does); by default they are INFO
        log lines.

        A generator that never ends is stopped (module docstring) by a signal, whose handler's
        exception (``Terminated``, ``KeyboardInterrupt``, ...) is raised here unchanged, so that the
        command or worker stops as it would anywhere else, or by ``abort()``, asked every
        ``WAIT_TICK_S``, turning true: a Cancelled naming the file (a job cancelled, a worker
        stopping: nobody's input was bad). A deadline is the caller's, as an ``abort``.
        """
        if not isinstance(inputs, Mapping):
            raise InputError(f"{self.path}: the input must be a mapping of signal names, "
                             f"not {type(inputs).__name__}")
        return self._interruptible(lambda: self._compute(inputs, on_log), abort)

    def _compute(self, inputs: Mapping[str, object], on_log: LogSink) -> np.ndarray:
        inst = self._instantiate(on_log)
        try:
            inst.call("init", 0)
            n_set = sum(self._set_signal(inst, str(name), value) for name, value in inputs.items())
            if n_set < self.n_inputs:
                raise InputError(f"not all inputs have been set: {n_set} of {self.n_inputs} "
                                 f"input values were given{self._dropped_hint(inst, inputs)}")
            raw = inst.dump_witness(self.witness_size, 4 * self.n32)
        except InputError as exc:
            raise InputError(f"{self.path}: {exc}") from None
        except _CircomException as exc:
            raise InputError(f"{self.path}: {self._circuit_error(exc)}") from None
        except wasmtime.Trap as exc:
            raise InputError(f"{self.path}: the witness generator trapped: {_trap_text(exc)}") from None
        except wasmtime.WasmtimeError as exc:  # an export called as circom's runtime calls it, of another signature
            raise self._not_a_generator(_trap_text(exc)) from None
        finally:
            inst.close()
        return np.frombuffer(raw, dtype="<u8").reshape(self.witness_size, FR_LIMBS).copy()

    @staticmethod
    def _dropped_hint(inst: _Instance, inputs: Mapping[str, object]) -> str:
        """Why an input went unset when it is the circuit's ``__proto__``, which JSON cannot give."""
        h = fnv1a_64(DROPPED_NAME)
        if DROPPED_NAME in inputs or inst.call("getInputSignalSize", h >> 32, h & 0xFFFFFFFF) <= 0:
            return ""
        return (f"; the circuit's input signal {DROPPED_NAME} cannot be given in input JSON (snarkjs "
                "drops that name as it reads the input, and so does cuzk-mp)")

    def _set_signal(self, inst: _Instance, name: str, value: object) -> int:
        """Set every value of one input signal; returns how many were set."""
        h = fnv1a_64(name)
        size = inst.call("getInputSignalSize", h >> 32, h & 0xFFFFFFFF)
        packed = value.limbs if isinstance(value, PackedValues) else None
        if packed is not None:
            values: Any = packed
        elif isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype != object:
            values = value  # (a long array of input JSON, packed: no list of it)
        else:
            values = flatten_values(value, name)
        if size <= 0:
            if len(values) == 0:  # a zero-length input array (or a name the circuit lacks) given no values
                return 0
            raise InputError(f"{name!r} is not an input signal of the circuit")
        if len(values) != size:
            problem = "not enough" if len(values) < size else "too many"
            raise InputError(f"{problem} values for input signal {name}: expected {size}, "
                             f"got {len(values)}")
        n8 = 4 * self.n32
        for first in range(0, size, CHUNK_VALUES):  # (HELPER_WAT: one call into the wasm a chunk)
            data, refused = encode_values(values, first, min(first + CHUNK_VALUES, size), name, size)
            if data:
                inst.set_inputs(h, first, data, n8)
            if refused is not None:
                raise refused
        return size

    @staticmethod
    def _circuit_error(exc: _CircomException) -> str:
        what = CIRCOM_EXCEPTIONS.get(exc.code, f"Unknown error (code {exc.code})")
        detail = "; ".join(line for line in exc.messages.splitlines() if line.strip())
        return "witness calculation failed: " + what + (f": {detail}" if detail else "")


def calculate_witness_file(wasm_path: str | Path, input_json_path: str | Path,
                           out_wtns_path: str | Path, on_log: LogSink = None) -> None:
    """``cuzk-mp wtns calculate CIRCUIT.wasm INPUT.json WITNESS.wtns`` (snarkjs's verb)."""
    inputs = load_input_json(input_json_path)  # a bad input fails before the wasm is compiled
    witness = WitnessCalculator(wasm_path).calculate(inputs, on_log)
    write_wtns(out_wtns_path, witness)
