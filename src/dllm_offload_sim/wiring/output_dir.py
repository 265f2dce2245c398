"""A Hydra callback that checks the run's output folder before Hydra makes it.

Hydra creates ``hydra.run.dir`` (or ``hydra.sweep.dir``) before the job runs; where it cannot (a read-only file
system, a path through a file, no permission), Hydra's own error is a traceback from ``pathlib``. This callback
makes the folder first, at ``on_run_start`` / ``on_multirun_start``, and on failure prints one line naming the
config key, the path and the reason, and exits with status 2, as every other bad input does.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hydra.experimental.callback import Callback


def make_output_dir(key: str, path: str) -> None:
    """Create ``path`` (with parents); on failure print ``error: key=path: reason`` and exit 2."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        reason = e.strerror or str(e)
        print(f"error: {key}={path}: cannot create the output folder: {reason}", file=sys.stderr)
        raise SystemExit(2) from None


class OutputDirCheck(Callback):
    """``hydra.callbacks.output_dir`` in the app's config: the output folder is made, or refused, before Hydra."""

    def on_run_start(self, config, **kwargs) -> None:
        make_output_dir("hydra.run.dir", str(config.hydra.run.dir))

    def on_multirun_start(self, config, **kwargs) -> None:
        make_output_dir("hydra.sweep.dir", str(config.hydra.sweep.dir))
