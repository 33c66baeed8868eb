"""What the CLI adds to the runtime's errors: the commands and flags that fix them. The runtime
raises facts (which model is missing and why, which file lacks a mask token); the words a user
types to act on them live here, where the flags are."""

from __future__ import annotations

from clover_runtime.errors import CloverError, NoGpu, NoMaskToken

DEMO_LINE = 'clover run demo "What is 48 + 36?"'


def hint_for(exc: CloverError) -> str | None:
    """The error's own hint joined with the command line that acts on it."""
    from clover_runtime.hub.resolve import NotCached

    extra: list[str] = []
    if isinstance(exc, NotCached):
        if exc.why in ("offline", "not_downloaded"):
            extra.append(f"download it first with: clover pull {exc.ref}")
        extra.append(f"or try the model that ships with clover: {DEMO_LINE}")
    elif isinstance(exc, NoMaskToken):
        extra.append("use --decode ar")
    elif isinstance(exc, NoGpu) and exc.cpu_torch is None:
        extra.append("--device mps opts in to Apple's GPU (experimental); --device cpu runs the torch backend on "
                     "the CPU")
    parts = [p for p in (exc.hint, *extra) if p]
    return "; ".join(parts) if parts else None
