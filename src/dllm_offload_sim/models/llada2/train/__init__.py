"""Training a small LLaDA2-topology dLLM with the masked block-diffusion objective (see README.md)."""
