"""Coral: serve many LLMs on heterogeneous cloud GPUs at the lowest cost that meets every SLO."""

__version__ = "0.1.0"
