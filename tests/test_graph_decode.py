"""The CUDA-graph-ready decode loop (grpo_cli/rollout/graph_decode.py, `rollout.cuda_graphs`).

On CPU its step runs eagerly: these tests check it against the hf_static loop, its sampler
against the distribution it must draw from, its host reads, and that in-place weight changes
reach the next rollout. The tests marked `gpu` (`make test-gpu`) capture it in CUDA graphs and
check replay against the eager step (passed on an H100 and an H200), and localise the NaN that
full runs with graphs met on an H200 on 2026-11-28 (docs/gpu_report_2026-11-28b_H200.md).
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_llama, tiny_nemotron
from host_reads import HostReads

from grpo_cli.algorithm.logprobs import token_logprobs
from grpo_cli.config.compose import compose_config
from grpo_cli.config.errors import ConfigError
from grpo_cli.models.char_tokenizer import build_char_tokenizer
from grpo_cli.rollout.base import SamplingSettings
from grpo_cli.rollout.sampling import filter_top_p, race_tokens
from grpo_cli.rollout.static_decode import StaticDecodeBackend, graph_decode_problem
from grpo_cli.validate import config_problems

CPU = torch.device("cpu")
PROMPTS = ["Tom has 3 books.\n", "7+5=?\n", "How many apples are left over today?\n"]
K = 8  # tokens per replay (check_every), as on CUDA


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def peaked_llama(tokenizer, eos_boost: float = 0.0, seed: int = 0, **overrides):
    """The tiny Llama with peaked logits (greedy has no near-ties); `eos_boost` makes some rows
    stop early."""
    model = tiny_llama(seed=seed, tokenizer=tokenizer, **overrides)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
        model.lm_head.weight[tokenizer.eos_token_id] += eos_boost * model.model.norm.weight
    return model


def prompts_of(tokenizer, texts=PROMPTS):
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


def graph_backend(model, tokenizer, device=CPU, k=K, **options):
    return StaticDecodeBackend(model, tokenizer, device, cuda_graphs=True, check_every=k, **options)


def assert_same_batch(expected, actual, atol):
    assert torch.equal(actual.input_ids, expected.input_ids)
    assert torch.equal(actual.completion_mask, expected.completion_mask)
    assert actual.completions == expected.completions
    assert actual.sampler_logprobs.dtype == torch.float32
    torch.testing.assert_close(actual.sampler_logprobs, expected.sampler_logprobs, atol=atol, rtol=0)


# Largest gap between the graph-ready step's and the hf_static loop's log-probs measured on CPU
# in bf16 for these models: 0.0 (attention runs in float32 in both; the masked capacity adds
# exact zeros). The bound leaves room for other kernels' summation orders.
BF16_TOLERANCE = 0.01


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("overrides", [{}, {"attention_bias": True, "mlp_bias": True}],
                         ids=["llama-gqa", "llama-biases"])
def test_greedy_graph_ready_step_equals_the_hf_static_loop(tokenizer, dtype, overrides):
    model = peaked_llama(tokenizer, eos_boost=1.0, seed=1, **overrides).to(dtype)
    settings = SamplingSettings(group_size=2, max_new_tokens=16, temperature=0.0)
    expected = StaticDecodeBackend(model, tokenizer, CPU).generate(prompts_of(tokenizer), settings, 0)
    actual = graph_backend(model, tokenizer).generate(prompts_of(tokenizer), settings, 0)
    lengths = expected.completion_lengths()
    assert lengths.min() < lengths.max()  # rows stop at different lengths
    assert_same_batch(expected, actual, atol=1e-5 if dtype == torch.float32 else BF16_TOLERANCE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_graph_ready_step_decodes_nemotron_as_the_hf_static_loop(tokenizer, dtype, temperature):
    """The paper's architecture (LayerNorm1P, relu^2 MLP without a gate, RoPE on half of each
    head) has a graph-ready step: the paper-scale rehearsal can decode in CUDA graphs."""
    model = tiny_nemotron(tokenizer=tokenizer, seed=1).to(dtype)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # peaked: greedy has no near-ties
    assert graph_decode_problem(model, torch.device("cuda")) is None
    settings = SamplingSettings(group_size=4, max_new_tokens=16, temperature=temperature)
    expected = StaticDecodeBackend(model, tokenizer, CPU).generate(prompts_of(tokenizer), settings, 2)
    actual = graph_backend(model, tokenizer).generate(prompts_of(tokenizer), settings, 2)
    assert expected.completion_mask.sum() > 40
    assert_same_batch(expected, actual, atol=1e-5 if dtype == torch.float32 else BF16_TOLERANCE)


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_sampled_tokens_equal_the_hf_static_loops(tokenizer, temperature, top_p):
    """The race draws what torch.multinomial draws from the same generator state (its
    one-sample path is this race; sampling.py). Not a requirement (the distribution test below
    is): if a torch release changes multinomial, this test says so."""
    model = peaked_llama(tokenizer, eos_boost=2.0)
    settings = SamplingSettings(group_size=4, max_new_tokens=16, temperature=temperature, top_p=top_p)
    for seed in (0, 1):
        expected = StaticDecodeBackend(model, tokenizer, CPU).generate(prompts_of(tokenizer), settings, seed)
        actual = graph_backend(model, tokenizer).generate(prompts_of(tokenizer), settings, seed)
        assert_same_batch(expected, actual, atol=1e-5)


def test_sampled_logprobs_are_the_policy_logprobs_and_the_layout_holds(tokenizer):
    model = peaked_llama(tokenizer, eos_boost=2.0)
    settings = SamplingSettings(group_size=4, max_new_tokens=16, temperature=0.7, top_p=0.9)
    batch = graph_backend(model, tokenizer).generate(prompts_of(tokenizer), settings, 11)
    with torch.no_grad():
        recomputed = token_logprobs(model, batch.input_ids, batch.attention_mask)  # [N, L]
    in_completion = batch.completion_mask > 0
    assert in_completion.sum() > 20
    assert (recomputed - batch.sampler_logprobs)[in_completion].abs().max() <= 1e-5
    assert (batch.sampler_logprobs[~in_completion] == 0).all()
    completion = batch.input_ids[:, batch.prompt_length :]  # [N, T]
    mask = batch.completion_mask[:, batch.prompt_length :]  # [N, T]
    assert (completion[mask == 0] == tokenizer.pad_token_id).all()


def test_same_seed_same_tokens_other_seed_other_tokens(tokenizer):
    model = peaked_llama(tokenizer, eos_boost=2.0).train()
    backend = graph_backend(model, tokenizer)
    settings = SamplingSettings(group_size=4, max_new_tokens=12)
    first = backend.generate(prompts_of(tokenizer), settings, generator_seed=1)
    again = backend.generate(prompts_of(tokenizer), settings, generator_seed=1)
    other = backend.generate(prompts_of(tokenizer), settings, generator_seed=2)
    assert torch.equal(first.input_ids, again.input_ids)
    assert torch.equal(first.sampler_logprobs, again.sampler_logprobs)
    assert not torch.equal(first.input_ids, other.input_ids)
    assert model.training


@pytest.mark.parametrize("k", [1, 5])
def test_tokens_per_replay_does_not_change_the_batch(tokenizer, k):
    """k = 5 does not divide 16: the completion capacity is 20 and the last replay overshoots."""
    model = peaked_llama(tokenizer, eos_boost=2.0)
    settings = SamplingSettings(group_size=3, max_new_tokens=16)
    reference = graph_backend(model, tokenizer).generate(prompts_of(tokenizer), settings, 4)
    other = graph_backend(model, tokenizer, k=k).generate(prompts_of(tokenizer), settings, 4)
    assert_same_batch(reference, other, atol=0)


def test_buffers_reused_across_rollouts_give_what_fresh_buffers_give(tokenizer):
    """Three rollouts of 3 prompts of other lengths share one bucket (3 groups, 64 prompt
    columns) with nothing left over from the rollout before; 4 prompts get their own."""
    model = peaked_llama(tokenizer, eos_boost=2.0)
    settings = SamplingSettings(group_size=2, max_new_tokens=16)
    reused = graph_backend(model, tokenizer)
    for texts in (PROMPTS, ["1+1=?\n", "9\n", "Hi.\n"], PROMPTS[::-1], PROMPTS + ["2+2=?\n"]):
        fresh = graph_backend(model, tokenizer).generate(prompts_of(tokenizer, texts), settings, 7)
        assert_same_batch(fresh, reused.generate(prompts_of(tokenizer, texts), settings, 7), atol=0)
    assert len(reused.graph_decoder.buckets) == 2


# An evaluation's bucket (greedy, R = 1, its own prompts and length) between training rollouts
# (sampled, R = 4), as a run interleaves them: each rollout must be what a fresh decoder gives.
INTERLEAVED = [("eval", 0), ("train", 3), ("eval", 0), ("train", 4), ("train", 3)]


def interleaved_rollouts_match_fresh_ones(model, tokenizer, device, atol):
    """`INTERLEAVED` through one long-lived graph decoder against a fresh eager one each time."""
    runs = {
        "eval": (SamplingSettings(group_size=1, max_new_tokens=24, temperature=0.0),
                 prompts_of(tokenizer, ["9+9=?\n", "Sam has 12 pens and gives 5 away. How many are left?\n"])),
        "train": (SamplingSettings(group_size=4, max_new_tokens=16, temperature=1.0), prompts_of(tokenizer)),
    }
    reused = graph_backend(model, tokenizer, device)
    for kind, seed in INTERLEAVED:
        settings, prompts = runs[kind]
        fresh = graph_backend(model, tokenizer, device, capture_graphs=False).generate(prompts, settings, seed)
        assert_same_batch(fresh, reused.generate(prompts, settings, seed), atol=atol)
    return reused


def test_an_evaluation_bucket_between_rollouts_leaves_them_unchanged(tokenizer):
    reused = interleaved_rollouts_match_fresh_ones(peaked_llama(tokenizer, eos_boost=2.0), tokenizer, CPU, 0)
    assert len(reused.graph_decoder.buckets) == 2


def test_weights_changed_in_place_reach_the_next_rollout(tokenizer):
    """As an optimizer step does: the fused q/k/v and gate/up copies are refreshed (without
    the refresh, rows part from the reference after the first token, which the prefill draws)."""
    model = peaked_llama(tokenizer)  # no EOS within 16 tokens: the decode step makes every token
    settings = SamplingSettings(group_size=2, max_new_tokens=16, temperature=0.0)
    backend = graph_backend(model, tokenizer)
    before = backend.generate(prompts_of(tokenizer), settings, 0)
    perturb_fused_weights(model)
    after = backend.generate(prompts_of(tokenizer), settings, 0)
    expected = StaticDecodeBackend(model, tokenizer, CPU).generate(prompts_of(tokenizer), settings, 0)
    assert not torch.equal(after.input_ids, before.input_ids)
    assert expected.completion_lengths().min() > 8
    assert_same_batch(expected, after, atol=1e-5)


def perturb_fused_weights(model, seed: int = 0) -> None:
    """An in-place change of the weights the step reads through its fused copies."""
    noise = torch.Generator(device=model.device).manual_seed(seed)
    with torch.no_grad():
        for layer in model.model.layers:
            for linear in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                           layer.mlp.gate_proj, layer.mlp.up_proj):
                scale = linear.weight.float().std()
                change = torch.randn(linear.weight.shape, generator=noise, device=model.device)
                linear.weight.add_((change * scale).to(linear.weight.dtype))


CHI2_999 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515}  # 0.999 quantiles by dof


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_race_draws_follow_the_tempered_top_p_distribution(top_p):
    """30,000 draws on a 6-token vocabulary against softmax(filter_top_p(logits / T))."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.5])
    temperature, draws = 0.7, 30_000
    rows = logits.expand(draws, -1).contiguous()  # [M, V]
    tokens = race_tokens(rows, temperature, top_p, torch.Generator().manual_seed(0))  # [M]
    counts = torch.bincount(tokens, minlength=6).double()
    scores = filter_top_p(logits[None] / temperature, top_p)[0]  # [V]
    support = torch.isfinite(scores)
    if top_p < 1.0:
        assert 1 < support.sum() < 6  # the filter removed something and kept a choice
    assert (counts[~support] == 0).all()
    probs = scores[support].double().softmax(-1)
    dof = int(support.sum()) - 1
    assert chi_square(counts[support], probs) < CHI2_999[dof]
    untempered = logits[support].double().softmax(-1)  # the wrong law: the test can tell
    assert chi_square(counts[support], untempered) > 10 * CHI2_999[dof]


