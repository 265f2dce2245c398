"""From configuration to objects: the Hydra configs (``conf/``) built into a trace, a cost model and a policy.

Shared by the simulator's app (``python -m sim``) and the validator's (``python -m validate``); neither
builds these objects itself. Every config group that describes an object names its class with ``_target_``
(``conf/policy/*.yaml``, ``conf/hw/*.yaml``).
"""
