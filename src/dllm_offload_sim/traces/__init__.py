"""Traces: the product's central data format, its writer/reader, a synthetic generator and analytics.

A trace is a directory holding ``meta.json`` plus three Parquet tables (``steps``, ``routing``,
``tokens``); see ``docs/trace-format.md``.
"""

from dllm_offload_sim.traces.errors import TraceError, TraceFormatError
from dllm_offload_sim.traces.topology import FLASH, MINI, ModelTopology, topology_preset

__all__ = ["TraceError", "TraceFormatError", "ModelTopology", "MINI", "FLASH", "topology_preset"]
