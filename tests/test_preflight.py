"""Sizes are checked before any model is built (issue 41, finding 3): too few records, a line too
long or not UTF-8, a prompt past the model's positions, a step that cannot fit in memory. Each is
one line naming the file:line or the key (exit 1 for data, 2 for settings), and the run's cache
stays empty: no model was built or warm-started."""

import json

import pytest
from cli_helpers import grpo_run

RECORD = {"question": "Ann has 2 pens. She gets 3. How many pens?", "answer": "<<2+3=5>>5\n#### 5"}


def gsm8k_dir(tmp_path, train_lines: list[str], test_records: int = 4):
    data = tmp_path / "gsm8k"
    data.mkdir()
    (data / "test.jsonl").write_text("\n".join(json.dumps(RECORD) for _ in range(test_records)) + "\n")
    (data / "train.jsonl").write_text("".join(line + "\n" for line in train_lines))
    return data


def records(count: int) -> list[str]:
    return [json.dumps(RECORD)] * count


def refused_early(tmp_path, *overrides, exit_code: int, message: str):
    """Run, then check the one printed line, the exit code, and that nothing was built."""
    cache = tmp_path / "cache"
    result = grpo_run(tmp_path / "results", cache, *overrides)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == exit_code, result.output
    assert len(lines) == 1 and message in lines[0], result.output
    assert "Traceback" not in result.output
    assert not cache.exists() or not any(cache.rglob("*")), sorted(cache.rglob("*"))  # no warm start
    return lines[0]


def test_empty_training_file_is_refused_before_the_model_is_built(tmp_path):
    data = gsm8k_dir(tmp_path, [])
    refused_early(tmp_path, "task=gsm8k", f"task.path={data}", exit_code=1,
                  message=f"{data / 'train.jsonl'}: 0 records, fewer than task.warm_start_size=500")


def test_fewer_records_than_warm_start_plus_train_size_names_both_keys(tmp_path):
    data = gsm8k_dir(tmp_path, records(10))
    line = refused_early(tmp_path, "task=gsm8k", f"task.path={data}", "task.warm_start_size=5",
                         "task.train_size=8", exit_code=1,
                         message=f"{data / 'train.jsonl'}: 10 records, fewer than")
    assert "task.warm_start_size=5 + task.train_size=8" in line


def test_all_records_left_for_grpo_fewer_than_prompts_per_step(tmp_path):
    data = gsm8k_dir(tmp_path, records(6))
    refused_early(tmp_path, "task=gsm8k", f"task.path={data}", "task.warm_start_size=4",
                  "task.train_size=-1", exit_code=1,
                  message="2 records left for GRPO after task.warm_start_size=4 set aside 4, "
                          "fewer than rollout.prompts_per_step=4")


def test_train_size_below_prompts_per_step_is_a_config_error(tmp_path):
    refused_early(tmp_path, "task.train_size=2", exit_code=2,
                  message="task.train_size=2: must be >= rollout.prompts_per_step=4")


@pytest.mark.parametrize("bad_line, message", [
    ('{"question": "' + "x" * 70_000 + '", "answer": "#### 1"}', "train.jsonl:2: line longer than 64 KiB"),
    (b'{"question": "caf\xe9", "answer": "#### 1"}'.decode("latin-1"), "train.jsonl:2: not UTF-8 (byte 0xe9"),
])
def test_a_huge_or_non_utf8_line_names_the_file_and_line(tmp_path, bad_line, message):
    data = tmp_path / "gsm8k"
    gsm8k_dir(tmp_path, [])
    payload = (json.dumps(RECORD) + "\n" + bad_line + "\n").encode("latin-1")
    (data / "train.jsonl").write_bytes(payload)
    refused_early(tmp_path, "task=gsm8k", f"task.path={data}", "task.warm_start_size=1",
                  "task.train_size=1", "rollout.prompts_per_step=1", exit_code=1, message=message)


