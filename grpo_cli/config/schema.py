"""Structured config: the one source of truth for every setting.

Each field has a one-line comment; YAML presets under `conf/` only set values. The dataclasses are
registered in Hydra's ConfigStore (see `register_configs`), so a typo'd key or a wrong type fails at
compose time with a message that names the key. A numeric field's allowed range is its own
metadata (`ranged(default, Range)`), read by grpo_cli/validate.py, which refuses a value outside
it in one line naming the key and the range; a field that may be None is not checked when None.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass(frozen=True)
class Range:
    """The values a numeric setting allows: from `low` (excluded when `low_open`) up to `high`
    (excluded when `high_open`), finite when `finite`; `bounds` replaces the bounds as shown and
    `note` follows them in parentheses."""

    low: float
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    finite: bool = False
    bounds: str = ""
    note: str = ""

    def holds(self, value) -> bool:
        """Whether `value` lies in the range (a NaN, None or a non-number never does)."""
        try:
            above = value > self.low if self.low_open else value >= self.low
            below = self.high is None or (value < self.high if self.high_open else value <= self.high)
            return bool(above and below and (not self.finite or math.isfinite(value)))
        except TypeError:
            return False

    def text(self) -> str:
        """'>= 1', '> 0', 'in (0, 1]', ...: what a refusal says the value must be."""
        if self.high is None:
            shown = f"{'>' if self.low_open else '>='} {self.bounds or self.low}"
        else:
            shown = "in " + (self.bounds or f"{'(' if self.low_open else '['}{self.low}, {self.high}"
                                              f"{')' if self.high_open else ']'}")
        return shown + (f" ({self.note})" if self.note else "")


def ranged(default, allowed: Range):
    """A field with `default` whose values must lie in `allowed`."""
    return field(default=default, metadata={"range": allowed})


AT_LEAST_0 = Range(0)
AT_LEAST_1 = Range(1)
POSITIVE = Range(0, low_open=True, finite=True)
UNIT = Range(0, 1)
UNIT_OPEN_BELOW = Range(0, 1, low_open=True)
OPEN_UNIT = Range(0, 1, low_open=True, high_open=True)
MAX_THREADS = 1024  # more intra-op threads than any node has cores (threads=100000 once panicked starting them)
THREADS = Range(0, MAX_THREADS, note="0 = torch's default")
SEEDS = Range(0, 2**64 - 1, bounds="[0, 2**64 - 1]", note="torch.manual_seed's range")  # a seed past it overflowed inside torch
# Below this, float32 sampling is greedy on any logit gap over ~1 nat (exp underflows past -103
# nats, and gap / temperature exceeds that): every rollout of a group alike, as at temperature 0
MIN_TEMPERATURE = 0.01
TEMPERATURE = Range(MIN_TEMPERATURE, finite=True, note="below it every rollout of a group is the same "
                    "greedy completion in float32: zero advantages")


@dataclass
class LoraConfig:
    enabled: bool = False  # wrap the policy in a peft LoRA adapter
    r: int = ranged(8, AT_LEAST_1)  # adapter rank
    alpha: int = 16  # LoRA scaling numerator
    dropout: float = ranged(0.0, UNIT)  # adapter dropout
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


@dataclass
class WarmStartConfig:
    steps: int = ranged(0, AT_LEAST_0)  # supervised steps on generated solutions before GRPO (0 = none)
    batch_size: int = ranged(32, AT_LEAST_1)  # sequences per supervised step
    lr: float = ranged(3e-3, POSITIVE)  # supervised learning rate
    noisy_answer_fraction: float = ranged(0.0, UNIT)  # demonstrations whose final "#### N" line is off by 1-3
    seed: int | None = ranged(None, AT_LEAST_0)  # None = the run's seed (each seed its own warm start: seeds are independent replicates); an int = one warm start shared by every run seed (intervals conditional on it)


@dataclass
class ModelConfig:
    name: str = MISSING  # short label used in results and plots
    source: str = "char_llama"  # char_llama (built locally) | hf (id or local path) | gguf_package
    path: str | None = None  # HF hub id or local directory (source=hf); GGUF file (source=gguf_package)
    package: str | None = None  # Python package that ships the GGUF file (source=gguf_package)
    weights: str = "pretrained"  # pretrained | random: the architecture of config_json with random weights (rehearsals; nothing downloaded)
    config_json: str | None = None  # weights=random: HF config.json (file or directory) to build from; None = model.path's
    hidden_size: int = ranged(64, AT_LEAST_1)  # char_llama: model width
    num_layers: int = ranged(2, AT_LEAST_1)  # char_llama: transformer blocks
    num_heads: int = ranged(4, AT_LEAST_1)  # char_llama: attention heads
    intermediate_size: int = ranged(256, AT_LEAST_1)  # char_llama: MLP width
    max_positions: int = ranged(256, AT_LEAST_1)  # char_llama: context length
    dtype: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | float32 | bfloat16
    stop_tokens: list[str] = field(default_factory=list)  # extra tokens that end a completion (besides EOS)
    autocast: str = "none"  # none | bf16: policy forwards under torch.autocast (fp32 weights and lm_head)
    autocast_head: bool = False  # with autocast=bf16: lm_head under autocast too (bf16 logits, TRL's bf16; opt-in)
    master_weights: str = "fp32"  # bf16 weights: fp32 (fp32 master + AdamW state for all) | probed (for probes.layer_regex's weights) | none (stochastic rounding)
    gradient_checkpointing: bool = False  # trade compute for activation memory
    lora: LoraConfig = field(default_factory=LoraConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)


@dataclass
class TaskConfig:
    name: str = MISSING  # arith | gsm8k
    seed: int = 1234  # problem-generation seed (independent of the training seed)
    min_steps: int = 1  # arith: fewest arithmetic steps in a problem
    max_steps: int = 2  # arith: most arithmetic steps in a problem
    operand_max: int = 9  # arith: operands are drawn from [1, operand_max]
    operators: list[str] = field(default_factory=lambda: ["+", "-", "*"])  # arith: allowed operators
    train_size: int = 2000  # problems GRPO trains on (arith: generated; gsm8k: first N, -1 all)
    warm_start_size: int = ranged(2000, AT_LEAST_0)  # problems set aside for the supervised warm start, never used by GRPO
    eval_size: int = ranged(128, AT_LEAST_0)  # number of held-out problems evaluated
    path: str | None = None  # gsm8k: directory with train.jsonl/test.jsonl; None = datasets hub
    hub_id: str = "openai/gsm8k"  # gsm8k: dataset id when path is None
    prompt_template: str = "{question}\n"  # how a question becomes a prompt
    use_chat_template: bool = False  # wrap the prompt with the tokenizer's chat template if it has one
    use_math_verify: bool = False  # fall back to math-verify when numeric comparison fails
    reward: str = "task"  # task (the task's checker) | random (rehearsals only: a seeded coin per rollout, every group mixed; not science)


@dataclass
class RolloutConfig:
    backend: str = "hf"  # hf (transformers generate) | hf_static (static KV-cache decode loop) | vllm
    compile_decode: bool = False  # hf_static: torch.compile the one-token decode step (compiles once per shape)
    draw: str = "auto"  # hf_static: auto (inverse_cdf, or multinomial's race inside CUDA graphs) | multinomial (torch.multinomial's stream) | inverse_cdf (one uniform per row: the same law, another stream, faster on CPU; rollout/sampling.py)
    cuda_graphs: bool | None = False  # hf_static on CUDA: decode in CUDA graphs, 8 tokens per replay, on-device sampling (rollout/graph_decode.py); null = auto: wherever the device is CUDA and the model has a graph-ready step. Opt-in: full runs with graphs hit a NaN gradient norm at step 0 on an H200 (2026-11-28, docs/gpu_report_2026-11-28b_H200.md)
    group_size: int = ranged(4, AT_LEAST_1)  # R: completions sampled per prompt
    prompts_per_step: int = ranged(8, AT_LEAST_1)  # B: prompts per optimizer step
    temperature: float = ranged(1.0, TEMPERATURE)  # sampling temperature
    top_p: float = ranged(1.0, UNIT_OPEN_BELOW)  # nucleus sampling
    max_new_tokens: int = ranged(48, AT_LEAST_1)  # completion length cap
    vllm_gpu_memory_utilization: float = ranged(0.3, UNIT_OPEN_BELOW)  # vllm: fraction of device memory for the engine
    vllm_enforce_eager: bool = True  # vllm: skip CUDA-graph capture


@dataclass
class TrainConfig:
    steps: int = ranged(50, AT_LEAST_1)  # optimizer steps of GRPO
    micro_batch_size: int = ranged(64, AT_LEAST_1)  # sequences per forward/backward micro-batch
    shared_prompt_forward: bool = True  # training forward computes each distinct prompt once (same loss and gradients)
    completion_buckets: int = ranged(4, AT_LEAST_1)  # up to this many forwards over rows of similar completion length, padding after short completions not computed: completion columns on the shared prompt forward's cache, or whole rows where the forward is plain (fused probe steps, the value head, shared_prompt_forward=false); same loss and gradients up to float summation order (1 = one forward)
    backward_live_rows: bool = True  # rows whose loss has no gradient (zero advantage on every token; no KL term, no value head) run their forward without autograd: the same gradient up to float summation order, no backward for them
    logits_chunk_mb: float = ranged(1024.0, AT_LEAST_0)  # float32 logits held at once by the log-prob pass (MiB); longer batches run lm_head + log-softmax in chunks of positions (0 = one pass)


@dataclass
class OptimConfig:
    lr: float = ranged(1e-3, POSITIVE)  # AdamW learning rate
    weight_decay: float = ranged(0.0, AT_LEAST_0)  # AdamW weight decay
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])  # AdamW betas
    max_grad_norm: float = 1.0  # gradient clipping (<=0 disables)
    fused: bool | None = None  # torch's fused AdamW kernel (fp32 weights): ~5x faster on CPU, round-off from the loop; null = auto: fused for fp32 weights, MixedPrecisionAdamW for bf16


@dataclass
class AlgorithmConfig:
    name: str = "grpo"  # advantage estimator registered in algorithm/advantages.py (conf/algorithm/<name>.yaml)
    std: str = "population"  # grpo: std of the group rewards, population (ddof=0) or sample (ddof=1)
    std_epsilon: float = ranged(1e-6, AT_LEAST_0)  # grpo: added to the std; zero-variance groups get advantage 0
    num_iterations: int = ranged(1, AT_LEAST_1)  # optimizer passes over each batch of rollouts (mu)
    epsilon: float = ranged(0.2, AT_LEAST_0)  # PPO clip, lower side
    epsilon_high: float = ranged(0.2, AT_LEAST_0)  # PPO clip, upper side (DAPO clip-higher when > epsilon)
    loss_agg: str = "token_mean"  # token_mean | seq_mean_token_mean | constant (Dr.GRPO)
    loss_constant: int | None = ranged(None, AT_LEAST_1)  # constant normaliser; None = rollout.max_new_tokens
    importance_sampling_level: str = "token"  # token | sequence (GSPO)
    kl_coef: float = ranged(0.0, AT_LEAST_0)  # weight of the k3 KL to the frozen reference (0 = no reference model)
    tis_cap: float = ranged(0.0, AT_LEAST_0)  # truncated importance sampling cap on sampler/policy ratio (0 = off)
    gamma: float = ranged(1.0, UNIT)  # ppo: GAE discount
    lam: float = ranged(0.95, UNIT)  # ppo: GAE lambda
    value_coef: float = ranged(0.5, AT_LEAST_0)  # ppo: value-loss weight
    process_baseline: str = "step_group"  # process: step_group (group mean per step) | return_to_go
    process_step_weight: float = 0.5  # process: reward for each correct calculator step
    otb_zero_tail: bool = True  # otb: a group's one longest rollout gets baseline 0 past the second-longest (verl)
    dynamic_sampling: bool = False  # DAPO: drop zero-variance groups, draw more prompts to refill
    dynamic_sampling_max_draws: int = ranged(3, AT_LEAST_0)  # DAPO: cap on extra rollout rounds per step
    overlong_penalty: float = ranged(0.0, AT_LEAST_0)  # DAPO: max penalty for completions hitting the length cap
    overlong_buffer: int = ranged(8, AT_LEAST_0)  # DAPO: tokens before the cap where the penalty ramps up


@dataclass
class ProbesConfig:
    enabled: bool = True  # false (probes=off): no probe runs whatever `every` says (presets set `every`, never this)
    every: int = ranged(5, AT_LEAST_0)  # probe every N steps (0 disables probes); step 0 is always probed
    matrices: list[str] = field(
        default_factory=lambda: [
            "rollout_group",
            "rollout_batch",
            "score_group",
            "group_batch",
            "layer",
            "update",
            "grad_sum",
        ]
    )  # which candidate gradient matrices to record
    layer_regex: str = r"(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj|lm_head|lora_[AB])"  # 2-D weights for layer/update/grad_sum spectra
    param_regex: str = ".*"  # parameters that span P for the per-rollout matrices
    gram_method: str = "auto"  # auto | ghost | per_sample | sketch
    sketch_dim: int = ranged(4096, AT_LEAST_1)  # sketch: random-projection width
    gram_row_chunk: int = ranged(0, AT_LEAST_0)  # per-rollout Grams: rollouts per forward/backward (0 = all at once)
    fused_gram: str = "auto"  # auto | always | never: per-rollout Grams from the training step's own forward/backward where exact (probes/fused.py; auto: not when that would unshare prompts, except over the live rows of train.backward_live_rows, where it replaces the separate pass over the same rows)
    rank_rtol: float = ranged(1e-6, OPEN_UNIT)  # numerical rank: sigma_k > rank_rtol * sigma_1
    layer_spectrum: str = "svd"  # layer/update/grad_sum singular values: svd (torch.linalg.svdvals, exact to ~1e-16 sigma_1) | gram (sqrt(eig) of the smaller float64 Gram: 3-10x faster at paper scale, values below ~1.5e-8 sigma_1 round-off; the paper presets)
    sparsity_rtol: float = ranged(1e-3, OPEN_UNIT)  # sparsity: |g| < sparsity_rtol * max|g|
    sparsity_every: int = ranged(1, AT_LEAST_0)  # grad_sparsity / grad_hoyer every N steps, probe steps or not (0: probe steps only); one pass over the probed parameters' gradients, one host read
    changed_every: int = ranged(1, AT_LEAST_0)  # step_changed_frac* (weights the step's update changed) every N steps (0: never); one copy of the layer_regex weights while the optimizer steps, read with the metrics row
    max_groups_saved: int = ranged(64, AT_LEAST_0)  # per-group spectra kept per probe step


@dataclass
class EvalConfig:
    every: int = ranged(10, AT_LEAST_0)  # held-out evaluation every N steps and at the first and last step (0 = never)
    greedy: bool = True  # greedy (True) or sampled (False) evaluation decoding


@dataclass
class AlarmConfig:
    entropy_floor: float = ranged(0.5, AT_LEAST_0)  # nats; alarm when mean token entropy stays below ...
    entropy_patience: int = ranged(50, AT_LEAST_1)  # ... for this many consecutive steps
    zero_variance_ceiling: float = ranged(0.9, UNIT)  # alarm when the zero-variance-group fraction stays above ...
    zero_variance_patience: int = ranged(20, AT_LEAST_1)  # ... for this many consecutive steps
    kl_max: float = ranged(1.0, POSITIVE)  # alarm when KL to the reference exceeds this (only with a reference)
    stop_on_alarm: bool = False  # end the run (status completed, stopped_by alarm) on the first alarm


@dataclass
class LoggerConfig:
    """Experiment trackers (grpo_cli/trackers/): off by default; pick any set with
    `logger=tensorboard`, `logger=[tensorboard,wandb,mlflow]`. The results directory stays the
    source of truth: a tracker that fails warns once and the run goes on without it."""

    tensorboard: bool = False  # TensorBoard event files, one log dir per run (package tensorboard)
    wandb: bool = False  # Weights & Biases, runs grouped by experiment (package wandb; WANDB_MODE=offline needs no network)
    mlflow: bool = False  # MLflow, runs nested under one parent run per experiment (package mlflow-skinny)
    project: str = "grpo-cli"  # W&B project and MLflow experiment name
    entity: str | None = None  # W&B entity (user or team); None = your key's default
    tracking_uri: str | None = None  # MLflow tracking URI; None = $MLFLOW_TRACKING_URI, else file store <results_dir>/mlruns
    log_dir: str | None = None  # TensorBoard root; None = <results_dir>/<experiment>/tensorboard
    rank_series: list[str] = field(
        default_factory=lambda: ["rollout_batch/erank_entropy", "rollout_group/erank_entropy"]
    )  # matrix/measure curves sent (mean over layers or groups per probe step); "all" = every pair
    figures: bool = True  # after a completed run, send the figures `grpo analyze` draws for it


@dataclass
class FaultConfig:
    """A failure on purpose, to rehearse what a run leaves behind (grpo_cli/train/fault.py)."""

    step: int | None = ranged(None, AT_LEAST_0)  # fail at this step (None = never)
    kind: str = "crash"  # crash (an error before the step) | interrupt (Ctrl-C before the step) | nan_loss (the step's last micro-batch's loss becomes NaN) | disk_full (ENOSPC before the step) | sigterm (SIGTERM to the run once the step is recorded)


@dataclass
class ExperimentConfig:
    name: str = "default"  # results/<name>/...; also the title of figures


@dataclass
class Config:
    model: ModelConfig = MISSING
    task: TaskConfig = MISSING
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    probes: ProbesConfig = field(default_factory=ProbesConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    alarms: AlarmConfig = field(default_factory=AlarmConfig)
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)  # rehearsals and tests only; off by default
    seed: int = ranged(0, SEEDS)  # training seed (sampling, init of char models, data order)
    device: str = "auto"  # auto | cpu | cuda
    deterministic: bool = False  # deterministic kernels (torch.use_deterministic_algorithms, CUBLAS_WORKSPACE_CONFIG): repeatable CUDA runs, slower
    threads: int = ranged(0, THREADS)  # torch intra-op threads per process (0 = leave torch's default)
    results_dir: str = "results"  # root of all results
    cache_dir: str = ".cache/grpo"  # warm-start checkpoints and built tokenizers
    resume: bool = True  # continue from checkpoints/ if the run directory has one
    reuse_from: list[str] = field(default_factory=list)  # experiment directories (under results_dir, or paths) whose completed runs this run is taken from where one is the same run: every key that changes results agrees (experiment.name aside), same device and versions (train/reuse.py; resume=false trains anew)
    resume_mismatch: str = "refuse"  # refuse | allow: resume though a key that changes results differs from the run directory's config.yaml (train/resume_guard.py)
    checkpoint_every: int = ranged(10, AT_LEAST_1)  # save a resumable checkpoint every N steps
    keep_checkpoints: bool = False  # also keep each checkpoint's weights as checkpoints/step_<N>.pt (`grpo probe RUN --all-checkpoints`)
    progress: bool = True  # show progress bars: the steps' and transformers' (loading weights, GGUF conversion)


def register_configs() -> None:
    """Register the schema so that every composed config is validated against it."""
    ConfigStore.instance().store(name="config_schema", node=Config)
