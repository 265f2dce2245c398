"""Torch models whose MoE routing the project traces."""
