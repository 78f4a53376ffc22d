"""Value checks over a composed config, run before any model is built (`grpo run`, `grpo config`).

The schema (schema.py) checks that every key exists and has the right type; this module checks
that every value is usable: ranges, known names, compilable regexes, and settings that would run
to `completed` while training nothing (R = 1 with a group baseline, temperature 0). Each problem is
one line that names the key and what is allowed. Checks that need the model (a regex that matches
no parameter) live where the model is first available (grpo_cli/probes/runner.py) and raise the
same `ConfigError`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable

from omegaconf import DictConfig, OmegaConf

from grpo_cli.config.errors import ConfigError
from grpo_cli.measures import RANK_MEASURES

ROLLOUT_BACKENDS = ("hf", "hf_static", "vllm")
MODEL_SOURCES = ("char_llama", "hf", "gguf_package")
MODEL_DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
MAX_THREADS = 1024  # more intra-op threads than any node has cores (threads=100000 once panicked starting them)
MAX_SEED = 2**64 - 1  # torch.manual_seed's range (a seed past it overflowed inside torch)
# Below this, float32 sampling is greedy on any logit gap over ~1 nat (exp underflows past -103
# nats, and gap / temperature exceeds that): every rollout of a group alike, as at temperature 0
MIN_TEMPERATURE = 0.01


def _no_group_baseline() -> tuple[str, ...]:
    """Estimators whose baseline is not the group's own rewards: one rollout per prompt still
    trains (a property of each registered estimator)."""
    from grpo_cli.algorithm.advantages import ESTIMATORS

    return tuple(name for name, estimator in sorted(ESTIMATORS.items()) if not estimator.group_baseline)


def _known_names() -> dict[str, tuple[str, ...]]:
    """Allowed names, read from the modules that own them (imported here, not at import time)."""
    from grpo_cli.algorithm.advantages import ESTIMATORS, GRPO_STD, PROCESS_BASELINES
    from grpo_cli.algorithm.loss import AGGREGATIONS, IMPORTANCE_SAMPLING_LEVELS
    from grpo_cli.algorithm.optim import MASTER_WEIGHTS
    from grpo_cli.models.policy import WEIGHTS
    from grpo_cli.probes.gram import METHODS
    from grpo_cli.probes.rank_measures import SPECTRUM_METHODS
    from grpo_cli.probes.runner import FUSED_GRAM, KNOWN_MATRICES
    from grpo_cli.rollout.sampling import DRAWS
    from grpo_cli.tasks import TASKS
    from grpo_cli.tasks.rehearsal import REWARDS
    from grpo_cli.train.autocast import AUTOCAST_KINDS
    from grpo_cli.train.fault import FAULT_KINDS

    return {
        "algorithm.name": tuple(sorted(ESTIMATORS)),
        "algorithm.loss_agg": tuple(AGGREGATIONS),
        "algorithm.importance_sampling_level": tuple(IMPORTANCE_SAMPLING_LEVELS),
        "algorithm.std": GRPO_STD,
        "algorithm.process_baseline": PROCESS_BASELINES,
        "probes.gram_method": tuple(METHODS),
        "probes.matrices": tuple(KNOWN_MATRICES),
        "probes.fused_gram": tuple(FUSED_GRAM),
        "probes.layer_spectrum": tuple(SPECTRUM_METHODS),
        "task.name": tuple(TASKS),
        "rollout.draw": ("auto", *DRAWS),
        "task.reward": tuple(REWARDS),
        "model.autocast": tuple(AUTOCAST_KINDS),
        "model.weights": tuple(WEIGHTS),
        "model.master_weights": tuple(MASTER_WEIGHTS),
        "fault.kind": tuple(FAULT_KINDS),
    }


def stray_keys(cfg: DictConfig, prefix: str = "") -> list[str]:
    """Keys that the typed schema does not define (Hydra's `+group.key=value` adds them)."""
    schema = OmegaConf.get_type(cfg)
    known = {f.name for f in dataclasses.fields(schema)} if dataclasses.is_dataclass(schema) else None
    stray = []
    for key in cfg.keys():
        if key == "hydra":
            continue
        if known is not None and key not in known:
            stray.append(f"{prefix}{key}")
            continue
        child = cfg._get_node(key)
        if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
            stray.extend(stray_keys(child, f"{prefix}{key}."))
    return stray


def inside_results_dir(name: str) -> bool:
    """A name that keeps <results_dir>/<name> inside results_dir: `smoke` or `sweeps/lr`, never
    `../..`, `/tmp/x` or `a//b`."""
    parts = str(name).replace("\\", "/").split("/")
    return bool(name) and not str(name).startswith("/") and all(p not in ("", ".", "..") for p in parts)


def config_problems(cfg: DictConfig) -> list[str]:
    """Every unusable value in `cfg`, one line each (empty when the config is usable)."""
    problems: list[str] = [
        f"{key}: not a setting of grpo's schema (remove the '+' override; `grpo config` lists every key)"
        for key in stray_keys(cfg)
    ]
    names = _known_names()

    def value(key: str):
        return OmegaConf.select(cfg, key, throw_on_missing=False)

    def need(key: str, ok: Callable[[object], bool], allowed: str) -> None:
        current = value(key)
        try:
            good = current is not None and ok(current)
        except (TypeError, ValueError):
            good = False
        if not good:
            problems.append(f"{key}={current!r}: must be {allowed}")

    def unread(key: str, setting: str) -> None:  # a value that the run would silently ignore
        if value(key) not in (None, ""):
            problems.append(f"{key}={value(key)!r}: must be null {setting}")

    def choice(key: str, allowed: tuple[str, ...]) -> None:
        need(key, lambda v: v in allowed, "one of " + ", ".join(allowed))

    def regex(key: str) -> None:
        try:
            re.compile(value(key))
        except (re.error, TypeError) as error:
            problems.append(f"{key}={value(key)!r}: not a valid regular expression ({error})")

    def at_least(key: str, low: float) -> None:
        need(key, lambda v: v >= low, f">= {low}")

    def positive(key: str) -> None:
        need(key, lambda v: v > 0 and math.isfinite(v), "> 0")

    def unit(key: str, low_open: bool = False) -> None:
        low = "(0" if low_open else "[0"
        need(key, lambda v: (v > 0 if low_open else v >= 0) and v <= 1, f"in {low}, 1]")

    # top level
    need("device", lambda v: v in DEVICES or re.fullmatch(r"cuda:\d+", v), "one of auto, cpu, cuda, cuda:N")
    need("seed", lambda v: 0 <= v <= MAX_SEED, "in [0, 2**64 - 1] (torch.manual_seed's range)")
    need("threads", lambda v: 0 <= v <= MAX_THREADS, f"in [0, {MAX_THREADS}] (0 = torch's default)")
    at_least("checkpoint_every", 1)
    choice("resume_mismatch", ("refuse", "allow"))
    # model
    choice("model.source", MODEL_SOURCES)
    choice("model.dtype", MODEL_DTYPES)
    choice("model.autocast", names["model.autocast"])
    if value("model.autocast_head"):
        need("model.autocast", lambda v: v == "bf16", "bf16 with model.autocast_head=true")
    choice("model.weights", names["model.weights"])
    choice("model.master_weights", names["model.master_weights"])
    for key in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "max_positions"):
        at_least(f"model.{key}", 1)
    need("model.hidden_size", lambda v: v % max(1, value("model.num_heads")) == 0,
         "a multiple of model.num_heads")
    if value("model.lora.enabled"):
        at_least("model.lora.r", 1)
        unit("model.lora.dropout")
    if value("model.source") == "char_llama" and value("model.weights") == "pretrained":
        unread("model.path", "with model.source=char_llama (built locally; model.source=hf or gguf_package "
                             "reads a path)")
    at_least("model.warm_start.steps", 0)
    at_least("model.warm_start.batch_size", 1)
    positive("model.warm_start.lr")
    unit("model.warm_start.noisy_answer_fraction")
    if value("model.warm_start.seed") is not None:  # null: the run's seed (models/warm_start.py)
        at_least("model.warm_start.seed", 0)
    # task
    choice("task.name", names["task.name"])
    choice("task.reward", names["task.reward"])
    if value("task.name") == "arith":
        unread("task.path", "with task.name=arith (generated problems; task=gsm8k reads task.path)")
    elif value("task.path") is not None and not str(value("task.path")).strip():  # once read as the cwd
        problems.append(f"task.path={value('task.path')!r}: must be a directory holding train.jsonl and "
                        "test.jsonl, or null for the datasets hub")
    need("task.train_size", lambda v: v == -1 or v >= 1, ">= 1 (or -1 for all)")
    at_least("task.eval_size", 0)
    at_least("task.warm_start_size", 0)
    if (value("model.source") == "char_llama" and value("model.weights") == "pretrained"
            and (value("model.warm_start.steps") or 0) > 0):  # models/warm_start.py trains on them
        need("task.warm_start_size", lambda v: v >= 1,
             ">= 1 with model.warm_start.steps > 0 (the warm start trains on those problems)")
    # rollout
    choice("rollout.backend", ROLLOUT_BACKENDS)
    at_least("rollout.prompts_per_step", 1)
    per_step = value("rollout.prompts_per_step")
    if isinstance(per_step, int) and per_step >= 1:  # each step draws that many distinct problems
        need("task.train_size", lambda v: v == -1 or v >= per_step,
             f">= rollout.prompts_per_step={per_step} (or -1 for all): each step draws that many distinct problems")
    at_least("rollout.max_new_tokens", 1)
    need("rollout.top_p", lambda v: 0 < v <= 1, "in (0, 1]")
    unit("rollout.vllm_gpu_memory_utilization", low_open=True)
    choice("rollout.draw", names["rollout.draw"])
    if value("rollout.draw") == "inverse_cdf":
        need("rollout.backend", lambda v: v == "hf_static", "hf_static with rollout.draw=inverse_cdf")
        if value("rollout.cuda_graphs") is not None:  # null (auto) turns the graphs off with inverse_cdf
            need("rollout.cuda_graphs", lambda v: not v, "false with rollout.draw=inverse_cdf")
    if value("rollout.compile_decode"):  # only the hf_static loop has a decode step to compile
        need("rollout.backend", lambda v: v == "hf_static", "hf_static with rollout.compile_decode=true")
    if value("rollout.cuda_graphs"):  # the model and the resolved device are checked at setup
        need("rollout.backend", lambda v: v == "hf_static", "hf_static with rollout.cuda_graphs=true")
        need("rollout.compile_decode", lambda v: not v, "false with rollout.cuda_graphs=true")
        need("device", lambda v: v != "cpu", "cuda (or auto on a CUDA machine) with rollout.cuda_graphs=true")
    estimator = value("algorithm.name")
    at_least("rollout.group_size", 1)
    group_size = value("rollout.group_size")
    no_group_baseline = _no_group_baseline()
    if isinstance(group_size, int) and group_size == 1 and estimator not in no_group_baseline:
        problems.append(
            f"rollout.group_size=1: must be >= 2 for algorithm={estimator} (a group of one has "
            f"zero advantage, so nothing trains; {' and '.join(no_group_baseline)} accept 1)"
        )
    need("rollout.temperature", lambda v: v >= MIN_TEMPERATURE and math.isfinite(v),
         f">= {MIN_TEMPERATURE} (below it every rollout of a group is the same greedy completion "
         "in float32: zero advantages)")
    # algorithm
    choice("algorithm.name", names["algorithm.name"])
    choice("algorithm.std", names["algorithm.std"])
    if estimator == "grpo" and value("algorithm.std") == "sample":
        need("rollout.group_size", lambda v: v >= 2, ">= 2 with algorithm.std=sample")
    at_least("algorithm.std_epsilon", 0)
    at_least("train.steps", 1)
    positive("optim.lr")
    at_least("optim.weight_decay", 0)
    need("optim.betas", lambda v: len(v) == 2 and all(0 <= b < 1 for b in v),
         "two numbers in [0, 1)")
    if value("optim.fused"):  # on CUDA, dtype auto gives bf16 weights: refused at setup
        need("model.dtype", lambda v: v != "bfloat16",
             "float32 or auto with optim.fused=true (bf16 weights use MixedPrecisionAdamW)")
    at_least("algorithm.num_iterations", 1)
    at_least("train.micro_batch_size", 1)
    at_least("train.logits_chunk_mb", 0)
    at_least("train.completion_buckets", 1)
    at_least("algorithm.epsilon", 0)
    at_least("algorithm.epsilon_high", 0)
    choice("algorithm.loss_agg", names["algorithm.loss_agg"])
    if value("algorithm.loss_constant") is not None:
        at_least("algorithm.loss_constant", 1)
    choice("algorithm.importance_sampling_level", names["algorithm.importance_sampling_level"])
    at_least("algorithm.kl_coef", 0)
    at_least("algorithm.tis_cap", 0)
    unit("algorithm.gamma")
    unit("algorithm.lam")
    at_least("algorithm.value_coef", 0)
    choice("algorithm.process_baseline", names["algorithm.process_baseline"])
    at_least("algorithm.dynamic_sampling_max_draws", 0)
    at_least("algorithm.overlong_penalty", 0)
    at_least("algorithm.overlong_buffer", 0)
    # probes and evaluation
    at_least("probes.every", 0)
    need("probes.matrices", lambda v: set(v) <= set(names["probes.matrices"]),
         "a list drawn from " + ", ".join(names["probes.matrices"]))
    regex("probes.layer_regex")
    regex("probes.param_regex")
    choice("probes.gram_method", names["probes.gram_method"])
    choice("probes.fused_gram", names["probes.fused_gram"])
    choice("probes.layer_spectrum", names["probes.layer_spectrum"])
    at_least("probes.sketch_dim", 1)
    at_least("probes.gram_row_chunk", 0)
    at_least("probes.sparsity_every", 0)
    need("probes.rank_rtol", lambda v: 0 < v < 1, "in (0, 1)")
    need("probes.sparsity_rtol", lambda v: 0 < v < 1, "in (0, 1)")
    at_least("probes.max_groups_saved", 0)
    at_least("eval.every", 0)
    # alarms
    at_least("alarms.entropy_floor", 0)
    at_least("alarms.entropy_patience", 1)
    unit("alarms.zero_variance_ceiling")
    at_least("alarms.zero_variance_patience", 1)
    positive("alarms.kl_max")
    # experiment trackers: "matrix/measure" pairs, or "all"
    need("logger.rank_series", lambda v: all(
        pair == "all" or (pair.count("/") == 1 and pair.split("/")[0] in names["probes.matrices"]
                          and pair.split("/")[1] in RANK_MEASURES) for pair in v),
         "'all' or matrix/measure pairs, matrix in " + ", ".join(names["probes.matrices"])
         + "; measure in " + ", ".join(RANK_MEASURES))
    # results paths stay under results_dir
    need("experiment.name", inside_results_dir,
         "a relative name under results_dir (no '..', '.', empty or absolute parts)")
    # a failure on purpose (grpo_cli/train/fault.py)
    choice("fault.kind", names["fault.kind"])
    if value("fault.step") is not None:
        at_least("fault.step", 0)
    return problems


def validate_config(cfg: DictConfig) -> None:
    """Raise ConfigError (one line per problem) unless every value of `cfg` is usable."""
    problems = config_problems(cfg)
    if problems:
        raise ConfigError("\n".join(problems))


def validate_bench_config(cfg: DictConfig) -> None:
    """`validate_config` for `grpo bench`, whose fixed-policy model sizes set `optim.lr=0` on
    purpose (grpo_cli/bench/builder.py: every step then samples from the same policy), which a
    run would refuse as training nothing; every other value is checked as for a run."""
    zero_lr = cfg.optim.lr == 0
    problems = [problem for problem in config_problems(cfg)
                if not (zero_lr and problem.startswith("optim.lr="))]
    if problems:
        raise ConfigError("\n".join(problems))
