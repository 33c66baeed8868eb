"""The optional torch backend (`pip install "clover-cli[gpu]"`): weight groups on a torch device.

Nothing here is imported unless GPU offload is asked for; without torch the request gets one
line saying how to install it (`require_torch`).
"""

from __future__ import annotations

import importlib.util
from typing import Any

from ..errors import CloverError

INSTALL_HINT = 'GPU offload needs torch: pip install "clover-cli[gpu]"'
# PyPI's torch wheel for Windows (and the +cpu wheels anywhere) has no CUDA: an NVIDIA card needs
# PyTorch's own index. cu128 covers Turing (RTX 20xx) through Blackwell (RTX 50xx).
CUDA_TORCH_INSTALL = "pip install torch --index-url https://download.pytorch.org/whl/cu128"


def torch_available() -> bool:
    """True when torch can be imported (checked without importing it)."""
    return importlib.util.find_spec("torch") is not None


def require_torch() -> Any:
    """The torch module, or a CloverError with the install line."""
    try:
        import torch
    except ImportError:
        raise CloverError(INSTALL_HINT) from None
    except Exception as exc:  # a broken install: say so in one line
        raise CloverError(f"torch failed to import ({type(exc).__name__}: {exc}); {INSTALL_HINT}") from None
    return torch


def cpu_only_build() -> str | None:
    """torch's version when the installed torch is built without CUDA or ROCm (PyPI's Windows wheel,
    a `+cpu` wheel), else None (no torch, a GPU build, or a torch that does not import). Reads the
    build, never initialises a device."""
    if not torch_available():
        return None
    try:
        import torch
    except Exception:  # noqa: BLE001 - a broken torch is reported where it is used
        return None
    version = getattr(torch, "version", None)
    if getattr(version, "cuda", None) or getattr(version, "hip", None):
        return None
    return str(getattr(torch, "__version__", "?"))
