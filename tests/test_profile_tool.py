"""grpo_cli/bench/profile.py: one call under torch.profiler, written as operator tables."""

import torch

from grpo_cli.bench.profile import profiled


def test_profiled_returns_the_result_and_names_the_operators(tmp_path):
    path = tmp_path / "profile.txt"
    a, b = torch.randn(32, 16), torch.randn(16, 8)
    result = profiled(lambda: a @ b, path, "a matmul", rows=5)
    assert torch.equal(result, a @ b)
    text = path.read_text()
    assert text.startswith("# a matmul\n")
    assert "## by self CPU time" in text and "aten::mm" in text
    profiled(lambda: a + 1, path, "an add", rows=5)  # appended, not overwritten
    assert "# a matmul" in path.read_text() and "# an add" in path.read_text()
