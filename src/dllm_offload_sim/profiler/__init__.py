"""Profiles a GPU host into a hardware profile: ``dllm-profile`` (needs torch; CUDA for a real profile)."""
