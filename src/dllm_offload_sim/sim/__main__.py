"""``dllm-sim``: the simulator's main job (see sim/app.py and conf/config.yaml)."""

import sys

import hydra

from dllm_offload_sim.sim.app import main as _main
from dllm_offload_sim.wiring.launchers import missing_launcher


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg):
    return _main(cfg)


def cli() -> None:
    """Console entry point: a launcher whose plugin is missing is named before Hydra runs."""
    msg = missing_launcher(sys.argv[1:])
    if msg:
        print(msg, file=sys.stderr)
        sys.exit(2)
    main()


if __name__ == "__main__":
    cli()
