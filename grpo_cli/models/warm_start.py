"""Build the CPU preset's tiny character-level Llama and warm-start it on worked solutions.

GRPO learns nothing from a policy that never succeeds (every group has zero variance), so the
CPU preset first runs a short supervised phase on generated solutions, aiming for a 20-60%
held-out success rate. The result is saved as an ordinary HF model directory under the cache,
keyed by everything that determines it, and reused by every run that shares it; a file lock keeps
parallel sweep members from building it twice.

Its seed (the random initialisation and the order of the demonstrations) is the run's seed unless
`model.warm_start.seed` pins one: by default each seed of a sweep is an independent replicate of
the whole experiment, warm start included, while the runs of one seed (every R, every estimator)
share that seed's warm start, so per-seed slopes over R and per-seed differences between
estimators stay paired. A pinned seed shares one warm start by every run seed: the seed-level
intervals are then conditional on that one model (run.json `initial_model` says which).

`noisy_answer_fraction` makes the demonstrations imperfect: that fraction of them ends with a wrong
final line (`#### N` off by 1-3) after correct calculator steps. The warm-started policy then has a
general, fixable flaw (it sometimes misreports its own result), which outcome rewards can remove
within minutes; a model this small cannot learn new arithmetic facts from outcome rewards in that
time, so without the flaw its held-out accuracy barely moves under GRPO.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, is_dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf
from transformers import LlamaConfig, LlamaForCausalLM

from grpo_cli.models.cache import cached_model_dir
from grpo_cli.models.char_tokenizer import build_char_tokenizer


def warm_start_seed(model_cfg, run_seed: int) -> int:
    """The seed the warm start is drawn with: model.warm_start.seed if pinned, else the run's."""
    pinned = model_cfg.warm_start.seed
    return int(run_seed if pinned is None else pinned)


def _plain(node) -> dict:
    if is_dataclass(node):
        return asdict(node)
    return OmegaConf.to_container(node, resolve=True)


