"""Input handling of cuzk_mp.circuits.circom that needs no node tools: FNV-1a 64 signal
hashing, JavaScript ``BigInt`` value semantics, array flattening and the JSON input reader.

The node-backed checks of the same functions (against real ``BigInt`` and snarkjs) are in
test_circom_witness.py.
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from cuzk_mp.algebra.field import R_MOD
from cuzk_mp.circuits import circom_values
from cuzk_mp.circuits.circom import (
    DROPPED_NAME, MAX_INPUT_BYTES, MAX_INPUT_DEPTH, MAX_VALUE_CHARS, flatten_values, fnv1a_64,
    js_bigint, load_input_json, parse_input_json,
)
from cuzk_mp.circuits.circom_values import PackedValues
from cuzk_mp.errors import FormatError, InputError

from tests.helpers import circom_generator


@pytest.mark.parametrize(("text", "expected"), [
    # Published FNV-1a 64-bit test vectors (Fowler/Noll/Vo reference test suite).
    ("", 0xCBF29CE484222325),
    ("a", 0xAF63DC4C8601EC8C),
    ("foobar", 0x85944171F73967E8),
])
def test_fnv1a_64_reference_vectors(text: str, expected: int) -> None:
    assert fnv1a_64(text) == expected


def test_fnv1a_64_hashes_utf16_code_units() -> None:
    # JavaScript's str[i].charCodeAt(0) walks UTF-16 code units: U+1F600 is two surrogates.
    h = 0xCBF29CE484222325
    for unit in (0xD83D, 0xDE00):
        h = ((h ^ unit) * 0x100000001B3) % (1 << 64)
    assert fnv1a_64("\U0001F600") == h


@pytest.mark.parametrize(("value", "expected"), [
    (True, 1), (False, 0), (7, 7), (-5, -5), (np.uint64(2**63), 2**63), (3.0, 3),
    ("12", 12), ("-12", -12), ("+12", 12), ("  42\n", 42), ("", 0), ("   ", 0),
    ("0x1F", 31), ("0XfF", 255), ("0o17", 15), ("0b101", 5), ("007", 7),
    (str(2**300), 2**300),
])
def test_js_bigint_accepts_what_javascript_accepts(value: object, expected: int) -> None:
    assert js_bigint(value, "signal x") == expected


@pytest.mark.parametrize("value", [
    1.5, float("nan"), float("inf"), None, {"a": 1}, "1.0", "1e3", "-0x1", "0x", "1_000",
    "12abc", "--1", "+", "0xg",
])
def test_js_bigint_rejects_what_javascript_rejects(value: object) -> None:
    with pytest.raises(InputError, match="signal x"):
        js_bigint(value, "signal x")


def test_flatten_values_is_row_major() -> None:
    nested = [[1, [2, 3]], (4,), np.array([5, 6])]
    assert flatten_values(nested, "s") == [1, 2, 3, 4, 5, 6]
    assert flatten_values(9, "s") == [9]
    assert flatten_values([], "s") == []
    with pytest.raises(InputError, match="signal s.*object"):
        flatten_values([{"x": 1}], "s")


def test_load_input_json_reads_numbers_as_javascript_does(tmp_path: Path) -> None:
    path = tmp_path / "in.json"
    path.write_text('{"a": 3, "b": "0x10", "c": [1e3, 2.0, 9007199254740993.5], '
                    '"d": 18446744073709551616, "e": -4}')
    data = load_input_json(path)
    assert data["a"] == 3 and data["b"] == "0x10" and data["e"] == -4
    # 2^64 is an exact double, so it is accepted as is.
    assert data["d"] == 2**64
    # Non-integral literals stay doubles; 9007199254740993.5 rounds to 2^53 + 2 as in JS.
    assert [js_bigint(v, "c") for v in data["c"]] == [1000, 2, 2**53 + 2]


def test_load_input_json_rejects_integers_a_double_cannot_hold(tmp_path: Path) -> None:
    path = tmp_path / "in.json"
    path.write_text('{"a": 12345678901234567890123}')
    with pytest.raises(InputError, match=r'in\.json.*write it as a decimal string: "12345678901234567890123"'):
        load_input_json(path)
    path.write_text('{"a": 1e23}')  # the advice is the number the literal means, not the literal
    with pytest.raises(InputError, match=r'write it as a decimal string: "100000000000000000000000"'):
        load_input_json(path)


@pytest.mark.parametrize(("text", "problem"), [
    ("[1, 2]", "JSON object"), ("{", "not valid JSON"), ('{"a": NaN}', "NaN"),
])
def test_load_input_json_rejects_malformed_files(tmp_path: Path, text: str,
                                                 problem: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(InputError, match=problem) as info:
        load_input_json(path)
    assert "bad.json" in str(info.value)


def test_the_name_proto_is_dropped_as_snarkjs_drops_it(tmp_path: Path) -> None:
    """snarkjs copies the parsed input key by key (ffjavascript's unstringifyBigInts), and assigning
    ``__proto__`` sets the copy's prototype: the key never reaches the witness generator, whatever its
    value. So a stray ``__proto__`` is ignored, and an input signal of that name is never set."""
    path = tmp_path / "in.json"
    for value in ('"5"', "null", '{"a": 1}', "[1, [2]]"):
        path.write_text(f'{{"a": 3, "__proto__": {value}, "b": "4"}}')
        assert load_input_json(path) == {"a": 3, "b": "4"}


def test_the_readme_states_where_input_reading_differs_from_snarkjs() -> None:
    """The limits refuse input that snarkjs reads (a 2000-digit value, arrays nested 40 deep, a
    300 MiB file): a user who swaps snarkjs for cuzk-mp finds them, with their values, in the
    README's snarkjs section, next to the other deliberate differences of input reading."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme[readme.index("## Proving like snarkjs"):]
    section = " ".join(section[:section.index("\n## ", 1)].split())
    for fact in (f"at most {MAX_INPUT_BYTES >> 20} MiB", f"nested at most {MAX_INPUT_DEPTH - 1} deep",
                 f"at most {MAX_VALUE_CHARS} characters", "is not an input signal", DROPPED_NAME):
        assert fact in section, fact


def test_load_input_json_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="nope.json"):
        load_input_json(tmp_path / "nope.json")


