"""cuzk-mp's circom witness generation against ``snarkjs wtns calculate`` (byte-identical
.wtns files), plus independent checks of what the test circuits compute (Python ints,
hashlib) and of the errors bad inputs give.

Needs the node tools (``make tools``); every test here is marked ``snarkjs``.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import random
import subprocess
from pathlib import Path

import numpy as np
import pytest

from cuzk_mp.circuits import circom_values
from cuzk_mp.circuits.circom import WitnessCalculator, calculate_witness_file, js_bigint, parse_input_json
from cuzk_mp.circuits.circom_values import PackedValues
from cuzk_mp.errors import InputError
from cuzk_mp.formats.wtns import wtns_bytes
from tests.oracle import (
    CIRCUITS, NODE_MODULES, R_MOD, TOOLS, Oracle, compile_circuit, cuzk, run_node, snarkjs,
    wtns_calculate, wtns_check, write_json,
)
from tests.oracle import oracle  # noqa: F401  (the session fixture, for pytest to find)

pytestmark = pytest.mark.snarkjs

SEED = 20261130
RANDOM_INPUTS = {"multiplier": 3, "mimc_chain": 3, "bits_compare": 3, "sha256_block": 1}


def _ints(w: np.ndarray) -> list[int]:
    return [int.from_bytes(row.astype("<u8").tobytes(), "little") for row in w]


def _snarkjs_wtns(oracle: Oracle, name: str, inputs: dict[str, object], tmp: Path) -> bytes:
    path = wtns_calculate(oracle.circuit(name).wasm, write_json(tmp / "in.json", inputs),
                          tmp / "snarkjs.wtns")
    return path.read_bytes()


@pytest.mark.parametrize("name", list(CIRCUITS))
def test_witness_is_byte_identical_to_snarkjs(oracle: Oracle, name: str,
                                              tmp_path: Path) -> None:
    files = oracle.circuit(name)
    calc = WitnessCalculator(files.wasm)  # one compiled module, a fresh instance per call
    rng = random.Random(f"{SEED}-{name}")
    print(f"seed {SEED}-{name}")
    for k in range(RANDOM_INPUTS[name]):
        inputs = CIRCUITS[name].sample_input(rng)
        expected = _snarkjs_wtns(oracle, name, inputs, tmp_path)
        ours = calc.calculate(inputs)
        assert wtns_bytes(ours) == expected, f"input {k}: {inputs}"
        assert ours.shape == (calc.witness_size, 4) and _ints(ours[:1]) == [1]
    assert wtns_check(files.r1cs, tmp_path / "snarkjs.wtns")


def test_witness_file_and_cli_match_snarkjs(oracle: Oracle, tmp_path: Path) -> None:
    files = oracle.circuit("mimc_chain")
    inputs = write_json(tmp_path / "in.json", CIRCUITS["mimc_chain"].sample_input(
        random.Random(SEED)))
    expected = wtns_calculate(files.wasm, inputs, tmp_path / "snarkjs.wtns").read_bytes()
    calculate_witness_file(files.wasm, inputs, tmp_path / "api.wtns")
    assert (tmp_path / "api.wtns").read_bytes() == expected
    proc = cuzk("wtns", "calculate", files.wasm, inputs, tmp_path / "cli.wtns", check=True)
    assert proc.returncode == 0
    assert (tmp_path / "cli.wtns").read_bytes() == expected


def test_multiplier_witness_is_the_product(oracle: Oracle) -> None:
    calc = WitnessCalculator(oracle.circuit("multiplier").wasm)
    a, b = R_MOD - 3, 2**200 + 12345
    assert _ints(calc.calculate({"a": a, "b": b})) == [1, a * b % R_MOD, a, b]


def test_sha256_public_outputs_equal_hashlib(oracle: Oracle) -> None:
    calc = WitnessCalculator(oracle.circuit("sha256_block").wasm)
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    for msg in (bytes(55), b"cuzk-mp".ljust(55, b"!"), bytes(rng.randrange(256) for _ in range(55))):
        hi, lo = _ints(calc.calculate({"msg": list(msg)})[1:3])
        assert ((hi << 128) | lo).to_bytes(32, "big") == hashlib.sha256(msg).digest()


def test_value_forms_match_snarkjs(oracle: Oracle, tmp_path: Path) -> None:
    """Decimal/hex/octal/binary strings, signs, spaces, booleans, numbers, values >= r; also read
    from JSON with every array packed, as a long one is (int64, or field elements reduced mod r)."""
    cases = [
        ("multiplier", {"a": "-1", "b": str(R_MOD + 5)}),
        ("mimc_chain", {"key": True, "seed": " 12 ", "salt": ["0x1f", "0XFF"]}),
        ("bits_compare", {"lower": "0b101", "upper": "0o7777", "pairs": [[6, "7"], ["0x8", 1e3],
                                                                           [4095, ""], [0, False]]}),
        ("mimc_chain", {"key": "1", "seed": "2", "salt": [str(R_MOD + 3), "-1"]}),
    ]
    for name, inputs in cases:
        expected = _snarkjs_wtns(oracle, name, inputs, tmp_path)
        calc = WitnessCalculator(oracle.circuit(name).wasm)
        assert wtns_bytes(calc.calculate(inputs)) == expected
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(circom_values, "PACK_MIN_BYTES", 0)
            packed = parse_input_json(json.dumps(inputs).encode())
        packed_keys = [k for k, v in packed.items() if isinstance(v, (np.ndarray, PackedValues))]
        assert packed_keys == [k for k, v in inputs.items() if isinstance(v, list)]  # every array, packed
        assert wtns_bytes(calc.calculate(packed)) == expected


def test_python_values_and_nesting(oracle: Oracle, tmp_path: Path) -> None:
    """The Python API also takes ints, numpy ints, tuples and arrays of any nesting."""
    name = "bits_compare"
    rows = [[1, 2], [3, 4], [5, 6], [7, 8]]
    expected = _snarkjs_wtns(oracle, name, {"lower": 2, "upper": 7, "pairs": rows}, tmp_path)
    calc = WitnessCalculator(oracle.circuit(name).wasm)
    for pairs in (np.array(rows, dtype=np.uint64), tuple(map(tuple, rows)), sum(rows, [])):
        w = calc.calculate({"lower": np.int64(2), "upper": 7, "pairs": pairs})
        assert wtns_bytes(w) == expected


def test_javascript_bigint_oracle() -> None:
    """js_bigint agrees with node's own BigInt(), value by value, on tricky strings."""
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    alphabet = "0123456789abfxob+- \t\n_.eE"
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(6))) for _ in range(400)]
    texts += ["0x", "0X1", "0b2", "+0x1", " -0 ", "\u00a012\u2028", "1n", "٣", str(2**260)]
    # Every JavaScript white-space/line-terminator, and three that Python strips but JS not.
    texts += [f"{c}7{c}" for c in "\t\n\v\f\r \xa0\u1680\u2028\u2029\u202f\u205f\u3000\ufeff"]
    texts += [f"{chr(c)}7" for c in range(0x2000, 0x200C)] + ["\x1c7", "\x857", "7\u0085"]
    script = ("const xs = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
              "console.log(JSON.stringify(xs.map(x => { try { return BigInt(x).toString(); }"
              " catch (e) { return null; } })));")
    proc = subprocess.run(["node", "-e", script], input=json.dumps(texts), capture_output=True,
                          text=True, check=True, cwd=TOOLS)
    for text, js in zip(texts, json.loads(proc.stdout), strict=True):
        try:
            ours = str(js_bigint(text, "t"))
        except InputError:
            ours = None
        assert ours == js, f"BigInt({text!r})"


