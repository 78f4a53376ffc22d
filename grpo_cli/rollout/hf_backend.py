"""Rollouts with Hugging Face `generate` (the CPU backend; also works on CUDA).

Sampling is from the policy itself: top-k is off, so with temperature 1 and top-p 1 the sampler's
log-probs are the policy's. The returned log-probs are always those of the untempered policy
(log-softmax of the raw logits), the quantity the importance ratio and the mismatch guard need.
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig

from grpo_cli.rollout.base import SamplingSettings
from grpo_cli.rollout.batch import RolloutBatch, assemble_batch, left_pad
from grpo_cli.rollout.stop_tokens import is_stop


def completion_mask_through_eos(completion_ids: torch.Tensor, stop_ids: int | list[int]) -> torch.Tensor:
    """1 on every completion token up to and including the first stop token, 0 after. [N, T] float."""
    is_eos = is_stop(completion_ids, stop_ids)  # [N, T]
    eos_before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()  # EOS strictly before t
    return (eos_before == 0).float()


class HFGenerateBackend:
    """Batched sampling with `model.generate`; shares weights with the policy (no sync needed)."""

    def __init__(self, model: torch.nn.Module, tokenizer, device: torch.device,
                 stop_ids: list[int] | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.stop_ids = stop_ids or [tokenizer.eos_token_id]  # stop_tokens.py

    def sync_weights(self, model: torch.nn.Module) -> None:
        self.model = model

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], settings: SamplingSettings, generator_seed: int
    ) -> RolloutBatch:
        pad_id, stop_ids = self.tokenizer.pad_token_id, self.stop_ids
        expanded = [prompt for prompt in prompts for _ in range(settings.group_size)]
        prompt_ids, prompt_mask = left_pad(expanded, pad_id)
        prompt_ids, prompt_mask = prompt_ids.to(self.device), prompt_mask.to(self.device)
        greedy = settings.temperature <= 0
        config = GenerationConfig(
            do_sample=not greedy,
            temperature=None if greedy else settings.temperature,
            top_p=None if greedy else settings.top_p,
            top_k=None,
            max_new_tokens=settings.max_new_tokens,
            eos_token_id=stop_ids if len(stop_ids) > 1 else stop_ids[0],
            pad_token_id=pad_id,
            return_dict_in_generate=True,
            output_logits=True,
        )
        torch.manual_seed(generator_seed)  # generate draws from the global RNG
        was_training = self.model.training
        self.model.eval()
        output = self.model.generate(
            input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=config
        )
        self.model.train(was_training)
        prompt_length = prompt_ids.shape[1]
        completion_ids = output.sequences[:, prompt_length:]  # [N, T]
        # One step at a time: a stacked [N, T, V] float32 copy would take N x T x V x 4 bytes
        # (33.5 GB at 64 x 512 x 256000); generate itself keeps every step's [N, V] logits.
        logprobs = torch.stack([
            torch.log_softmax(step_logits.float(), dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
            for step_logits, tokens in zip(output.logits, completion_ids.unbind(1), strict=True)
        ], dim=1)  # [N, T]
        completion_mask = completion_mask_through_eos(completion_ids, stop_ids)  # [N, T]
        texts = self.tokenizer.batch_decode(
            [row[mask.bool()] for row, mask in zip(completion_ids, completion_mask, strict=True)],
            skip_special_tokens=True,
        )
        return assemble_batch(
            prompt_ids, prompt_mask, completion_ids, completion_mask, logprobs,
            settings.group_size, texts, pad_id=pad_id,
        )
