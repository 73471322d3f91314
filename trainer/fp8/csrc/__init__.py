"""CUDA sources of trainer.fp8 built ahead of time (see build.py)."""