@pytest.mark.parametrize("max_new", [16, 32])
def test_no_host_read_per_token(tokenizer, max_new):
    """The whole rollout reads "all done" once per k tokens, plus four reads a rollout (its
    log-probs finite, the batch width, the tokens and their mask for the texts); the hf_static loop with
    check_every=1 reads once per token."""
    model = peaked_llama(tokenizer)
    settings = SamplingSettings(group_size=2, max_new_tokens=max_new, temperature=1.0, top_p=0.9)
    counts = {}
    for name, backend in (("graph", graph_backend(model, tokenizer)),
                          ("loop", StaticDecodeBackend(model, tokenizer, CPU, check_every=1))):
        backend.generate(prompts_of(tokenizer), settings, 0)  # buckets built outside the count
        with HostReads() as reads:
            batch = backend.generate(prompts_of(tokenizer), settings, 0)
        assert batch.completion_lengths().max() == max_new  # every token step ran
        counts[name] = reads.total
    assert counts["graph"] <= math.ceil(max_new / K) - 1 + 4
    assert counts["loop"] >= max_new - 1  # the counter sees per-token reads


def test_graph_decode_problem_names_what_is_missing(tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    cuda = torch.device("cuda")  # a device object only; nothing runs on it
    llama = tiny_llama(tokenizer=tokenizer)
    assert graph_decode_problem(llama, cuda) is None
    assert "device=cuda" in graph_decode_problem(llama, CPU)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2))
    assert "GPT2LMHeadModel" in graph_decode_problem(gpt2, cuda)
    dynamic = tiny_llama(tokenizer=tokenizer, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    assert "RoPE" in graph_decode_problem(dynamic, cuda)


def cuda_graphs_config(*overrides):
    return compose_config(["experiment=smoke", "rollout.backend=hf_static",
                           "rollout.cuda_graphs=true", *overrides])


def test_config_refuses_cuda_graphs_where_they_cannot_apply():
    assert config_problems(cuda_graphs_config("device=cuda")) == []
    assert config_problems(cuda_graphs_config("device=auto")) == []
    assert any(line.startswith("device='cpu'") and "cuda_graphs" in line
               for line in config_problems(cuda_graphs_config("device=cpu")))
    assert any(line.startswith("rollout.backend='hf'")
               for line in config_problems(cuda_graphs_config("device=cuda", "rollout.backend=hf")))
    assert any(line.startswith("rollout.compile_decode=True") for line in config_problems(
        cuda_graphs_config("device=cuda", "rollout.compile_decode=true")))


def test_setup_refuses_an_unsupported_model_in_one_line(tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    from grpo_cli.train.setup import build_backend

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2,
                                      eos_token_id=tokenizer.eos_token_id))
    with pytest.raises(ConfigError, match=r"^rollout\.cuda_graphs=true: GPT2LMHeadModel") as error:
        build_backend(cuda_graphs_config("device=cuda"), gpt2, tokenizer, torch.device("cuda"), "")
    assert "\n" not in str(error.value)
    llama = tiny_llama(tokenizer=tokenizer)
    with pytest.raises(ConfigError, match="device=cuda"):  # device=auto on a machine without CUDA
        build_backend(cuda_graphs_config("device=auto"), llama, tokenizer, CPU, "")


