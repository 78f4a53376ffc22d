"""Effective-rank measures of a spectrum, their names, and their closed-form group predictions;
and the gradient statistics of a per-rollout Gram (norms, noise scale, SNR: the last section).

The one owner of these facts (numpy only, no torch): the probes wrap it for tensors
(grpo_cli/probes/rank_measures.py) and write its values to ranks.csv; results and analysis import
it to name columns, recompute a measure or draw a prediction. docs/results.md defines each one.

Every measure takes sigma, the singular values of a matrix in any order (negatives from
round-off are clamped to 0), and works in float64. A zero or empty spectrum gives 0 for every
measure, never NaN.

Closed form of one group's gradient matrix from its reward composition alone: a group of
R = m + M binary-outcome rollouts, m in the minority and M in the majority, whose score vectors
(per-rollout gradients of log-prob) are orthonormal. A zero-sum advantage (r_i - mean r, with or
without a std division) is proportional to M on every minority row and to -m on every majority
row. Orthonormal rows scaled by a_i have singular values |a_i|, so up to a common scale

    sigma = (M repeated m times, m repeated M times).

From it (sum sigma = 2mM, sum sigma^2 = mMR, sum sigma^4 = mM(M^3 + m^3)):

    erank_entropy       = 2 sqrt(mM)                                (= R when m = M)
    erank_entropy_sq    = (mR/M)^(M/R) * (MR/m)^(m/R)
    stable_rank         = mR/M = m + m^2/M
    participation_ratio = mM R^2 / (M^3 + m^3)
    energy_rank(f)      = ceil(f mR/M)                  if f <= M/R (minority rows suffice)
                          m + ceil(M (fR - M) / m)      otherwise
    numerical_rank      = R (m if m/M <= rtol)

A zero-variance group (m = 0) has a zero matrix: every measure 0.

Cancellation (`predicted_coherence`): rows g_i = a_i s_i with unit score vectors of one pairwise
cosine rho (rho = 0: orthonormal) have 1^T G 1 = (1 - rho) sum a^2 + rho (sum a)^2 and
tr G = sum a^2, so their coherence 1^T G 1 / (R tr G) (grpo_cli/probes/cancellation.py) is

    coherence = ((1 - rho) + rho (sum a)^2 / sum a^2) / R.

A zero-sum advantage (grpo, dr_grpo, rloo; any composition 0 < m) has sum a = 0: coherence
(1 - rho) / R whatever m and M, 1/R for orthonormal scores; the scores' shared component cancels
exactly, so measured values below 1/R are that cancellation. A batch-mean baseline (reinforce,
binary rewards, k of R correct, batch success rate p) has sum a = k - R p and
sum a^2 = k (1 - p)^2 + (R - k) p^2, which do depend on the composition.
"""

from __future__ import annotations

import math

import numpy as np

RANK_MEASURES = (  # the rank columns of ranks.csv, in order
    "erank_entropy",  # exp(H(p)), p_k = sigma_k / sum sigma (Roy & Vetterli 2007)
    "erank_entropy_sq",  # exp(H(p)), p_k = sigma_k^2 / sum sigma^2
    "stable_rank",  # sum sigma^2 / sigma_1^2
    "participation_ratio",  # (sum sigma^2)^2 / sum sigma^4
    "energy_rank_90",  # fewest k holding 90% of sum sigma^2
    "energy_rank_99",  # fewest k holding 99% of sum sigma^2
    "numerical_rank",  # count of sigma_k > rtol * sigma_1
)
MEASURE_LABELS = {  # axis and table labels
    "erank_entropy": "exp-entropy rank (sigma)",
    "erank_entropy_sq": "exp-entropy rank (sigma^2)",
    "stable_rank": "stable rank",
    "participation_ratio": "participation ratio",
    "energy_rank_90": "90% energy rank",
    "energy_rank_99": "99% energy rank",
    "numerical_rank": "numerical rank",
}

# relative slack on the energy threshold: round-off must not push 40% of [0.7] * 5 to k=3
ENERGY_TOLERANCE = 1e-12


