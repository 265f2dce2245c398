"""Profiles a GPU host into a hardware profile: ``python -m profiler`` (needs torch; CUDA for a real profile)."""
