"""Errors that reach the user as one clear line (the CLI prints them, the server maps them)."""

from __future__ import annotations


class CloverError(Exception):
    """A failure the user can act on: its message is printed as one line, exit code 1."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class ModelFileError(CloverError):
    """A GGUF file that cannot be used: not GGUF, truncated, wrong shapes, unknown architecture."""


class ContextLengthError(CloverError):
    """A sequence would grow past the context length the state was created with."""

    def __init__(self, n_tokens: int, n_ctx: int) -> None:
        super().__init__(f"context length exceeded: {n_tokens} tokens > n_ctx {n_ctx}")
        self.n_tokens = n_tokens
        self.n_ctx = n_ctx


class HubError(CloverError):
    """A download or cache failure (not found, unauthorized, offline miss, disk full). `needs` says what
    the user could supply, for a front end to word in its own flags: "file" (a file in the repository),
    "file_path" (its path inside the repository), "quant_or_file" (a quant tag or a file), "token" (a
    Hub token)."""

    def __init__(self, message: str, hint: str | None = None, needs: str | None = None) -> None:
        super().__init__(message, hint)
        self.needs = needs


class TemplateError(CloverError):
    """A chat template that failed to render; the message names the template line."""


class NoMaskToken(CloverError):
    """Block diffusion was asked of a file without a mask token (AR still works)."""


class NoGpu(CloverError):
    """GPU offload was asked for and no device can take it; `cpu_torch` names a CPU-only torch build
    installed beside an NVIDIA GPU (None otherwise)."""

    def __init__(self, message: str, cpu_torch: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.cpu_torch = cpu_torch
