"""Where the traces shipped inside the package live, and how a config names one."""

from __future__ import annotations

from pathlib import Path

from dllm_offload_sim.traces.errors import TraceError

DATA_DIR = Path(__file__).resolve().parent / "data"
SYNTHETIC_TRACE = "synthetic_mini_b16"  # the calibrated synthetic trace (traces.synth, seed 0)
REAL_TRACES = ("llada2_small_humaneval_b16", "llada2_small_gsm8k_b16")  # collected (docs/training.md)
BLOCK32_TRACE = "llada2_small_gsm8k_b32"  # the GSM8K prompts of REAL_TRACES[1] at block 32, by the same model
SHIPPED_TRACES = (*REAL_TRACES, BLOCK32_TRACE, SYNTHETIC_TRACE)
SHIPPED_MAX_BYTES = 20_000_000  # every shipped trace together stays within this (the package's size)
DEFAULT_TRACE = REAL_TRACES[0]  # the main job's trace
# the names of the simulator's trace= choices (conf/trace/), which name shipped traces too where no folder does
TRACE_ALIASES = {"default": DEFAULT_TRACE, "gsm8k": REAL_TRACES[1], "synthetic": SYNTHETIC_TRACE}


def shipped_trace_path(name: str) -> Path:
    return DATA_DIR / name


def default_trace_path() -> Path:
    """The trace the main job runs on when none is given."""
    return shipped_trace_path(DEFAULT_TRACE)


def trace_label(path) -> str:
    """How a result names the trace it ran on: a shipped trace by its name (not the install's path), any other by
    its path as given."""
    p = Path(path)
    try:
        if p.resolve().parent == DATA_DIR:
            return p.name
    except OSError:
        pass
    return str(path)


def resolve_trace(path_or_name) -> Path:
    """A trace directory from a config value or an argument: None = the default, a bare shipped name
    (``synthetic_mini_b16``) = that shipped trace, a ``trace=`` choice of the simulator (``default``, ``gsm8k``,
    ``synthetic``) = its shipped trace where no such folder exists here, anything else = a path."""
    if path_or_name is None:
        return default_trace_path()
    s = str(path_or_name)
    if not s.strip():
        raise TraceError(
            f"the trace path is empty: name a trace directory or a shipped trace ({', '.join(SHIPPED_TRACES)}"
            f"; trace.path=null for the default)"
        )
    if "/" not in s and (DATA_DIR / s / "meta.json").is_file():
        return DATA_DIR / s
    if s in TRACE_ALIASES and not Path(s).exists():
        return DATA_DIR / TRACE_ALIASES[s]
    return Path(s)
