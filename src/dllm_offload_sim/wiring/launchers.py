"""The sweep launchers that need an optional dependency, checked before Hydra composes the config: without the
plugin Hydra's own error is "Could not find 'hydra/launcher/submitit_slurm'", which names no extra to install."""

from __future__ import annotations

import importlib.util

# hydra/launcher=NAME -> (the module it needs, the extra that installs it)
LAUNCHER_NEEDS = {
    "slurm": ("hydra_plugins.hydra_submitit_launcher", "slurm"),
    "ray": ("ray", "ray"),
}


def missing_launcher(argv: list[str]) -> str | None:
    """The error line for a ``hydra/launcher=NAME`` override whose plugin is not installed, else None."""
    for arg in argv:
        key, _, name = arg.partition("=")
        if key.lstrip("+~") != "hydra/launcher" or name not in LAUNCHER_NEEDS:
            continue
        module, extra = LAUNCHER_NEEDS[name]
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            return (
                f"error: hydra/launcher={name} needs {module.split('.')[-1]}, which the '{extra}' extra installs: "
                f"pip install 'dllm-offload-sim[{extra}]' (in a checkout: pip install -e '.[{extra}]')"
            )
    return None