def warm_start_key(model_cfg, task_cfg, seed: int) -> str:
    """Hash of the settings that determine the warm-started weights, `seed` (warm_start_seed's)
    among them; whether the seed was pinned or taken from the run does not change the weights."""
    model = {k: v for k, v in _plain(model_cfg).items() if k not in ("name", "lora", "dtype")}
    model.pop("gradient_checkpointing", None)
    model["warm_start"] = {k: v for k, v in model["warm_start"].items() if k != "seed"}
    # The warm-start split is a prefix of the generated training problems, so train_size does not
    # change it; eval_size does (training draws skip every held-out problem).
    task = {k: v for k, v in _plain(task_cfg).items() if k != "train_size"}
    blob = json.dumps({"model": model, "task": task, "seed": int(seed)}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def warm_start_record(model_cfg, task_cfg, run_seed: int) -> dict:
    """run.json's `initial_model` for a char_llama run: which warm start it trained from, and
    whether every run seed shares it (`shared`: a pinned model.warm_start.seed)."""
    seed = warm_start_seed(model_cfg, run_seed)
    return {"kind": "warm_start", "key": warm_start_key(model_cfg, task_cfg, seed), "seed": seed,
            "shared": model_cfg.warm_start.seed is not None}


def build_char_llama(model_cfg, vocab_size: int, pad_id: int | None, bos_id: int, eos_id: int,
                     num_key_value_heads: int | None = None):
    """A randomly initialised Llama of `model_cfg`'s shape (untied lm_head); key/value heads =
    query heads unless `num_key_value_heads` is given (benchmarks of GQA shapes)."""
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=model_cfg.hidden_size,
        intermediate_size=model_cfg.intermediate_size,
        num_hidden_layers=model_cfg.num_layers,
        num_attention_heads=model_cfg.num_heads,
        num_key_value_heads=num_key_value_heads or model_cfg.num_heads,
        max_position_embeddings=model_cfg.max_positions,
        pad_token_id=pad_id,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def supervised_batch(tokenizer, prompts: list[str], targets: list[str]):
    """Left-padded prompt+target batch with a loss mask on target tokens (and EOS)."""
    rows, masks = [], []
    for prompt, target in zip(prompts, targets, strict=True):
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        target_ids = tokenizer(target, add_special_tokens=False)["input_ids"] + [
            tokenizer.eos_token_id
        ]
        rows.append(prompt_ids + target_ids)
        masks.append([0] * len(prompt_ids) + [1] * len(target_ids))
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    loss_mask = torch.zeros((len(rows), width))
    for index, (row, mask) in enumerate(zip(rows, masks, strict=True)):
        input_ids[index, width - len(row) :] = torch.tensor(row)
        attention[index, width - len(row) :] = 1
        loss_mask[index, width - len(row) :] = torch.tensor(mask, dtype=torch.float)
    return input_ids, attention, loss_mask


def demonstration(problem, generator: random.Random, noisy_fraction: float) -> str:
    """The worked solution, with its final answer corrupted with probability `noisy_fraction`."""
    if noisy_fraction <= 0 or generator.random() >= noisy_fraction:
        return problem.solution
    body, _, answer = problem.solution.rpartition("#### ")
    wrong = int(float(answer)) + generator.choice([-3, -2, -1, 1, 2, 3])
    return f"{body}#### {wrong}"


def supervised_finetune(model, tokenizer, task, warm_cfg, device, seed: int, log=print) -> None:
    """Teacher-forced cross-entropy on task solutions (prompt tokens masked out); `seed` draws
    the demonstrations and their noise."""
    generator = random.Random(seed)
    problems = list(task.warm_start)
    if not problems:
        raise ValueError("the warm start needs task.warm_start_size > 0 problems")
    optimizer = torch.optim.AdamW(model.parameters(), lr=warm_cfg.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=warm_cfg.lr, total_steps=warm_cfg.steps, pct_start=0.1
    )
    model.train()
    for step in range(warm_cfg.steps):
        chosen = [generator.choice(problems) for _ in range(warm_cfg.batch_size)]
        input_ids, attention, loss_mask = supervised_batch(
            tokenizer,
            [task.prompt(p) for p in chosen],
            [demonstration(p, generator, warm_cfg.noisy_answer_fraction) for p in chosen],
        )
        input_ids, attention, loss_mask = (t.to(device) for t in (input_ids, attention, loss_mask))
        position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=input_ids, attention_mask=attention, position_ids=position_ids).logits
        token_loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].transpose(1, 2), input_ids[:, 1:], reduction="none"
        )  # [N, L-1]
        loss = (token_loss * loss_mask[:, 1:]).sum() / loss_mask[:, 1:].sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % max(1, warm_cfg.steps // 5) == 0 or step == warm_cfg.steps - 1:
            log(f"warm start step {step + 1}/{warm_cfg.steps}: loss {loss.item():.3f}")
    model.eval()


def warm_started_char_llama(model_cfg, task, task_cfg, cache_dir: str, run_seed: int,
                            log=print) -> Path:
    """Return the directory of the cached warm-started char Llama of `run_seed` (or of the pinned
    model.warm_start.seed), building it if needed. The build draws from its own torch stream
    (fork_rng), so a run that builds it continues with the same random state as one that finds
    it cached."""
    seed = warm_start_seed(model_cfg, run_seed)
    key = warm_start_key(model_cfg, task_cfg, seed)

    def build(partial: Path) -> None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            _build(partial)

    def _build(partial: Path) -> None:
        tokenizer = build_char_tokenizer()
        model = build_char_llama(
            model_cfg,
            vocab_size=len(tokenizer),
            pad_id=tokenizer.pad_token_id,
            bos_id=tokenizer.bos_token_id,
            eos_id=tokenizer.eos_token_id,
        )
        if model_cfg.warm_start.steps > 0:
            log(f"warm-starting {model_cfg.name} (seed {seed}, {key}) for "
                f"{model_cfg.warm_start.steps} steps")
            supervised_finetune(model, tokenizer, task, model_cfg.warm_start, torch.device("cpu"),
                                seed, log)
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)

    return cached_model_dir(Path(cache_dir) / "warm_start", key, build)
