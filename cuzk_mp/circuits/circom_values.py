"""What a value of circom input JSON means (JavaScript's ``BigInt``), and large arrays read packed.

snarkjs reduces every input value with ``BigInt(v) mod p``; :func:`js_bigint` is that ``BigInt``.
An input file can be up to ``MAX_INPUT_BYTES`` (cuzk_mp.circuits.circom) of a few long arrays; read
as a tree of Python values it took 3.7x its size (5.7x for plain numbers): a str or an int object and
a list slot per value, beside the file's bytes and their decoded text. :func:`pack_values` reads such an array straight
from the file's bytes, a piece at a time, into one numpy array: int64 where every value fits, else
each value already reduced mod r as the witness calculator writes it (:class:`PackedValues`). It
takes only arrays whose every value it can read without a refusal; any other value is left to the
JSON parser and the calculator, which report it as they always have.
"""

from __future__ import annotations

import math
import re

import numpy as np

from cuzk_mp.algebra.field import FR_LIMBS, R_MOD, ints_to_limbs
from cuzk_mp.errors import InputError
from cuzk_mp.formats.json_bounds import js_number

# ECMAScript StringToBigInt: whitespace (WhiteSpace + LineTerminator) is trimmed, an empty
# string is 0, decimal may carry a sign, 0x/0o/0b literals may not; no "_" separators.
_JS_SPACE = ("\t\n\v\f\r \xa0\u1680\u2028\u2029\u202f\u205f\u3000\ufeff"
             + "".join(map(chr, range(0x2000, 0x200B))))
_JS_DEC = re.compile(r"[+-]?[0-9]+")
_JS_RADIX = {"x": (16, re.compile(r"[0-9a-fA-F]+")), "o": (8, re.compile(r"[0-7]+")),
             "b": (2, re.compile(r"[01]+"))}

MAX_VALUE_CHARS = 1000  # one value: a number literal or a string (a field element is 78 digits)

# Arrays of less JSON text than this stay lists of JSON values (what a small input reads as).
PACK_MIN_BYTES = 1 << 16
_PIECE_BYTES = 1 << 18  # the text read into Python values at a time
_INT64 = (-(1 << 63), (1 << 63) - 1)
# In an array whose text has no backslash and no brace (no escapes, no objects): one value, a
# string or a number/true/false/null (the text is valid JSON: the rest are brackets, commas, spaces).
_TOKEN = re.compile(rb'"[^"]*"|[^\s\[\],"]+')
# Pieces of only decimal strings, or of only integer literals of at most 15 digits (exact doubles):
# each value is the integer its digits spell (what BigInt and js_number give), read in one pass.
_SEPARATORS = rb"[\s\[\],]*+"
_DECIMAL_STRINGS = re.compile(_SEPARATORS + rb'(?:"[0-9]{1,%d}+"' % MAX_VALUE_CHARS + _SEPARATORS + rb")*+")
_SHORT_INTEGERS = re.compile(_SEPARATORS + rb"(?:-?[0-9]{1,15}+(?![0-9])" + _SEPARATORS + rb")*+")
_INTEGER = re.compile(rb"-?[0-9]+")


def js_bigint(value: object, where: str) -> int:
    """``BigInt(value)`` as JavaScript computes it, for the value kinds JSON can carry.

    ``where`` names the input (``"signal a[3]"``) in the InputError raised for values that
    JavaScript rejects too: non-integral or non-finite numbers, malformed strings, null,
    objects.
    """
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value) or value != math.floor(value):
            raise InputError(f"{where}: {value!r} is not an integer")
        return int(value)
    if isinstance(value, str):
        return _js_string_to_bigint(value, where)
    kind = "null" if value is None else type(value).__name__
    raise InputError(f"{where}: a value must be a number or a string, not {kind}")


def _js_string_to_bigint(text: str, where: str) -> int:
    if len(text) > MAX_VALUE_CHARS:
        raise InputError(f"{where}: a value of {len(text)} characters, more than the limit of "
                         f"{MAX_VALUE_CHARS}")
    s = text.strip(_JS_SPACE)
    if not s:
        return 0
    if len(s) > 2 and s[0] == "0" and s[1].lower() in _JS_RADIX:
        base, digits = _JS_RADIX[s[1].lower()]
        if digits.fullmatch(s[2:]):
            return int(s[2:], base)
    elif _JS_DEC.fullmatch(s):
        return int(s, 10)
    raise InputError(f"{where}: {text!r} is not an integer (decimal, 0x.., 0o.. or 0b..)")


