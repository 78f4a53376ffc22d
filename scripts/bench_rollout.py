"""Rollout throughput: Hugging Face `generate`, grpo-cli's hf_static loop (eager, or in CUDA
graphs with `rollout.cuda_graphs`) and the vLLM backend, same model, prompts and sampling settings.

Builds a randomly initialised char-level Llama locally (no hub), samples B prompts x R completions
with each backend, and reports generated tokens per second (tokens through EOS, not padding).
Every backend returns per-token log-probs, as a rollout must. vLLM runs in its own environment:

    bash scripts/setup_vllm_env.sh
    OMP_NUM_THREADS=1 .venv-vllm/bin/python scripts/bench_rollout.py --size tiny --out bench.csv
    OMP_NUM_THREADS=1 .venv-vllm/bin/python scripts/bench_rollout.py --size small --out bench.csv

Without vLLM, name the backends; on a GPU, e.g. the SmolLM2-135M shape at 64 rows in bf16:

    python scripts/bench_rollout.py --device cuda --dtype bfloat16 --size smollm2 --prompts 8 \
        --group-size 8 --backends hf_generate,hf_static,hf_static_graphs

`smollm2` has SmolLM2-135M's shape and vocabulary size (49,152; ids past the char tokenizer's
decode to nothing), random weights, and an untied output head (163M parameters, not 135M: one
more 49,152 x 576 matrix read per token). `nemotron_4b` is the paper's model class, built from
conf/model/nemotron_4b.config.json with random weights on the device (4.19B parameters, 256,000
ids; nothing is downloaded or written unless vLLM is asked for): the rehearsal's rollout shape is

    python scripts/bench_rollout.py --device cuda --dtype bfloat16 --size nemotron_4b --prompts 8 \
        --group-size 8 --max-new-tokens 512 --repeats 1 --backends hf_static,hf_static_graphs

`nemotron_tiny` is the same config at tiny sizes (the CPU test of that path). `hf_static_graphs` is `rollout.cuda_graphs=true`
(grpo_cli/rollout/graph_decode.py; `--tokens-per-replay` tokens per graph replay); off CUDA it
runs the same step eagerly.

`--train-pass` also times the training pass on the last hf_static batch (or a fresh one): the
training forward `grpo run` uses (grpo_cli/train/policy_forward.py, shared prompts), the clipped
GRPO loss, backward, gradient clipping and the optimizer `grpo run` builds (AdamW, or the
mixed-precision AdamW with fp32 masters for bf16 weights): issue 16's "64 x ~100 tokens" pass.
`--dry-run` checks the arguments and prints what would run, without importing torch.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import tempfile
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")

SIZES = {  # name -> (hidden, layers, heads, kv heads, intermediate, vocab or 0 = the tokenizer's)
    "tiny": (128, 2, 4, 4, 256, 0),  # head_dim 32 or 64 (vLLM CPU attention)
    "small": (512, 8, 8, 8, 1408, 0),  # ~25M, the shape of `grpo bench --model-size 25m`
    "smollm2": (576, 30, 9, 3, 1536, 49152),  # SmolLM2-135M's shape
}
# Nemotron shapes: conf/model/nemotron_4b.config.json with these fields replaced
# (vocab_size 0 = the tokenizer's)
NEMOTRON_SIZES = {
    "nemotron_4b": {},
    "nemotron_tiny": {"hidden_size": 64, "head_dim": 16, "kv_channels": 16, "intermediate_size": 128,
                      "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
                      "vocab_size": 0},
}
NEMOTRON_CONFIG = os.path.join(os.path.dirname(__file__), "..", "conf", "model", "nemotron_4b.config.json")
BACKENDS = ("hf_generate", "hf_static", "hf_static_graphs", "vllm")


def save_char_llama(directory: str, hidden: int, layers: int, heads: int, kv_heads: int,
                    intermediate: int, vocab: int):
    """grpo-cli's char Llama builder (models/warm_start.py) at this shape, random weights, saved
    with the char tokenizer as an HF directory (vLLM loads it from there)."""
    import torch

    from grpo_cli.config.schema import ModelConfig
    from grpo_cli.models.char_tokenizer import build_char_tokenizer
    from grpo_cli.models.warm_start import build_char_llama

    tokenizer = build_char_tokenizer()  # the tokenizer grpo-cli's own char models use
    tokenizer.save_pretrained(directory)
    shape = ModelConfig(name="bench_rollout", hidden_size=hidden, num_layers=layers,
                        num_heads=heads, intermediate_size=intermediate, max_positions=512)
    torch.manual_seed(0)
    model = build_char_llama(shape, max(vocab, len(tokenizer)), tokenizer.pad_token_id,
                             tokenizer.bos_token_id, tokenizer.eos_token_id, num_key_value_heads=kv_heads)
    model.save_pretrained(directory)
    return tokenizer, model.eval()


def build_nemotron(directory: str, fields: dict, device: torch.device, dtype: torch.dtype, save: bool):
    """NemotronForCausalLM from the shipped config.json with `fields` replaced, random weights drawn
    on `device` in `dtype` (no fp32 copy of a 4B model on the host), and the char tokenizer's
    special ids; saved to `directory` only when `save` (what vLLM loads)."""
    import json

    import torch
    from transformers import NemotronConfig, NemotronForCausalLM

    from grpo_cli.models.char_tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    with open(NEMOTRON_CONFIG) as handle:
        values = json.load(handle) | fields
    values["vocab_size"] = values["vocab_size"] or len(tokenizer)
    values.update(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                  eos_token_id=tokenizer.eos_token_id)
    config = NemotronConfig(**{key: value for key, value in values.items() if key != "architectures"})
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = NemotronForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    if save:
        tokenizer.save_pretrained(directory)
        model.save_pretrained(directory)
    return tokenizer, model.eval()


def build_model(size: str, directory: str, device: torch.device, dtype: torch.dtype, save: bool):
    """(tokenizer, model on `device` in `dtype`) for a `--size`."""
    if size in NEMOTRON_SIZES:
        return build_nemotron(directory, NEMOTRON_SIZES[size], device, dtype, save)
    tokenizer, model = save_char_llama(directory, *SIZES[size])
    return tokenizer, model.to(device, dtype)


def make_prompts(tokenizer, count: int) -> list[list[int]]:
    texts = [f"{a}+{a + 6}*{a}-{a + 6}=" * (1 + a % 3) for a in range(1, count + 1)]
    return [[tokenizer.bos_token_id] + tokenizer(text).input_ids for text in texts]


def hf_rollout(model, prompts, settings, pad_id: int, seed: int) -> tuple[int, torch.Tensor]:
    """Sample with model.generate (left-padded batch) plus the sampled tokens' log-probs."""
    import torch

    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    attention_mask = (
        torch.arange(width) >= torch.tensor([width - len(p) for p in prompts])[:, None]
    ).long()
    input_ids, attention_mask = input_ids.to(model.device), attention_mask.to(model.device)
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