def test_grpo_run_refuses_cuda_graphs_on_cpu(tmp_path, cache_dir):
    from cli_helpers import grpo_run

    result = grpo_run(tmp_path, cache_dir, "rollout.backend=hf_static", "rollout.cuda_graphs=true")
    assert result.exit_code != 0
    assert "config error: device='cpu'" in result.output and "rollout.cuda_graphs=true" in result.output
    assert not (tmp_path / "smoke").exists()  # refused before anything was written


# ---- GPU tier: capture and replay (make test-gpu; not yet run on a GPU) ----

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = torch.device("cuda")
CUDA_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: BF16_TOLERANCE}


def cuda_llama(tokenizer, dtype=torch.float32, eos_boost=2.0):
    return peaked_llama(tokenizer, eos_boost=eos_boost).to(CUDA, dtype)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("temperature,top_p", [(0.0, 1.0), (1.0, 1.0), (0.8, 0.9)])
def test_cuda_graph_replay_gives_the_eager_steps_tokens(tokenizer, dtype, temperature, top_p):
    model = cuda_llama(tokenizer, dtype)
    settings = SamplingSettings(group_size=4, max_new_tokens=20, temperature=temperature, top_p=top_p)
    eager = graph_backend(model, tokenizer, CUDA, capture_graphs=False)
    captured = graph_backend(model, tokenizer, CUDA)
    for seed in (3, 4):  # the second rollout replays the graph captured for the first
        expected = eager.generate(prompts_of(tokenizer), settings, seed)
        actual = captured.generate(prompts_of(tokenizer), settings, seed)
        assert_same_batch(expected, actual, atol=CUDA_TOLERANCE[dtype])
    assert captured.graph_decoder.captures == 1 and eager.graph_decoder.captures == 0


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cuda_graph_replay_decodes_nemotron_as_the_eager_step(tokenizer, temperature):
    """The paper's architecture in bf16 (its dtype on CUDA), captured and replayed."""
    model = tiny_nemotron(tokenizer=tokenizer, seed=1).to(CUDA, torch.bfloat16)
    settings = SamplingSettings(group_size=4, max_new_tokens=20, temperature=temperature)
    eager = graph_backend(model, tokenizer, CUDA, capture_graphs=False)
    captured = graph_backend(model, tokenizer, CUDA)
    for seed in (3, 4):
        expected = eager.generate(prompts_of(tokenizer), settings, seed)
        actual = captured.generate(prompts_of(tokenizer), settings, seed)
        assert_same_batch(expected, actual, atol=CUDA_TOLERANCE[torch.bfloat16])
    assert captured.graph_decoder.captures == 1
    # the bf16 model's keys and values are cached float32, as attention reads them (no cast a call)
    layers = [layer for bucket in captured.graph_decoder.buckets.values() for layer in bucket.cache.layers]
    assert layers and all(part.dtype == torch.float32 for layer in layers
                          for part in (layer.prompt_keys, layer.prompt_values, layer.keys, layer.values))


