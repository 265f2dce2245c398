"""``dllm-sim``: the simulator's main job (see sim/app.py and conf/config.yaml)."""

import hydra

from dllm_offload_sim.sim.app import main as _main


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg):
    return _main(cfg)


if __name__ == "__main__":
    main()