def train_pass(model, batch, prompt_keys: list[int], repeats: int) -> list[float]:
    """Seconds of each of `repeats` training passes (after one warm-up) over `batch`: forward
    with shared prompts, the clipped GRPO loss at ratio 1, backward, clipping, optimizer step."""
    import torch

    from grpo_cli.algorithm.loss import policy_loss
    from grpo_cli.algorithm.optim import build_optimizer, master_params
    from grpo_cli.config.schema import ModelConfig, OptimConfig, TrainConfig
    from grpo_cli.train.policy_forward import forward_policy

    optim_cfg = OptimConfig()
    named = list(model.named_parameters())
    master = master_params(named, ModelConfig().master_weights, "")  # bf16 weights: fp32 masters
    optimizer = build_optimizer([p for _, p in named], optim_cfg, seed=0, master=master)
    generator = torch.Generator().manual_seed(0)
    advantages = torch.randn(batch.num_rollouts, 1, generator=generator).to(batch.input_ids.device)
    advantages = advantages.expand_as(batch.completion_mask)  # [N, L]: one value per rollout
    model.train()
    seconds = []
    for repeat in range(repeats + 1):  # the first pass is a warm-up
        if batch.input_ids.is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        logprobs, _, _ = forward_policy(model, batch, shared_prompt_forward=True,
                                        chunk_mb=TrainConfig().logits_chunk_mb,
                                        prompt_keys=prompt_keys)  # [N, L]
        loss, _ = policy_loss(logprobs, logprobs.detach(), advantages, batch.completion_mask)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), optim_cfg.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if batch.input_ids.is_cuda:
            torch.cuda.synchronize()
        if repeat:
            seconds.append(time.perf_counter() - start)
    model.eval()
    return seconds