@pytest.mark.parametrize(("name", "inputs", "problem", "snarkjs_rejects"), [
    ("multiplier", {"a": 1}, "not all inputs have been set: 1 of 2", True),
    ("multiplier", {"a": [1, 2], "b": 3}, "too many values for input signal a", True),
    ("bits_compare", {"lower": 1, "upper": 2, "pairs": [[1, 2]]},
     "not enough values for input signal pairs: expected 8, got 2", True),
    ("multiplier", {"a": 1, "b": 2, "zz": 1}, "'zz' is not an input signal", True),
    ("multiplier", {"a": 1.5, "b": 2}, "signal a: 1.5 is not an integer", True),
    ("multiplier", {"a": None, "b": 2}, "signal a: .*not null", True),
    ("multiplier", {"a": "12abc", "b": 2}, "signal a: '12abc' is not an integer", True),
    ("mimc_chain", {"key": 1, "seed": 2, "salt": [3, {"x": 4}]}, "signal salt: .*object", True),
    ("bits_compare", {"lower": 1, "upper": 2, "pairs": [[1, 2], [3, 4], [5, 6], [7, 2**32]]},
     "Assert Failed: Error in template Num2Bits_0 line: 38", True),
])
def test_bad_inputs_give_clear_errors(oracle: Oracle, tmp_path: Path, name: str,
                                      inputs: dict[str, object], problem: str,
                                      snarkjs_rejects: bool) -> None:
    wasm = oracle.circuit(name).wasm
    calc = WitnessCalculator(wasm)
    with pytest.raises(InputError, match=problem) as info:
        calc.calculate(inputs)
    assert str(wasm) in str(info.value)
    rejected = snarkjs("wtns", "calculate", wasm, write_json(tmp_path / "in.json", inputs),
                       tmp_path / "w.wtns", check=False).returncode != 0
    assert rejected == snarkjs_rejects
    # The calculator is still usable: every call runs in a fresh instance.
    assert calc.calculate(CIRCUITS[name].sample_input(random.Random(SEED))).shape[1] == 4