@pytest.mark.gpu
@requires_cuda
def test_cuda_graph_greedy_equals_the_hf_static_loop(tokenizer):
    model = cuda_llama(tokenizer, eos_boost=1.0)
    settings = SamplingSettings(group_size=2, max_new_tokens=16, temperature=0.0)
    expected = StaticDecodeBackend(model, tokenizer, CUDA).generate(prompts_of(tokenizer), settings, 0)
    actual = graph_backend(model, tokenizer, CUDA).generate(prompts_of(tokenizer), settings, 0)
    assert_same_batch(expected, actual, atol=1e-5)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "fp32-weights-bf16-autocast"])
def test_cuda_graph_replay_follows_weights_changed_in_place(tokenizer, autocast):
    """One graph, two rollouts with an in-place weight change between them (an optimizer step):
    the replay gives the eager step's tokens for the new weights. Under autocast the capture
    keeps no cached bf16 copy of the old weights."""
    from grpo_cli.train.autocast import policy_autocast

    model = cuda_llama(tokenizer)
    settings = SamplingSettings(group_size=4, max_new_tokens=16, temperature=1.0)
    eager = graph_backend(model, tokenizer, CUDA, capture_graphs=False)
    captured = graph_backend(model, tokenizer, CUDA)
    with policy_autocast(CUDA, "bf16" if autocast else "none"):
        before = captured.generate(prompts_of(tokenizer), settings, 5)
    perturb_fused_weights(model)
    with torch.no_grad():
        model.lm_head.weight.mul_(1.5)  # a weight the step reads directly, not through a copy
    with policy_autocast(CUDA, "bf16" if autocast else "none"):
        after = captured.generate(prompts_of(tokenizer), settings, 5)
        expected = eager.generate(prompts_of(tokenizer), settings, 5)
    assert not torch.equal(after.input_ids, before.input_ids)
    assert_same_batch(expected, after, atol=BF16_TOLERANCE if autocast else 1e-5)
    assert captured.graph_decoder.captures == 1


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cuda_graph_buckets_captured_in_turn_do_not_disturb_each_other(tokenizer, dtype):
    """The evaluation's capture before step 0 is one of what the H200 NaN needed: two buckets
    captured and replayed in turn, every replay against a fresh eager decode."""
    reused = interleaved_rollouts_match_fresh_ones(cuda_llama(tokenizer, dtype), tokenizer, CUDA,
                                                   CUDA_TOLERANCE[dtype])
    assert reused.graph_decoder.captures == 2


