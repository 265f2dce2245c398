"""``dllm-train``: train the small LLaDA2-topology model (see train.py)."""

from dllm_offload_sim.models.llada2.train.train import main
from dllm_offload_sim.traces.cli import entry_point

cli = entry_point(main)  # console entry point ``dllm-train``

if __name__ == "__main__":
    cli()