def test_witness_calculator_rejects_a_non_wasm_file(tmp_path: Path) -> None:
    from cuzk_mp.circuits.circom import WitnessCalculator

    path = tmp_path / "fake.wasm"
    for text in (json.dumps({"not": "wasm"}).encode(), b"(module)", b"module.exports = async function"):
        path.write_bytes(text)  # WAT text too: wasmtime would compile it, circom never writes it
        with pytest.raises(FormatError, match=r"fake\.wasm.*not a wasm module \(it does not start with \\0asm\)"):
            WitnessCalculator(path)
    path.write_bytes(b"\0asm\x01\0\0\0\x01\xff")  # a wasm header, then a damaged section
    with pytest.raises(FormatError, match=r"fake\.wasm.*not a valid wasm module: [^\n]+$") as e:
        WitnessCalculator(path)
    assert "\n" not in str(e.value)
    with pytest.raises(InputError, match="a directory, not a circom wasm file"):
        WitnessCalculator(tmp_path)
    with pytest.raises(InputError, match="no such circom wasm"):
        WitnessCalculator(tmp_path / "missing.wasm")


@pytest.mark.parametrize(("part", "says"), [
    ({"version": "(unreachable)"}, "unreachable"),
    ({"start": "(unreachable)"}, "unreachable"),
    ({"witness_size": "(param i32) (result i32) (i32.const 1)"}, "too few parameters"),
])
def test_a_generator_that_traps_or_has_other_signatures_is_a_bad_file(tmp_path: Path, part: dict[str, str],
                                                                     says: str) -> None:
    """What its header calls (and its start function) run is the file's: a trap or an export of another
    signature is a FormatError naming the file, not an internal error."""
    from cuzk_mp.circuits.circom import WitnessCalculator

    path = circom_generator(tmp_path, "bad", **part)
    with pytest.raises(FormatError, match=rf"bad\.wasm.*not a circom 2\.x witness generator: .*{says}"):
        WitnessCalculator(path)


def test_each_witness_lets_its_instance_go(tmp_path: Path) -> None:
    """A calculator serves many witnesses (a synthesis worker keeps one): each one's wasm instance,
    with its memory, is let go when it is done, also when the generator fails it."""
    import gc

    from cuzk_mp.circuits.circom import WitnessCalculator

    calc = WitnessCalculator(circom_generator(tmp_path, "good"))
    for _ in range(5):
        assert calc.calculate({}).tolist() == [[1, 0, 0, 0]]
    bad = WitnessCalculator(circom_generator(tmp_path, "init", init=""))  # init takes no argument
    with pytest.raises(FormatError, match="too many parameters"):
        bad.calculate({})
    gc.collect()
    assert sum(type(o).__name__ == "_Instance" for o in gc.get_objects()) == 0