@pytest.mark.gpu
@requires_cuda
def test_a_graph_outlives_another_graph_captured_on_the_same_stream(tokenizer):
    """pytorch/pytorch#193402 (graph_decode.clear_cublas_workspaces): `torch.cuda.graph` captures
    every graph on one stream, and torch releases a stream's cuBLAS workspaces when a graph
    captured on it is destroyed. Here one decoder's graph is destroyed (as a finished test's
    backend is when the garbage collector gets to it, mid-way through the next test) while a
    second decoder's graph, captured after it, lives on. What the first one released goes to new
    tensors; the survivor's replays must leave them intact and still give the eager step's tokens.
    The MLP's wide inner dimension (K = 16384 in down_proj at 12 rows) is the shape cuBLAS runs
    with a split-K workspace."""
    import gc

    model = peaked_llama(tokenizer, eos_boost=2.0, intermediate_size=16384).to(CUDA)
    settings = SamplingSettings(group_size=4, max_new_tokens=20, temperature=1.0)
    prompts = prompts_of(tokenizer)
    eager = graph_backend(model, tokenizer, CUDA, capture_graphs=False)
    first, survivor = graph_backend(model, tokenizer, CUDA), graph_backend(model, tokenizer, CUDA)
    first.generate(prompts, settings, 3)
    survivor.generate(prompts, settings, 3)
    assert first.graph_decoder.captures == 1 and survivor.graph_decoder.captures == 1
    del first
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # what the first graph's pool held goes back to the device ...
    sentinels = ([torch.full((8 << 20,), 7.0, device=CUDA) for _ in range(16)]  # ... and to these
                 + [torch.full((1 << 18,), 7.0, device=CUDA) for _ in range(64)])  # 16 x 32 MiB, 64 x 1 MiB
    for seed in (4, 5):
        expected = eager.generate(prompts, settings, seed)
        actual = survivor.generate(prompts, settings, seed)
        assert_same_batch(expected, actual, atol=1e-5)
    torch.cuda.synchronize()
    overwritten = sum(int((sentinel != 7.0).sum()) for sentinel in sentinels)
    assert overwritten == 0, f"{overwritten} entries of tensors allocated after the first graph died were overwritten"
    assert survivor.graph_decoder.captures == 1


