"""``python -m models.llada2.train``: train the small LLaDA2-topology model (see train.py)."""

import sys

from models.llada2.train.train import main
from traces.cli import run_cli


def cli() -> None:
    """Console entry point (``dllm-train``)."""
    sys.exit(run_cli(main))


if __name__ == "__main__":
    cli()
