"""Does the simulator predict the hardware? Replay sweeps on a GPU (``dllm-validate``), the fidelity
table, report and figure, re-prediction of stored measurements, and the end-to-end mode (a real model
decoding with offloaded experts)."""
