"""Units at the edges: parse human strings ("400Gbps", "1us", "256MiB") into canonical numbers.

Inside fabricpilot every quantity is a plain number whose unit is in its name:
``rate_gbps`` (10^9 bit/s, i.e. bits per nanosecond), ``delay_ns`` / ``start_ns`` (integer
nanoseconds) and ``size_bytes`` (integer bytes). Strings with units are accepted only where a
user types them (scenario files, CLI flags) and are converted here, once.

Size suffixes follow nccl-tests for the bare forms: ``1K``/``1M``/``1G`` are powers of two
(``-b 1M`` is 1048576 bytes); ``KiB``/``MiB``/``GiB`` are powers of two as well; ``KB``/``MB``/
``GB`` with a ``B`` are powers of ten.
"""

from __future__ import annotations

import re

_NUM = r"([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)"
_PATTERN = re.compile(rf"^\s*{_NUM}\s*([A-Za-zµμ/]*)\s*$", re.ASCII)  # (digits 0-9 only)

# The rates a scenario or a topology file takes: at 1 Mb/s, 1 PiB still ends within the
# engine's 64-bit ns clock; 1e6 Gb/s is far beyond any link's.
MIN_RATE_GBPS = 1e-3
MAX_RATE_GBPS = 1e6

RATE_UNITS_GBPS: dict[str, float] = {
    "bps": 1e-9, "kbps": 1e-6, "mbps": 1e-3, "gbps": 1.0, "tbps": 1e3,
    "b/s": 1e-9, "kb/s": 1e-6, "mb/s": 1e-3, "gb/s": 1.0, "tb/s": 1e3,
}
TIME_UNITS_NS: dict[str, float] = {"ns": 1.0, "us": 1e3, "µs": 1e3, "μs": 1e3, "ms": 1e6,
                                  "s": 1e9}  # (µ: the micro sign; μ: Greek mu)
SIZE_UNITS_BYTES: dict[str, int] = {
    "b": 1,
    "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40, "pib": 1 << 50,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15,
}  # (up to P: the largest size a scenario may give is 1 PiB)
SIZE_UNITS_WRITTEN = ("B; K, M, G, T, P (powers of two, as nccl-tests reads them); KB, MB, GB, "
                      "TB, PB (of ten); KiB, MiB, GiB, TiB, PiB (of two)")
"""The size units as a size is written (a lower-case b is a bit, a size is in bytes)."""

_DIMENSIONS: dict[str, tuple[dict[str, float] | dict[str, int], str]] = {
    "rate": (RATE_UNITS_GBPS, "Gbps"),
    "time": (TIME_UNITS_NS, "ns"),
    "size": (SIZE_UNITS_BYTES, "B"),
}


class UnitError(ValueError):
    """A quantity string has no number, or a unit of the wrong dimension."""


