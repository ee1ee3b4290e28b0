"""gpuenv: one spec per project for GPU containers."""

__version__ = "0.1.0"