def _spectrum(sigma) -> np.ndarray:  # [K] float64, descending, >= 0
    values = np.asarray(sigma, dtype=np.float64).reshape(-1).clip(min=0.0)
    return np.sort(values)[::-1]


def _entropy_rank(weights: np.ndarray) -> float:
    """exp(H(p)) with p = weights / sum(weights); 0 for zero weights."""
    total = weights.sum()
    if total <= 0:
        return 0.0
    p = weights[weights > 0] / total
    return float(np.exp(-(p * np.log(p)).sum()))


def erank_entropy(sigma) -> float:
    """exp(H(p)), p_k = sigma_k / sum sigma (Roy & Vetterli 2007).

    >>> round(erank_entropy([1.0, 1.0, 1.0]), 12)
    3.0
    """
    return _entropy_rank(_spectrum(sigma))


def erank_entropy_sq(sigma) -> float:
    """exp(H(p)), p_k = sigma_k^2 / sum sigma^2 (entropy of the energy distribution)."""
    return _entropy_rank(_spectrum(sigma) ** 2)


def _stable_rank(s: np.ndarray, energy: np.ndarray) -> float:  # s descending, energy = s^2
    if s.size == 0 or s[0] <= 0:
        return 0.0
    return float(energy.sum() / s[0] ** 2)


def stable_rank(sigma) -> float:
    """sum sigma^2 / sigma_1^2 = ||A||_F^2 / ||A||_2^2.

    >>> stable_rank([1.0, 0.0])
    1.0
    """
    s = _spectrum(sigma)
    return _stable_rank(s, s**2)


def _participation_ratio(energy: np.ndarray) -> float:
    fourth = (energy**2).sum()
    if fourth <= 0:
        return 0.0
    return float(energy.sum() ** 2 / fourth)


def participation_ratio(sigma) -> float:
    """(sum sigma^2)^2 / sum sigma^4."""
    return _participation_ratio(_spectrum(sigma) ** 2)


def _energy_rank_of(energy: np.ndarray, fraction: float) -> int:  # energy descending
    total = energy.sum()
    if total <= 0:
        return 0
    threshold = fraction * total * (1.0 - ENERGY_TOLERANCE)
    reached = energy.cumsum() >= threshold  # [K]
    return int(reached.argmax()) + 1


def energy_rank(sigma, fraction: float) -> int:
    """Fewest k with sum_{j<=k} sigma_j^2 >= fraction * sum sigma^2 (descending sigma)."""
    return _energy_rank_of(_spectrum(sigma) ** 2, fraction)


def _numerical_rank(s: np.ndarray, rtol: float) -> int:  # s descending
    if s.size == 0:
        return 0
    return int((s > rtol * s[0]).sum())


def numerical_rank(sigma, rtol: float = 1e-6) -> int:
    """Count of sigma_k > rtol * sigma_1."""
    return _numerical_rank(_spectrum(sigma), rtol)


def rank_measures(sigma, rtol: float = 1e-6) -> dict[str, float]:
    """Every measure of `RANK_MEASURES`, as floats, in that order (one sort of the spectrum)."""
    s = _spectrum(sigma)
    energy = s**2
    return {
        "erank_entropy": _entropy_rank(s),
        "erank_entropy_sq": _entropy_rank(energy),
        "stable_rank": _stable_rank(s, energy),
        "participation_ratio": _participation_ratio(energy),
        "energy_rank_90": float(_energy_rank_of(energy, 0.90)),
        "energy_rank_99": float(_energy_rank_of(energy, 0.99)),
        "numerical_rank": float(_numerical_rank(s, rtol)),
    }


def top1_energy_share(sigma) -> float:
    """sigma_1^2 / sum sigma^2: the share of ||A||_F^2 that the best rank-1 approximation keeps
    (Eckart-Young); 1 / stable_rank, 0 for a zero spectrum. The "rank-1" notion of the update
    (docs/interpreting.md).

    >>> top1_energy_share([3.0, 1.0, 1.0, 1.0])
    0.75
    """
    s = _spectrum(sigma)
    total = float((s**2).sum())
    return float(s[0] ** 2 / total) if total > 0 else 0.0


