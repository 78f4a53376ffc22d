"""tests/deprecation_guard.py (installed for every test by conftest.py) fails a test exactly when a
deprecated API is called from grpo_cli's own code, not from a test or from inside a library."""

import inspect
import warnings

import pytest
import torch
from conftest import tiny_llama
from deprecation_guard import OwnDeprecation


def _define(module_name: str, source: str, **names):
    """Compile `source` as if it were the module `module_name`; return its namespace."""
    namespace = {"warnings": warnings, **names, "__name__": module_name}
    exec(compile(source, f"<{module_name}>", "exec"), namespace)
    return namespace


LIBRARY = _define(  # a deprecation named at the caller (stacklevel=2) or at itself (stacklevel=1)
    "somelib.api",
    "def old(): warnings.warn('old() is deprecated', FutureWarning, stacklevel=2)\n"
    "def old_here(): warnings.warn('old_here() is deprecated', DeprecationWarning)\n"
    "def internal(): old(); old_here()\n",
)
LIBRARY = {name: LIBRARY[name] for name in ("old", "old_here", "internal")}


@pytest.mark.parametrize("name", ["old", "old_here"])
def test_deprecated_call_from_grpo_cli_fails(name):
    ours = _define("grpo_cli.fake", f"def run(): {name}()\n", **LIBRARY)
    with pytest.raises(OwnDeprecation, match=f"{name}\\(\\) is deprecated"):
        ours["run"]()


def test_deprecated_call_from_a_test_or_inside_a_library_passes():
    """(pytest.warns would swap the guard out: the calls run under it and must not raise.)"""
    ours = _define("grpo_cli.fake", "def run(): internal()\ndef bad(): old()\n", **LIBRARY)
    with pytest.raises(OwnDeprecation):
        ours["bad"]()  # the guard is installed here ...
    LIBRARY["old"]()  # ... and lets a test call a deprecated API
    LIBRARY["old_here"]()
    ours["run"]()  # grpo_cli calls a current API that uses deprecated ones internally


def test_transformers_past_key_values_through_module_call_is_ours():
    """The `@deprecate_kwarg` warning is attributed to torch's Module.__call__; the guard looks
    past it to the caller, and `cache=` (what grpo_cli now passes) raises nothing."""
    from transformers import DynamicCache

    model = tiny_llama()
    ids = torch.tensor([[5, 6, 7]])
    ours = _define("grpo_cli.fake", "def run(model, ids, **kw): return model(input_ids=ids, use_cache=True, **kw)\n")
    if "cache" not in inspect.signature(model.forward).parameters:
        pytest.skip("this transformers has no `cache` argument yet")
    with pytest.raises(OwnDeprecation, match="past_key_values"):
        ours["run"](model, ids, past_key_values=DynamicCache(config=model.config))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        ours["run"](model, ids, cache=DynamicCache(config=model.config))
