"""Where the traces shipped inside the package live."""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
DEFAULT_TRACE = "synthetic_mini_b16"


def shipped_trace_path(name: str) -> Path:
    return DATA_DIR / name


def default_trace_path() -> Path:
    """The trace the main job runs on when none is given."""
    return shipped_trace_path(DEFAULT_TRACE)
