"""Java ``String.hashCode`` and the two hashes RocketMQ derives from it.

RocketMQ stores two hashes that a byte-compatible store must reproduce exactly:

* the ConsumeQueue ``tagsCode`` of a message is ``tags.hashCode()`` (0 when there are
  no tags), a signed 32-bit Java int stored in an 8-byte long;
* an IndexFile entry stores ``indexKeyHashMethod(key) = abs(key.hashCode())``, and 0
  when that is still negative (``Math.abs(Integer.MIN_VALUE)`` stays negative).

``String.hashCode`` is ``s[0]*31^(n-1) + ... + s[n-1]`` over the string's UTF-16 code
units, wrapped to a signed 32-bit int. Characters outside the BMP count as two code
units (a surrogate pair), exactly as in Java.

The sum is computed with ``map(operator.mul, ...)`` against a table of powers of 31 so
the per-character work stays in C. Tag hashes are cached (tags repeat heavily); index
keys (unique keys above all) are not, since a cache would only churn.
"""

from __future__ import annotations

import functools
import operator

import numpy as np

_MASK32 = 0xFFFFFFFF
_POWERS: list[int] = [1]
_REVERSED_POWERS: dict[int, tuple[int, ...]] = {}


def _powers(n: int) -> tuple[int, ...]:
    """31^(n-1) .. 31^0, each reduced mod 2^32 (built once per length)."""
    found = _REVERSED_POWERS.get(n)
    if found is None:
        while len(_POWERS) < n:
            _POWERS.append((_POWERS[-1] * 31) & _MASK32)
        found = _REVERSED_POWERS[n] = tuple(_POWERS[n - 1::-1]) if n else ()
    return found


def _code_units(s: str) -> bytes | list[int]:
    if s.isascii():
        return s.encode("ascii")
    raw = s.encode("utf-16-be", "surrogatepass")
    return [int.from_bytes(raw[i : i + 2], "big") for i in range(0, len(raw), 2)]


def java_string_hash_uncached(s: str) -> int:
    """Java ``String.hashCode()``: a signed 32-bit int.

    >>> java_string_hash_uncached("TAG1"), java_string_hash_uncached("TagA")
    (2567159, 2598919)
    """
    units = _code_units(s)
    h = sum(map(operator.mul, units, _powers(len(units)))) & _MASK32
    return h - 0x1_0000_0000 if h & 0x8000_0000 else h


# Tags repeat from message to message: their hashes are cached.
java_string_hash = functools.lru_cache(maxsize=65536)(java_string_hash_uncached)


def tags_code(tags: str | None) -> int:
    """The ConsumeQueue ``tagsCode`` of a message: ``tags.hashCode()``, 0 without tags."""
    return java_string_hash(tags) if tags else 0


def index_key_hash(key: str) -> int:
    """IndexFile ``indexKeyHashMethod``: ``abs(key.hashCode())``, 0 if still negative."""
    h = abs(java_string_hash_uncached(key))
    return 0 if h > 0x7FFF_FFFF else h


def index_key_hash_raw(key: bytes) -> int:
    """``index_key_hash`` of a key given as UTF-8 bytes, decoded as dispatch decodes
    (``"replace"``): an ASCII key hashes as its bytes (one byte, one code unit)."""
    if not key.isascii():
        return index_key_hash(key.decode("utf-8", "replace"))
    powers = _REVERSED_POWERS.get(len(key)) or _powers(len(key))
    h = sum(map(operator.mul, key, powers)) & _MASK32
    if h & 0x8000_0000:
        h = 0x1_0000_0000 - h        # abs() of the negative Java int
    return 0 if h > 0x7FFF_FFFF else h


# ---------------------------------------------------------------------------------- in bulk
_POW31 = np.ones(1, np.uint32)


def _pow31(n: int) -> np.ndarray:
    """31^0 .. 31^(n-1) as uint32 (Java's int arithmetic wraps the same way)."""
    global _POW31
    if len(_POW31) < n:
        table = np.empty(max(n, 2 * len(_POW31)), np.uint32)
        table[0] = 1
        with np.errstate(over="ignore"):
            for i in range(1, len(table)):
                table[i] = table[i - 1] * np.uint32(31)
        _POW31 = table
    return _POW31


def index_key_hashes(keys: list[bytes]) -> np.ndarray:
    """``index_key_hash`` of every key (UTF-8 bytes), as int64, in one numpy pass.

    Keys that are pure ASCII hash as their bytes (one byte is one UTF-16 code unit);
    any other key is decoded as the dispatch path decodes it (``"replace"``) and hashed
    one by one. Every key must be non-empty."""
    lengths = np.fromiter(map(len, keys), np.int64, len(keys))
    data = np.frombuffer(b"".join(keys), np.uint8)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    exponents = np.repeat(ends - 1, lengths) - np.arange(len(data), dtype=np.int64)
    with np.errstate(over="ignore"):
        terms = data.astype(np.uint32) * _pow31(int(lengths.max(initial=1)))[exponents]
        h = np.add.reduceat(terms, starts, dtype=np.uint32) if len(keys) else terms[:0]
    hashes = np.abs(h.view(np.int32).astype(np.int64))
    hashes[hashes > 0x7FFF_FFFF] = 0
    if data.max(initial=0) >= 0x80:
        wide = np.flatnonzero(np.maximum.reduceat(data, starts) >= 0x80) if len(keys) else []
        for i in wide.tolist():
            hashes[i] = index_key_hash(keys[i].decode("utf-8", "replace"))
    return hashes
