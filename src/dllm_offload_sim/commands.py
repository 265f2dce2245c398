"""Console commands that need an optional dependency: each checks it is installed before importing the command, so
that without it (``--help`` included) the user reads which extra to install instead of a traceback."""

from __future__ import annotations

import importlib
import sys

from dllm_offload_sim.traces.cli import missing_extra


def _needs(module: str, extra: str, target: str, prog: str):
    def cli() -> None:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError:
            print(missing_extra(prog, module, extra), file=sys.stderr)
            sys.exit(2)
        mod, fn = target.split(":")
        getattr(importlib.import_module(mod), fn)()

    cli.__doc__ = f"Console entry point of {prog} ({target}), which needs {module}."
    return cli


# the command, the module it needs, the extra that installs it, and the command's own entry point (which also runs
# as ``python -m`` its module); dllm-profile is not here: it checks for torch itself, as its --help and --refit
# need none
NEEDS_EXTRA = {
    "dllm-e2e": ("torch", "gpu", "dllm_offload_sim.validate.e2e:cli"),
    "dllm-train": ("torch", "gpu", "dllm_offload_sim.models.llada2.train.__main__:cli"),
    "dllm-trace-collect": ("torch", "gpu", "dllm_offload_sim.models.llada2.collect:cli"),
    "dllm-trace-record-hf": ("transformers", "hf", "dllm_offload_sim.models.hf_routing:cli"),
}
e2e = _needs(*NEEDS_EXTRA["dllm-e2e"], "dllm-e2e")
train = _needs(*NEEDS_EXTRA["dllm-train"], "dllm-train")
trace_collect = _needs(*NEEDS_EXTRA["dllm-trace-collect"], "dllm-trace-collect")
trace_record_hf = _needs(*NEEDS_EXTRA["dllm-trace-record-hf"], "dllm-trace-record-hf")
