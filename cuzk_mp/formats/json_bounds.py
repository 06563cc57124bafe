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
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

import numpy as np

from ..errors import FormatError, InputError

DEFAULT_MAX_DEPTH = 64
DEFAULT_MAX_NUMBER_CHARS = 400  # a JavaScript double needs at most ~330 characters
DEFAULT_MAX_BYTES = 1 << 30

# A JSON string token; possessive quantifiers keep an unterminated string linear.
_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_NOT_BRACKET = re.compile(r'[^\[\]{}]++')
_OPENERS = np.zeros(256, dtype=np.int8)
_OPENERS[[ord("["), ord("{")]] = 1
_OPENERS[[ord("]"), ord("}")]] = -1
_DEPTH_CHUNK = 1 << 22


def max_nesting(text: str) -> int:
    """The deepest nesting of arrays and objects in ``text`` (brackets inside strings ignored).

    Linear in the length of ``text``; malformed documents give some number, and the parser
    then reports what is malformed.
    """
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text)).encode("ascii")
    deepest, level = 0, 0
    for start in range(0, len(brackets), _DEPTH_CHUNK):
        steps = _OPENERS[np.frombuffer(brackets[start:start + _DEPTH_CHUNK], dtype=np.uint8)]
        running = np.cumsum(steps, dtype=np.int64) + level
        deepest = max(deepest, int(running.max()))
        level = int(running[-1])
    return deepest


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


def loads(data: bytes | str, name: str, *, max_depth: int = DEFAULT_MAX_DEPTH,
          max_number_chars: int = DEFAULT_MAX_NUMBER_CHARS, max_bytes: int = DEFAULT_MAX_BYTES,
          parse_number: Callable[[str], Any] = _default_number) -> Any:
    """Parse a JSON document within the limits above; FormatError naming ``name`` if it is not
    one. An InputError raised by ``parse_number`` propagates with ``name`` prefixed."""
    if len(data) > max_bytes:
        raise FormatError(name, None, f"{len(data)} bytes of JSON, more than the limit of {max_bytes}")
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FormatError(name, None, f"not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    else:
        text = data
    depth = max_nesting(text)
    if depth > max_depth:
        raise FormatError(name, None, f"arrays/objects nested {depth} deep, more than the limit of {max_depth}")

    def number(literal: str) -> Any:
        if len(literal) > max_number_chars:
            raise FormatError(name, None, f"a number of {len(literal)} characters ({literal[:20]}...), more "
                              f"than the limit of {max_number_chars}; large values go in strings")
        return parse_number(literal)

    def constant(literal: str) -> Any:
        raise FormatError(name, None, f"{literal} is not a JSON value")

    try:
        return json.loads(text, parse_int=number, parse_float=number, parse_constant=constant)
    except FormatError:
        raise
    except InputError as exc:  # parse_number's own refusal of a value
        raise InputError(f"{name}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise FormatError(name, None, f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:  # only if the caller's stack is already deep: the depth scan came first
        raise FormatError(name, None, "nested too deeply to parse here") from None
    except ValueError as exc:
        raise FormatError(name, None, f"not valid JSON: {exc}") from None
