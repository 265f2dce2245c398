"""dllm-offload-sim: trace-driven simulation and real-GPU validation of MoE expert offloading in diffusion LLMs.

Packages, bottom layer first (no import runs up): ``traces`` (the trace format), ``policies`` (pure residency
policies), ``costmodel`` (profiled costs), ``wiring`` (configs to objects), ``sim`` (the SimPy simulator) and
``models`` (LLaDA2 in PyTorch), ``runtime`` (the GPU offloading runtime), ``profiler``, ``validate``.
"""
