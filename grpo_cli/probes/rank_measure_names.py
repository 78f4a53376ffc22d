"""The rank measures recorded for every matrix, in column order (no torch import here)."""

RANK_MEASURES = (
    "erank_entropy",  # exp(H(p)), p_k = sigma_k / sum sigma (Roy & Vetterli 2007)
    "erank_entropy_sq",  # exp(H(p)), p_k = sigma_k^2 / sum sigma^2
    "stable_rank",  # sum sigma^2 / sigma_1^2
    "participation_ratio",  # (sum sigma^2)^2 / sum sigma^4
    "energy_rank_90",  # fewest k holding 90% of sum sigma^2
    "energy_rank_99",  # fewest k holding 99% of sum sigma^2
    "numerical_rank",  # count of sigma_k > rtol * sigma_1
)
