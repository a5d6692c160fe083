"""The error a user's input causes, as distinct from a bug.

`ConfigError` is raised for a setting that cannot be used (engine, policy, metric, command
options); the message names the key and says what is accepted. The commands print it as one line
and exit 2; any other exception is reported as an internal error. Traces and cost models have
their own input errors (`traces.schema.TraceError`, `cost_models.base.CostModelError`), since
they import nothing from the simulator.
"""


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names the key."""
