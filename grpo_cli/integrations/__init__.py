"""Probes for runs trained by other libraries (TRL's GRPOTrainer), writing grpo-cli's results."""
