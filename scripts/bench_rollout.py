"""Rollout throughput: Hugging Face `generate`, grpo-cli's hf_static loop and the vLLM backend,
same model, prompts and sampling settings.

Builds a randomly initialised char-level Llama locally (no hub), samples B prompts x R completions
with both backends, and reports generated tokens per second (tokens through EOS, not padding).
Both sides return per-token log-probs, as a rollout must. Run it in the vLLM environment:

    bash scripts/setup_vllm_env.sh
    OMP_NUM_THREADS=1 .venv-vllm/bin/python scripts/bench_rollout.py --size tiny --out bench.csv
    OMP_NUM_THREADS=1 .venv-vllm/bin/python scripts/bench_rollout.py --size small --out bench.csv
"""

from __future__ import annotations

import argparse
import csv
import os
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

SIZES = {  # name -> (hidden, layers, heads, intermediate); head_dim 32 or 64 (vLLM CPU attention)
    "tiny": (128, 2, 4, 256),
    "small": (512, 8, 8, 1408),
}


def build_char_llama(directory: str, hidden: int, layers: int, heads: int, intermediate: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    from grpo_cli.models.char_tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()  # the tokenizer grpo-cli's own char models use
    tokenizer.save_pretrained(directory)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(directory)
    return tokenizer, model.eval()


def make_prompts(tokenizer, count: int) -> list[list[int]]:
    texts = [f"{a}+{a + 6}*{a}-{a + 6}=" * (1 + a % 3) for a in range(1, count + 1)]
    return [[tokenizer.bos_token_id] + tokenizer(text).input_ids for text in texts]


def hf_rollout(model, prompts, settings, pad_id: int, seed: int) -> tuple[int, torch.Tensor]:
    """Sample with model.generate (left-padded batch) plus the sampled tokens' log-probs."""
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    attention_mask = (
        torch.arange(width) >= torch.tensor([width - len(p) for p in prompts])[:, None]
    ).long()
    torch.manual_seed(seed)
    greedy = settings.temperature == 0
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            do_sample=not greedy,
            temperature=None if greedy else settings.temperature,
            top_p=None if greedy else settings.top_p,
            top_k=None,
            max_new_tokens=settings.max_new_tokens,
            num_return_sequences=settings.group_size,
            pad_token_id=pad_id,
            return_dict_in_generate=True,
            output_logits=True,
        )
    completions = out.sequences[:, width:]  # [N, T]
    logits = torch.stack(out.logits, dim=1).float()  # [N, T, V] raw logits
    logprobs = logits.log_softmax(-1).gather(-1, completions.unsqueeze(-1)).squeeze(-1)  # [N, T]
    is_eos = completions == model.generation_config.eos_token_id
    counted = (is_eos.cumsum(1) - is_eos.long()) == 0  # through the first EOS; the rest is padding
    return int(counted.sum()), logprobs * counted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny", choices=sorted(SIZES))  # one engine per process
    parser.add_argument("--prompts", type=int, default=8)  # B
    parser.add_argument("--group-size", type=int, default=8)  # R
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="CSV file to append the rows to")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from grpo_cli.rollout.base import SamplingSettings
    from grpo_cli.rollout.static_decode import StaticDecodeBackend
    from grpo_cli.rollout.vllm_backend import VllmBackend

    settings = SamplingSettings(
        group_size=args.group_size,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
    )
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        tokenizer, model = build_char_llama(directory, *SIZES[args.size])
        params = sum(p.numel() for p in model.parameters())
        prompts = make_prompts(tokenizer, args.prompts)
        start = time.perf_counter()
        backend = VllmBackend(directory, dtype="float32", gpu_memory_utilization=0.05)
        init_s = time.perf_counter() - start
        start = time.perf_counter()
        backend.sync_weights(model)  # what the trainer pays after every optimizer step
        sync_s = time.perf_counter() - start
        static = StaticDecodeBackend(model, tokenizer, torch.device("cpu"))
        runs = {
            "hf_generate": lambda seed: hf_rollout(model, prompts, settings, 0, seed)[0],
            "hf_static": lambda seed: int(static.generate(prompts, settings, seed).completion_mask.sum()),
            "vllm": lambda seed: int(
                backend.generate(prompts, settings, seed).completion_mask.sum()
            ),
        }
        for name, run in runs.items():
            run(10_000)  # warm-up
            tokens, seconds = 0, 0.0
            for seed in range(args.repeats):
                start = time.perf_counter()
                tokens += run(seed)
                seconds += time.perf_counter() - start
            rows.append(
                {
                    "backend": name,
                    "model": args.size,
                    "params": params,
                    "prompts": args.prompts,
                    "group_size": args.group_size,
                    "max_new_tokens": args.max_new_tokens,
                    "temperature": args.temperature,
                    "threads": args.threads,
                    "tokens": tokens,
                    "seconds": round(seconds, 3),
                    "tokens_per_s": round(tokens / seconds, 1),
                    "engine_init_s": round(init_s, 1) if name == "vllm" else "",
                    "sync_weights_s": round(sync_s, 3) if name == "vllm" else "",
                }
            )
            print(rows[-1], flush=True)
    if args.out:
        new = not os.path.exists(args.out)
        with open(args.out, "a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            if new:
                writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
