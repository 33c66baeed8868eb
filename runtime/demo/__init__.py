"""The demo model that ships with clover: a 5.4 MB model of the Clover architecture (Gated DeltaNet
and gated attention, routed experts, block diffusion) trained by `training/train.py` from seed 0
on arithmetic, facts about clover and weather/calculator tool dialogues. It lets a new user see
real answers and real diffusion figures without a 21 GB download; `demo` names it wherever a
model is accepted (`clover run demo`, `clover serve demo`, `load_model("demo")`)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ModelFileError

DEMO_NAME = "demo"
DEMO_FILE = "clover-demo-Q8_0.gguf"


def is_demo(text: object) -> bool:
    """True for the name `demo` (any case, surrounding spaces ignored); `./demo` stays a path."""
    return isinstance(text, str) and text.strip().lower() == DEMO_NAME


def demo_path() -> Path:
    """The installed demo GGUF; ModelFileError when an install lost it (a trimmed package)."""
    path = Path(__file__).resolve().parent / DEMO_FILE
    if not path.is_file():
        raise ModelFileError(f"the demo model is missing from this install ({path})",
                             hint="reinstall clover-cli, or name a .gguf file or a Hub model instead")
    return path
