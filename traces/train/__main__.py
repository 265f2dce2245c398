import sys

from traces.train.train import main

sys.exit(main())
