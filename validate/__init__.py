"""Real-GPU execution: expert offloading primitives (host experts, GPU slot pool, copy engine,
grouped expert compute, CPU experts, the non-expert layer) and, later, the validator itself.

Everything here also runs on the CPU (``device="cpu"``) so that CI can test its logic.
"""