def _meaning(value: object) -> list[int] | str:
    """What the calculator writes for one signal's value (each BigInt mod r), or its refusal."""
    if isinstance(value, PackedValues):
        return [int.from_bytes(row.tobytes(), "little") for row in value.limbs]
    try:
        return [js_bigint(v, "v") % R_MOD for v in flatten_values(value, "v")]
    except InputError as exc:
        return f"refused: {exc}"


def _parsed(data: bytes) -> dict[str, object] | str:
    try:
        return {key: _meaning(value) for key, value in parse_input_json(data, "in.json").items()}
    except InputError as exc:
        return f"{type(exc).__name__}: {exc}"


FIELD = str(R_MOD + 5).encode()
# Long arrays read packed: every value form JavaScript's BigInt takes, nesting, values past int64.
PACKED = [
    b'{"a": ["1", "0x1f", " 12 \xe2\x80\xa8", "", "-5", "+7", "0o17", "0b101", "007", "' + FIELD + b'", "\xc2\xa09"]}',
    b'{"a": [1, -2, 2.0, 1e3, true, false, 9007199254740993.5, -0.0, 9007199254740992, -0]}',
    b'{"a": [[1, "2"], [], [[3], ["' + FIELD + b'"]]], "b": 5, "c": "0x10"}',
    b'{"a": ["9223372036854775807", -9223372036854775808]}',
]
# Arrays left to the JSON parser: each reads, or is refused, as it always was.
UNPACKED = [
    b'{"a": ["1", "x"]}', b'{"a": [1, null]}', b'{"a": [1, {"b": 2}]}', b'{"a": ["\\u0031", "2"]}',
    b'{"a": [1.5, 2]}', b'{"a": ["' + b"9" * 1001 + b'"]}', b'{"a": [' + b"9" * 1001 + b"]}",
    b'{"a": [12345678901234567890123]}', b'{"a": [1234567890123456]}', b'{"a": [1e400]}', b'{"a": [1, 2], "a": [3]}',
    b'{"a": [1e400], "a": [1]}', b'{"__proto__": [1, 2], "a": ["3"]}', b'{"a": ["12", "3,4", "5"]}',
    b'{"a": [[]]}', b'{"a": ["1", "\\ud800"]}', b'{"a": [NaN]}', b'{"a": [1, 2]',
]


