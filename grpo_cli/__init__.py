"""grpo-cli: measure the gradient geometry of GRPO."""

__version__ = "0.1.0"
