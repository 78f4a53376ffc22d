"""Training figures: held-out accuracy and reward, and training dynamics with alarms."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from grpo_cli.analysis.load import Run
from grpo_cli.analysis.style import (
    Styles,
    band,
    draw_alarms,
    empty_figure,
    new_figure,
    no_data,
    r_color,
)
from grpo_cli.analysis.tables import (
    NOISE_WINDOW,
    REWARD_WINDOW,
    RUNNING_MEDIAN,
    SCALED_BY_ROLLOUTS,
    accuracy_curve,
    curves,
    reward_curve,
    run_meta,
)

# drawn over zero_variance_frac: the per-prompt expectation and the batch-rate lower bound
EXPECTED_ZERO_VARIANCE = {
    "expected_zero_variance_frac": "--",
    "expected_zero_variance_frac_batch": ":",
}
NO_DATA_HINTS = {"kl": "\n(e.g. no reference model: algorithm.kl_coef = 0)"}
DYNAMICS = {
    "grad_sparsity": "gradient sparsity (fraction)",
    "entropy": "token entropy (nats)",
    "zero_variance_frac": "zero-variance groups (fraction)",
    "kl": "KL to reference (nats)",
    "groups_all_wrong": "all-wrong groups (fraction)",
    "groups_all_right": "all-right groups (fraction)",
}


def _long(runs: list[Run], curve_of) -> pd.DataFrame:
    parts = []
    for run in runs:
        curve = curve_of(run)
        if len(curve):
            parts.append(
                pd.DataFrame(
                    {
                        "step": curve["step"].to_numpy(),
                        "x": curve["step"].to_numpy(),
                        "value": curve.iloc[:, 1].to_numpy(),
                    }
                ).assign(**run_meta(run))
            )
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def accuracy_figure(runs: list[Run], styles: Styles, title: str) -> Figure:
    panels = [
        (
            _long(runs, accuracy_curve),
            "held-out accuracy (fraction)",
            "held-out accuracy (eval.csv)",
        ),
        (
            _long(runs, reward_curve),
            f"training reward (rolling mean, {REWARD_WINDOW} steps)",
            "training reward (metrics.csv reward_mean)",
        ),
    ]
    if all(table.empty for table, _, _ in panels):
        return empty_figure(f"{title}: accuracy and reward", "no eval.csv or metrics.csv data")
    grid = new_figure(1, 2, width=5.2, height=3.8)
    sizes = set()
    for ax, (table, ylabel, panel_title) in zip(grid.axes[0], panels, strict=True):
        if table.empty:
            no_data(ax)
            continue
        for (size, variant), curve in curves(table, []).groupby(["group_size", "variant"]):
            band(ax, curve, r_color(size), styles.line(variant), styles.label(size, variant))
            sizes.add(size)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.set_title(panel_title, fontsize=10)
        ax.grid(alpha=0.3)
    handles = styles.legend_handles(sizes)
    return grid.finish(
        f"{title}: held-out accuracy and training reward (mean over seeds, band: min-max)", handles
    )


def dynamics_figure(
    metrics_x: pd.DataFrame, alarms: pd.DataFrame, styles: Styles, title: str, xlabel: str
) -> Figure:
    """grad_sparsity, entropy, zero_variance_frac (expected value dashed), kl and the all-wrong
    and all-right group shares vs step/progress."""
    if metrics_x.empty:
        return empty_figure(f"{title}: training dynamics", "no metrics.csv data")
    data = curves(metrics_x, ["metric"])
    grid = new_figure(3, 2, width=5.2, height=3.4)
    for ax, (metric, ylabel) in zip(
        [a for row in grid.axes for a in row], DYNAMICS.items(), strict=True
    ):
        panel = data[data["metric"] == metric]
        if panel.empty:
            no_data(ax, f"no {metric} values in metrics.csv" + NO_DATA_HINTS.get(metric, ""))
            ax.set_title(metric, fontsize=10)
            continue
        for (size, variant), curve in panel.groupby(["group_size", "variant"]):
            band(ax, curve, r_color(size), styles.line(variant), styles.label(size, variant))
        if metric == "zero_variance_frac":
            for expected_metric, ls in EXPECTED_ZERO_VARIANCE.items():
                expected = data[data["metric"] == expected_metric]
                for (size, _), curve in expected.groupby(["group_size", "variant"]):
                    ax.plot(
                        curve["x"], curve["mean"], color=r_color(size), ls=ls, lw=1.0, alpha=0.8
                    )
        draw_alarms(ax, alarms)
        ax.set_title(metric, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    handles = styles.legend_handles(data["group_size"].unique(), alarms=not alarms.empty)
    handles += [
        Line2D([], [], color="0.3", ls="--", lw=1.0, label="expected, mean of p_b^R + (1-p_b)^R"),
        Line2D([], [], color="0.3", ls=":", lw=1.0, label="lower bound, batch p^R + (1-p)^R"),
    ]
    return grid.finish(f"{title}: training dynamics (mean over seeds, band: min-max)", handles)


# metrics.csv's gradient statistics (probe steps; docs/results.md "Gradient statistics"), as
# drawn: per-rollout norms times N, the noise scales as running medians on a log axis
# (grpo_cli/analysis/tables.py gradient_table)
GRADIENTS = {
    "grad_norm_rollout_median_times_n": "N x per-rollout gradient norm, median",
    "grad_norm_rollout_cv": "per-rollout norm, coefficient of variation",
    "grad_norm_batch_gram": "batch gradient norm, sqrt(1'K1)",
    "grad_snr": "gradient SNR, N / B_simple",
    "grad_noise_scale_running_median": f"B_simple (rollouts), median of {NOISE_WINDOW} probes",
    "grad_noise_scale_groups_running_median": f"B_simple (prompts), median of {NOISE_WINDOW} probes",
    "grad_norm_layer_max_share": "largest layer's share of ||G||^2",
}
LOG_PANELS = ("grad_noise_scale_running_median", "grad_noise_scale_groups_running_median")
# drawn over grad_norm_batch_gram: the trainer's own norm; marked: steps flagged as disagreeing
GRADIENT_OVERLAYS = ("grad_norm_probed", "grad_norm_mismatch")
# the metrics.csv columns gradient_table reads for them
GRADIENT_COLUMNS = (*SCALED_BY_ROLLOUTS, *RUNNING_MEDIAN, "grad_norm_rollout_cv", "grad_norm_batch_gram",
                    "grad_snr", "grad_norm_layer_max_share", *GRADIENT_OVERLAYS)


def gradients_figure(metrics_x: pd.DataFrame, styles: Styles, title: str, xlabel: str) -> Figure:
    """The per-rollout Gram's gradient statistics vs step/progress (`metrics_x`: gradient_table's
    GRADIENTS and GRADIENT_OVERLAYS rows); the trainer's norm dashed over the Gram's, steps where
    they disagree beyond round-off marked x; the noise scales on a log axis."""
    if metrics_x.empty or not metrics_x["metric"].isin(list(GRADIENTS)).any():
        return empty_figure(f"{title}: gradient statistics",
                            "no gradient statistics in metrics.csv (no per-rollout matrix probed)")
    data = curves(metrics_x, ["metric"])
    grid = new_figure(4, 2, width=5.2, height=3.4)
    axes = [a for row in grid.axes for a in row]
    for ax in axes[len(GRADIENTS):]:
        ax.remove()
    for ax, (metric, ylabel) in zip(axes, GRADIENTS.items(), strict=False):
        panel = data[data["metric"] == metric]
        ax.set_title(metric, fontsize=10)
        if panel.empty:
            no_data(ax, f"no {metric} values in metrics.csv")
            continue
        for (size, variant), curve in panel.groupby(["group_size", "variant"]):
            band(ax, curve, r_color(size), styles.line(variant), styles.label(size, variant))
        if metric in LOG_PANELS:
            ax.set_yscale("log")
        if metric == "grad_norm_batch_gram":
            for (size, _), curve in data[data["metric"] == "grad_norm_probed"].groupby(["group_size", "variant"]):
                ax.plot(curve["x"], curve["mean"], color=r_color(size), ls="--", lw=1.0, alpha=0.8)
            flagged = metrics_x[(metrics_x["metric"] == "grad_norm_mismatch") & (metrics_x["value"] > 0)]
            at = panel.drop_duplicates("x").set_index("x")["mean"]
            xs = [x for x in flagged["x"].unique() if x in at.index]
            ax.plot(xs, at.loc[xs].to_numpy(), "x", color="red", ms=8, ls="none")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    handles = styles.legend_handles(data["group_size"].unique())
    handles += [
        Line2D([], [], color="0.3", ls="--", lw=1.0, label="trainer's norm over the probed parameters"),
        Line2D([], [], color="red", marker="x", ls="none", label="norms disagree (grad_norm_mismatch)"),
    ]
    return grid.finish(f"{title}: gradient statistics from the per-rollout Gram "
                       "(mean over seeds, band: min-max)", handles)
