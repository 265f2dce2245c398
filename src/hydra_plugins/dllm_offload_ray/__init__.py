"""A Hydra launcher that runs each sweep job as a Ray task (``hydra/launcher=ray``), on a local Ray instance
or on a running Ray cluster. Registered with Hydra by importing :mod:`.config`."""