def test_the_cublas_clash_script_plans_anywhere_and_runs_where_cuda_is():
    """scripts/cublas_graph_clash.py, the GPU visit's check of pytorch/pytorch#193402: its plan
    prints anywhere; without CUDA it refuses in one line, with CUDA it reads both modes."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "cublas_graph_clash.py"
    plan = subprocess.run([sys.executable, str(script), "--dry-run"], capture_output=True, text=True)
    assert plan.returncode == 0 and plan.stdout.startswith("plan:"), plan.stderr
    ran = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    if torch.cuda.is_available():
        assert ran.returncode == 0, ran.stderr
        assert "plain: overwritten" in ran.stdout and "bracketed: overwritten 0, product ok" in ran.stdout
    else:
        assert ran.returncode != 0 and "needs a CUDA device" in ran.stderr


@pytest.mark.gpu
@requires_cuda
def test_cuda_run_with_cuda_graphs(tmp_path, cache_dir):
    import json

    from cli_helpers import grpo_run

    result = grpo_run(tmp_path, cache_dir, "rollout.backend=hf_static", "rollout.cuda_graphs=true",
                      "train.steps=3", "task.eval_size=8", device="cuda")
    assert result.exit_code == 0, result.output
    out = next((tmp_path / "smoke").iterdir())
    assert json.loads((out / "run.json").read_text())["status"] == "completed"


def test_auto_graphs_fall_back_to_the_eager_loop_with_its_draws(tokenizer):
    """rollout.cuda_graphs left at auto (`graphs_fallback`): a graph decode that fails (here a
    model without a graph-ready step) warns once, and the rollout is the eager loop's, token for
    token; explicit graphs (no fallback) raise instead."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2,
                                      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)).eval()
    settings = SamplingSettings(group_size=2, max_new_tokens=8, temperature=1.0)
    eager = StaticDecodeBackend(gpt2, tokenizer, CPU).generate(prompts_of(tokenizer), settings, 5)
    auto = StaticDecodeBackend(gpt2, tokenizer, CPU, cuda_graphs=True, graphs_fallback=True)
    with pytest.warns(RuntimeWarning, match="decodes eagerly"):
        fallen = auto.generate(prompts_of(tokenizer), settings, 5)
    assert auto.cuda_graphs is False
    assert_same_batch(eager, fallen, atol=1e-6)
    explicit = StaticDecodeBackend(gpt2, tokenizer, CPU, cuda_graphs=True)
    with pytest.raises(ValueError, match="graph-ready"):
        explicit.generate(prompts_of(tokenizer), settings, 5)


