"""GSM8K (Cobbe et al. 2021) from local JSONL files or the datasets hub.

Records are in the original release format, `{"question": ..., "answer": "...\\n#### N"}`. Train
problems are the first `train_size` records of the train split, eval problems the first `eval_size`
of the test split (-1 = all). A malformed record raises `DataFormatError` naming the file and line
(or hub split and row); records past the requested count are not read.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from grpo_cli.config.errors import InputError
from grpo_cli.tasks.problem import Problem, format_prompt
from grpo_cli.tasks.step_rewards import parse_steps

__all__ = ["DataFileMissing", "DataFormatError", "format_prompt", "load_gsm8k", "load_jsonl", "parse_record"]

SPLIT_FILES = {"train": "train.jsonl", "eval": "test.jsonl"}
HUB_SPLITS = {"train": "train", "eval": "test"}


class DataFormatError(InputError, ValueError):
    """A GSM8K record that is not valid JSON with a question and an answer ending in '#### N'."""


class DataFileMissing(InputError, FileNotFoundError):
    """A GSM8K split file that `task.path` names but that does not exist."""


def parse_record(record: Any, where: str) -> Problem:
    """One GSM8K record as a Problem; `where` ("train.jsonl:12") goes into any error."""
    if not isinstance(record, dict):
        raise DataFormatError(f"{where}: expected a JSON object, got {type(record).__name__}")
    missing = [key for key in ("question", "answer") if not isinstance(record.get(key), str)]
    if missing:
        raise DataFormatError(f"{where}: missing or non-string key(s) {missing}")
    solution = record["answer"].strip()
    if "####" not in solution:
        raise DataFormatError(f"{where}: answer has no '####' final-answer line")
    answer = solution.rsplit("####", 1)[1].strip()
    if not answer:
        raise DataFormatError(f"{where}: nothing after '####'")
    return Problem(record["question"].strip(), answer, solution, parse_steps(solution), source=where)


def _take(records: Iterable[tuple[Any, str]], limit: int) -> list[Problem]:
    """The first `limit` records (-1 = all) as problems; later records are never pulled."""
    problems: list[Problem] = []
    if limit == 0:
        return problems
    for record, where in records:
        problems.append(parse_record(record, where))
        if len(problems) == limit:
            break
    return problems


MAX_LINE_BYTES = 64 * 1024  # a GSM8K record is a few hundred bytes; a longer line is refused unread


def _jsonl_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line, read at most MAX_LINE_BYTES at a time, so a huge line
    (a wrong file, a line with no newline) is refused before it is held in memory."""
    with path.open("rb") as lines:
        line_number = 0
        while raw := lines.readline(MAX_LINE_BYTES + 1):
            line_number += 1
            if len(raw) > MAX_LINE_BYTES:
                raise DataFormatError(
                    f"{path}:{line_number}: line longer than {MAX_LINE_BYTES // 1024} KiB "
                    "(a GSM8K record is a few hundred bytes); is this the right file?"
                )
            try:
                yield line_number, raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise DataFormatError(
                    f"{path}:{line_number}: not UTF-8 (byte {raw[error.start]:#04x} at column "
                    f"{error.start + 1}); save the file as UTF-8"
                ) from None


def _jsonl_records(path: Path) -> Iterator[tuple[Any, str]]:
    for line_number, line in _jsonl_lines(path):
        if not line.strip():
            continue  # blank lines (e.g. a trailing newline) are not records
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataFormatError(
                f"{path}:{line_number}: invalid JSON ({error.msg})"
            ) from error
        yield record, f"{path}:{line_number}"


def load_jsonl(path: str | Path, limit: int = -1) -> list[Problem]:
    """The first `limit` problems (-1 = all) of a GSM8K JSONL file."""
    path = Path(path)
    if not path.is_file():
        raise DataFileMissing(f"GSM8K file not found: {path}")
    return _take(_jsonl_records(path), limit)


def load_gsm8k(
    path: str | Path | None = None,
    hub_id: str = "openai/gsm8k",
    train_size: int = -1,
    eval_size: int = -1,
) -> tuple[list[Problem], list[Problem]]:
    """(train, eval) problems from `path`/{train,test}.jsonl, or from the hub when path is None."""
    sizes = {"train": train_size, "eval": eval_size}
    if path is not None:
        directory = Path(path)
        train = load_jsonl(directory / SPLIT_FILES["train"], train_size)
        return train, load_jsonl(directory / SPLIT_FILES["eval"], eval_size)
    import datasets  # heavy: only when actually loading from the hub

    dataset = datasets.load_dataset(hub_id, "main")
    splits = []
    for split in ("train", "eval"):
        hub_split = HUB_SPLITS[split]
        rows = (
            (record, f"{hub_id} ({hub_split} split) row {index}")
            for index, record in enumerate(dataset[hub_split])
        )
        splits.append(_take(rows, sizes[split]))
    return splits[0], splits[1]
