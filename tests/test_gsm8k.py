import json
from pathlib import Path

import pytest

from grpo_cli.config.schema import TaskConfig
from grpo_cli.tasks import build_task
from grpo_cli.tasks.answers import answers_match
from grpo_cli.tasks.gsm8k import DataFormatError, format_prompt, load_gsm8k, load_jsonl
from grpo_cli.tasks.problem import Problem, Step
from grpo_cli.tasks.step_rewards import step_spans

SHARED_GSM8K = Path(__file__).parents[2] / "shared/data/gsm8k"  # ../shared beside the checkout

needs_shared_copy = pytest.mark.skipif(
    not SHARED_GSM8K.is_dir(), reason=f"no local GSM8K copy at {SHARED_GSM8K}"
)

RECORD = {
    "question": "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts?",
    "answer": "It takes 2/2=<<2/2=1>>1 bolt of white fiber\nSo 2+1=<<2+1=3>>3 bolts\n#### 3",
}


def _write_split(directory: Path, name: str, lines: list[str]) -> Path:
    path = directory / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@needs_shared_copy
def test_every_test_reference_solution_checks_correct_against_its_answer():
    problems = load_jsonl(SHARED_GSM8K / "test.jsonl")
    assert len(problems) == 1319
    wrong = [p.answer for p in problems if not answers_match(p.solution, p.answer)]
    assert wrong == []
    assert not answers_match(problems[0].solution, str(float(problems[0].answer) + 1))


@needs_shared_copy
def test_shared_copy_loads_with_sizes_and_parsed_steps():
    train, eval_problems = load_gsm8k(SHARED_GSM8K, train_size=100, eval_size=-1)
    assert len(train) == 100 and len(eval_problems) == 1319
    first = eval_problems[0]
    assert first.question.startswith("Janet")
    assert first.answer == "18"
    assert first.steps == (Step("16-3-4", 9.0), Step("9*2", 18.0))
    all_train, _ = load_gsm8k(SHARED_GSM8K, train_size=-1, eval_size=0)
    assert len(all_train) == 7473
    assert all_train[:100] == train


def test_local_files_load_and_limit(tmp_path):
    _write_split(tmp_path, "train.jsonl", [json.dumps(RECORD)] * 5)
    _write_split(tmp_path, "test.jsonl", [json.dumps(RECORD)] * 3)
    train, eval_problems = load_gsm8k(tmp_path, train_size=2, eval_size=-1)
    assert len(train) == 2 and len(eval_problems) == 3
    assert train[0] == Problem(
        question=RECORD["question"],
        answer="3",
        solution=RECORD["answer"],
        steps=(Step("2/2", 1.0), Step("2+1", 3.0)),
    )


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ('{"question": "q", "answer": "no final line"', "invalid JSON"),
        (json.dumps({"question": "q"}), "missing"),
        (json.dumps({"question": "q", "answer": 3}), "missing"),
        (json.dumps({"question": "q", "answer": "it is 3"}), "####"),
        (json.dumps({"question": "q", "answer": "it is 3\n####  "}), "nothing after"),
        (json.dumps(["q", "a"]), "JSON object"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, bad_line, message):
    path = _write_split(tmp_path, "train.jsonl", [json.dumps(RECORD), "", bad_line])
    with pytest.raises(DataFormatError, match=message) as error:
        load_jsonl(path)
    assert f"{path}:3:" in str(error.value)  # the blank line 2 still counts


def test_records_past_the_limit_are_not_read(tmp_path):
    path = _write_split(tmp_path, "train.jsonl", [json.dumps(RECORD), "not json"])
    assert len(load_jsonl(path, limit=1)) == 1


def test_missing_file_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="train.jsonl"):
        load_gsm8k(tmp_path)


class _ChatTokenizer:
    chat_template = "{{ messages }}"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert tokenize is False and add_generation_prompt is True
        return f"<user>{messages[0]['content']}</user><assistant>"


def test_format_prompt_fills_template_and_applies_chat_template_only_when_asked():
    problem = Problem("How many?", "3", "#### 3")
    assert format_prompt(problem, "Q: {question}\nA:") == "Q: How many?\nA:"
    tokenizer = _ChatTokenizer()
    assert format_prompt(problem, "{question}", tokenizer) == "How many?"
    wrapped = format_prompt(problem, "{question}", tokenizer, use_chat_template=True)
    assert wrapped == "<user>How many?</user><assistant>"
    tokenizer.chat_template = None  # a base model: fall back to the plain template
    assert format_prompt(problem, "{question}", tokenizer, use_chat_template=True) == "How many?"


def test_build_task_gsm8k_from_local_path(tmp_path):
    _write_split(tmp_path, "train.jsonl", [json.dumps(RECORD)] * 4)
    _write_split(tmp_path, "test.jsonl", [json.dumps(RECORD)] * 2)
    config = TaskConfig(
        name="gsm8k", path=str(tmp_path), train_size=3, warm_start_size=1, eval_size=-1,
        prompt_template="{question}\n", use_chat_template=True,
    )
    task = build_task(config, tokenizer=_ChatTokenizer())
    assert task.name == "gsm8k" and len(task.train) == 3 and len(task.eval) == 2
    assert len(task.warm_start) == 1  # set aside before the GRPO split
    problem = task.eval[0]
    assert task.prompt(problem) == f"<user>{problem.question}\n</user><assistant>"
    assert task.reward("so 2+1=<<2+1=3>>3\n#### 3", problem) == 1.0
    assert task.reward("#### 4", problem) == 0.0
    checks = task.step_checks("2+1=<<2+1=3>>3 and <<3*5=16>>16", problem)
    assert [check.correct for check in checks] == [True, False]


@needs_shared_copy
def test_reference_steps_of_the_test_split_mostly_pass_the_step_checker():
    problems = load_jsonl(SHARED_GSM8K / "test.jsonl")
    arithmetic = [c.correct for p in problems for c in step_spans(p.solution)]
    with_question = [c.correct for p in problems for c in step_spans(p.solution, p.question)]
    assert len(arithmetic) == sum(p.solution.count("<<") for p in problems) > 4000
    assert sum(arithmetic) >= len(arithmetic) - 2  # GSM8K has a couple of odd annotations ("//")
    assert sum(with_question) / len(with_question) > 0.95  # the rest use numbers computed in prose
