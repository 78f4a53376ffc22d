"""Time MixedPrecisionAdamW's per-parameter loop against its multi-tensor (foreach) path on
SmolLM2-135M-shaped parameters: random tensors of the model's 272 shapes, no model, no download.

    OMP_NUM_THREADS=1 python scripts/bench_optim.py [--device cpu] [--master fp32|none] [--steps 6]

One optimizer, one set of parameters and fixed random gradients; the two paths alternate step by
step (ABBA order) on the same state, so load drifts hit both alike. Prints each path's median and
minimum seconds per step, their ratio, and the ops per step from one profiled step of each path
(on CPU the outermost aten calls that would launch a kernel on a GPU; on CUDA the kernels).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from grpo_cli.algorithm.optim import MixedPrecisionAdamW


def smollm2_135m_shapes(layers: int = 30) -> list[tuple[int, ...]]:
    """SmolLM2-135M's parameter shapes: hidden 576, intermediate 1536, 9 query heads and 3
    key/value heads of 64, vocab 49152, tied embedding (30 layers: 272 tensors, 134.5M)."""
    hidden, intermediate, kv, vocab = 576, 1536, 3 * 64, 49152
    block = [(hidden, hidden), (kv, hidden), (kv, hidden), (hidden, hidden),  # q, k, v, o
             (intermediate, hidden), (intermediate, hidden), (hidden, intermediate),  # MLP
             (hidden,), (hidden,)]  # input and post-attention RMSNorm
    return [(vocab, hidden)] + block * layers + [(hidden,)]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_step(optimizer: MixedPrecisionAdamW, foreach: bool, device: torch.device) -> float:
    optimizer.foreach = foreach
    synchronize(device)
    start = time.perf_counter()
    optimizer.step()
    synchronize(device)
    return time.perf_counter() - start


# aten calls that only make tensor metadata or allocate: no kernel on a GPU
NO_KERNEL = {"aten::view", "aten::slice", "aten::split", "aten::split_with_sizes", "aten::empty",
             "aten::empty_strided", "aten::as_strided", "aten::detach", "aten::alias", "aten::t",
             "aten::reshape", "aten::narrow", "aten::unbind", "aten::lift_fresh"}


def ops_per_step(optimizer: MixedPrecisionAdamW, foreach: bool, device: torch.device) -> int:
    """Outermost aten calls of one step that would run a kernel (CPU), or the CUDA kernels
    launched (CUDA), from the profiler."""
    optimizer.foreach = foreach
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        optimizer.step()
        synchronize(device)
    events = prof.events()
    if device.type == "cuda":
        return sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    return sum(1 for e in events if e.name.startswith("aten::") and e.name not in NO_KERNEL
               and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--master", choices=("fp32", "none"), default="fp32",
                        help="bf16 weights with fp32 masters (the default on CUDA) or stochastic rounding")
    parser.add_argument("--steps", type=int, default=6, help="timed steps per path")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--slice-elements", type=int, default=2**24)
    parser.add_argument("--no-profile", action="store_true", help="skip counting ops per step")
    args = parser.parse_args()
    device = torch.device(args.device)

    generator = torch.Generator().manual_seed(0)
    params = []
    for shape in smollm2_135m_shapes(args.layers):
        param = torch.nn.Parameter((torch.randn(shape, generator=generator) * 0.02)
                                   .to(device, torch.bfloat16))
        param.grad = torch.randn(shape, generator=generator).to(device, torch.bfloat16)
        params.append(param)
    optimizer = MixedPrecisionAdamW(params, lr=1e-6, weight_decay=0.0,
                                    master_params=params if args.master == "fp32" else (),
                                    slice_elements=args.slice_elements)
    elements = sum(p.numel() for p in params)
    print(f"{len(params)} bf16 tensors, {elements / 1e6:.1f}M elements, masters: {args.master}, "
          f"device {device}, torch threads {torch.get_num_threads()}")

    for foreach in (False, True):  # warm-up: the first step allocates the state
        timed_step(optimizer, foreach, device)
    times: dict[bool, list[float]] = {False: [], True: []}
    for index in range(args.steps):
        order = (False, True) if index % 2 == 0 else (True, False)
        for foreach in order:
            times[foreach].append(timed_step(optimizer, foreach, device))
    if not args.no_profile:
        ops = {foreach: ops_per_step(optimizer, foreach, device) for foreach in (False, True)}
    label = {False: "per-parameter", True: "foreach"}
    for foreach in (False, True):
        line = (f"{label[foreach]:>13}: median {statistics.median(times[foreach]):.4f} s, "
                f"min {min(times[foreach]):.4f} s over {args.steps} steps")
        if not args.no_profile:
            kind = "CUDA kernels" if device.type == "cuda" else "aten compute calls"
            line += f"; {ops[foreach]} {kind} per step"
        print(line)
    ratio = statistics.median(times[True]) / statistics.median(times[False])
    print(f"foreach / per-parameter (median): {ratio:.3f}")


if __name__ == "__main__":
    main()
