"""Usage errors a command finds after click has parsed its flags (a bad --decode, a prompt given
twice): one line like any error, but exit code 2, as click gives its own usage errors."""

from __future__ import annotations

from clover_runtime.errors import CloverError


class UsageError(CloverError):
    """The command line asks for something that cannot be meant; nothing was started."""

    exit_code = 2


def choice(flag: str, value: str, allowed: tuple[str, ...]) -> str:
    """`value` when it is one of `allowed`, else a UsageError naming the flag and the choices."""
    if value not in allowed:
        raise UsageError(f"{flag} must be {', '.join(allowed[:-1])} or {allowed[-1]}, not {value!r}")
    return value
