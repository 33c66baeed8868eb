"""What the CLI adds to the runtime's errors: the commands and flags that fix them. The runtime
raises facts (which model is missing and why, which file lacks a mask token); the words a user
types to act on them live here, where the flags are."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from clover_runtime.errors import CloverError, HubError, NoGpu, NoMaskToken
from clover_runtime.sizes import size_text

DEMO_LINE = 'clover run demo "What is 48 + 36?"'
AGENT_CTX = 65536  # agent clients (Hermes Agent: ~12K-token first request) need this much per request


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
    hint = _with_flags(exc) if isinstance(exc, HubError) else exc.hint
    parts = [p for p in (hint, *extra) if p]
    return "; ".join(parts) if parts else None


def _with_flags(exc: HubError) -> str | None:
    """A Hub error's hint with the flag that supplies what it `needs`."""
    hint = exc.hint
    if exc.needs == "file":
        return "choose one with --file NAME"
    if exc.needs == "file_path":
        return "give the path inside the repository with --file"
    if exc.needs == "quant_or_file":
        return f"{hint} (pick one with :QUANT or --file NAME)" if hint else "pick one with :QUANT or --file NAME"
    if exc.needs == "token":
        return f"{hint} (--hf-token or HF_TOKEN)" if hint else "pass a token with --hf-token or HF_TOKEN"
    return hint


def _agent_note(n_ctx: int) -> str:
    """What a shorter context costs agent clients, on the same advice line."""
    if n_ctx >= AGENT_CTX:
        return ""
    return f" (too short for agent clients such as Hermes Agent, which need -c {AGENT_CTX})"


def fit_advice_text(advice: Any) -> str:
    """One `memory_fit.FitAdvice` (or its JSON, as doctor reports it) in the flags that act on it."""
    a = advice if isinstance(advice, Mapping) else vars(advice)
    kind = a.get("kind")
    if kind == "shorter_context":
        where = "with the weights paging from disk" if a.get("paging") else "entirely in RAM"
        return f"a shorter context: -c {a['n_ctx']} fits {where}{_agent_note(a['n_ctx'])}"
    if kind == "smaller_quant":
        return f"a smaller quant: the weights alone are {size_text(a['weights'])}"
    if kind == "fewer_parallel":
        return f"fewer parallel sequences: -np {a['n_parallel']} multiplies the KV cache and state"
    return str(kind)


def fit_hint(advice: Iterable[Any]) -> str | None:
    """A verdict's advice as one line, for CloverError's hint."""
    lines = [fit_advice_text(a) for a in advice]
    return "try " + "; or ".join(lines) if lines else None
