"""Seconds of one layer spectrum (the probes' `layer`, `update` and `grad_sum` matrices) by each
`probes.layer_spectrum` route, at a preset's shapes, and how far the two routes' values are apart.

    python scripts/bench_layer_spectra.py --shapes nemotron_4b --device cuda
    python scripts/bench_layer_spectra.py --shapes smollm2 --threads 2

`nemotron_4b` is what `paper_gsm8k`'s `probes.layer_regex` selects in each of layers 0, 15 and 31
(q_proj 3072 x 3072, v_proj 1024 x 3072, down_proj 3072 x 9216); a probe step decomposes each
of those nine three times (layer, update, grad_sum). `tiny` leaves out lm_head (its shape depends
on the task's characters). Matrices are random float32, cast to float64
as the probes do; every route is timed `--repeats` times after one warm-up (the first call on
CUDA loads cuSOLVER), synchronised on CUDA. Prints one line per shape and route and the probe
step's total (nine matrices x three ways) per route.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

# (rows, columns, how many of the preset's probed weights have that shape)
SHAPES = {
    "nemotron_4b": [(3072, 3072, 3), (1024, 3072, 3), (3072, 9216, 3)],  # paper_gsm8k: layers 0, 15, 31
    "smollm2": [(576, 576, 2), (192, 576, 1), (576, 1536, 1)],  # cpu_smollm2*: layer 29's q, v, o, down
    "tiny": [(64, 64, 8), (192, 64, 4), (64, 192, 2)],  # cpu_rank_collapse: 2 layers' projections
}
WAYS = 3  # each probed weight is decomposed as layer, update and grad_sum


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", choices=sorted(SHAPES), default="nemotron_4b")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads on a CPU (0: torch's default)")
    parser.add_argument("--methods", default="svd,gram",
                        help="routes to time, comma-separated (svd of 3072 x 9216 may take minutes)")
    args = parser.parse_args(argv)
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    from grpo_cli.probes.rank_measures import SPECTRUM_METHODS, singular_values

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    methods = [method for method in args.methods.split(",") if method]
    unknown = sorted(set(methods) - set(SPECTRUM_METHODS))
    if unknown:
        parser.error(f"--methods: unknown {', '.join(unknown)}; one of {', '.join(SPECTRUM_METHODS)}")
    generator = torch.Generator().manual_seed(0)
    totals = dict.fromkeys(methods, 0.0)
    for rows, columns, count in SHAPES[args.shapes]:
        matrix = torch.randn(rows, columns, generator=generator).to(device, torch.float64)
        values, seconds = {}, {}
        for method in methods:
            values[method] = singular_values(matrix, method)  # warm-up
            times = []
            for _ in range(args.repeats):
                sync()
                start = time.perf_counter()
                singular_values(matrix, method)
                sync()
                times.append(time.perf_counter() - start)
            seconds[method] = statistics.median(times)
            totals[method] += count * WAYS * seconds[method]
        line = ", ".join(f"{method} {seconds[method]:.4f} s" for method in methods)
        if len(methods) == 2:
            gap = float((values["gram"] - values["svd"]).abs().max() / values["svd"][0])
            line += f"; svd / gram {seconds['svd'] / seconds['gram']:.2f}; max |gap| {gap:.1e} sigma_1"
        print(f"{rows} x {columns} on {device}: {line}", flush=True)
    line = ", ".join(f"{method} {total:.3f} s" for method, total in totals.items())
    print(f"a probe step's layer spectra ({args.shapes}: each weight x {WAYS} ways): {line}")


if __name__ == "__main__":
    main()
