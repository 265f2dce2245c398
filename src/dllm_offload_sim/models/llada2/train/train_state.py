"""A training run's resumable state: what ``dllm-train --resume`` needs to continue a run where it stopped.

The state holds the model and optimiser, the step reached and the schedule, the log so far, and the positions of
the two random streams (the window sampler's and the noise generator's), so a resumed run draws what the
uninterrupted run would have drawn. It is written atomically to ``train_state.pt`` in the run directory, and
records the run's settings: a resume with other settings is refused, naming the setting.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path

import torch

from dllm_offload_sim.traces.atomic import atomic_write_file
from dllm_offload_sim.traces.errors import TraceError

STATE_FILE = "train_state.pt"


@dataclass
class TrainState:
    """Everything a run needs to continue from step ``step`` (see the module docstring)."""

    settings: dict  # the run's settings; a resume must match them
    step: int  # optimiser steps done
    total: int  # the schedule's steps
    rows: list  # the training log so far
    train_s: float  # training seconds so far (evaluations excluded)
    elapsed_s: float  # wall seconds so far
    sampler_state: dict  # the window sampler's generator state, for the next batch
    noise_state: torch.Tensor  # the noise generator's state
    model: dict  # the model's state_dict (experts fused)
    optimizer: dict  # the optimiser's state_dict

    def save(self, run_dir: Path) -> Path:
        """Write the state to ``run_dir/train_state.pt`` atomically (a crash leaves the previous one)."""
        return atomic_write_file(Path(run_dir) / STATE_FILE, lambda tmp: torch.save(self.__dict__, tmp))

    @classmethod
    def load(cls, run_dir: Path, settings: dict) -> "TrainState":
        """The state in ``run_dir``, checked against this run's ``settings``."""
        path = Path(run_dir) / STATE_FILE
        try:
            d = torch.load(path, map_location="cpu", weights_only=True)
            state = cls(**d)
        except (OSError, RuntimeError, TypeError, EOFError, pickle.UnpicklingError) as e:
            raise TraceError(f"{path}: not a readable training state ({e})") from e
        for k in sorted(set(settings) | set(state.settings)):
            if settings.get(k) != state.settings.get(k):
                raise TraceError(
                    f"{path}: the run was started with {k}={state.settings.get(k)!r}, this one has "
                    f"{k}={settings.get(k)!r}; resume with the same settings or choose another --out"
                )
        return state
