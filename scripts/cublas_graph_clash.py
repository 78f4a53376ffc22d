"""Does this torch let one CUDA graph's destruction free the cuBLAS workspace another one uses?

    python scripts/cublas_graph_clash.py            # on a CUDA machine, ~10 s
    python scripts/cublas_graph_clash.py --dry-run  # anywhere: the plan, nothing run

pytorch/pytorch#193402: `torch.cuda.graph` captures every graph on one shared stream, torch
caches one cuBLAS workspace per (handle, stream), so a later graph embeds the workspace an earlier
capture allocated; destroying the earlier graph releases that stream's workspaces
(pytorch/pytorch#175276), and the memory can go to new tensors while the later graph still writes
its GEMM scratch there. grpo-cli's CUDA-graph decode brackets each capture with
`graph_decode.clear_cublas_workspaces` against this (a suspect of the H200 NaN,
docs/gpu_report_2026-11-28b_H200.md).

Twice, once as torch does it (`plain`) and once bracketed like the decoder (`bracketed`): capture
graph A, then graph B, of a split-K-shaped GEMM (16 x 65536 by 65536 x 16: cuBLAS takes a
workspace for it); destroy A; return the freed memory to the device; fill new tensors with a
sentinel; replay B; count the sentinel entries B's replay overwrote, and check B's product. One
line per mode: `plain: overwritten N, product ok|WRONG`. N > 0 in `plain` confirms the clash on
this torch; `bracketed` should read 0 and ok.
"""

from __future__ import annotations

import argparse
import gc
import sys

ROWS, INNER = 16, 65536  # a GEMM with a long inner dimension: split-K, with a workspace
SENTINEL = 7.0


def one_mode(bracketed: bool) -> str:
    import torch

    from grpo_cli.rollout.graph_decode import clear_cublas_workspaces

    generator = torch.Generator(device="cuda").manual_seed(0)
    left = torch.randn(ROWS, INNER, device="cuda", generator=generator)
    right = torch.randn(INNER, ROWS, device="cuda", generator=generator)

    def capture():
        out = torch.empty(ROWS, ROWS, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.matmul(left, right, out=out)  # warm-up, as the decoder does
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        if bracketed:
            clear_cublas_workspaces()
        with torch.cuda.graph(graph):
            torch.matmul(left, right, out=out)
        if bracketed:
            clear_cublas_workspaces()
        return graph, out

    first, _ = capture()
    survivor, out = capture()
    del first
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    sentinels = ([torch.full((8 << 20,), SENTINEL, device="cuda") for _ in range(16)]  # 16 x 32 MiB
                 + [torch.full((1 << 18,), SENTINEL, device="cuda") for _ in range(64)])  # 64 x 1 MiB
    out.zero_()
    for _ in range(3):
        survivor.replay()
    torch.cuda.synchronize()
    overwritten = sum(int((sentinel != SENTINEL).sum()) for sentinel in sentinels)
    expected = (left.double() @ right.double()).float()
    ok = torch.allclose(out, expected, rtol=1e-3, atol=1e-2)
    return f"overwritten {overwritten}, product {'ok' if ok else 'WRONG'}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    args = parser.parse_args(argv)
    if args.dry_run:
        print(f"plan: capture two graphs of a {ROWS}x{INNER} @ {INNER}x{ROWS} GEMM on torch.cuda.graph's "
              "stream, destroy the first, replay the second over fresh sentinel tensors; modes plain, bracketed")
        return
    import torch

    if not torch.cuda.is_available():
        sys.exit("cublas_graph_clash.py needs a CUDA device (--dry-run shows the plan)")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for mode in ("plain", "bracketed"):
        print(f"{mode}: {one_mode(mode == 'bracketed')}", flush=True)


if __name__ == "__main__":
    main()