def test_an_empty_array_sets_nothing_as_in_snarkjs(oracle: Oracle, tmp_path: Path) -> None:
    """``X: []`` for a size-0 input (a zero-length ``signal input x[0]``, indistinguishable in the wasm
    from a name the circuit lacks) sets nothing: the witness is snarkjs's, byte for byte."""
    wasm = oracle.circuit("multiplier").wasm
    inputs = {"a": 3, "zz": [], "b": 5}
    ours = WitnessCalculator(wasm).calculate(inputs)
    assert np.array_equal(ours, WitnessCalculator(wasm).calculate({"a": 3, "b": 5}))
    snarkjs("wtns", "calculate", wasm, write_json(tmp_path / "in.json", inputs), tmp_path / "w.wtns")
    assert (tmp_path / "w.wtns").read_bytes() == wtns_bytes(ours)


def test_the_name_proto_is_ignored_as_in_snarkjs(oracle: Oracle, tmp_path: Path) -> None:
    """A ``__proto__`` key never reaches snarkjs's witness generator: a stray one is ignored (the
    witness is snarkjs's), and a circuit with an input signal of that name is refused by both, here
    with a message that says why."""
    wasm = oracle.circuit("multiplier").wasm
    path = write_json(tmp_path / "in.json", {"a": 3, "__proto__": "5", "b": 4})
    snarkjs("wtns", "calculate", wasm, path, tmp_path / "snarkjs.wtns")
    proc = cuzk("wtns", "calculate", wasm, path, tmp_path / "cuzk.wtns", check=True)
    assert (tmp_path / "cuzk.wtns").read_bytes() == (tmp_path / "snarkjs.wtns").read_bytes()
    assert "__proto__" in proc.stderr  # a warning names the key that was not read

    src = tmp_path / "proto.circom"
    src.write_text("pragma circom 2.0.0;\ntemplate P() { signal input __proto__; signal input b; "
                   "signal output c; c <== __proto__ * b; }\ncomponent main = P();\n")
    _, proto_wasm = compile_circuit(src, tmp_path / "proto")
    path = write_json(tmp_path / "proto.json", {"__proto__": 3, "b": 4})
    assert snarkjs("wtns", "calculate", proto_wasm, path, tmp_path / "p.wtns", check=False).returncode != 0
    proc = cuzk("wtns", "calculate", proto_wasm, path, tmp_path / "p.wtns")
    assert proc.returncode == 2, proc.stderr
    assert "not all inputs have been set: 1 of 2" in proc.stderr
    assert "input signal __proto__ cannot be given in input JSON" in proc.stderr


def test_rejects_a_circuit_compiled_for_another_prime(tmp_path: Path, oracle: Oracle) -> None:
    src = CIRCUITS["multiplier"].source
    out = tmp_path / "bn128"
    out.mkdir()
    run_node("circom2/cli.js", src, "--wasm", "-p", "bn128", "-l", NODE_MODULES, "-o", out)
    with pytest.raises(InputError, match="not BLS12-381.*-p bls12381"):
        WitnessCalculator(out / "multiplier_js" / "multiplier.wasm")


def test_calculator_pickles_by_path(oracle: Oracle) -> None:
    calc = WitnessCalculator(oracle.circuit("multiplier").wasm)
    clone = pickle.loads(pickle.dumps(calc))
    assert clone.path == calc.path and clone.witness_size == 4 and clone.n_inputs == 2
    assert _ints(clone.calculate({"a": 6, "b": 7}))[1] == 42



def test_long_input_arrays_match_snarkjs(oracle: Oracle, tmp_path: Path) -> None:
    """An input array longer than one chunk of the values set inside wasm (circom_loops), read from
    JSON packed (decimal strings of values up to 2r: reduced limbs; numbers, negative ones too: int64)
    and given as a list of Python values: the witness is snarkjs's, byte for byte."""
    from cuzk_mp.circuits.circom_loops import CHUNK_VALUES

    n = CHUNK_VALUES + 232
    src = tmp_path / "wide.circom"
    src.write_text("pragma circom 2.0.0;\ntemplate Wide(N) { signal input a[N]; signal input b; "
                   "signal output s[N]; for (var i = 0; i < N; i++) { s[i] <== a[i] * b; } }\n"
                   f"component main = Wide({n});\n")
    _, wasm = compile_circuit(src, tmp_path / "wide")
    calc = WitnessCalculator(wasm)
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    strings = [str(rng.randrange(2 * R_MOD)) for _ in range(n)]
    numbers = [rng.randrange(-(2**53) + 1, 2**53) for _ in range(n)]  # exact doubles, as snarkjs reads them
    for values, kind in ((strings, PackedValues), (numbers, np.ndarray)):
        path = write_json(tmp_path / "in.json", {"a": values, "b": "7"})
        expected = wtns_calculate(wasm, path, tmp_path / "snarkjs.wtns").read_bytes()
        packed = parse_input_json(path.read_bytes())
        assert isinstance(packed["a"], kind)
        assert wtns_bytes(calc.calculate(packed)) == expected
        assert wtns_bytes(calc.calculate({"a": values, "b": 7})) == expected
