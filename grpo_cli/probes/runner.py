"""Probe a training step: spectra and rank measures of every candidate gradient matrix.

Per-rollout matrices (rollout_group, rollout_batch, score_group, group_batch) come from N x N
Gram matrices in float64 (grpo_cli/probes/gram.py), never from an SVD of a P-wide matrix. Row i
of the advantage-weighted matrix is the gradient of rollout i's loss contribution at the weights
the step's loss was computed at, -sum_t w_it A_it grad log pi(y_it), with w the loss's
aggregation weights (at ratio 1, the PPO-clip gradient); the score control drops A. In a training
run the Grams are taken before the optimizer step (`StepCapture.before_update`), from the
training step's own forward and backward where that is exact (grpo_cli/probes/fused.py), else
from a separate pass. Layer matrices are the captured batch gradients (`layer`), accumulated
updates W_t - W_0 (`update`, read from the optimizer's fp32 master weights where it keeps them)
and accumulated raw gradients sum_t G_t (`grad_sum`, float32, before clipping; what `update` would
be without Adam's per-coordinate normalisation) of selected 2-D weights, decomposed in float64 on
their device: svdvals, or with `probes.layer_spectrum=gram` (the paper presets) the smaller Gram's
eigenvalues (rank_measures.singular_values).
"""

from __future__ import annotations

import math
import re
import statistics
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from grpo_cli.algorithm.optim import keeps_master, master_weight
from grpo_cli.config.errors import ConfigError, InputError
from grpo_cli.config.schema import ProbesConfig
from grpo_cli.measures import (
    RANK_MEASURES,
    TOP_ENERGY_COLUMNS,
    predicted_coherence,
    predicted_rank_measures,
    top_energy_shares,
)
from grpo_cli.probes.cancellation import coherence, mean_cosine
from grpo_cli.probes.composition import (
    composition_applies,
    distinct_rows,
    distinct_spectrum,
    group_composition,
)
from grpo_cli.probes.fused import per_rollout_advantage
from grpo_cli.probes.gradient_stats import (
    gradient_metrics,
    layer_batch_norms,
    layer_squares,
    mismatch_message,
    rollout_rows,
)
from grpo_cli.probes.gram import group_blocks, group_sum_gram, per_rollout_grams
from grpo_cli.probes.per_sample import select_params
from grpo_cli.probes.powerlaw import fit_power_law
from grpo_cli.probes.rank_measures import (
    all_rank_measures,
    singular_values,
    singular_values_from_gram,
)
from grpo_cli.probes.sparsity import (
    changed_entries,
    combined_sparsity,
    gradient_sparsity,
    hoyer_sparsity,
)
from grpo_cli.probes.step import ProbedStep
from grpo_cli.runtime.files import DISK_HINT, UnsafeCheckpointError, load_plain, save_atomic
from grpo_cli.runtime.sharded import whole

PER_ROLLOUT_MATRICES = ("rollout_group", "rollout_batch", "score_group", "group_batch")
# entries of W_t that differ from W_0: in the weights as the model holds them (bf16 when it is
# bf16), in the fp32 masters (empty without them), and in a bf16 round-to-nearest copy of the
# full-precision weights (what bf16 weights would show; arXiv 2511.08567)
CHANGED_COLUMNS = ("changed_frac", "changed_frac_master", "changed_frac_bf16")
# rollout_group rows (and their mean/median): 1^T G 1 / (R tr G), its closed form at the group's
# advantages and mean score cosine (grpo_cli/measures.py: predicted_coherence), that cosine
CANCELLATION_COLUMNS = ("coherence", "pred_coherence", "score_cosine")
FUSED_GRAM = ("auto", "always", "never")  # probes.fused_gram
KNOWN_MATRICES = PER_ROLLOUT_MATRICES + ("layer", "update", "grad_sum")


