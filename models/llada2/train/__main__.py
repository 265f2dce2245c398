"""``python -m models.llada2.train``: train the small LLaDA2-topology model (see train.py)."""

from models.llada2.train.train import main
from traces.cli import entry_point

cli = entry_point(main)  # console entry point ``dllm-train``

if __name__ == "__main__":
    cli()
