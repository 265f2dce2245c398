"""The error of a configuration that cannot hold."""


class ConfigError(ValueError):
    """A configuration that cannot hold (a field and its value named); raised before anything runs."""