@dataclass
class ProbeRows:
    ranks: list[dict] = field(default_factory=list)  # rows of ranks.csv
    spectra: list[dict] = field(default_factory=list)  # rows of spectra.parquet
    metrics: dict = field(default_factory=dict)  # probe columns of metrics.csv
    grad_norms: list[dict] = field(default_factory=list)  # rows of grad_norms.csv


def mean_abs_cosine(gram: torch.Tensor) -> float:  # gram [R, R]
    """Mean |cos| between distinct rows, read off their Gram matrix (NaN when undefined)."""
    norms = gram.diagonal().clamp(min=0).sqrt()  # [R]
    keep = norms > 0
    if int(keep.sum()) < 2:
        return float("nan")
    sub = gram[keep][:, keep] / torch.outer(norms[keep], norms[keep])
    off = ~torch.eye(sub.shape[0], dtype=torch.bool, device=sub.device)
    return float(sub[off].abs().mean())


def nonzero_advantage_rows(
    advantages: torch.Tensor, completion_mask: torch.Tensor  # [N, L] each
) -> torch.Tensor:  # [N] bool
    """Rollouts with a non-zero advantage on some completion token: the non-zero rows of the
    advantage-weighted matrices (ranks.csv `n_nonzero_rows`)."""
    return ((advantages != 0) & (completion_mask > 0)).any(dim=-1)


def _check_selection(matrices: set[str], layer_params: dict, gram_params: dict, probes_cfg,
                     model: torch.nn.Module) -> None:
    """A regex that selects no parameter would record rank 0 for every probe: refuse it."""
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    example = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    if matrices & set(PER_ROLLOUT_MATRICES) and not gram_params:
        raise ConfigError(
            f"probes.param_regex={probes_cfg.param_regex!r} matches no trainable parameter "
            f"(names look like: {example})"
        )
    if matrices & {"layer", "update", "grad_sum"} and not layer_params:
        raise ConfigError(
            f"probes.layer_regex={probes_cfg.layer_regex!r} matches no trainable 2-D weight "
            f"(names look like: {example})"
        )


def check_matrices(matrices) -> None:
    """probes.matrices names only KNOWN_MATRICES (grpo run's ProbeSuite, the TRL callback)."""
    unknown = sorted(set(matrices) - set(KNOWN_MATRICES))
    if unknown:
        raise ConfigError(f"probes.matrices: unknown {unknown}; known: {', '.join(KNOWN_MATRICES)}")


