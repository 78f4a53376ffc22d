"""Time the per-rollout Gram routes on a ~1M-parameter Llama (CPU by default).

    OMP_NUM_THREADS=1 python scripts/bench_gram.py [--rollouts 32] [--tokens 48] [--device cpu]

Prints seconds per call and the largest entrywise deviation from the naive reference.

    OMP_NUM_THREADS=1 python scripts/bench_gram.py --memory --row-chunks 0,8,2 [--vocab 32000]

Sketch Gram with `row_chunk` rollouts per forward/backward (0 = all at once): seconds per call
and peak memory, each setting in a fresh process; peak RSS above the process's RSS before the
call on CPU, `torch.cuda.max_memory_allocated` above the allocation before it on CUDA.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import time

import torch

from grpo_cli.config.schema import ModelConfig
from grpo_cli.models.warm_start import build_char_llama
from grpo_cli.probes.gram import ghost_gram, naive_gram, sketch_gram


def tiny_llama(dtype: torch.dtype, vocab: int = 512) -> torch.nn.Module:
    """grpo-cli's char Llama builder at ~1M parameters (4 blocks of width 128, untied lm_head);
    no pad id (LlamaConfig's bos 1 and eos 2), as the Grams are taken over random ids."""
    shape = ModelConfig(name="bench_gram", hidden_size=128, num_layers=4, num_heads=4,
                        intermediate_size=352, max_positions=256)
    return build_char_llama(shape, vocab, pad_id=None, bos_id=1, eos_id=2).to(dtype).eval()


def padded_batch(rollouts: int, tokens: int, vocab: int, device: str):
    """Left-padded prompts (tokens // 3 columns), right-padded completions, random coefficients."""
    gen = torch.Generator().manual_seed(0)
    prompt_len = tokens // 3
    input_ids = torch.randint(1, vocab, (rollouts, tokens), generator=gen)  # [N, L]
    attention_mask = torch.ones_like(input_ids)
    for i in range(rollouts):
        attention_mask[i, : i % prompt_len] = 0  # left padding of the prompt
        attention_mask[i, tokens - (i % (tokens - prompt_len)) :] = 0  # right padding of completion
    input_ids = input_ids * attention_mask
    completion = attention_mask.clone()
    completion[:, :prompt_len] = 0
    coeff = torch.randn(rollouts, tokens, generator=gen) * completion  # [N, L]
    return input_ids.to(device), attention_mask.to(device), coeff.to(device)


def timed(fn, repeats: int):
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        out = fn()
    return (time.perf_counter() - start) / repeats, out


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _chunked_sketch(args, row_chunk: int, queue) -> None:
    """In a fresh process: (seconds per call, peak MiB above the start, K) of one setting."""
    torch.set_num_threads(1 if args.device == "cpu" else torch.get_num_threads())
    torch.manual_seed(0)
    model = tiny_llama(getattr(torch, args.dtype), args.vocab).to(args.device)
    batch = padded_batch(args.rollouts, args.tokens, model.config.vocab_size, args.device)
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start_mib = torch.cuda.memory_allocated() / 2**20
    else:
        start_mib = _rss_mib()

    def call():
        out = sketch_gram(model, *batch, sketch_dim=args.sketch_dim, row_chunk=row_chunk)
        if cuda:
            torch.cuda.synchronize()
        return out

    seconds, res = timed(call, args.repeats)
    if cuda:
        peak_mib = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10  # KiB on Linux
    queue.put((seconds, peak_mib - start_mib, res.gram.cpu().numpy()))  # numpy: pickled


def memory_table(args) -> None:
    context = multiprocessing.get_context("spawn")
    rows, reference = [], None
    for row_chunk in (int(c) for c in args.row_chunks.split(",")):
        queue = context.Queue()
        child = context.Process(target=_chunked_sketch, args=(args, row_chunk, queue))
        child.start()
        seconds, peak_mib, gram = queue.get()
        gram = torch.from_numpy(gram)
        child.join()
        reference = gram if reference is None else reference
        deviation = float((gram - reference).abs().max() / reference.abs().max())
        rows.append((row_chunk, seconds, peak_mib, deviation))
    kind = "CUDA allocated" if args.device.startswith("cuda") else "RSS"
    print(f"sketch k={args.sketch_dim}: peak {kind} above the start of the call; "
          f"max|dK|/max|K| against row_chunk={rows[0][0]}")
    for row_chunk, seconds, peak_mib, deviation in rows:
        print(f"  row_chunk={row_chunk:<4} {seconds:8.3f} s  peak +{peak_mib:8.1f} MiB  "
              f"{deviation:.1e}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--sketch-dim", type=int, default=1024)
    parser.add_argument("--memory", action="store_true", help="chunked sketch: time and memory")
    parser.add_argument("--row-chunks", default="0,8,2", help="with --memory: settings to run")
    args = parser.parse_args()
    if args.memory:
        memory_table(args)
        return
    torch.manual_seed(0)
    model = tiny_llama(getattr(torch, args.dtype), args.vocab).to(args.device)
    batch = padded_batch(args.rollouts, args.tokens, model.config.vocab_size, args.device)
    print(
        f"params {sum(p.numel() for p in model.parameters()):,}  N={args.rollouts}  "
        f"L={args.tokens}  device={args.device}  dtype={args.dtype}"
    )
    t_ref, ref = timed(lambda: naive_gram(model, *batch), args.repeats)
    scale = float(ref.gram.abs().max())
    print(f"naive (per_sample)   {t_ref:8.3f} s")
    for route in ("auto", "ghost", "materialize"):
        t, res = timed(lambda route=route: ghost_gram(model, *batch, route=route), args.repeats)
        err = float((res.gram - ref.gram).abs().max()) / scale
        print(f"ghost route={route:<11} {t:8.3f} s  x{t_ref / t:5.1f}  max|dK|/max|K| {err:.1e}")
    t, res = timed(lambda: sketch_gram(model, *batch, sketch_dim=args.sketch_dim), args.repeats)
    err = float((res.gram - ref.gram).norm() / ref.gram.norm())
    print(
        f"sketch k={args.sketch_dim:<10} {t:8.3f} s  x{t_ref / t:5.1f}  ||dK||_F/||K||_F {err:.2f}"
    )


if __name__ == "__main__":
    main()
