"""The optional torch backend (`pip install "clover-cli[gpu]"`): weight groups on a torch device.

Nothing here is imported unless GPU offload is asked for; without torch the request gets one
line saying how to install it (`require_torch`).
"""

from __future__ import annotations

import importlib.util
from typing import Any

from ..errors import CloverError

INSTALL_HINT = 'GPU offload needs torch: pip install "clover-cli[gpu]"'


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
