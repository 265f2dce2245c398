"""From configuration to objects: the Hydra configs (``conf/``) built into a trace, a cost model and a policy.

Shared by the simulator's app (``dllm-sim``) and the validator's (``dllm-validate``); neither
builds these objects itself. Every config group that describes an object names its class with ``_target_``
(``conf/policy/*.yaml``, ``conf/hw/*.yaml``).
"""
