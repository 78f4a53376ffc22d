"""What a step costs, measured per named phase: time (timing.py) and peak memory (memory.py).

Below every trainer: grpo-cli's loop, the TRL callback and the benchmarks time with the same
PhaseTimer, so their timings.csv rows mean the same thing.
"""
