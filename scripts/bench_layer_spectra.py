"""Seconds of one layer spectrum (the probes' `layer`, `update` and `grad_sum` matrices) by each
`probes.layer_spectrum` route, at a preset's shapes, and how far the two routes' values are apart.

    python scripts/bench_layer_spectra.py --shapes nemotron_4b --device cuda --out spectra.csv
    python scripts/bench_layer_spectra.py --shapes smollm2 --threads 2

`nemotron_4b` is what `paper_gsm8k`'s `probes.layer_regex` selects in each of layers 0, 15 and 31
(q_proj 3072 x 3072, v_proj 1024 x 3072, down_proj 3072 x 9216); a probe step decomposes each
of those nine three times (layer, update, grad_sum). `tiny` leaves out lm_head (its shape depends
on the task's characters). Matrices are random float32, cast to float64 as the probes do; each
route is timed `--repeats` times after one warm-up (the first call on CUDA loads cuSOLVER),
synchronised on CUDA. Routes run one after the other over every shape, in `--methods` order, and
each timing is printed (and appended to `--out`) as soon as it is taken, so a run stopped by a
time limit keeps what it measured; then each route's probe-step total (weights x three ways) and
the routes' largest gap. `--dry-run` checks the arguments without importing torch.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import time
from pathlib import Path

# (rows, columns, how many of the preset's probed weights have that shape)
SHAPES = {
    "nemotron_4b": [(3072, 3072, 3), (1024, 3072, 3), (3072, 9216, 3)],  # paper_gsm8k: layers 0, 15, 31
    "smollm2": [(576, 576, 2), (192, 576, 1), (576, 1536, 1)],  # cpu_smollm2*: layer 29's q, v, o, down
    "tiny": [(64, 64, 8), (192, 64, 4), (64, 192, 2)],  # cpu_rank_collapse: 2 layers' projections
}
WAYS = 3  # each probed weight is decomposed as layer, update and grad_sum
METHODS = ("svd", "gram")  # grpo_cli.probes.rank_measures.SPECTRUM_METHODS (checked in main)
COLUMNS = ("shapes", "device", "method", "rows", "columns", "count", "seconds")  # --out; rows 0: the total


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", choices=sorted(SHAPES), default="nemotron_4b")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads on a CPU (0: torch's default)")
    parser.add_argument("--methods", default="gram,svd",
                        help="routes to time, in order, comma-separated (svd of 3072 x 9216 may take minutes)")
    parser.add_argument("--out", default=None, help="CSV file to append the timings to")
    parser.add_argument("--dry-run", action="store_true", help="check the arguments, run nothing")
    args = parser.parse_args(argv)
    args.methods = [method for method in args.methods.split(",") if method]
    unknown = sorted(set(args.methods) - set(METHODS))
    if unknown or not args.methods:
        parser.error(f"--methods: unknown {', '.join(unknown) or 'none given'}; one of {', '.join(METHODS)}")
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    return args


def append_row(path: str | None, row: dict) -> None:
    if path is None:
        return
    target = Path(path)
    new = not target.exists()
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        if new:
            writer.writeheader()
        writer.writerow(row)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    shapes = SHAPES[args.shapes]
    if args.dry_run:
        print(f"bench_layer_spectra: {args.shapes} on {args.device}, {', '.join(args.methods)}, "
              f"{args.repeats} repeats, {len(shapes)} shapes")
        return
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    from grpo_cli.probes.rank_measures import SPECTRUM_METHODS, singular_values

    assert set(METHODS) == set(SPECTRUM_METHODS), "METHODS must name the probes' routes"
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    generator = torch.Generator().manual_seed(0)
    matrices = [torch.randn(rows, columns, generator=generator).to(device, torch.float64)
                for rows, columns, _ in shapes]
    values: dict[tuple[str, int], torch.Tensor] = {}
    base = {"shapes": args.shapes, "device": str(device)}
    for method in args.methods:
        total = 0.0
        for index, ((rows, columns, count), matrix) in enumerate(zip(shapes, matrices, strict=True)):
            values[method, index] = singular_values(matrix, method)  # warm-up
            times = []
            for _ in range(args.repeats):
                sync()
                start = time.perf_counter()
                singular_values(matrix, method)
                sync()
                times.append(time.perf_counter() - start)
            seconds = statistics.median(times)
            total += count * WAYS * seconds
            print(f"{method}: {rows} x {columns} on {device}: {seconds:.4f} s", flush=True)
            append_row(args.out, {**base, "method": method, "rows": rows, "columns": columns,
                                  "count": count, "seconds": seconds})
        print(f"{method}: a probe step's layer spectra ({args.shapes}: each weight x {WAYS} ways): "
              f"{total:.3f} s", flush=True)
        append_row(args.out, {**base, "method": method, "rows": 0, "columns": 0,
                              "count": sum(count for _, _, count in shapes) * WAYS, "seconds": total})
    if set(args.methods) == set(METHODS):
        gap = max(float((values["gram", i] - values["svd", i]).abs().max() / values["svd", i][0])
                  for i in range(len(shapes)))
        print(f"largest gap between the routes: {gap:.1e} sigma_1")


if __name__ == "__main__":
    main()
