"""One process of a TRL GRPOTrainer run with the SpectraCallback, started by `accelerate launch`
(tests/test_trl_spectra.py's DDP and FSDP2 tests, and docs/speed_log.md's overhead measurement).

Each process saves its own generation outputs (`batches/rank{r}-step{s}.pt`) and what it wrote
(`ranks/rank{r}.json`), so the test can rebuild the global batch and check who wrote the run.

    accelerate launch --cpu --num_processes 2 tests/trl_ddp_worker.py --cache DIR --out DIR

`--fsdp2` shards the model with accelerate's FSDP2 plugin on CPU, which accelerate itself never
does (`force_fsdp2`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from step_parity import TINY, parity_reward  # noqa: E402

VARIED = ["task.max_steps=2", "task.operand_max=30", "task.operators=[+,-]"]  # as test_trl_spectra


def force_fsdp2(trainer) -> None:
    """Make the trainer's accelerator an FSDP2 one, as accelerate makes it on GPUs.

    accelerate 1.15 (state.py, AcceleratorState.__init__) turns DistributedType.FSDP on only
    over an accelerator backend (MULTI_GPU, MULTI_NPU, ...): under torchrun on CPU the state is
    MULTI_CPU whatever fsdp_plugin says. This sets what that branch would have set (the state's
    and PartialState's shared distributed_type, the plugin) and transformers' flag, before
    `train()` prepares the model: accelerate then calls `fully_shard` on each LlamaDecoderLayer
    and the root, on a CPU mesh over gloo. Library state only; grpo-cli is not touched.
    """
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["LlamaDecoderLayer"], reshard_after_forward=True,
        cpu_ram_efficient_loading=False, state_dict_type="FULL_STATE_DICT",
    )
    state = trainer.accelerator.state
    state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP  # AcceleratorState() copies it back
    state.fsdp_plugin = plugin
    trainer.is_fsdp_enabled = True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cache", required=True)  # grpo-cli's model cache (the test made the model)
    parser.add_argument("--out", required=True)  # run dir = OUT/run; batches and ranks beside it
    parser.add_argument("--rows-per-process", type=int, default=6)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--every", type=int, default=1)
    parser.add_argument("--loss-type", default="grpo")
    parser.add_argument("--lr", type=float, default=0.0)
    parser.add_argument("--dtype", default="float64")
    parser.add_argument("--matrices", nargs="*", default=None)
    parser.add_argument("--fsdp2", action="store_true")  # shard with FSDP2 (force_fsdp2)
    args = parser.parse_args()
    torch.set_num_threads(1)

    from trl import GRPOConfig, GRPOTrainer

    from grpo_cli.config.compose import compose_config
    from grpo_cli.integrations.trl_setup import (
        grpo_config_kwargs,
        load_trl_policy,
        task_dataset,
        task_reward,
    )
    from grpo_cli.integrations.trl_spectra import SpectraCallback
    from grpo_cli.models.policy import load_policy
    from grpo_cli.tasks import build_task

    out = Path(args.out)
    cfg = compose_config(TINY + VARIED + [f"cache_dir={args.cache}", f"rollout.group_size={args.group_size}"])
    task = build_task(cfg.task)
    loaded = load_policy(cfg, task, torch.device("cpu"), log=lambda message: None)  # from the cache
    task.tokenizer = loaded.tokenizer
    task.reward = parity_reward
    model, tokenizer = load_trl_policy(loaded.source_path, "cpu", dtype=getattr(torch, args.dtype))
    kwargs = grpo_config_kwargs(cfg, steps=args.steps, output_dir=str(out / "trl"), device_type="cpu",
                                loss_type=args.loss_type)
    kwargs.update(learning_rate=args.lr, per_device_train_batch_size=args.rows_per_process, max_grad_norm=1e9)
    trainer = GRPOTrainer(model=model, reward_funcs=task_reward(task), args=GRPOConfig(**kwargs),
                          train_dataset=task_dataset(task), processing_class=tokenizer)
    if args.fsdp2:
        force_fsdp2(trainer)
    callback = SpectraCallback(out / "run", every=args.every, matrices=args.matrices, task="arith").attach(trainer)

    rank = trainer.accelerator.process_index
    batches = out / "batches"
    batches.mkdir(parents=True, exist_ok=True)
    inner, step = trainer._generate_and_score_completions, [0]
    score, rewards = trainer._calculate_rewards, []

    def scoring(*a, **k):  # this process's rows' rewards as TRL weighs them (before its gather)
        per_func = score(*a, **k)  # [rows, F]
        rewards.append((per_func * trainer.reward_weights.to(per_func.device)).nansum(dim=1))
        return per_func

    def saving(*a, **k):  # wraps the callback's wrapper: the same dict TRL trains on
        output = inner(*a, **k)
        saved = {key: value for key, value in output.items() if torch.is_tensor(value)}
        torch.save({**saved, "rewards": rewards[-1]}, batches / f"rank{rank}-step{step[0]}.pt")
        step[0] += 1
        return output

    trainer._calculate_rewards = scoring
    trainer._generate_and_score_completions = saving
    trainer.train()
    from grpo_cli.runtime.sharded import whole

    # FSDP2: each process holds DTensor shards; whole() gathers them (every process, same order)
    weights = torch.cat([whole(p.detach()).reshape(-1).double() for p in trainer.model.parameters()])
    (out / "ranks").mkdir(exist_ok=True)
    (out / "ranks" / f"rank{rank}.json").write_text(json.dumps({
        "rank": rank, "processes": trainer.accelerator.num_processes,
        "distributed_type": str(trainer.accelerator.distributed_type),
        "sharded": any(hasattr(p, "full_tensor") for p in trainer.model.parameters()),
        "wrote": callback.results is not None, "weights_sum": float(weights.sum()),
        "weights_norm": float(weights.norm()),
    }))


if __name__ == "__main__":
    main()
