"""Units and the whole-number checks every entry point uses, written once.

Memory is counted in bytes; tables show GiB (2**30) and MiB (2**20), as vendors' datasheets and
``nvidia-smi`` do, for GPU and CPU memory alike; traffic on the wire is in MB (1e6), as networks count.
"""

from __future__ import annotations

GIB = 1024**3
MIB = 1024**2
MB = 1e6


def gib(nbytes: float) -> str:
    """``"1.50 GiB"``: the form formula texts use."""
    return f"{nbytes / GIB:.2f} GiB"


def size(nbytes: float) -> str:
    """``"1.50 GiB"`` from 1 GiB up (either sign), else ``"12.00 MiB"``: the form findings and tables use."""
    return gib(nbytes) if abs(nbytes) >= GIB else f"{nbytes / MIB:.2f} MiB"


def mib(nbytes: float | None) -> float | None:
    """Bytes as MiB (a number, for tables); None stays None."""
    return None if nbytes is None else nbytes / MIB


#: the smallest magnitude ``number`` writes out; a value closer to zero (not zero) is shown as below it
SMALLEST = 1e-4


def number(value: float) -> str:
    """A float as a table shows it: a whole number with separators (``273920.0`` -> ``"273,920"``), else
    four significant digits (``0.41087999999999997`` -> ``"0.4109"``), one decimal from 1,000 up; never
    in e-notation: a value closer to zero than ``SMALLEST`` is ``"<0.0001"`` (``">-0.0001"`` below zero).
    A table whose values are that small wants a smaller unit: its caller scales them (MiB, not GiB)."""
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    if value == int(value) and abs(value) < 1e15:
        return f"{value:,.0f}"
    if abs(value) < SMALLEST:
        return f"<{SMALLEST:g}" if value > 0 else f">-{SMALLEST:g}"
    return f"{value:,.1f}" if abs(value) >= 1000 else f"{value:.4g}"


def first_line(error: BaseException | str, typed: bool = False) -> str:
    """The first line of a text or an error's message (an error without one: its type's name);
    ``typed=True`` puts the error's type in front (``"KeyError: 'x'"``)."""
    if isinstance(error, str):
        return error.strip().split("\n", 1)[0]
    text = str(error).strip().split("\n", 1)[0]
    name = type(error).__name__
    return (f"{name}: {text}" if typed else text) if text else name


def whole_number(name: str, value: object, low: int = 1) -> int:
    """``value`` if it is an int >= ``low`` (not a bool); else ValueError naming the field and the range."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name}: must be a whole number >= {low}, got {value!r}")
    return value


def parse_count(text: str) -> int:
    """``7e9``, ``7B``, ``350M``, ``1_000_000`` or ``6,738,415,616`` as an integer count."""
    t = text.strip().replace("_", "").replace(",", "")
    scale = {"k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}.get(t[-1:].lower())
    try:
        value = float(t[:-1]) * scale if scale else float(t)
    except ValueError:
        raise ValueError(f"not a count: {text!r} (try 7e9, 7B or 350M)") from None
    return int(value)


def count_text(value: float) -> str:
    """A count as ``parse_count`` reads it back: ``2T``, ``134.8B``, ``350M``, ``4k``, ``12``."""
    for suffix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.4g}{suffix}"
    return f"{value:g}"