@pytest.mark.parametrize("data", PACKED + UNPACKED)
def test_packed_arrays_mean_what_their_json_means(data: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long array is read packed (here every array, in pieces of a few bytes: cut only at commas
    outside strings); what it means (each value as the calculator writes it) and every refusal, with
    its message, are those of the array read as JSON."""
    monkeypatch.setattr(circom_values, "PACK_MIN_BYTES", 1 << 62)
    expected = _parsed(data)
    monkeypatch.setattr(circom_values, "PACK_MIN_BYTES", 0)
    monkeypatch.setattr(circom_values, "_PIECE_BYTES", 4)
    assert _parsed(data) == expected
    if data in PACKED:
        assert isinstance(parse_input_json(data)["a"], (np.ndarray, PackedValues))


def test_the_calculator_sets_packed_values_as_the_values_they_pack(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The witness of packed values (int64, or already reduced) is that of the same values as JSON."""
    from cuzk_mp.circuits.circom import WitnessCalculator

    for data in PACKED[:2]:
        monkeypatch.setattr(circom_values, "PACK_MIN_BYTES", 1 << 62)
        as_json = parse_input_json(data)["a"]
        monkeypatch.setattr(circom_values, "PACK_MIN_BYTES", 0)
        packed = parse_input_json(data)["a"]
        assert isinstance(packed, (np.ndarray, PackedValues)) and not isinstance(as_json, (np.ndarray, PackedValues))
        calc = WitnessCalculator(circom_generator(tmp_path, "echo", inputs=len(packed)))
        witness = calc.calculate({"a": packed})
        assert np.array_equal(witness, calc.calculate({"a": as_json}))
        assert [int.from_bytes(row.tobytes(), "little") for row in witness] == [1] + _meaning(as_json)
        with pytest.raises(InputError, match=f"not enough values for input signal a: expected {len(packed) + 1}"):
            WitnessCalculator(circom_generator(tmp_path, "more", inputs=len(packed) + 1)).calculate({"a": packed})


@pytest.mark.parametrize(("shape", "bound"), [("strings", 2.0), ("numbers", 2.5)])
def test_a_large_input_is_read_in_a_small_multiple_of_its_size(tmp_path: Path, shape: str, bound: float) -> None:
    """An input file of long arrays (up to MAX_INPUT_BYTES) is read packed: Python's allocations peak
    at its bytes plus ~0.45x (decimal strings of field elements) or ~0.95x (numbers below 2^32), not
    at the 3.7x / 5.7x of a tree of Python values (perf/results/input-json-memory-cpu.json)."""
    if shape == "strings":  # 16 MiB of decimal strings of field elements
        values = [R_MOD - 1 - 7919 * i for i in range(207_000)]
        text = ",".join(f'"{v}"' for v in values)
    else:  # 16 MiB of plain numbers
        values = [i * 2654435761 % (1 << 32) for i in range(1_600_000)]
        text = ",".join(map(str, values))
    path = tmp_path / "in.json"
    path.write_text('{"a": [' + text + "]}")
    del text
    tracemalloc.start()
    try:
        data = load_input_json(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    size = path.stat().st_size
    assert peak < bound * size, f"{peak / size:.2f}x the file's {size} bytes"
    packed = data["a"]
    if shape == "strings":
        assert isinstance(packed, PackedValues) and _meaning(packed) == values
    else:
        assert isinstance(packed, np.ndarray) and packed.dtype == np.int64 and packed.tolist() == values


def test_values_are_set_chunk_by_chunk_as_one_at_a_time(tmp_path: Path) -> None:
    """The values of a signal are set a chunk at a time inside wasm (circom_loops): more than two chunks
    of int64 extremes, uint64, reduced limbs and JSON values each read back as BigInt(v) mod r, in order;
    a refused value in a later chunk is refused by its index, after the values before it were set."""
    from cuzk_mp.circuits.circom import WitnessCalculator
    from cuzk_mp.circuits.circom_loops import CHUNK_VALUES

    n = 2 * CHUNK_VALUES + 7
    calc = WitnessCalculator(circom_generator(tmp_path, "echo", inputs=n))
    rng = np.random.default_rng(20261205)
    ints = rng.integers(-(1 << 63), (1 << 63) - 1, n, dtype=np.int64, endpoint=True)
    ints[:5] = [-(1 << 63), (1 << 63) - 1, -1, 0, -(1 << 32) - 1]
    big = [R_MOD - 1 - 7919 * i for i in range(n)]
    forms = [str(R_MOD + 5), "-1", " 0x1f ", True, 3.0, "", np.uint64(2**64 - 1)]
    cases: list[tuple[object, list[int]]] = [
        (ints, [int(v) % R_MOD for v in ints]),
        (ints.astype(np.int8), [int(v) % R_MOD for v in ints.astype(np.int8)]),
        (ints.view(np.uint64), [int(v) for v in ints.view(np.uint64)]),
        (PackedValues(circom_values._limbs(big)), big),
        (forms + [int(v) for v in ints[len(forms):]],
         [R_MOD + 5 - R_MOD, R_MOD - 1, 31, 1, 3, 0, 2**64 - 1] + [int(v) % R_MOD for v in ints[len(forms):]]),
    ]
    for value, expected in cases:
        witness = calc.calculate({"a": value})
        assert [int.from_bytes(row.tobytes(), "little") for row in witness] == [1] + expected
    bad: list[object] = [1] * n
    bad[CHUNK_VALUES + 3] = "1.5"
    with pytest.raises(InputError, match=rf"signal a value {CHUNK_VALUES + 3} \(flattened\): '1.5' is not an integer"):
        calc.calculate({"a": bad})
    trap = f"(if (i32.eq (local.get 2) (i32.const {CHUNK_VALUES + 2})) (then unreachable))"
    trap_at = circom_generator(tmp_path, "trap", inputs=n, set_input=trap)  # setInputSignal traps there
    with pytest.raises(InputError, match="trap.wasm: the witness generator trapped: .*unreachable"):
        WitnessCalculator(trap_at).calculate({"a": bad})  # the value before the refused one is set first
    with pytest.raises(InputError, match=f"too many values for input signal a: expected {n}, got {n + 1}"):
        calc.calculate({"a": np.zeros(n + 1, dtype=np.int64)})
