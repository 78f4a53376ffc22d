"""A training step reads back to the host a fixed number of times, whatever the number of
micro-batches or rows, and a non-finite loss still stops the step before the optimizer applies it.

Host reads (device syncs on CUDA) are counted on CPU by tests/host_reads.py over a whole
`TrainingLoop.run_step`, rollout and held-out evaluation set apart (their decode loops have their
own tests).
"""

from __future__ import annotations

import pytest
import torch
from host_reads import HostReads, sites
from step_parity import setup_for

from grpo_cli.config.schema import TrainConfig
from grpo_cli.train.loop import TrainingLoop
from grpo_cli.train.pass_reading import NonFiniteLossError
from grpo_cli.train.trainer import GRPOTrainer

# grpo-cli's own reads in a step of one pass (docs/speed_log.md): the token counts, the pass's
# logged terms with its gradient norm (the non-finite checks), and the metrics row.
OWN_READS_PER_STEP = 3


def step_reads(tmp_path, *overrides) -> dict[str, list]:
    """The host reads of one `run_step` (the second; the first builds what is built once), by
    source: rollout, eval, optimizer, transformers, and grpo-cli's own."""
    setup = setup_for(tmp_path, "train.shared_prompt_forward=true", *overrides)
    loop = TrainingLoop(setup.cfg, setup)
    loop.run_step(0)
    with HostReads() as reads:
        loop.run_step(1)
    rollout, evaluation = reads.within(GRPOTrainer.rollout), reads.within(TrainingLoop.evaluate)
    sources: dict[str, list] = {"own": [], "optimizer": [], "transformers": []}
    for read in reads.outside(GRPOTrainer.rollout):
        if read in evaluation:
            continue
        files = [code.co_filename for code in read.codes]
        if any("/torch/optim/" in name for name in files):
            source = "optimizer"  # torch's AdamW reads its step count, a host tensor unless capturable
        elif any("/transformers/" in name for name in files):
            source = "transformers"
        else:
            source = "own"
        sources[source].append(read)
    return {"rollout": rollout, "eval": evaluation, **sources}


@pytest.mark.parametrize("rows", [
    ["rollout.prompts_per_step=3", "train.micro_batch_size=12"],  # 12 rows, one micro-batch
    ["rollout.prompts_per_step=3", "train.micro_batch_size=3"],  # four, each within a group
    ["rollout.prompts_per_step=6", "train.micro_batch_size=5"],  # 24 rows, five, splitting groups
], ids=["1x12", "4x3", "5x5"])
def test_host_reads_do_not_grow_with_micro_batches_or_rows(tmp_path, rows):
    reads = step_reads(tmp_path, *rows)
    own = sites(reads["own"])
    assert len(reads["own"]) == OWN_READS_PER_STEP, own
    # the metrics row's one read is the batch readings' (probes/step_metrics.py), the pass's is
    # pass_reading.py's (one pass here), the plan's the trainer's
    assert sum("probes/step_metrics.py" in site and "(read_batch)" in site for site in own) == 1, own
    assert sum("train/pass_reading.py" in site and "(read_pass)" in site for site in own) == 1, own
    assert all("grpo_cli/train/trainer.py" in site or "(read_batch)" in site or "(read_pass)" in site
               for site in own), own
    assert len(reads["rollout"]) > 0  # the counter sees the sampler's reads, set apart here
    # transformers' SDPA mask builder checks each forward's padding (masking_utils
    # `_ignore_causal_mask_sdpa`): one read per model call, the training forward's only ones
    micro_batches = -(-int(rows[0].split("=")[1]) * 4 // int(rows[1].split("=")[1]))
    assert all(any("masking_utils" in code.co_filename for code in read.codes)
               for read in reads["transformers"])
    # a prompt forward and up to train.completion_buckets completion forwards per micro-batch
    assert len(reads["transformers"]) <= (1 + TrainConfig().completion_buckets) * micro_batches


def test_a_second_pass_adds_its_own_read(tmp_path):
    """num_iterations=2: each pass reads its logged terms and its gradient norm once."""
    reads = step_reads(tmp_path, "algorithm.num_iterations=2", "train.micro_batch_size=5")
    assert len(reads["own"]) == OWN_READS_PER_STEP + 1, sites(reads["own"])


def test_off_probe_sparsity_adds_one_read(tmp_path):
    """probes.sparsity_every=1 on a step that probes nothing else (step 1 of every=100): the
    gradient's sparsity over every probed parameter costs one read, in probes/sparsity.py."""
    measured = step_reads(tmp_path / "on", "probes.every=100", "probes.matrices=[layer]")
    assert len(measured["own"]) == OWN_READS_PER_STEP + 1, sites(measured["own"])
    assert sum("probes/sparsity.py" in site for site in sites(measured["own"])) == 1
    off = step_reads(tmp_path / "off", "probes.every=100", "probes.matrices=[layer]", "probes.sparsity_every=0")
    assert len(off["own"]) == OWN_READS_PER_STEP, sites(off["own"])


@pytest.mark.parametrize("prompts", [3, 6])
def test_process_rewards_add_two_reads_whatever_the_rows(tmp_path, prompts):
    """algorithm=process: `step_tensors` reads the batch once (not twice per row) and the
    estimator reads its step count and index check once."""
    reads = step_reads(tmp_path, "algorithm=process", f"rollout.prompts_per_step={prompts}",
                       "train.micro_batch_size=5")
    own = sites(reads["own"])
    assert len(reads["own"]) == OWN_READS_PER_STEP + 2, own
    assert sum(count for site, count in own.items() if "step_tensors" in site) == 1


@pytest.mark.parametrize("micro_batch_size", [12, 5])
def test_non_finite_loss_stops_the_step_before_the_update(tmp_path, micro_batch_size):
    """A NaN loss in the step's last micro-batch only (fault.kind=nan_loss), found by the one
    read of the pass's logged terms: the step stops before any weight moves."""
    setup = setup_for(tmp_path, f"train.micro_batch_size={micro_batch_size}", "fault.step=3",
                      "fault.kind=nan_loss")
    before = {name: p.detach().clone() for name, p in setup.model.named_parameters()}
    with pytest.raises(NonFiniteLossError, match="step 3: loss is nan"):
        setup.trainer.step(3)
    for name, p in setup.model.named_parameters():
        assert torch.equal(p.detach(), before[name]), name  # no NaN update applied


def test_non_finite_gradient_norm_stops_the_step_before_the_update(tmp_path):
    """A finite loss whose gradient is not: the norm, read with the logged terms, stops the
    step before clipping and the optimizer touch a weight."""
    setup = setup_for(tmp_path, "train.micro_batch_size=5")
    before = {name: p.detach().clone() for name, p in setup.model.named_parameters()}
    weight = setup.model.lm_head.weight
    weight.register_hook(lambda grad: grad * float("inf"))  # on the test's model, not the trainer
    with pytest.raises(NonFiniteLossError, match="step 2: gradient norm is (nan|inf)") as error:
        setup.trainer.step(2)
    # ... and names the one tensor whose gradient is not finite (grpo_cli/train/non_finite.py)
    assert "non-finite gradients in 1 of " in str(error.value), error.value
    assert "tensors: lm_head.weight (" in str(error.value), error.value
    for name, p in setup.model.named_parameters():
        assert torch.equal(p.detach(), before[name]), name