def parse_quantity(value: object, dimension: str) -> float:
    """Convert ``value`` to the canonical unit of ``dimension`` (rate→Gb/s, time→ns, size→B).

    Numbers pass through unchanged (they are already in the canonical unit of the key).

    >>> parse_quantity("400Gbps", "rate")
    400.0
    >>> parse_quantity("1.5us", "time")
    1500.0
    >>> parse_quantity("1M", "size")
    1048576.0
    >>> parse_quantity(100, "time")
    100.0
    >>> parse_quantity("1.5µs", "time")
    1500.0
    >>> parse_quantity("1Mb", "size")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fabricpilot.units.UnitError: '1Mb' is in bits (b); a size is in bytes: write MB ...
    >>> parse_quantity("1Gib", "size")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fabricpilot.units.UnitError: '1Gib' is in bits (b); ... write GB (powers of ten) or GiB (of two)

    A rate in bytes (a capital B, as NVLink's are quoted) is eight times the bits:

    >>> parse_quantity("900GB/s", "rate"), parse_quantity("50GBps", "rate")
    (7200.0, 400.0)

    A time's unit is written in lower case (``Ms`` would be megaseconds), a size's
    prefixes above k in capitals before a B (``mB`` would be millibytes; a bare ``1m`` is
    1 MiB, as nccl-tests reads it):

    >>> parse_quantity("1Ms", "time")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fabricpilot.units.UnitError: wrong unit 'Ms' for a time; ... (in lower case)
    >>> parse_quantity("1mB", "size")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fabricpilot.units.UnitError: wrong unit 'mB' for a size: write MB (M, G, T, P in capitals)
    """
    table, canonical = _DIMENSIONS[dimension]
    if isinstance(value, bool):
        raise UnitError(f"expected a {dimension} in {canonical}, got a boolean")
    if isinstance(value, int | float):
        try:
            return float(value)
        except OverflowError:  # (an int beyond any float)
            raise UnitError(f"{dimension} out of range (above 1e308 {canonical})") from None
    if not isinstance(value, str):
        raise UnitError(f"expected a {dimension} in {canonical}, got {type(value).__name__}")
    match = _PATTERN.match(value)
    if match is None:
        raise UnitError(f"cannot read {value!r} as a {dimension}")
    number, unit = float(match.group(1)), match.group(2).lower()
    if unit == "":
        return number
    if dimension == "rate" and "B" in match.group(2):  # (bytes per second: 8 bits each)
        bits = match.group(2).replace("B", "b")
        if bits.lower() not in table:
            raise UnitError(f"wrong unit {match.group(2)!r} for a rate; use one of "
                            f"{', '.join(sorted(k for k in table if k.isascii()))} (bits), "
                            f"or GB/s (bytes)")
        return 8 * number * table[bits.lower()]
    if dimension == "size" and match.group(2).endswith("b"):  # (Gb, Gib: giga-, gibibits)
        pre = match.group(2)[:1].upper() if len(match.group(2)) > 1 else ""  # (mb: MB)
        write = f"{pre}B (powers of ten) or {pre}iB (of two)" if pre else "B"
        raise UnitError(f"{value!r} is in bits (b); a size is in bytes: write {write}")
    written = match.group(2)
    if dimension == "time" and unit in table and written != unit:
        raise UnitError(f"wrong unit {written!r} for a time; use one of "
                        f"{', '.join(sorted(k for k in table if k.isascii()))} (in lower case)")
    if dimension == "size" and unit in table and written[0] in "mgtp" and len(unit) > 1:
        # (a bare 1m is nccl-tests' 1 MiB; 1mB a millibyte)
        right = written[0].upper() + {"ib": "iB", "b": "B"}.get(unit[1:], "")
        raise UnitError(f"wrong unit {written!r} for a size: write {right} (M, G, T, P in "
                        f"capitals)")
    if unit not in table:
        other = next((d for d, (t, _) in _DIMENSIONS.items() if unit in t), None)
        hint = f" (that is a {other} unit)" if other else ""
        units = SIZE_UNITS_WRITTEN if dimension == "size" else \
            ", ".join(sorted({k for k in table if k.isascii()}))
        raise UnitError(f"wrong unit {match.group(2)!r} for a {dimension}{hint}; "
                        f"use one of {units}")
    return number * table[unit]


def format_bytes(size_bytes: float) -> str:
    """Human-readable size with binary prefixes.

    >>> format_bytes(1048576)
    '1.0 MiB'
    """
    value = float(size_bytes)
    for prefix in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or prefix == "TiB":
            return f"{value:.0f} {prefix}" if prefix == "B" else f"{value:.1f} {prefix}"
        value /= 1024
    raise AssertionError("unreachable")


def gbps_to_bytes_per_ns(rate_gbps: float) -> float:
    """Gb/s is bits per nanosecond; divide by 8 for bytes per nanosecond.

    >>> gbps_to_bytes_per_ns(400)
    50.0
    """
    return rate_gbps / 8.0


MAX_IDS = 1 << 20
"""The most ids :func:`parse_id_ranges` expands (more than any fabric has GPUs)."""


def parse_id_ranges(text: str, max_ids: int = MAX_IDS) -> list[int]:
    """Ids written as ranges, in the order written: ``"0-3,8"`` -> ``[0, 1, 2, 3, 8]``; at
    most ``max_ids`` of them (a longer list is an error, found before it is expanded).

    >>> parse_id_ranges("64-65, 0-1")
    [64, 65, 0, 1]
    >>> parse_id_ranges("3-1")
    Traceback (most recent call last):
    ...
    ValueError: bad range '3-1' (expected N or N-M with 0 <= N <= M)
    >>> parse_id_ranges("0-99999999999")
    Traceback (most recent call last):
    ...
    ValueError: more than 1048576 ids ('0-99999999999' alone has 100000000000)
    """
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi or lo)
        except ValueError:
            a, b = 1, 0
        if b < a or a < 0:
            raise ValueError(f"bad range {part!r} (expected N or N-M with 0 <= N <= M)")
        if len(out) + b - a + 1 > max_ids:
            raise ValueError(f"more than {max_ids} ids ({part!r} alone has {b - a + 1})")
        out.extend(range(a, b + 1))
    return out

