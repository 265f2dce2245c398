import sys

from models.llada2.train.train import main
from traces.cli import run_cli

sys.exit(run_cli(main))
