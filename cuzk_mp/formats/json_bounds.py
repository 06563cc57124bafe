"""Bounded JSON reading: the one way cuzk-mp parses JSON it did not write.

Python's :func:`json.loads` refuses some documents with exceptions that are not about the format
(``RecursionError`` for deep nesting, ``ValueError`` for an integer of more than 4300 digits) and
accepts ``NaN`` and ``Infinity``, which are not JSON. :func:`loads` reads a document with explicit
limits instead and turns every refusal into a :class:`~cuzk_mp.errors.FormatError` that names the
document and what is wrong:

* UTF-8 text only;
* nesting (arrays and objects) at most ``max_depth`` deep, measured *before* parsing, so a
  100,000-deep document costs one linear scan and no recursion;
* every number literal at most ``max_number_chars`` characters (a 5000-digit integer is refused
  before any conversion); ``NaN``, ``Infinity`` and ``-Infinity`` are refused;
* at most ``max_bytes`` of input.

Numbers are converted by ``parse_number`` (the literal text in, a value out), so a caller can give
them its own meaning (circom inputs read numbers as JavaScript does). Strings are not limited
here: they cost no more than their bytes, and each format checks its own values.

The limits are checked on the bytes themselves (:func:`check`), never beside a decoded copy, and a
caller may read the members of an object document its own way (``parse_member``: circom inputs pack
long arrays): a large document then costs its bytes and what the caller keeps, not a tree of Python
values.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

import msgspec
import numpy as np

from ..errors import FormatError, InputError
from .binfile import file_kind

DEFAULT_MAX_DEPTH = 64
DEFAULT_MAX_NUMBER_CHARS = 400  # a JavaScript double needs at most ~330 characters
DEFAULT_MAX_BYTES = 1 << 30

# Everything but the brackets outside strings, in one match per run between two brackets: a JSON
# string token (possessive quantifiers keep an unterminated one linear), a run of other characters, or
# a quote that starts no string (malformed text). One match per run, not per token: a document of
# millions of values leaves a few brackets and no list of pieces behind.
_SKIP_PATTERN = r'(?:"(?:[^"\\]++|\\.)*+"|[^\[\]{}"]++|")++'
_SKIP = re.compile(_SKIP_PATTERN, re.DOTALL)
_SKIP_BYTES = re.compile(_SKIP_PATTERN.encode(), re.DOTALL)
_OPENERS = np.zeros(256, dtype=np.int8)
_OPENERS[[ord("["), ord("{")]] = 1
_OPENERS[[ord("]"), ord("}")]] = -1
_DEPTH_CHUNK = 1 << 22
_UTF8_CHUNK = 1 << 24
_ASCII_BYTE = re.compile(rb"[\x00-\x7f]")


def max_nesting(text: str | bytes) -> int:
    """The deepest nesting of arrays and objects in ``text`` (brackets inside strings ignored).

    Linear in the length of ``text``, and UTF-8 bytes give what their text gives (no byte of a
    multi-byte character is a bracket, quote or backslash); malformed documents give some number,
    and the parser then reports what is malformed.
    """
    if isinstance(text, str):
        brackets = _SKIP.sub("", text).encode("ascii")
    else:
        brackets = _SKIP_BYTES.sub(b"", text)
    deepest, level = 0, 0
    for start in range(0, len(brackets), _DEPTH_CHUNK):
        steps = _OPENERS[np.frombuffer(brackets[start:start + _DEPTH_CHUNK], dtype=np.uint8)]
        running = np.cumsum(steps, dtype=np.int64) + level
        deepest = max(deepest, int(running.max()))
        level = int(running[-1])
    return deepest


def _check_utf8(data: bytes, name: str) -> None:
    """FormatError unless ``data`` is UTF-8 text, decoded a piece at a time (no copy of the whole
    text is made). Pieces end just after an ASCII byte, where no character continues, so each
    refusal names the reason and the byte that decoding the whole would."""
    if data.isascii():
        return
    start = 0
    while start < len(data):
        ascii_byte = _ASCII_BYTE.search(data, min(start + _UTF8_CHUNK, len(data)) - 1)
        end = ascii_byte.end() if ascii_byte else len(data)
        try:
            str(data[start:end], "utf-8")
        except UnicodeDecodeError as exc:
            raise FormatError(name, None, f"not UTF-8 text: {exc.reason} at byte {start + exc.start}") from None
        start = end


def check(data: bytes | str, name: str, *, max_depth: int = DEFAULT_MAX_DEPTH,
          max_bytes: int = DEFAULT_MAX_BYTES) -> None:
    """FormatError naming ``name`` for a document beyond the size, encoding or nesting limits,
    found before any parsing and without a decoded copy of the document beside it."""
    if len(data) > max_bytes:
        raise FormatError(name, None, f"{len(data)} bytes of JSON, more than the limit of {max_bytes}")
    if not isinstance(data, str):
        kind = file_kind(data[:64])
        if kind is not None and kind != "JSON text":  # a key, witness or wasm given in a JSON file's place
            raise FormatError(name, None, f"not JSON text but {kind}")
        _check_utf8(data, name)
    depth = max_nesting(data)
    if depth > max_depth:
        raise FormatError(name, None, f"arrays/objects nested {depth} deep, more than the limit of {max_depth}")


JS_SAFE = 1 << 53  # integers of magnitude <= 2^53 are exact JavaScript doubles


def js_number(literal: str) -> int | float:
    """A JSON number literal as JavaScript's JSON.parse sees it (an IEEE double), for documents
    snarkjs reads: an integer a double cannot hold exactly is an InputError (snarkjs would use
    another value) advising the decimal string of the value the literal means."""
    if len(literal) <= 15 and literal.lstrip("-").isdigit():
        return int(literal)  # below 10^15 < 2^53: exact as a double, the common case
    as_double = float(literal)
    if not math.isfinite(as_double):
        raise InputError(f"JSON number {literal[:40]} is beyond the range of a JavaScript number")
    try:
        exact = Decimal(literal)
    except InvalidOperation:  # pragma: no cover - json only hands us valid literals
        raise InputError(f"bad JSON number {literal!r}") from None
    if exact == exact.to_integral_value() and abs(exact) > JS_SAFE and Decimal(as_double) != exact:
        raise InputError(
            f"JSON number {literal} is not exact as a JavaScript number (snarkjs would use "
            f"{int(as_double)}); write it as a decimal string: \"{int(exact)}\"")
    return as_double if "." in literal or "e" in literal.lower() else int(exact)


def _default_number(literal: str) -> int | float:
    return float(literal) if any(c in literal for c in ".eE") else int(literal)


_MEMBERS = msgspec.json.Decoder(dict[str, msgspec.Raw])
_WS = rb"[ \t\n\r]*"
_OPEN = re.compile(_WS + rb"\{")
_KEY = re.compile(_WS + rb'("(?:[^"\\]++|\\.)*+")' + _WS + b":" + _WS, re.DOTALL)
_AFTER = re.compile(_WS + rb"(?:(,)|\}" + _WS + rb"\Z)")


def object_members(data: bytes) -> list[tuple[str, int, int]] | None:
    """The members of a JSON object document, in document order: (key, start, end) of each value's
    text in ``data``. None unless the document is JSON (msgspec's decoder, which validates it without
    building its values, says so), an object at the top, and names no key twice (what json does with
    a repeated key is left to json)."""
    try:
        values = _MEMBERS.decode(data)
    except (msgspec.DecodeError, RecursionError):  # ValidationError (not an object) is a DecodeError
        return None
    opened = _OPEN.match(data)
    assert opened is not None, "msgspec decoded an object"
    pos, members, seen = opened.end(), [], set()
    while values:
        key = _KEY.match(data, pos)
        if key is None:
            return None
        name = json.loads(key.group(1))
        raw = values.get(name)
        start = key.end()
        if raw is None or name in seen or not data.startswith(raw, start):  # not the key's last value
            return None
        seen.add(name)
        members.append((name, start, start + len(raw)))
        after = _AFTER.match(data, start + len(raw))
        if after is None:
            return None
        if after.group(1) is None:
            break
        pos = after.end()
    return members if len(members) == len(values) else None


def loads(data: bytes | str, name: str, *, max_depth: int = DEFAULT_MAX_DEPTH,
          max_number_chars: int = DEFAULT_MAX_NUMBER_CHARS, max_bytes: int = DEFAULT_MAX_BYTES,
          parse_number: Callable[[str], Any] = _default_number,
          parse_member: Callable[[bytes, int, int], Any] | None = None) -> Any:
    """Parse a JSON document within the limits above; FormatError naming ``name`` if it is not
    one. An InputError raised by ``parse_number`` propagates with ``name`` prefixed.

    ``parse_member``, for an object document given as bytes, is offered the text of each member's
    value (the document, start, end) and gives its value, or None to have it parsed as any other:
    a caller that packs long arrays (circom inputs) never holds them as a tree of Python values nor
    the document as text. It must take only what parsing would take as is; a document without
    members (:func:`object_members`) is parsed whole, so the refusals are the same either way.
    """
    if not isinstance(data, (str, bytes)):
        data = bytes(data)
    check(data, name, max_depth=max_depth, max_bytes=max_bytes)

    def number(literal: str) -> Any:
        if len(literal) > max_number_chars:
            raise FormatError(name, None, f"a number of {len(literal)} characters ({literal[:20]}...), more "
                              f"than the limit of {max_number_chars}; large values go in strings")
        return parse_number(literal)

    def constant(literal: str) -> Any:
        raise FormatError(name, None, f"{literal} is not a JSON value")

    def parse(text: str) -> Any:
        try:
            return json.loads(text, parse_int=number, parse_float=number, parse_constant=constant)
        except FormatError:
            raise
        except InputError as exc:  # parse_number's own refusal of a value
            raise InputError(f"{name}: {exc}") from None

    members = object_members(data) if parse_member is not None and isinstance(data, bytes) else None
    if parse_member is not None and isinstance(data, bytes) and members is not None:
        try:
            parsed = {}
            for key, start, end in members:
                value = parse_member(data, start, end)
                parsed[key] = parse(data[start:end].decode("utf-8")) if value is None else value
            return parsed
        except (ValueError, RecursionError):  # json refuses what msgspec took: the whole document says where
            pass
    try:
        return parse(data if isinstance(data, str) else data.decode("utf-8"))
    except json.JSONDecodeError as exc:
        raise FormatError(name, None, f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:  # only if the caller's stack is already deep: the depth scan came first
        raise FormatError(name, None, "nested too deeply to parse here") from None
    except ValueError as exc:
        raise FormatError(name, None, f"not valid JSON: {exc}") from None
