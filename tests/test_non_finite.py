"""A non-finite loss or gradient norm stops the step with a message that says where the NaN or
inf is (grpo_cli/train/non_finite.py): which parameters' gradients, and which of the batch's
inputs (sampler log-probs, the training forward's log-probs on and off the completion mask,
advantages, token ids)."""

from __future__ import annotations

import re

import pytest
import torch
from step_parity import setup_for

from grpo_cli.rollout.batch import assemble_batch
from grpo_cli.train.non_finite import batch_report, gradient_report
from grpo_cli.train.pass_reading import NonFiniteLossError


def small_batch():
    """Two rows: prompt [5, 6], completions [7, 8] (both counted) and [9, pad] (one counted)."""
    prompt_ids = torch.tensor([[5, 6], [5, 6]])
    completion_ids = torch.tensor([[7, 8], [9, 0]])
    completion_mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    logprobs = torch.full((2, 2), -1.0)
    return assemble_batch(prompt_ids, torch.ones_like(prompt_ids), completion_ids, completion_mask,
                          logprobs, group_size=2, pad_id=0)


def test_gradient_report_names_the_non_finite_tensors_and_counts_their_entries():
    finite, nan, inf = (torch.nn.Parameter(torch.zeros(3)) for _ in range(3))
    finite.grad = torch.ones(3)
    nan.grad = torch.tensor([float("nan"), 1.0, float("nan")])
    inf.grad = torch.tensor([float("inf"), float("-inf"), float("nan")])
    report = gradient_report([("a", finite), ("b", nan), ("c", inf), ("d", torch.nn.Parameter(torch.ones(1)))])
    assert report == "non-finite gradients in 2 of 3 tensors: b (2 NaN of 3); c (1 NaN, 2 inf of 3)"


def test_gradient_report_names_at_most_four_and_counts_the_rest():
    params = []
    for index in range(6):
        p = torch.nn.Parameter(torch.zeros(1))
        p.grad = torch.tensor([float("nan")])
        params.append((f"p{index}", p))
    report = gradient_report(params)
    assert report.startswith("non-finite gradients in 6 of 6 tensors: p0 (1 NaN of 1)")
    assert "p3 (1 NaN of 1); and 2 more" in report and "p4" not in report


def test_gradient_report_says_when_no_parameter_has_a_gradient():
    assert gradient_report([("w", torch.nn.Parameter(torch.zeros(1)))]) == "no parameter has a gradient"


def test_batch_report_separates_the_tokens_the_loss_counts_from_the_rest():
    batch = small_batch()  # [2, 4]: columns 2 and 3 are completions; (1, 3) is padding
    policy = torch.zeros(2, 4)
    policy[1, 3] = float("nan")  # padding: the loss masks it, its backward does not
    policy[0, 0] = float("inf")  # a prompt column
    policy[0, 2] = float("nan")  # a counted completion token
    advantages = torch.zeros(2, 4)
    advantages[1, 3] = float("nan")  # not counted: not reported
    batch.sampler_logprobs[1, 2] = float("-inf")
    batch.input_ids[0, 3] = 50
    report = batch_report(batch, policy, advantages, vocab_size=50)
    assert report == (
        "the batch: sampler log-probs 1 inf; the training forward's log-probs 1 NaN on completion "
        "tokens, 1 NaN, 1 inf elsewhere; advantages finite; token ids outside the vocabulary (50): 1"
    )
    assert batch_report(small_batch(), None, None, None) == "the batch: sampler log-probs finite"


def test_a_nan_loss_says_the_batch_was_finite(tmp_path):
    """fault.kind=nan_loss multiplies the loss by NaN: the rollout and the forward were finite,
    and the message says so, with the gradients it left."""
    setup = setup_for(tmp_path, "fault.step=1", "fault.kind=nan_loss")
    with pytest.raises(NonFiniteLossError) as error:
        setup.trainer.step(1)
    message = str(error.value)
    assert message.startswith("step 1: loss is nan"), message
    assert re.search(r"non-finite gradients in (\d+) of \1 tensors: model\.embed_tokens\.weight", message), message
    assert ("the batch: sampler log-probs finite; the training forward's log-probs finite on "
            "completion tokens, finite elsewhere; advantages finite; token ids outside the "
            "vocabulary") in message, message


def test_a_nan_in_the_training_forward_is_located_there_not_in_the_rollout(tmp_path):
    """The training forward's logits at its first position made NaN (a hook on the test's model;
    the rollout's, under no_grad, stay finite): the message points at the forward's log-probs,
    and says the sampler's were finite."""
    setup = setup_for(tmp_path)
    head = setup.model.get_output_embeddings()

    def poison(module, args, output):  # [n, L', V]
        if not torch.is_grad_enabled():  # the rollout's (and idle rows') forwards stay finite
            return output
        output = output.clone()
        output[:, 0] = float("nan")
        return output

    head.register_forward_hook(poison)
    with pytest.raises(NonFiniteLossError) as error:
        setup.trainer.step(0)
    message = str(error.value)
    assert "sampler log-probs finite" in message, message
    found = re.search(r"the training forward's log-probs (\d+) NaN on completion tokens", message)
    assert found and int(found.group(1)) > 0, message
    assert "norm overflowed" not in message, message  # the loss stopped it, not the norm


def test_gradient_report_blames_the_norm_only_when_the_norm_stopped_the_step():
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.ones(2)
    assert gradient_report([("w", p)]) == "every gradient of the 1 tensors is finite"
    assert gradient_report([("w", p)], norm_failed=True).endswith("(their norm overflowed: lower optim.lr)")


def test_a_report_that_cannot_be_read_does_not_hide_the_failure(tmp_path):
    """The diagnosis runs on the failure path: if it fails itself (here: no micro-batch output to
    read), the message says so instead of raising over the NonFiniteLossError it explains."""
    setup = setup_for(tmp_path)
    report = setup.trainer._non_finite_report(None, [], None, True)
    assert report.startswith(". (where the NaN or inf is could not be read: ValueError: torch.cat()"), report