def device_name(value: str) -> str:
    if value in ("cpu", "cuda") or (value.startswith("cuda:") and value[5:].isdigit()):
        return value
    raise argparse.ArgumentTypeError(f"{value!r} is not cpu, cuda or cuda:N")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny", choices=sorted(SIZES) + sorted(NEMOTRON_SIZES))  # one engine per process
    parser.add_argument("--prompts", type=int, default=8)  # B
    parser.add_argument("--group-size", type=int, default=8)  # R
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", type=device_name)  # vLLM picks its own
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--backends", default="hf_generate,hf_static,vllm",
                        help="comma-separated, from " + ", ".join(BACKENDS))
    parser.add_argument("--tokens-per-replay", type=int, default=8)  # hf_static_graphs: k
    parser.add_argument("--train-pass", action="store_true",
                        help="also time forward + backward + optimizer over one hf_static batch")
    parser.add_argument("--out", default=None, help="CSV file to append the rows to")
    parser.add_argument("--profile", default=None,
                        help="text file: one more repeat of each backend under torch.profiler, as operator tables")
    parser.add_argument("--dry-run", action="store_true",
                        help="check the arguments, print the plan, run nothing")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.backends.split(",")) - set(BACKENDS))
    if unknown:
        parser.error(f"--backends: unknown {', '.join(unknown)} (choose from {', '.join(BACKENDS)})")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    chosen = args.backends.split(",")
    if args.dry_run:
        print(f"bench_rollout: {args.size} on {args.device} ({args.dtype}), {args.prompts} prompts x "
              f"{args.group_size}, {args.max_new_tokens} new tokens, {args.repeats} repeats: "
              + ", ".join(chosen + (["train_pass"] if args.train_pass else [])))
        return
    import torch

    torch.set_num_threads(args.threads)

    from grpo_cli.rollout.base import SamplingSettings
    from grpo_cli.rollout.static_decode import StaticDecodeBackend

    settings = SamplingSettings(
        group_size=args.group_size,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
    )
    device = torch.device(args.device)
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        tokenizer, model = build_model(args.size, directory, device, getattr(torch, args.dtype),
                                       save="vllm" in chosen)
        params = sum(p.numel() for p in model.parameters())
        prompts = make_prompts(tokenizer, args.prompts)
        runs, init_s, sync_s = {}, 0.0, 0.0
        if "hf_generate" in chosen:
            runs["hf_generate"] = lambda seed: hf_rollout(model, prompts, settings, 0, seed)[0]
        if "hf_static" in chosen or args.train_pass:
            static = StaticDecodeBackend(model, tokenizer, device)
        if "hf_static" in chosen:
            runs["hf_static"] = lambda seed: int(static.generate(prompts, settings, seed).completion_mask.sum())
        if "hf_static_graphs" in chosen:
            graphs = StaticDecodeBackend(model, tokenizer, device, cuda_graphs=True,
                                         check_every=args.tokens_per_replay)
            runs["hf_static_graphs"] = lambda seed: int(
                graphs.generate(prompts, settings, seed).completion_mask.sum()
            )
        if "vllm" in chosen:
            from grpo_cli.rollout.vllm_backend import VllmBackend

            start = time.perf_counter()
            backend = VllmBackend(directory, dtype=args.dtype, gpu_memory_utilization=0.05)
            init_s = time.perf_counter() - start
            start = time.perf_counter()
            backend.sync_weights(model)  # what the trainer pays after every optimizer step
            sync_s = time.perf_counter() - start
            runs["vllm"] = lambda seed: int(backend.generate(prompts, settings, seed).completion_mask.sum())
        common = {
            "model": args.size,
            "params": params,
            "device": str(device),
            "dtype": args.dtype,
            "prompts": args.prompts,
            "group_size": args.group_size,
            "max_new_tokens": args.max_new_tokens,
            "temperature": args.temperature,
            "threads": args.threads,
        }
        for name, run in runs.items():
            run(10_000)  # warm-up (and, for hf_static_graphs on CUDA, the graph capture)
            tokens, seconds = 0, 0.0
            for seed in range(args.repeats):
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                tokens += run(seed)  # reads the token count back: the rollout has finished
                seconds += time.perf_counter() - start
            rows.append(
                {
                    "backend": name,
                    **common,
                    "tokens": tokens,
                    "seconds": round(seconds, 3),
                    "seconds_per_repeat": round(seconds / args.repeats, 4),
                    "tokens_per_s": round(tokens / seconds, 1),
                    "engine_init_s": round(init_s, 1) if name == "vllm" else "",
                    "sync_weights_s": round(sync_s, 3) if name == "vllm" else "",
                }
            )
            print(rows[-1], flush=True)
            if args.profile:
                from grpo_cli.bench.profile import profiled

                profiled(lambda run=run: run(args.repeats), args.profile,
                         f"{name}: {args.size}, {args.prompts} x {args.group_size} rows, "
                         f"{args.max_new_tokens} new tokens, {args.dtype}, {args.device}")
        if args.train_pass:
            batch = static.generate(prompts, settings, 0)
            keys = [row // args.group_size for row in range(batch.num_rollouts)]  # row -> prompt
            seconds = train_pass(model, batch, keys, args.repeats)
            if args.profile:
                from grpo_cli.bench.profile import profiled

                profiled(lambda: train_pass(model, batch, keys, 1), args.profile,
                         f"train_pass (a warm-up pass and a timed one): {args.size}, {batch.num_rollouts} rows, "
                         f"{args.dtype}, {args.device}")
            tokens = int(batch.attention_mask.sum())  # prompt and completion tokens of one pass
            rows.append({
                "backend": "train_pass",
                **common,
                "tokens": tokens * args.repeats,
                "seconds": round(sum(seconds), 3),
                "seconds_per_repeat": round(statistics.median(seconds), 4),
                "tokens_per_s": round(tokens * args.repeats / sum(seconds), 1),
                "engine_init_s": "",
                "sync_weights_s": "",
            })
            print(rows[-1], f"({batch.num_rollouts} rows x {batch.input_ids.shape[1]} columns)",
                  flush=True)
    if args.out:
        new = not os.path.exists(args.out)
        with open(args.out, "a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            if new:
                writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