# trajectory.csv (`grpo trajectory`, grpo_cli/probes/trajectory.py): the update W_t - W_0 over a
# run's kept checkpoints, one row per weight ("all": the selected weights together) and kept step
TRAJECTORY_COLUMNS = ("step", "layer", "update_norm", "rank1_share", "cosine_to_last",
                      "path_rank1_share", "path_linearity")
TOP_ENERGY_K = (1, 2, 3)  # ranks.csv top<k>_energy_share, every row (SALT, arXiv 2606.05800)
TOP_ENERGY_COLUMNS = tuple(f"top{k}_energy_share" for k in TOP_ENERGY_K)


def top_energy_shares(sigma) -> dict[str, float]:
    """E_k = sum_{j<=k} sigma_j^2 / sum sigma^2 for k in TOP_ENERGY_K (descending sigma): the share
    of ||A||_F^2 in the top-k singular directions, the best rank-k approximation's (Eckart-Young);
    its residual 1 - E_k lies outside them. E_k = 1 once k covers the spectrum; 0 for a zero one.

    >>> top_energy_shares([2.0, 1.0, 1.0, 1.0, 1.0])
    {'top1_energy_share': 0.5, 'top2_energy_share': 0.625, 'top3_energy_share': 0.75}
    """
    energy = _spectrum(sigma) ** 2
    total = float(energy.sum())
    cumulative = energy.cumsum()
    return {column: (float(cumulative[min(k, energy.size) - 1]) / total if total > 0 else 0.0)
            for k, column in zip(TOP_ENERGY_K, TOP_ENERGY_COLUMNS, strict=True)}


# a group's summed gradient counts as zero when ||G_b||^2 <= this x R x tr K_b: K's entries come
# from float32 per-rollout gradients, each good to ~eps32 |g_i| |g_j|, so 1^T K_b 1 is known to
# ~eps32 (sum_i |g_i|)^2 <= eps32 R tr K_b; 64 eps32 leaves room for the sums' length
GROUP_SUM_ZERO_RTOL = 64 * 2.0**-23


def group_abs_cosine(gram, group_size: int, zero_rtol: float = GROUP_SUM_ZERO_RTOL) -> float:
    """Mean |cos(G_b, G_c)| over pairs b < c of groups, G_b = sum_{i in b} g_i the group's (one
    prompt's) summed gradient, exact from K [N, N] (rows of a group contiguous): <G_b, G_c> is
    (S K S^T)_bc, S the [B, N] group indicator. 0: the prompts' gradients are orthogonal; 1:
    parallel or opposed ("Why GRPO needs normalization", arXiv 2601.23135, reads its training
    phases off this cross-prompt orthogonality). Groups whose sum is zero (every advantage 0, or
    below `zero_rtol`, above) are left out; NaN with fewer than two left.

    >>> group_abs_cosine([[1.0, 0.0], [0.0, 1.0]], 1), group_abs_cosine([[1.0, -2.0], [-2.0, 4.0]], 1)
    (0.0, 1.0)
    """
    k = np.asarray(gram, dtype=np.float64)
    groups = k.shape[0] // group_size
    blocks = k.reshape(groups, group_size, groups, group_size)
    sums = blocks.sum(axis=(1, 3))  # [B, B]
    traces = np.einsum("bibi->b", blocks)  # [B] tr K_b
    squares = np.diagonal(sums)  # [B] ||G_b||^2
    kept = squares > zero_rtol * group_size * np.clip(traces, 0.0, None)
    if int(kept.sum()) < 2:
        return math.nan
    norms = np.sqrt(squares[kept])
    cosines = sums[np.ix_(kept, kept)] / np.outer(norms, norms)
    return float(np.abs(cosines[np.triu_indices(norms.size, 1)]).mean())