class PackedValues:
    """The values of one input signal, each already ``BigInt(v) mod r`` (what snarkjs computes
    before writing it to the wasm): ``limbs``, (n, 4) little-endian uint64, standard form."""

    __slots__ = ("limbs",)

    def __init__(self, limbs: np.ndarray) -> None:
        self.limbs = limbs

    def __len__(self) -> int:
        return len(self.limbs)


def _token_bigint(token: bytes) -> int | None:
    """``BigInt`` of one JSON value's text (a string without escapes, a number, true, false or
    null), as reading it as JSON and then :func:`js_bigint` give; None where either refuses it."""
    if token[0] == 0x22:  # a string
        text = token[1:-1]
        if text.isdigit() and len(text) <= MAX_VALUE_CHARS:  # ASCII decimal digits: the common case
            return int(text)
        try:
            return _js_string_to_bigint(text.decode("utf-8"), "")
        except InputError:
            return None
    if token == b"null" or len(token) > MAX_VALUE_CHARS:
        return None
    try:
        return js_bigint(True if token == b"true" else False if token == b"false" else js_number(token.decode()), "")
    except InputError:
        return None


def _piece_bigints(data: bytes, pos: int, end: int) -> list[int] | None:
    """``BigInt`` of every value in the text ``data[pos:end]`` (a piece of an array), in order;
    None if one of them is refused (:func:`_token_bigint`)."""
    if _DECIMAL_STRINGS.fullmatch(data, pos, end) or _SHORT_INTEGERS.fullmatch(data, pos, end):
        return list(map(int, _INTEGER.findall(data, pos, end)))
    values = [_token_bigint(token) for token in _TOKEN.findall(data, pos, end)]
    return None if None in values else values  # type: ignore[return-value]


def _limbs(values: list[int]) -> np.ndarray:
    """``values`` mod r as (n, 4) little-endian uint64 limbs."""
    return ints_to_limbs([v % R_MOD for v in values], FR_LIMBS)


def pack_values(data: bytes, start: int, end: int) -> np.ndarray | PackedValues | None:
    """The array of JSON text ``data[start:end]`` (valid JSON: a member's value, see
    :func:`cuzk_mp.formats.json_bounds.loads`), flattened row-major as circom reads it: int64 where
    every value fits, else :class:`PackedValues`. None (the parser reads it as JSON) for less text
    than ``PACK_MIN_BYTES``, anything but an array, an array with an escape or an object in it, and
    one with a value that reading it as JSON or ``BigInt`` would refuse."""
    if (end - start < PACK_MIN_BYTES or data[start] != 0x5B or data.find(b"\\", start, end) >= 0
            or data.find(b"{", start, end) >= 0):
        return None
    most = data.count(b",", start, end) + 1  # values, at most (no escapes: a quote always opens or closes a string)
    small: np.ndarray | None = None  # int64 while every value fits, else large (allocated at need)
    large: np.ndarray | None = None
    count, pos = 0, start + 1
    while pos < end:
        cut = min(pos + _PIECE_BYTES, end)
        scanned, quotes = pos, 0
        while cut < end:  # the piece ends at a comma outside strings (an even number of quotes before it)
            comma = data.find(b",", cut, end)
            if comma < 0:
                cut = end
                break
            quotes, scanned = quotes + data.count(b'"', scanned, comma), comma
            if quotes % 2 == 0:
                cut = comma
                break
            cut = comma + 1
        ints = _piece_bigints(data, pos, cut)
        if ints is None:
            return None
        if large is None and ints and not (_INT64[0] <= min(ints) and max(ints) <= _INT64[1]):
            large = np.empty((most, FR_LIMBS), dtype="<u8")
            if small is not None:
                large[:count] = _limbs(small[:count].tolist())
                small = None
        if large is not None:
            large[count:count + len(ints)] = _limbs(ints)
        elif ints:
            if small is None:
                small = np.empty(most, dtype=np.int64)
            small[count:count + len(ints)] = ints
        count += len(ints)
        pos = cut + 1
    if count == 0:
        return None
    return PackedValues(large[:count]) if large is not None else small[:count]  # type: ignore[index]
