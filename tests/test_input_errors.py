"""A run that fails on bad input (a malformed GSM8K line, a missing model.path) prints one line
naming the file and line or the path, exits 1, and shows no traceback unless GRPO_DEBUG=1."""

import json

import pytest
from cli_helpers import grpo_run

RECORD = {"question": "What is 1 + 1?", "answer": "1 + 1 = 2\n#### 2"}


@pytest.fixture
def malformed_gsm8k(tmp_path):
    """A GSM8K directory whose train split has a bad fourth line."""
    data = tmp_path / "gsm8k"
    data.mkdir()
    good = "\n".join(json.dumps(RECORD) for _ in range(3))
    (data / "test.jsonl").write_text(good + "\n")
    (data / "train.jsonl").write_text(good + '\n{"question": "q", "answer": "no marker"}\n')
    return data


def printed_lines(result) -> list[str]:
    return [line for line in result.output.splitlines() if line.strip()]


def bad_input_runs(tmp_path, malformed_gsm8k):
    return {
        f"{malformed_gsm8k / 'train.jsonl'}:4: answer has no '####'":
            ["task=gsm8k", f"task.path={malformed_gsm8k}"],
        "model.path='/no/such/model': no such directory": ["model=hf", "model.path=/no/such/model"],
        f"GSM8K file not found: {tmp_path / 'empty' / 'train.jsonl'}":
            ["task=gsm8k", f"task.path={tmp_path / 'empty'}"],
    }


def test_bad_input_is_one_line_and_exit_1(tmp_path, malformed_gsm8k):
    (tmp_path / "empty").mkdir()
    for message, overrides in bad_input_runs(tmp_path, malformed_gsm8k).items():
        result = grpo_run(tmp_path / "results", tmp_path / "cache", *overrides)
        assert result.exit_code == 1, result.output
        lines = printed_lines(result)
        assert len(lines) == 1 and message in lines[0], result.output
        assert "Traceback" not in result.output


def test_debug_flag_shows_the_input_error(tmp_path, malformed_gsm8k, monkeypatch):
    monkeypatch.setenv("GRPO_DEBUG", "1")
    result = grpo_run(tmp_path / "results", tmp_path / "cache", "task=gsm8k",
                      f"task.path={malformed_gsm8k}")
    assert result.exit_code == 1
    assert "Traceback" in result.output and len(printed_lines(result)) > 3, result.output
    assert "DataFormatError" in result.output.split("Traceback")[1]


@pytest.mark.parametrize(("bad_line", "message"), [
    ('{"question": ' + "[" * 20_000 + "]" * 20_000 + "}", "JSON nested too deeply to read"),
    ('{"question": "q", "answer": "#### 2", "id": ' + "7" * 5000 + "}", "Exceeds the limit (4300 digits)"),
    ('{"question": "why \\ud800?", "answer": "#### 2"}', "question holds a lone surrogate ('\\ud800' at character 5)"),
])
def test_a_hostile_data_line_is_one_line_naming_file_and_line(tmp_path, bad_line, message):
    """Once a RecursionError, an int-conversion ValueError or a UnicodeEncodeError in the
    tokenizer: 35-46-line tracebacks naming no file (issue 63)."""
    data = tmp_path / "gsm8k"
    data.mkdir()
    good = "\n".join(json.dumps(RECORD) for _ in range(3))
    (data / "test.jsonl").write_text(good + "\n")
    (data / "train.jsonl").write_text(good + "\n" + bad_line + "\n")
    result = grpo_run(tmp_path / "results", tmp_path / "cache", "task=gsm8k", f"task.path={data}")
    assert result.exit_code == 1, result.output
    lines = printed_lines(result)
    assert len(lines) == 1 and f"{data / 'train.jsonl'}:4: " in lines[0] and message in lines[0], result.output


def test_gsm8k_from_the_hub_offline_is_one_line_naming_task_path(tmp_path):
    """HF_DATASETS_OFFLINE is set for every test (conftest.py): once a 39-line Hydra traceback."""
    result = grpo_run(tmp_path / "results", tmp_path / "cache", "task=gsm8k")
    assert result.exit_code == 1, result.output
    lines = printed_lines(result)
    assert len(lines) == 1, result.output
    assert ("task.path is not set and task.hub_id='openai/gsm8k' could not be loaded "
            "(HF_DATASETS_OFFLINE is set and it is not cached); give task.path=DIR") in lines[0]
