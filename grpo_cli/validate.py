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
import re
import typing
from collections.abc import Callable

from omegaconf import DictConfig, OmegaConf

from grpo_cli.config.errors import ConfigError
from grpo_cli.measures import RANK_MEASURES

ROLLOUT_BACKENDS = ("hf", "hf_static", "vllm")
MODEL_DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")


def _no_group_baseline() -> tuple[str, ...]:
    """Estimators whose baseline is not the group's own rewards: one rollout per prompt still
    trains (a property of each registered estimator)."""
    from grpo_cli.algorithm.advantages import ESTIMATORS

    return tuple(name for name, estimator in sorted(ESTIMATORS.items()) if not estimator.group_baseline)


def _known_names() -> dict[str, tuple[str, ...]]:
    """Allowed names of each choice setting, read from the modules that own them (imported here,
    not at import time)."""
    from grpo_cli.algorithm.advantages import ESTIMATORS, GRPO_STD, PROCESS_BASELINES
    from grpo_cli.algorithm.loss import AGGREGATIONS, IMPORTANCE_SAMPLING_LEVELS
    from grpo_cli.algorithm.optim import MASTER_WEIGHTS
    from grpo_cli.models.policy import SOURCES, WEIGHTS
    from grpo_cli.probes.gram import METHODS
    from grpo_cli.probes.rank_measures import SPECTRUM_METHODS
    from grpo_cli.probes.runner import FUSED_GRAM, KNOWN_MATRICES
    from grpo_cli.rollout.sampling import DRAWS
    from grpo_cli.tasks import TASKS
    from grpo_cli.tasks.rehearsal import REWARDS
    from grpo_cli.train.autocast import AUTOCAST_KINDS
    from grpo_cli.train.fault import FAULT_KINDS

    return {
        "resume_mismatch": ("refuse", "allow"),
        "model.source": SOURCES,
        "model.dtype": MODEL_DTYPES,
        "rollout.backend": ROLLOUT_BACKENDS,
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


def schema_ranges(schema=None, prefix: str = ""):
    """(key, Range, may be None) of every field of the schema that has a range (its metadata,
    config/schema.py's `ranged`), in schema order."""
    from grpo_cli.config.schema import Config

    schema = Config if schema is None else schema
    hints = typing.get_type_hints(schema)
    for item in dataclasses.fields(schema):
        hint = hints[item.name]
        if "range" in item.metadata:
            yield f"{prefix}{item.name}", item.metadata["range"], type(None) in typing.get_args(hint)
        elif dataclasses.is_dataclass(hint):
            yield from schema_ranges(hint, f"{prefix}{item.name}.")


class _Checks:
    """The problems found in one config (one line each) and the checks that find them."""

    def __init__(self, cfg: DictConfig):
        self.cfg = cfg
        self.problems: list[str] = []

    def value(self, key: str):
        return OmegaConf.select(self.cfg, key, throw_on_missing=False)

    def need(self, key: str, ok: Callable[[object], bool], allowed: str) -> None:
        current = self.value(key)
        try:
            good = current is not None and ok(current)
        except (TypeError, ValueError):
            good = False
        if not good:
            self.problems.append(f"{key}={current!r}: must be {allowed}")

    def unread(self, key: str, setting: str) -> None:  # a value that the run would silently ignore
        if self.value(key) not in (None, ""):
            self.problems.append(f"{key}={self.value(key)!r}: must be null {setting}")

    def choice(self, key: str, allowed: tuple[str, ...]) -> None:
        self.need(key, lambda v: v in allowed, "one of " + ", ".join(allowed))

    def regex(self, key: str) -> None:
        try:
            re.compile(self.value(key))
        except (re.error, TypeError) as error:
            self.problems.append(f"{key}={self.value(key)!r}: not a valid regular expression ({error})")


def config_problems(cfg: DictConfig) -> list[str]:
    """Every unusable value in `cfg`, one line each (empty when the config is usable): keys the
    schema lacks, values outside their field's range or choices, then the rules that tie keys."""
    checks = _Checks(cfg)
    checks.problems += [
        f"{key}: not a setting of grpo's schema (remove the '+' override; `grpo config` lists every key)"
        for key in stray_keys(cfg)
    ]
    for key, allowed, may_be_none in schema_ranges():
        if not (may_be_none and checks.value(key) is None):  # None: unset (the field's comment says what then)
            checks.need(key, allowed.holds, allowed.text())
    names = _known_names()
    for key, allowed in names.items():
        if key != "probes.matrices":  # a list: _probe_rules
            checks.choice(key, allowed)
    for rules in (_top_rules, _model_rules, _task_rules, _rollout_rules, _algorithm_rules):
        rules(checks)
    _probe_rules(checks, names)
    return checks.problems


def _top_rules(checks: _Checks) -> None:
    checks.need("device", lambda v: v in DEVICES or re.fullmatch(r"cuda:\d+", v),
                "one of auto, cpu, cuda, cuda:N")
    checks.need("experiment.name", inside_results_dir,  # results paths stay under results_dir
                "a relative name under results_dir (no '..', '.', empty or absolute parts)")


def _model_rules(checks: _Checks) -> None:
    value, need = checks.value, checks.need
    if value("model.autocast_head"):
        need("model.autocast", lambda v: v == "bf16", "bf16 with model.autocast_head=true")
    need("model.hidden_size", lambda v: v % max(1, value("model.num_heads")) == 0,
         "a multiple of model.num_heads")
    if value("model.source") == "char_llama" and value("model.weights") == "pretrained":
        checks.unread("model.path", "with model.source=char_llama (built locally; model.source=hf or "
                                    "gguf_package reads a path)")
    if value("optim.fused"):  # on CUDA, dtype auto gives bf16 weights: refused at setup
        need("model.dtype", lambda v: v != "bfloat16",
             "float32 or auto with optim.fused=true (bf16 weights use MixedPrecisionAdamW)")


def _task_rules(checks: _Checks) -> None:
    value, need = checks.value, checks.need
    if value("task.name") == "arith":
        checks.unread("task.path", "with task.name=arith (generated problems; task=gsm8k reads task.path)")
    elif value("task.path") is not None and not str(value("task.path")).strip():  # once read as the cwd
        checks.problems.append(f"task.path={value('task.path')!r}: must be a directory holding "
                               "train.jsonl and test.jsonl, or null for the datasets hub")
    need("task.train_size", lambda v: v == -1 or v >= 1, ">= 1 (or -1 for all)")
    if (value("model.source") == "char_llama" and value("model.weights") == "pretrained"
            and (value("model.warm_start.steps") or 0) > 0):  # models/warm_start.py trains on them
        need("task.warm_start_size", lambda v: v >= 1,
             ">= 1 with model.warm_start.steps > 0 (the warm start trains on those problems)")
    per_step = value("rollout.prompts_per_step")
    if isinstance(per_step, int) and per_step >= 1:  # each step draws that many distinct problems
        need("task.train_size", lambda v: v == -1 or v >= per_step,
             f">= rollout.prompts_per_step={per_step} (or -1 for all): each step draws that many "
             "distinct problems")


def _rollout_rules(checks: _Checks) -> None:
    value, need = checks.value, checks.need
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


def _algorithm_rules(checks: _Checks) -> None:
    value, need = checks.value, checks.need
    estimator, group_size = value("algorithm.name"), value("rollout.group_size")
    no_group_baseline = _no_group_baseline()
    if isinstance(group_size, int) and group_size == 1 and estimator not in no_group_baseline:
        checks.problems.append(
            f"rollout.group_size=1: must be >= 2 for algorithm={estimator} (a group of one has "
            f"zero advantage, so nothing trains; {' and '.join(no_group_baseline)} accept 1)"
        )
    if estimator == "grpo" and value("algorithm.std") == "sample":
        need("rollout.group_size", lambda v: v >= 2, ">= 2 with algorithm.std=sample")
    need("optim.betas", lambda v: len(v) == 2 and all(0 <= b < 1 for b in v), "two numbers in [0, 1)")


def _probe_rules(checks: _Checks, names: dict[str, tuple[str, ...]]) -> None:
    matrices = names["probes.matrices"]
    checks.need("probes.matrices", lambda v: set(v) <= set(matrices), "a list drawn from " + ", ".join(matrices))
    checks.regex("probes.layer_regex")
    checks.regex("probes.param_regex")
    checks.need("logger.rank_series", lambda v: all(  # experiment trackers: "matrix/measure" pairs, or "all"
        pair == "all" or (pair.count("/") == 1 and pair.split("/")[0] in matrices
                          and pair.split("/")[1] in RANK_MEASURES) for pair in v),
        "'all' or matrix/measure pairs, matrix in " + ", ".join(matrices)
        + "; measure in " + ", ".join(RANK_MEASURES))


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
