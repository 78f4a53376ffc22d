"""The output head in float32 against bf16 autocast (model.autocast_head) on a large vocabulary.

One head pass as the trainer does it: hidden states [tokens, width] times the head's weight
[vocab, width], float32 log-softmax, the sampled tokens' log-probs, backward to both. Prints the
median time of each mode and how far bf16's log-probs and gradients are from float32's.
Defaults: Nemotron-Mini-4B's head (width 3072, vocabulary 256,000), 4096 tokens.

    python scripts/bench_head.py --device cuda          # the figure issue 45 asks for
    python scripts/bench_head.py --tokens 64 --vocab 4096 --width 64   # a CPU smoke run
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def head_pass(hidden: torch.Tensor, weight: torch.Tensor, tokens: torch.Tensor, bf16: bool):
    hidden = hidden.detach().requires_grad_(True)
    weight = weight.detach().requires_grad_(True)
    with torch.autocast(hidden.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = hidden @ weight.T
    logprobs = torch.log_softmax(logits.float(), dim=-1).gather(1, tokens[:, None]).squeeze(1)
    logprobs.sum().backward()
    return logprobs.detach(), hidden.grad, weight.grad


def timed(fn, device: torch.device, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--width", type=int, default=3072)
    parser.add_argument("--vocab", type=int, default=256_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    device = torch.device(args.device)
    generator = torch.Generator(device="cpu").manual_seed(0)
    hidden = torch.randn(args.tokens, args.width, generator=generator).to(device)
    weight = (torch.randn(args.vocab, args.width, generator=generator) * args.width ** -0.5).to(device)
    tokens = torch.randint(args.vocab, (args.tokens,), generator=generator).to(device)
    results = {}
    for name, bf16 in (("fp32", False), ("bf16", True)):
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        times = timed(lambda bf16=bf16: head_pass(hidden, weight, tokens, bf16), device, args.repeats)
        peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
        results[name] = head_pass(hidden, weight, tokens, bf16)
        print(f"{name} head: median {1000 * statistics.median(times):.1f} ms "
              f"({', '.join(f'{1000 * t:.1f}' for t in times)}), peak {peak:.1f} GiB")
    (lp32, gh32, gw32), (lp16, gh16, gw16) = results["fp32"], results["bf16"]
    rel = lambda a, b: float((a - b).norm() / b.norm())  # noqa: E731
    print(f"bf16 against fp32: log-prob max |diff| {float((lp16 - lp32).abs().max()):.4f} nats, "
          f"mean {float((lp16 - lp32).abs().mean()):.4f}; gradient relative error hidden "
          f"{rel(gh16, gh32):.4f}, weight {rel(gw16, gw32):.4f}")
    print(f"shape: {args.tokens} tokens x width {args.width} x vocabulary {args.vocab}, {device}")


if __name__ == "__main__":
    main()
