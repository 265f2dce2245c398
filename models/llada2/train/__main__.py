import sys

from models.llada2.train.train import main

sys.exit(main())