def predicted_coherence(advantages, cosine: float = 0.0) -> float:
    """Coherence of rows a_i s_i for unit score vectors of pairwise cosine `cosine` (module
    docstring); NaN when every a_i is 0.

    >>> predicted_coherence([0.75, -0.25, -0.25, -0.25])  # zero-sum, orthonormal: 1/R
    0.25
    >>> predicted_coherence([1.0, -1.0], cosine=0.5)  # zero-sum: (1 - rho) / R
    0.25
    """
    a = np.asarray(advantages, dtype=np.float64).reshape(-1)
    energy = float((a**2).sum())
    if energy <= 0:
        return math.nan
    return ((1.0 - cosine) + cosine * float(a.sum()) ** 2 / energy) / a.size


# ---- closed forms from the group composition (module docstring) --------------------------------
def _check(minority: int, majority: int) -> None:
    if minority < 0 or majority < minority:
        raise ValueError(f"need 0 <= minority <= majority, got {minority} and {majority}")


def composition_spectrum(minority: int, majority: int) -> np.ndarray:  # [R] float64, descending
    """sigma = (M x m, m x M) for m = minority, M = majority (common scale dropped); zeros if m = 0.

    >>> composition_spectrum(1, 3).tolist()
    [3.0, 1.0, 1.0, 1.0]
    """
    _check(minority, majority)
    if minority == 0:
        return np.zeros(majority)
    return np.array([float(majority)] * minority + [float(minority)] * majority)


def _energy_rank(minority: int, majority: int, fraction: float) -> float:
    """Fewest k whose sigma^2 reach `fraction` of the energy, with the same ENERGY_TOLERANCE."""
    m, M, R = minority, majority, minority + majority
    target = fraction * (1.0 - ENERGY_TOLERANCE) * R  # the threshold in units of m M
    if target <= M:
        return float(math.ceil(target * m / M))
    return float(m + math.ceil(M * (target - M) / m))


def predicted_rank_measures(minority: int, majority: int, rtol: float = 1e-6) -> dict[str, float]:
    """The closed forms of the module docstring, keyed like `rank_measures`.

    >>> predicted_rank_measures(1, 1)["erank_entropy"]
    2.0
    >>> round(predicted_rank_measures(1, 3)["erank_entropy"], 4)  # 2 sqrt(3)
    3.4641
    """
    _check(minority, majority)
    if minority == 0:
        return dict.fromkeys(RANK_MEASURES, 0.0)
    m, M = float(minority), float(majority)
    R = m + M
    return {
        "erank_entropy": 2.0 * math.sqrt(m * M),
        "erank_entropy_sq": math.exp((M / R) * math.log(m * R / M) + (m / R) * math.log(M * R / m)),
        "stable_rank": m * R / M,
        "participation_ratio": m * M * R**2 / (M**3 + m**3),
        "energy_rank_90": _energy_rank(minority, majority, 0.90),
        "energy_rank_99": _energy_rank(minority, majority, 0.99),
        "numerical_rank": R if m / M > rtol else m,
    }


# ---- gradient statistics from a Gram of per-example gradients (docs/results.md) ----------------
# K_ij = <g_i, g_j> for N rows g_i whose weighted sum sum_i w_i g_i is the batch gradient (the
# probes' rows carry the loss's aggregation weights already: w = 1). Everything below is exact in
# K, from float64 sums; nothing needs the P-wide rows.
GRAD_NORM_SUMMARY = ("mean", "median", "min", "max", "cv")  # grad_norm_rollout_<name> columns


def batch_gradient_norm(gram, row_weights=None) -> float:
    """||sum_i w_i g_i|| = sqrt(w^T K w) (w = 1 by default); 0 for an empty K.

    >>> batch_gradient_norm([[1.0, 0.0], [0.0, 1.0]])  # orthonormal rows: sqrt(2)
    1.4142135623730951
    """
    k = _weighted_gram(gram, row_weights)
    return math.sqrt(max(float(k.sum()), 0.0))


def _weighted_gram(gram, row_weights) -> np.ndarray:  # [N, N] float64: diag(w) K diag(w)
    k = np.asarray(gram, dtype=np.float64)
    if row_weights is None:
        return k
    w = np.asarray(row_weights, dtype=np.float64).reshape(-1)
    return k * np.outer(w, w)


def rollout_gradient_norms(gram) -> np.ndarray:  # [N] float64
    """||g_i|| = sqrt(K_ii), negative round-off clamped to 0."""
    return np.sqrt(np.clip(np.diagonal(np.asarray(gram, dtype=np.float64)), 0.0, None))


