"""llama-bench's list syntax for `clover bench` flags: `a,b`, repeated flags, `a-b`, `a-b+step`,
`a-b*mult`, and `-pg pp,tg` pairs. CLI syntax, so it lives with the CLI; the runtime gets plain lists."""

from __future__ import annotations

import re
from collections.abc import Iterable

from .usage import UsageError

_RANGE_RE = re.compile(r"^(?P<a>\d+)-(?P<b>\d+)(?:(?P<op>[+*])(?P<step>\d+))?$")


def parse_int_list(values: Iterable[str]) -> list[int]:
    """Expand llama-bench list syntax: `a,b`, repeated flags, `a-b` (+1), `a-b+step`, `a-b*mult`."""
    out: list[int] = []
    for value in values:
        for part in str(value).split(","):
            part = part.strip()
            if not part:
                continue
            m = _RANGE_RE.match(part)
            if not m:
                try:
                    out.append(int(part))
                except ValueError:
                    raise UsageError(f"invalid number or range '{part}'") from None
                continue
            a, b = int(m.group("a")), int(m.group("b"))
            op, step = m.group("op") or "+", int(m.group("step") or 1)
            if step <= 0 or (op == "*" and step == 1) or b < a or (op == "*" and a == 0):
                raise UsageError(f"invalid range '{part}'")
            x = a
            while x <= b:
                out.append(x)
                x = x + step if op == "+" else x * step
    return out


def parse_float_list(values: Iterable[str]) -> list[float]:
    """Comma lists and repeated flags of floats (no ranges)."""
    out: list[float] = []
    for value in values:
        for part in str(value).split(","):
            if part.strip():
                try:
                    out.append(float(part))
                except ValueError:
                    raise UsageError(f"invalid number '{part.strip()}'") from None
    return out


def parse_pairs(values: Iterable[str]) -> list[tuple[int, int]]:
    """`-pg pp,tg` values (each flag one pair)."""
    out = []
    for value in values:
        parts = [p.strip() for p in str(value).split(",")]
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise UsageError(f"-pg takes two numbers 'pp,tg', got '{value}'")
        out.append((int(parts[0]), int(parts[1])))
    return out
