"""GSM8K (Cobbe et al. 2021) from local JSONL files or the datasets hub.

Records are in the original release format, `{"question": ..., "answer": "...\\n#### N"}`. Train
problems are the first `train_size` records of the train split, eval problems the first `eval_size`
of the test split (-1 = all). A malformed record raises `DataFormatError` naming the file and line
(or hub split and row); records past the requested count are not read.
"""

from __future__ import annotations

import json
import os
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
    for key in ("question", "answer"):
        try:
            record[key].encode("utf-8")
        except UnicodeEncodeError as error:  # a lone surrogate, e.g. "\ud800" in the JSON
            raise DataFormatError(f"{where}: {key} holds a lone surrogate ({record[key][error.start]!r} "
                                  f"at character {error.start + 1}), not text") from None
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
        except RecursionError:  # [[[[...: deeper than Python's parser goes
            raise DataFormatError(f"{path}:{line_number}: JSON nested too deeply to read") from None
        except ValueError as error:  # an integer past int's digit limit (sys.get_int_max_str_digits)
            raise DataFormatError(f"{path}:{line_number}: {str(error).splitlines()[0]}") from None
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

    try:
        dataset = datasets.load_dataset(hub_id, "main")
    except Exception as error:  # noqa: BLE001 - no network, not cached offline, no such dataset
        offline = [name for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
                   if os.environ.get(name, "0") not in ("0", "", "false", "False")]
        why = f"{offline[0]} is set and it is not cached" if offline else (
            f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
        raise DataFileMissing(f"task.path is not set and task.hub_id={hub_id!r} could not be loaded "
                              f"({why}); give task.path=DIR holding train.jsonl and test.jsonl") from error
    splits = []
    for split in ("train", "eval"):
        hub_split = HUB_SPLITS[split]
        rows = (
            (record, f"{hub_id} ({hub_split} split) row {index}")
            for index, record in enumerate(dataset[hub_split])
        )
        splits.append(_take(rows, sizes[split]))
    return splits[0], splits[1]