def test_a_prompt_past_the_model_positions_names_its_line(tmp_path):
    long_question = dict(RECORD, question="Ann has 2 pens. " * 20 + "How many pens?")  # 334 characters
    data = gsm8k_dir(tmp_path, [*records(5), json.dumps(long_question), *records(2)])
    line = refused_early(tmp_path, "task=gsm8k", f"task.path={data}", "task.warm_start_size=1",
                         "task.train_size=-1", exit_code=1, message=f"{data / 'train.jsonl'}:6: prompt of ")
    assert "tokens + rollout.max_new_tokens=24 exceeds the model's 160 positions (model.max_positions)" in line


def test_generated_prompts_past_the_positions_name_the_settings(tmp_path):
    refused_early(tmp_path, "rollout.max_new_tokens=150", exit_code=2,
                  message="rollout.max_new_tokens=150 exceeds the model's 160 positions (model.max_positions)")


def test_a_step_that_cannot_fit_in_memory_is_refused_with_the_numbers(tmp_path):
    """rollout.group_size=100000 once grew to 23 GB until the kernel's OOM killer ended the run;
    ten million rollouts need terabytes on any machine these tests run on."""
    line = refused_early(tmp_path, "rollout.group_size=10000000", exit_code=2,
                         message="rollout.group_size=10000000 x rollout.prompts_per_step=4 = 40000000 rollouts")
    assert "GiB is free on" in line and "per-rollout Gram" in line


def test_memory_estimate_is_the_documented_lower_bound():
    """Hand-computed for the smoke model: P = 2 layers x (64 x (128 + 128) + 3 x 64 x 192) +
    2 x V x 64 (untied embeddings) in fp32 x 4 copies; KV = 2 layers x 2 x 64 x 4 bytes per token
    over B R (prompt + new tokens), or B prompt + B R new tokens where hf_static shares prompts;
    logits B x R x V x 4; Gram (B R)^2 x 8."""
    from grpo_cli.config.compose import compose_config
    from grpo_cli.train.preflight import memory_needed, shape_before_loading

    cfg = compose_config(["experiment=smoke"])
    shape = shape_before_loading(cfg)
    vocab = shape.vocab_size
    parts = memory_needed(cfg, shape, prompt_tokens=40, dtype_bytes=4)
    assert shape.parameters == 2 * (64 * 256 + 3 * 64 * 192) + 2 * vocab * 64
    assert parts["weights and optimizer"] == shape.parameters * 4 * 4
    assert parts["rollout KV cache"] == 2 * 2 * 64 * 4 * 16 * (40 + 24)  # rollout=hf: a prompt per rollout
    shared = memory_needed(compose_config(["experiment=smoke", "rollout=hf_static"]), shape, 40, 4)
    assert shared["rollout KV cache"] == 2 * 2 * 64 * 4 * (4 * 40 + 16 * 24)  # one prompt per group
    assert parts["logits of a decode step"] == 16 * vocab * 4
    assert parts["per-rollout Gram"] == 16 * 16 * 8


def test_no_warm_start_problems_for_a_warm_start_is_a_config_error(tmp_path):
    refused_early(tmp_path, "task.warm_start_size=0", exit_code=2,
                  message="task.warm_start_size=0: must be >= 1 with model.warm_start.steps > 0")


def test_random_weights_are_sized_from_their_config_alone(tmp_path):
    """paper_rehearsal's Nemotron-Mini-4B: parameters counted on the meta device (its MLP has two
    matrices, so a Llama-shaped count would say 5.1B), no weight written or drawn."""
    from grpo_cli.config.compose import compose_config
    from grpo_cli.train.preflight import shape_before_loading

    cfg = compose_config(["experiment=paper_rehearsal", f"cache_dir={tmp_path}"])
    shape = shape_before_loading(cfg, log=lambda line: None)
    assert 4.1e9 < shape.parameters < 4.3e9 and shape.max_positions == 4096
    assert not [p for p in tmp_path.rglob("*") if p.suffix in (".safetensors", ".bin")]