def test_a_graph_decode_with_non_finite_output_falls_back_or_stops(tokenizer):
    """State that only the graph decoder reads (here its RoPE table, set to NaN: a stand-in for a
    graph that reads memory it no longer owns) gives non-finite log-probs. At auto the rollout
    warns and is the eager loop's, token for token; with explicit graphs it is an error that
    names the graph decode, not a NaN gradient norm steps later."""
    model = peaked_llama(tokenizer, eos_boost=0.5)
    settings = SamplingSettings(group_size=2, max_new_tokens=12, temperature=1.0)
    eager = StaticDecodeBackend(model, tokenizer, CPU).generate(prompts_of(tokenizer), settings, 3)
    for fallback in (True, False):
        backend = graph_backend(model, tokenizer, graphs_fallback=fallback)
        backend.generate(prompts_of(tokenizer), settings, 3)  # builds the decoder and its step
        backend.graph_decoder.step.rope_table[0].fill_(float("nan"))
        if fallback:
            with pytest.warns(RuntimeWarning, match="non-finite log-probs"):
                fallen = backend.generate(prompts_of(tokenizer), settings, 3)
            assert backend.cuda_graphs is False
            assert_same_batch(eager, fallen, atol=1e-6)
        else:
            with pytest.raises(RuntimeError, match="graph decode gave non-finite log-probs in 6 of 6 rows"):
                backend.generate(prompts_of(tokenizer), settings, 3)