class ProbeSuite:
    """Which matrices to probe, when, and the reference weights W_0 for the update matrices."""

    def __init__(self, probes_cfg: ProbesConfig | DictConfig, model: torch.nn.Module, initial_path: Path,
                 optimizer: torch.optim.Optimizer | None = None, problem_steps: list[int] | None = None):
        check_matrices(probes_cfg.matrices)
        if probes_cfg.fused_gram not in FUSED_GRAM:
            raise ConfigError(
                f"probes.fused_gram: {probes_cfg.fused_gram!r}; known: {', '.join(FUSED_GRAM)}"
            )
        if isinstance(probes_cfg, DictConfig):  # a ProbesConfig: record reads it per group and layer
            probes_cfg = OmegaConf.to_object(probes_cfg)  # (~25 us an attribute as a DictConfig)
        self.cfg = probes_cfg
        self.matrices = set(probes_cfg.matrices)
        self._hooks_verified = False  # the Gram hooks' consistency check passed once (rollout_grams)
        # per-rollout Grams from the training pass (fused.py) until the hooks fail there once
        self.fuse_training_pass = probes_cfg.fused_gram != "never" and probes_cfg.gram_method != "per_sample"
        pattern = re.compile(probes_cfg.layer_regex)
        self.layer_params = {
            name: p
            for name, p in model.named_parameters()
            if p.requires_grad and p.ndim == 2 and pattern.search(name)
        }
        self.gram_params = select_params(model, probes_cfg.param_regex)
        _check_selection(self.matrices, self.layer_params, self.gram_params, probes_cfg, model)
        self.optimizer = optimizer  # where fp32 master weights live (None: the parameters)
        # checked steps of each training problem's reference solution (ranks.csv problem_steps)
        self.problem_steps = problem_steps
        self.initial = self._initial_layers(initial_path)
        self.grad_sum: dict[str, torch.Tensor] = {}  # name -> sum_t G_t, float32 on the device
        self._captured: dict[str, torch.Tensor] = {}
        # grad_sparsity / grad_hoyer of the last measured batch gradient (NaN: none measured)
        self._sparsity = dict.fromkeys(("grad_sparsity", "grad_hoyer"), math.nan)
        # (names, ||p.grad||^2 [P'] float64 on the device) over gram_params with a gradient, taken
        # before the update (capture_layer_grads); None: not captured since the last record
        self._probed_squares: tuple[list[str], torch.Tensor] | None = None

    def _initial_layers(self, path: Path) -> dict[str, torch.Tensor]:
        if "update" not in self.matrices:
            return {}
        if path.exists():
            return self._read_initial_layers(path)
        initial = {name: p.detach().to("cpu", copy=True) for name, p in self.layer_params.items()}
        save_atomic(initial, path, "probes' initial layers", DISK_HINT)
        return initial

    def _read_initial_layers(self, path: Path) -> dict[str, torch.Tensor]:
        """W_0 saved by an earlier start of this run, as tensors only (weights_only: nothing in
        it runs); InputError names the file if it is damaged or holds other layers."""
        try:
            initial = load_plain(path)
        except UnsafeCheckpointError:
            raise
        except Exception as error:  # torch raises many types for a damaged or foreign file
            cause = f"{type(error).__name__}: {error}".strip().splitlines()[0].split(". ")[0]
            raise InputError(f"{path}: unreadable ({cause}); delete it and re-run to save it "
                             "again from the model's initial weights") from None
        shapes = {name: tuple(p.shape) for name, p in self.layer_params.items()}
        saved = ({name: tuple(t.shape) for name, t in initial.items() if isinstance(t, torch.Tensor)}
                 if isinstance(initial, dict) else None)
        if saved != shapes:
            raise InputError(f"{path}: not this model's initial layers (probes.layer_regex selects "
                             f"{len(shapes)} weights); delete it and re-run to save it again")
        return initial

    def rounded_update_layers(self) -> list[str]:
        """Weights whose `update` would include bf16 rounding (no fp32 master for them)."""
        if "update" not in self.matrices:
            return []
        return [name for name, p in self.layer_params.items()
                if p.dtype != torch.float32 and not keeps_master(self.optimizer, p)]

    def accumulate_gradients(self) -> None:
        """Called after every backward pass (StepCapture.after_backward, and the TRL callback):
        grad_sum += G_t."""
        for name, p in self.layer_params.items():
            if p.grad is None:
                continue
            if name not in self.grad_sum:
                self.grad_sum[name] = torch.zeros_like(p, dtype=torch.float32)
            self.grad_sum[name].add_(p.grad)

    def state_dict(self) -> dict:
        return {"grad_sum": {name: t.cpu() for name, t in self.grad_sum.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.grad_sum = {name: t.to(self.layer_params[name].device, torch.float32)
                         for name, t in state.get("grad_sum", {}).items()}

    @property
    def hooks_verified(self) -> bool:
        """Whether the Gram hooks' consistency check has passed once with no parameter falling
        back to per_sample; the separate pass skips the check (and its weight gradients) from then on."""
        return self._hooks_verified

    def hooks_passed(self) -> None:
        """The hooks' consistency check passed (on the training pass: StepCapture)."""
        self._hooks_verified = True

    def fall_back_to_separate_pass(self) -> None:
        """A use the training pass's hooks missed: every later probe takes the separate pass."""
        self.fuse_training_pass = False
        warnings.warn("probes: per-rollout factors of the training pass failed their check; "
                      "using a separate pass", stacklevel=3)

    @property
    def per_rollout_matrices(self) -> bool:
        """Whether a probed matrix is per-rollout (PER_ROLLOUT_MATRICES: from the rows' Grams)."""
        return bool(self.matrices & set(PER_ROLLOUT_MATRICES))

    def due(self, step: int, total_steps: int) -> bool:
        every = self.cfg.every
        return every > 0 and (step % every == 0 or step == total_steps - 1)

    def sparsity_due(self, step: int) -> bool:
        """Whether step `step` measures its gradient's sparsity off a probe step
        (probes.sparsity_every; claim 3's trend test wants a point at every step)."""
        every = self.cfg.sparsity_every
        return every > 0 and step % every == 0

    def measure_sparsity(self) -> dict[str, float]:
        """After backward, before the optimizer step: grad_sparsity and grad_hoyer of the batch
        gradient over the probed parameters (probes.param_regex), the measures claim 3 reads."""
        grads = [p.grad for p in self.gram_params.values() if p.grad is not None]
        measured = combined_sparsity(grads, self.cfg.sparsity_rtol) if grads else {}
        self._sparsity = {"grad_sparsity": measured.get("sparsity", math.nan),
                          "grad_hoyer": measured.get("hoyer", math.nan)}
        return dict(self._sparsity)

    def capture_layer_grads(self) -> dict[str, torch.Tensor]:
        """Called after backward, before the optimizer step: batch gradients (for `layer`) and
        sparsity. Under FSDP2 (DTensor `.grad`, one shard per process) the norms, sparsity and
        layer gradients are reduced or gathered whole here, so every process calls it
        (collectives, in the same order) and `record`, on one process, reads plain tensors."""
        self.measure_sparsity()
        names = [name for name, p in self.gram_params.items() if p.grad is not None]
        squares = [self.gram_params[name].grad.detach().double().square().sum() for name in names]
        # kept on the device: `record` reads them with the Grams (no host read here)
        self._probed_squares = (names, whole(torch.stack(squares)) if squares
                                else torch.zeros(0, dtype=torch.float64))
        if "layer" not in self.matrices:  # only `layer` reads them
            return {}
        return {
            name: whole(p.grad.detach()).to(torch.float64, copy=True)
            for name, p in self.layer_params.items()
            if p.grad is not None
        }

    def record(self, step: int, output: ProbedStep, model: torch.nn.Module) -> ProbeRows:
        rows = ProbeRows()
        rows.metrics = dict(self._sparsity)
        captured, self._probed_squares = self._probed_squares, None
        names, squares = captured if captured is not None else ([], None)
        squares = None if squares is None else squares.cpu()  # [P'] ||G_p||^2, one host read
        if self.per_rollout_matrices:
            probed = math.nan if squares is None else float(squares.sum().sqrt())  # no grad at all: 0
            self._per_rollout(step, output, model, rows, probed)
        if squares is not None and squares.numel():  # the batch gradient per layer (grad_norms.csv)
            layer_rows, share = layer_batch_norms(step, names, squares)
            rows.grad_norms.extend(layer_rows)
            rows.metrics.update(share)
        if "layer" in self.matrices:
            for name, grad in output.layer_grads.items():
                self._layer_row(step, "layer", name, grad, rows)
        if "update" in self.matrices:
            changed_total = dict.fromkeys(CHANGED_COLUMNS, 0.0)  # entries, over every layer
            for name, param in self.layer_params.items():
                current = master_weight(self.optimizer, param).detach()
                # on the weights' device: a paper-scale layer's spectrum there, not on the host's CPU
                initial = self.initial[name].to(current.device)  # W_0 moved once for both uses
                delta = current.to(torch.float64, copy=True).sub_(initial)  # one float64 copy
                changed = self._changed(param, initial)
                for column, fraction in changed.items():  # NaN (no master somewhere) stays NaN
                    changed_total[column] += fraction * param.numel()
                self._layer_row(step, "update", name, delta, rows, **changed)
            size = sum(p.numel() for p in self.layer_params.values())
            rows.metrics.update({f"update_{column}": total / size for column, total in changed_total.items()})
        if "grad_sum" in self.matrices:
            for name, total in self.grad_sum.items():
                self._layer_row(step, "grad_sum", name, total, rows)
        return rows

    # ---- per-rollout matrices ------------------------------------------------------------------
    def _per_rollout(self, step: int, output: ProbedStep, model, rows: ProbeRows,
                     probed_norm: float) -> None:
        batch, weights = output.batch, output.loss_weights
        size = batch.group_size
        grams = output.rollout_grams or self.rollout_grams(step, batch, weights, output.advantages, model)
        full = grams["advantage"]  # [N, N]
        nonzero = nonzero_advantage_rows(output.advantages, batch.completion_mask)  # [N] bool
        self._gradient_statistics(step, grams, nonzero, output, rows, probed_norm)
        if "rollout_batch" in self.matrices:
            self._add(rows, step, "rollout_batch", "all", singular_values_from_gram(full),
                      coherence=coherence(full), n_nonzero_rows=int(nonzero.sum()))
        if "group_batch" in self.matrices:
            self._add(rows, step, "group_batch", "all", singular_values_from_gram(group_sum_gram(full, size)),
                      n_nonzero_rows=int(nonzero.reshape(-1, size).any(1).sum()))
        score_blocks = grams.get("score_blocks")  # [B, R, R]
        if not self.needs_score:
            return
        completion = batch.input_ids.reshape(-1, size, batch.input_ids.shape[-1])  # [B, R, L]
        completion_mask = batch.completion_mask.reshape(-1, size, batch.completion_mask.shape[-1])
        inverses = [distinct_rows(tokens, mask) for tokens, mask in zip(completion, completion_mask,
                                                                          strict=True)]  # [R] each
        if "rollout_group" in self.matrices:
            self._groups(step, "rollout_group", group_blocks(full, size), output, rows, score_blocks,
                         inverses)
        if "score_group" in self.matrices:
            self._groups(step, "score_group", score_blocks, output, rows, None, inverses)

    def _gradient_statistics(self, step: int, grams: dict, nonzero: torch.Tensor,
                             output: ProbedStep, rows: ProbeRows, probed: float) -> None:
        """The gradient columns of metrics.csv and the rows of grad_norms.csv, from K_adv and its
        per-parameter diagonals alone (grpo_cli/probes/gradient_stats.py). The trainer's norm
        (`probed`, read before the update) is compared where the trainer says it is the rows' sum
        (`ProbedStep.row_sum_rtol`) and K is exact (not sketched)."""
        full = grams["advantage"]  # [N, N]
        rtol = None if self.cfg.gram_method == "sketch" else output.row_sum_rtol
        size = output.batch.group_size
        metrics = gradient_metrics(full, nonzero, size, probed, rtol)
        if metrics["grad_norm_mismatch"] == 1.0:
            warnings.warn(mismatch_message(step, metrics, rtol), stacklevel=2)
        rows.metrics.update(metrics)
        squares = {"all": full.detach().double().diagonal().cpu()}
        if grams.get("param_diagonals") is not None:  # [P, N]
            squares.update(layer_squares(list(self.gram_params), grams["param_diagonals"]))
        per_rollout = per_rollout_advantage(output.advantages, output.batch.completion_mask)  # [N] | None
        rows.grad_norms.extend(rollout_rows(step, squares, size, output.scored.rewards.tolist(),
                                            None if per_rollout is None else per_rollout.tolist()))

    def param_diagonals(self, diagonals: dict[str, torch.Tensor], num_rows: int, device) -> torch.Tensor:
        """{name: K_adv's diagonal over that parameter [N]} as [P, N], rows in gram_params order
        (zeros where absent), the form the TRL callback's processes sum."""
        out = torch.zeros(len(self.gram_params), num_rows, dtype=torch.float64, device=device)
        for k, name in enumerate(self.gram_params):
            if name in diagonals:
                out[k] = diagonals[name].to(device, torch.float64)
        return out

    @property
    def needs_score(self) -> bool:
        """Whether a matrix reads the score rows' group blocks."""
        return bool(self.matrices & {"score_group", "rollout_group"})

    def rollout_grams(self, step, batch, weights, advantages, model,
                      params: dict | None = None, own: set[str] | None = None) -> dict[str, torch.Tensor]:
        """{"advantage": K_adv [N, N], "score_blocks": K_score's group blocks [B, R, R]} from a
        separate pass: Grams of the advantage-weighted and plain score rows, over `params`
        (default: every parameter of probes.param_regex; both Grams are sums over parameters, so
        shares over disjoint parameter sets add up to the whole, as the TRL callback's processes do).
        `own`: of those, the parameters whose Grams are computed; the others are differentiated
        all the same (an FSDP2 run's processes must run the same backward, `hooked_grams`).

        When every rollout's tokens share one advantage a_i (outcome estimators), the rows are
        a_i times the score rows, so K_adv = (a a^T) * K_score exactly and one backward pass
        serves both; per-token advantages (ppo, process, otb) need their own pass.

        Only the groups with a non-zero advantage run (the rows of the others are zero in K_adv,
        and no matrix reads their score blocks, which are NaN): on the CPU presets that is often
        half the batch or less.
        """
        size, n = batch.group_size, batch.num_rollouts
        per_rollout = per_rollout_advantage(advantages, batch.completion_mask)  # [N] or None
        nonzero = nonzero_advantage_rows(advantages, batch.completion_mask)  # [N]
        if self.needs_score:  # every row of an informative group (its score block is read)
            keep = nonzero.reshape(-1, size).any(1).repeat_interleave(size)  # [N]
        else:  # only K_adv is read: the zero-advantage rows can go too
            keep = nonzero
        rows = keep.nonzero().flatten().to(batch.input_ids.device)  # [M]
        advantage = torch.zeros(n, n, dtype=torch.float64, device=batch.input_ids.device)
        score = torch.full_like(advantage, math.nan)
        params = self.gram_params if params is None else params
        diagonals = advantage.new_zeros(len(self.gram_params), n)  # [P, N] (param_diagonals)
        if rows.numel():
            weights, advantages = weights[rows], advantages[rows]
            coeffs = {"score": weights}
            if per_rollout is None:
                coeffs["advantage"] = -(weights * advantages)
            results = per_rollout_grams(
                model, batch.input_ids[rows], batch.attention_mask[rows], coeffs,
                params, method=self.cfg.gram_method, sketch_dim=self.cfg.sketch_dim, seed=step,
                row_chunk=self.cfg.gram_row_chunk, check=not self._hooks_verified, per_param=True,
                own=own,
            )  # one forward per row chunk, shared by the coefficient sets
            self._note_hook_check(next(iter(results.values())).methods)
            grams = {key: result.gram for key, result in results.items()}  # each [M, M] float64
            per_param = results["advantage" if per_rollout is None else "score"].per_param
            scale = None
            if per_rollout is not None:
                scale = per_rollout[rows.to(per_rollout.device)].double().to(grams["score"].device)
                grams["advantage"] = torch.outer(scale, scale) * grams["score"]
            for k, name in enumerate(self.gram_params):
                if name in per_param:  # K_adv's diagonal over this parameter, [M]
                    diagonal = per_param[name].diagonal() * (1.0 if scale is None else scale.square())
                    diagonals[k, rows.to(diagonals.device)] = diagonal.to(diagonals.device)
            index = (rows.unsqueeze(1), rows.unsqueeze(0))
            advantage[index] = grams["advantage"].to(advantage.device)
            score[index] = grams["score"].to(score.device)
        return {"advantage": advantage, "score_blocks": group_blocks(score, size),
                "param_diagonals": diagonals}

    def _note_hook_check(self, methods: dict[str, str]) -> None:
        """The hooks' consistency check depends on the model's structure only: once every hooked
        parameter has passed it (`methods`: the method each parameter's Gram used; empty: no pass
        ran, nothing was checked), later probes skip it (and the weight gradients)."""
        if methods:
            fell_back = self.cfg.gram_method != "per_sample" and "per_sample" in methods.values()
            self._hooks_verified = not fell_back

    def score_rows_gram(self, step, batch, weights, rows: torch.Tensor, model) -> torch.Tensor:
        """K_score [M, M] of the given rows (whole groups) from a separate pass."""
        rows = rows.to(batch.input_ids.device)
        result = per_rollout_grams(
            model, batch.input_ids[rows], batch.attention_mask[rows], {"score": weights[rows]},
            self.gram_params, method=self.cfg.gram_method, sketch_dim=self.cfg.sketch_dim,
            seed=step, row_chunk=self.cfg.gram_row_chunk, check=not self._hooks_verified,
        )["score"]
        return result.gram

    def _groups(self, step, matrix, blocks, output: ProbedStep, rows: ProbeRows, score_blocks,
                inverses: list[torch.Tensor]) -> None:
        """One row per informative group, then mean/median aggregates over them."""
        batch = output.batch
        size = batch.group_size
        correct = output.scored.correct.reshape(-1, size)  # [B, R]
        per_rollout = per_rollout_advantage(output.advantages, batch.completion_mask)  # [N] | None
        rollout_advantages = None if per_rollout is None else per_rollout.reshape(-1, size)  # [B, R]
        # zero-advantage groups have a zero matrix in rollout_group, kept out of the SVD; the
        # score_group control covers the same groups
        nonzero = nonzero_advantage_rows(output.advantages, batch.completion_mask).reshape(-1, size)  # [B, R]
        kept = [index for index in range(blocks.shape[0]) if bool(nonzero[index].any())]
        zero_groups = blocks.shape[0] - len(kept)
        sigmas = singular_values_from_gram(blocks[kept]) if kept else None  # [G, R]
        group_rows = []
        for sigma, index in zip(sigmas if kept else [], kept, strict=True):
            minority, majority = group_composition(correct[index])
            inverse = inverses[index]  # [R]
            extras = {
                "minority": minority,
                "majority": majority,
                "distinct": int(inverse.max()) + 1 if inverse.numel() else 0,
                "mean_abs_cosine": mean_abs_cosine(
                    score_blocks[index] if score_blocks is not None else blocks[index]
                ),
                "n_nonzero_rows": int(nonzero[index].sum()),
            }
            if matrix == "rollout_group":  # cancellation (grpo_cli/probes/cancellation.py)
                extras["coherence"] = coherence(blocks[index])
                if rollout_advantages is not None and score_blocks is not None:
                    extras["score_cosine"] = mean_cosine(score_blocks[index])
                    extras["pred_coherence"] = predicted_coherence(
                        rollout_advantages[index].cpu().numpy(),
                        0.0 if math.isnan(extras["score_cosine"]) else extras["score_cosine"],
                    )
            if self.problem_steps is not None and len(batch.problem_indices) == blocks.shape[0]:
                extras["problem_steps"] = self.problem_steps[batch.problem_indices[index]]
            # closed forms only where their assumptions hold (grpo_cli/probes/composition.py)
            if (
                matrix == "rollout_group"
                and rollout_advantages is not None
                and composition_applies(rollout_advantages[index], correct[index])
            ):
                rtol = self.cfg.rank_rtol
                predicted = predicted_rank_measures(minority, majority, rtol)
                extras.update({f"pred_{name}": value for name, value in predicted.items()})
                over_distinct = distinct_spectrum(rollout_advantages[index], inverse)  # [U]
                extras.update(
                    {
                        f"pred_distinct_{name}": value
                        for name, value in all_rank_measures(over_distinct, rtol).items()
                    }
                )
            keep_spectrum = index < self.cfg.max_groups_saved
            group_rows.append(
                self._add(rows, step, matrix, f"g{index}", sigma, spectrum=keep_spectrum, **extras)
            )
        rows.ranks.extend(_group_aggregates(step, matrix, size, zero_groups, group_rows))

    # ---- layer matrices ------------------------------------------------------------------------
    def _changed(self, param: torch.Tensor, initial: torch.Tensor) -> dict[str, float]:
        """Fraction of `param`'s entries changed since W_0 (`initial`), per CHANGED_COLUMNS (NaN:
        no master)."""
        size = max(param.numel(), 1)
        master = master_weight(self.optimizer, param) if keeps_master(self.optimizer, param) else None
        full = param if master is None else master  # the full-precision weights
        return {
            "changed_frac": changed_entries(param, initial) / size,
            "changed_frac_master": math.nan if master is None else changed_entries(master, initial) / size,
            "changed_frac_bf16": changed_entries(full, initial, torch.bfloat16) / size,
        }

    def _layer_row(self, step: int, matrix: str, name: str, tensor: torch.Tensor, rows: ProbeRows,
                   **extras):
        device = tensor.device if tensor.is_cuda else "cpu"
        sigma = singular_values(tensor.to(device, torch.float64), self.cfg.layer_spectrum).cpu()
        alpha, r2 = fit_power_law(sigma, rtol=self.cfg.rank_rtol)
        self._add(
            rows, step, matrix, "all", sigma, layer=name,
            sparsity=gradient_sparsity(tensor, self.cfg.sparsity_rtol),
            hoyer=hoyer_sparsity(tensor),
            powerlaw_alpha=alpha, powerlaw_r2=r2, **extras,
        )

    def _add(self, rows: ProbeRows, step, matrix, group, sigma, layer="", spectrum=True, **extras):
        sigma = sigma.detach().double().cpu()
        row = {"step": step, "matrix": matrix, "layer": layer, "group": group,
               "n_rows": int(sigma.numel())}
        row.update(all_rank_measures(sigma, self.cfg.rank_rtol))
        row.update(top_energy_shares(sigma.numpy()))  # SALT's top-k shared directions
        row.update(extras)
        rows.ranks.append(row)
        if spectrum:
            rows.spectra.extend(
                {"step": step, "matrix": matrix, "layer": layer, "group": group, "k": k + 1,
                 "sigma": float(value)}
                for k, value in enumerate(sigma.tolist())
            )
        return row


def _group_aggregates(step: int, matrix: str, size: int, zero_groups: int,
                      group_rows: list[dict]) -> list[dict]:
    """The "mean" and "median" rows over one matrix's per-group rows (NaN where no group was
    informative; a cancellation column only where some group has it)."""
    out = []
    for aggregate, reduce in (("mean", statistics.fmean), ("median", statistics.median)):
        row = {"step": step, "matrix": matrix, "layer": "", "group": aggregate,
               "n_rows": size, "n_zero_groups": zero_groups}
        for column in (*RANK_MEASURES, *TOP_ENERGY_COLUMNS, "n_nonzero_rows"):
            values = [r[column] for r in group_rows]
            row[column] = reduce(values) if values else float("nan")
        for column in CANCELLATION_COLUMNS:
            values = [r[column] for r in group_rows if not math.isnan(r.get(column, math.nan))]
            if values:
                row[column] = reduce(values)
        out.append(row)
    return out
