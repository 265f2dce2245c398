"""One progress bar for a whole sweep: the jobs finished out of those launched, whichever launcher runs them."""

from __future__ import annotations

import threading
from pathlib import Path

from hydra.experimental.callback import Callback


class SweepProgress(Callback):
    """A Hydra callback (``hydra.callbacks`` in ``conf/config.yaml``): during a multirun, the launching process
    counts the jobs' ``done.json`` files (written last by each finished job) against the sweep's size and shows
    one bar; the jobs themselves show none. At the end it says where the results are and how to merge them."""

    def __init__(self, poll_s: float = 0.5):
        self.poll_s = poll_s
        self._stop = None

    def __getstate__(self) -> dict:  # the launcher ships callbacks to its workers: the bar stays here
        return {"poll_s": self.poll_s}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def on_multirun_start(self, config, **kwargs) -> None:
        from dllm_offload_sim.sim.collect import sweep_size

        self.sweep, self.total = Path(config.hydra.sweep.dir), sweep_size(config)
        self.quiet = bool(config.get("quiet", False))
        if self.quiet:
            return
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _done(self) -> int:
        return sum(1 for _ in self.sweep.glob("*/done.json")) if self.sweep.is_dir() else 0

    def _poll(self) -> None:
        from tqdm import tqdm

        with tqdm(total=self.total, desc="sweep", unit="job") as bar:
            while True:
                n = self._done()
                bar.update(n - bar.n)
                if self._stop.wait(self.poll_s):
                    bar.update(self._done() - bar.n)
                    return

    def on_multirun_end(self, config, **kwargs) -> None:
        if self._stop is not None:
            self._stop.set()
            self._thread.join(timeout=10)
        print(
            f"sweep: {self._done()} of {self.total} jobs done in {self.sweep}; merge them with "
            f"dllm-sim-collect {self.sweep}"
        )
        failed = sorted(self.sweep.glob("*/failed.json")) if self.sweep.is_dir() else []
        if failed:
            import json
            import sys

            for f in failed:
                print(
                    f"failed job {f.parent.name}: {json.loads(f.read_text()).get('error')}", file=sys.stderr
                )
            raise SystemExit(1)  # the others ran; the sweep is not whole
