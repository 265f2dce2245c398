"""A PyTorch LLaDA2-MoE model (HF parameter names), its checkpoint loader and block-diffusion decoding."""
