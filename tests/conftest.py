"""Shared pytest set-up: make tests/ importable for the helper modules that live beside the tests."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