@pytest.mark.gpu
@requires_cuda
def test_a_cuda_run_at_auto_decodes_in_graphs(tmp_path):
    """rollout.cuda_graphs=null (auto) on CUDA with a graph-ready model: the run's sampler
    captures its graphs and keeps them over optimizer steps, without falling back (no warning).
    (Passed on an H200, 2026-11-28, as the then default; without evaluation or probes.)"""
    import warnings

    from grpo_cli.bench.builder import build_setup

    cfg = compose_config(["experiment=smoke", "device=cuda", "rollout.backend=hf_static",
                          "rollout.cuda_graphs=null", "progress=false", "probes.every=0",
                          f"cache_dir={tmp_path}"])
    setup = build_setup(cfg, log=lambda message: None)
    backend = setup.trainer.backend
    assert backend.cuda_graphs is True
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for step in range(3):
            setup.trainer.step(step)
    assert backend.cuda_graphs is True and backend.graph_decoder.captures == 1


def graph_run_loop(tmp_path, *overrides):
    """`grpo run`'s loop (train/run.py `_train`) on the smoke experiment with CUDA graphs, in
    this process: the components, then the training loop."""
    from grpo_cli.train.loop import TrainingLoop
    from grpo_cli.train.setup import build_components

    cfg = compose_config(["experiment=smoke", "device=cuda", "rollout.backend=hf_static",
                          "rollout.cuda_graphs=true", "progress=false", "task.eval_size=8",
                          f"cache_dir={tmp_path / 'cache'}", *overrides])
    parts = build_components(cfg, tmp_path / "initial_layers.pt", log=lambda message: None)
    return TrainingLoop(cfg, parts)


@pytest.mark.gpu
@requires_cuda
def test_a_graph_rollout_after_an_evaluation_has_finite_log_probs_and_varied_rows(tmp_path):
    """On an H200 (2026-11-28) every full smoke run with CUDA graphs (an evaluation before step
    0, probes) stopped at step 0 on a NaN gradient norm, while graph runs without either trained.
    The evaluation captures a second bucket (greedy, R = 1) before the training one: the
    training rollout that follows must still be finite and sampled (rows of a group differ)."""
    loop = graph_run_loop(tmp_path, "probes.every=0")
    trainer = loop.trainer
    loop.evaluate(0)
    problems = trainer.task.train[:4]
    prompts = [trainer.tokenizer(trainer.task.prompt(p), add_special_tokens=False)["input_ids"]
               for p in problems]
    settings = SamplingSettings(group_size=4, max_new_tokens=24, temperature=1.0)
    with trainer.autocast():
        batch = trainer.backend.generate(prompts, settings, generator_seed=3)
    assert trainer.backend.graph_decoder.captures == 2
    assert torch.isfinite(batch.sampler_logprobs).all()
    in_completion = batch.completion_mask.bool()
    assert (batch.sampler_logprobs[in_completion] < 0).any()
    completions = batch.completions
    assert any(len(set(completions[g * 4:(g + 1) * 4])) > 1 for g in range(len(problems)))


# Which of a full run's parts meets the NaN (the H200 failure above): each case turns one off.
GRAPH_RUN_CASES = {
    "full": [],
    "no_eval": ["eval.every=0"],
    "no_probes": ["probes.every=0"],
    "one_bucket": ["train.completion_buckets=1"],
    "all_rows_backward": ["train.backward_live_rows=false"],
    "before_issue_45": ["train.completion_buckets=1", "train.backward_live_rows=false"],  # passed 2026-11-27
}


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("case", list(GRAPH_RUN_CASES))
def test_graph_runs_train_with_finite_gradients(tmp_path, case):
    """Three steps of the run loop with CUDA graphs: every loss and gradient norm finite."""
    loop = graph_run_loop(tmp_path, "probes.every=1", "eval.every=1", *GRAPH_RUN_CASES[case])
    if loop.eval_every > 0:
        loop.evaluate(0)  # as `_train` does before step 0
    for step in range(3):
        metrics = loop.run_step(step).output.metrics
        assert math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"]), (step, metrics)
