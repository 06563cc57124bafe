"""Hostile JSON: every document Python would refuse with an exception of its own (deep nesting,
5000-digit numbers, NaN, invalid UTF-8, huge sizes) is a typed InputError/FormatError naming the
document and what is wrong, from the library, from ``groth16 verify`` and ``wtns calculate``
(exit 2 with a message, never a traceback). Legitimate documents near the limits still pass."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from cuzk_mp.circuits import circom
from cuzk_mp.circuits.circom import js_bigint, load_input_json, parse_input_json
from cuzk_mp.errors import FormatError, InputError
from cuzk_mp.formats import json_bounds
from cuzk_mp.formats.snarkjs_json import proof_from_json, public_from_json, read_json, vk_from_json
from tests.helpers import ENV, PY, REPO

DATA = REPO / "tests" / "data_formats"
DEEP = b"[" * 100_000 + b"]" * 100_000

# (name, input JSON, what the message must say)
HOSTILE_INPUTS = [
    ("5000-digit integer", b'{"a": ' + b"9" * 5000 + b"}", "number of 5000 characters"),
    ("5000-digit string", b'{"a": "' + b"9" * 5000 + b'"}', "5000 characters"),
    ("5000-digit hex string", b'{"a": ["0x' + b"f" * 5000 + b'"]}', "characters"),
    ("nesting 100,000 deep", b'{"a": ' + DEEP + b"}", "nested 100001 deep"),
    ("top level nested 100,000 deep", DEEP, "nested 100000 deep"),
    ("objects nested deep", b'{"a": ' + b'{"b": ' * 50_000 + b"1" + b"}" * 50_001, "nested 50001 deep"),
    ("invalid UTF-8", b'{"a": "\xff\xfe"}', "not UTF-8"),
    ("overlong UTF-8", b'{"a": "\xc0\xaf"}', "not UTF-8"),
    ("NaN", b'{"a": NaN}', "NaN"),
    ("Infinity", b'{"a": [Infinity]}', "Infinity"),
    ("-Infinity", b'{"a": -Infinity}', "Infinity"),
    ("1e400", b'{"a": 1e400}', "range of a JavaScript number"),
    ("-1e99999", b'{"a": -1e99999}', "range of a JavaScript number"),
    ("2^70 unquoted", b'{"a": 1180591620717411303425}', "write it as a decimal string"),
    ("null value", b'{"a": null}', "not null"),
    ("object value", b'{"a": {"b": 1}}', "not an object"),
    ("object inside an array", b'{"a": [1, [2, {"c": 3}]]}', "not an object"),
    ("array at top level", b"[1, 2]", "JSON object"),
    ("string at top level", b'"hello"', "JSON object"),
    ("empty document", b"", "not valid JSON"),
    ("truncated", b'{"a": [1, 2', "not valid JSON"),
    ("unterminated string", b'{"a": "' + b"1" * 100_000, "not valid JSON"),
    ("trailing garbage", b'{"a": 1} x', "not valid JSON"),
    ("UTF-8 BOM", b'\xef\xbb\xbf{"a": 1}', "not valid JSON"),
    ("control character in a string", b'{"a": "1\x00"}', "not valid JSON"),
]


@pytest.mark.parametrize(("data", "problem"), [c[1:] for c in HOSTILE_INPUTS],
                         ids=[c[0] for c in HOSTILE_INPUTS])
def test_parse_input_json_refuses_with_a_typed_error(data: bytes, problem: str) -> None:
    with pytest.raises(InputError, match=problem) as info:
        parse_input_json(data, "job-7 input")
    assert str(info.value).startswith("job-7 input")


def test_parse_input_json_keeps_what_is_legitimate_near_the_limits() -> None:
    nested = b'{"a": ' + b"[" * (circom.MAX_INPUT_DEPTH - 1) + b"1" + b"]" * (circom.MAX_INPUT_DEPTH - 1) + b"}"
    assert parse_input_json(nested)["a"] is not None
    long_value = "7" * circom.MAX_VALUE_CHARS
    data = parse_input_json(json.dumps({"a": long_value, "b": [True, 2.0, "0x10", -3]}).encode())
    assert js_bigint(data["a"], "a") == int(long_value)
    # brackets inside strings are not nesting
    assert parse_input_json(b'{"a": "' + b"[" * 500 + b'"}')["a"] == "[" * 500
    assert parse_input_json(b'{"a": "\\"[[[[\\\\"}')["a"] == '"[[[[\\'
    too_deep = b'{"a": ' + b"[" * circom.MAX_INPUT_DEPTH + b"1" + b"]" * circom.MAX_INPUT_DEPTH + b"}"
    with pytest.raises(FormatError, match="nested 33 deep"):
        parse_input_json(too_deep)


def test_js_bigint_refuses_an_overlong_string_from_any_caller() -> None:
    with pytest.raises(InputError, match="signal x: a value of 5000 characters"):
        js_bigint("9" * 5000, "signal x")


def test_load_input_json_refuses_an_oversized_file_before_reading(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "in.json"
    path.write_bytes(b'{"a": [' + b"1," * 600 + b"1]}")
    monkeypatch.setattr(circom, "MAX_INPUT_BYTES", 1000)
    with pytest.raises(FormatError, match=r"in\.json.*more than the limit of 1000"):
        load_input_json(path)


def test_bounded_loads_names_limits() -> None:
    assert json_bounds.max_nesting('{"a": [[1], {"b": "]]]]"}]}') == 3
    assert json_bounds.max_nesting("") == 0
    with pytest.raises(FormatError, match="doc: 11 bytes of JSON, more than the limit of 10"):
        json_bounds.loads(b'{"a": 1234}', "doc", max_bytes=10)
    # the depth scan is linear and works in chunks: a document deeper than one chunk
    deep = "[" * (json_bounds._DEPTH_CHUNK + 5) + "]" * (json_bounds._DEPTH_CHUNK + 5)
    assert json_bounds.max_nesting(deep) == json_bounds._DEPTH_CHUNK + 5


def _proof_json() -> dict:
    return json.loads((DATA / "proof.json").read_text())


@pytest.mark.parametrize(("name", "text", "problem"), [
    ("public.json", "[" + "1" * 5000 + "]", "number of 5000 characters"),
    ("public.json", '["' + "1" * 5000 + '"]', "decimal string of 5000 digits"),
    ("public.json", "[NaN]", "NaN"),
    ("proof.json", DEEP.decode(), "nested 100000 deep"),
    ("proof.json", '{"pi_a": ' + "[" * 20 + "]" * 20 + "}", "nested 21 deep"),
    ("verification_key.json", '{"nPublic": ' + "9" * 300 + "}", "number of 300 characters"),
    ("proof.json", "\udcff", "not UTF-8"),
])
def test_snarkjs_json_readers_refuse_hostile_values(tmp_path: Path, name: str, text: str, problem: str) -> None:
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    reader = {"public.json": public_from_json, "proof.json": proof_from_json,
              "verification_key.json": vk_from_json}[name]
    with pytest.raises(FormatError, match=problem) as info:
        reader(read_json(path), name=str(path))
    assert str(path) in str(info.value)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PY, *args], check=False, env=ENV, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("which", "content", "problem"), [
    ("public", "[" + "1" * 5000 + "]", "number of 5000 characters"),
    ("public", '["' + "1" * 5000 + '"]', "decimal string of 5000 digits"),
    ("proof", DEEP.decode(), "nested 100000 deep"),
    ("proof", "", "not valid JSON"),
    ("vk", '{"nPublic": NaN}', "NaN"),
])
def test_groth16_verify_cli_ends_in_a_message_naming_the_file(tmp_path: Path, which: str, content: str,
                                                             problem: str) -> None:
    files = {k: tmp_path / f"{k}.json" for k in ("vk", "public", "proof")}
    shutil.copy(DATA / "verification_key.json", files["vk"])
    shutil.copy(DATA / "public.json", files["public"])
    files["proof"].write_text(json.dumps(_proof_json()))
    assert _cli("groth16", "verify", *map(str, files.values())).stdout.strip() == "OK!"
    files[which].write_text(content)
    proc = _cli("groth16", "verify", *map(str, files.values()))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "OK!" not in proc.stdout
    assert str(files[which]) in proc.stderr and problem in proc.stderr


@pytest.mark.parametrize(("data", "problem"), [
    (b'{"a": ' + b"9" * 5000 + b"}", "number of 5000 characters"),
    (b'{"a": ' + DEEP + b"}", "nested 100001 deep"),
    (b'{"a": "\xff"}', "not UTF-8"),
])
def test_wtns_calculate_cli_refuses_hostile_input_json(tmp_path: Path, data: bytes, problem: str) -> None:
    (tmp_path / "in.json").write_bytes(data)
    proc = _cli("wtns", "calculate", str(tmp_path / "c.wasm"), str(tmp_path / "in.json"), str(tmp_path / "w.wtns"))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and problem in proc.stderr and "in.json" in proc.stderr
    assert not (tmp_path / "w.wtns").exists()
