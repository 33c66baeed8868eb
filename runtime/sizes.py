"""Byte units and how clover writes a size, shared by the fit report, the placement plan and the CLI."""

from __future__ import annotations

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30


def size_text(n: float) -> str:
    """Bytes in the largest unit that keeps a digit before the point: '22.3 GiB', '310.5 MiB', '96.0 KiB'.

    A tiny model must not read "needs 0.0 GiB"."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} bytes"