def norm_summary(norms) -> dict[str, float]:
    """mean, median, min, max and coefficient of variation (population std / mean) of norms;
    NaN for no norms, cv NaN for a zero mean.

    >>> norm_summary([1.0, 3.0])["cv"]
    0.5
    """
    x = np.asarray(norms, dtype=np.float64).reshape(-1)
    if x.size == 0:
        return dict.fromkeys(GRAD_NORM_SUMMARY, math.nan)
    mean = float(x.mean())
    return {"mean": mean, "median": float(np.median(x)), "min": float(x.min()), "max": float(x.max()),
            "cv": float(x.std()) / mean if mean > 0 else math.nan}


def gradient_noise(gram, row_weights=None) -> tuple[float, float]:
    """(|G|^2, tr Sigma), unbiased from N per-example gradients (McCandlish et al. 2018, "An
    Empirical Model of Large-Batch Training", App. A's two-batch estimators with B_small = 1 and
    B_big = N), the examples x_i = N w_i g_i whose mean is
    the batch gradient sum_i w_i g_i. With K' = diag(w) K diag(w):

        tr Sigma = N (N tr K' - 1^T K' 1) / (N - 1)     (sample variance of the x_i, summed)
        |G|^2    = N (1^T K' 1 - tr K') / (N - 1)       (|mean x|^2 - tr Sigma / N)

    |G|^2 may come out negative when the signal is below the noise. NaN for N < 2.

    >>> gradient_noise([[1.0, 1.0], [1.0, 1.0]])  # identical rows: no noise
    (4.0, 0.0)
    >>> gradient_noise([[1.0, 0.0], [0.0, 1.0]])  # orthonormal rows: no signal
    (0.0, 4.0)
    """
    k = _weighted_gram(gram, row_weights)
    n = k.shape[0]
    if n < 2:
        return math.nan, math.nan
    trace, total = float(np.trace(k)), float(k.sum())
    return n * (total - trace) / (n - 1), n * (n * trace - total) / (n - 1)


def noise_scale(gram, row_weights=None) -> float:
    """B_simple = tr Sigma / |G|^2 (McCandlish et al. 2018), in examples (rows of K):
    the batch size at which the batch gradient's noise equals its signal. NaN where the
    unbiased |G|^2 is not positive (signal not resolved at this batch) or N < 2.

    >>> noise_scale([[4.0, 2.0], [2.0, 4.0]])  # |G|^2 = 8, tr Sigma = 8
    1.0
    """
    signal, noise = gradient_noise(gram, row_weights)
    return noise / signal if signal > 0 else math.nan


def gradient_snr(gram, row_weights=None) -> float:
    """Signal-to-noise ratio of the batch gradient, |G|^2 / (tr Sigma / N) = N / B_simple: the
    squared norm of the expected gradient over the summed variance of the batch mean (Sigma / N);
    negative when the unbiased |G|^2 is (signal below its own sampling error). NaN for N < 2 or
    tr Sigma = 0 with |G|^2 = 0; +inf for noiseless rows.

    >>> gradient_snr([[4.0, 2.0], [2.0, 4.0]])
    2.0
    """
    signal, noise = gradient_noise(gram, row_weights)
    n = np.asarray(gram).shape[0]
    if math.isnan(signal) or (noise == 0 and signal == 0):
        return math.nan
    return signal * n / noise if noise > 0 else math.inf


def norms_disagree(gram_norm: float, trainer_norm: float, rtol: float) -> bool:
    """Whether the batch gradient's norm from K and the trainer's own differ by more than rtol
    relative to the larger: a partial (one-shard) norm is 1/sqrt(shards) of the true one.
    False when either is NaN (nothing to compare).

    >>> norms_disagree(1.0, 1.0 / math.sqrt(2.0), 1e-4)
    True
    """
    if math.isnan(gram_norm) or math.isnan(trainer_norm):
        return False
    return abs(gram_norm - trainer_norm) > rtol * max(abs(gram_norm), abs(trainer_norm))
