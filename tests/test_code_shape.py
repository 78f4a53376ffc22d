"""The shape issue 65 asks of the code and the pages a reader opens first.

- no function in the package over 60 lines (one owner per range: split, do not grow);
- the README fits a screen or two: <= 150 lines, <= 1,600 words, no line over 400 characters;
- no line over 500 characters in docs/ (docs/speed_log.md, the speed log, aside), generated
  blocks included: `grpo analyze --write-docs` writes tables with short cells.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[1]
MAX_FUNCTION_LINES = 60


def long_functions(root: Path) -> list[str]:
    found = []
    for path in sorted((root / "grpo_cli").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({length} lines)")
    return found


def long_lines(path: Path, limit: int) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{number} ({len(line)} characters)"
            for number, line in enumerate(path.read_text().splitlines(), 1) if len(line) > limit]


def test_no_function_in_the_package_is_over_60_lines():
    assert long_functions(ROOT) == []


def test_the_check_sees_a_long_function(tmp_path):
    package = tmp_path / "grpo_cli"
    package.mkdir()
    body = "\n".join(f"    x{k} = {k}" for k in range(MAX_FUNCTION_LINES))
    (package / "m.py").write_text(f"def short():\n    return 1\n\n\ndef long():\n{body}\n")
    assert long_functions(tmp_path) == ["grpo_cli/m.py:5 long (61 lines)"]


def test_the_readme_fits_a_screen_or_two():
    readme = ROOT / "README.md"
    text = readme.read_text()
    assert len(text.splitlines()) <= 150
    assert len(text.split()) <= 1600
    assert long_lines(readme, 400) == []


def test_no_docs_line_is_over_500_characters():
    pages = [p for p in sorted((ROOT / "docs").rglob("*.md")) if p.name != "speed_log.md"]
    assert pages, "docs/ has no page"
    assert [line for page in pages for line in long_lines(page, 500)] == []


# Reading modules whose sentences have moved to a words module (issue 65: compute, then render):
# they compute fact records and leave every sentence to their renderer, so no f-string is left.
WORDS_MOVED = {
    "grpo_cli/analysis/rank_verdict.py": "grpo_cli/analysis/words_over_r.py",
    "grpo_cli/analysis/outliers.py": "grpo_cli/analysis/words_over_r.py",
    "grpo_cli/analysis/token_weights.py": "grpo_cli/analysis/words_credit.py",
    "grpo_cli/analysis/falsifier.py": "grpo_cli/analysis/words_falsifier.py",
}


def f_strings(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return sorted({node.lineno for node in ast.walk(tree) if isinstance(node, ast.JoinedStr)})


def test_modules_whose_words_moved_compose_no_sentence():
    assert {module: f_strings(ROOT / module) for module in WORDS_MOVED} == {m: [] for m in WORDS_MOVED}
    assert all(f_strings(ROOT / words) for words in WORDS_MOVED.values())


def test_the_check_sees_an_f_string(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('x = 1\n\n\ndef says(r):\n    return f"R = {r}"\n')
    assert f_strings(module) == [5]
