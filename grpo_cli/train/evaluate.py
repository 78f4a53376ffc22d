"""Held-out evaluation: one completion per eval problem, accuracy of the final answers."""

from __future__ import annotations

from grpo_cli.rollout.base import SamplingSettings


def evaluate(backend, tokenizer, task, cfg, seed: int) -> dict:
    """Accuracy on the first `task.eval_size` held-out problems (greedy unless configured)."""
    problems = task.eval
    prompts = [tokenizer(task.prompt(p), add_special_tokens=False)["input_ids"] for p in problems]
    greedy = cfg.eval.greedy
    settings = SamplingSettings(
        group_size=1,
        max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=0.0 if greedy else cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
    )
    batch = backend.generate(prompts, settings, generator_seed=seed)
    correct = [task.reward(text, problem) for text, problem in zip(batch.completions, problems, strict=True)]
    return {"accuracy": sum(correct) / max(len(correct), 1), "n": len(correct), "greedy": greedy}
