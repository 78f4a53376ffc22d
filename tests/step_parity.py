"""One GRPO step on a tiny random model, and its loss and gradients, for speed-up parity tests."""

from __future__ import annotations

import torch

from grpo_cli.bench.builder import build_setup
from grpo_cli.config.compose import compose_config

# The reference: plain training forward, fp32.
PLAIN = ["train.shared_prompt_forward=false", "model.autocast=none"]

# device=cpu: parity to 1e-5 is a CPU fp32 claim (with device=auto a CUDA machine loads bf16).
TINY = [
    "experiment=smoke", "device=cpu", "probes.every=0", "progress=false", "model.name=bench_tiny",
    "model.hidden_size=32", "model.num_layers=2", "model.num_heads=4",
    "model.intermediate_size=64", "model.warm_start.steps=0", "rollout.prompts_per_step=3",
    "rollout.group_size=4", "rollout.max_new_tokens=10", "task.train_size=50",
]


def parity_reward(text: str, problem) -> float:
    """Any reward that varies within groups, so advantages (and gradients) are not all zero."""
    return float(sum(map(ord, text)) % 3 == 0)


def setup_for(cache_dir, *overrides):
    cfg = compose_config(TINY + PLAIN + [f"cache_dir={cache_dir}"] + list(overrides))
    setup = build_setup(cfg, log=lambda message: None)
    setup.task.reward = parity_reward
    return setup


class GradientSnapshot:
    """A `ProbeCapture` (grpo_cli/train/step_data.py) that copies every .grad before the update."""

    training_pass = False
    unshare_prompts = False

    def __init__(self, model):
        self.model = model
        self.grads: dict[str, torch.Tensor] = {}

    def micro_batch(self, rows):
        raise AssertionError("training_pass is False")

    def before_update(self, batch, advantages, loss_weights, fused):
        for name, p in self.model.named_parameters():
            self.grads[name] = p.grad.detach().clone()
        return {}, {}

    def after_backward(self):
        pass

    def after_update(self):
        return None


def step_loss_and_grads(setup, step: int = 0):
    snapshot = GradientSnapshot(setup.model)
    output = setup.trainer.step(step, capture=snapshot)
    return output.metrics["loss"], snapshot.grads, output


def assert_same_update(reference, candidate, rtol=1e-5):
    loss_a, grads_a, out_a = reference
    loss_b, grads_b, out_b = candidate
    assert torch.equal(out_a.batch.input_ids, out_b.batch.input_ids)  # identical inputs
    assert out_a.advantages.abs().sum() > 0  # a real gradient, not an all-zero one
    assert abs(loss_a - loss_b) <= rtol * max(abs(loss_a), 1e-12)
    for name, grad in grads_a.items():
        scale = grad.norm().clamp(min=1e-12)
        assert (grads_b[name] - grad).norm() <= rtol * scale, name
    assert sum(grad.norm() for grad in grads_a.values()) > 0


def relative_gap(reference: torch.Tensor, candidate: torch.Tensor) -> float:
    return float((candidate - reference).norm() / reference.norm().clamp(min=1e-30))


class GradForwards:
    """Counts the model's forwards that run with autograd (a torch forward hook, while open)."""

    def __init__(self, model):
        self.model, self.count = model, 0

    def __enter__(self) -> GradForwards:
        def hook(module, args, output):
            self.count += torch.is_grad_enabled()
        self.handle = self.model.get_decoder().register_forward_hook(hook)
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()
