"""Without vllm installed, the backend module still imports and says how to get vllm."""

import importlib.util

import pytest

from grpo_cli.rollout import vllm_backend


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_missing_vllm_error_names_the_install_command(tmp_path):
    with pytest.raises(ImportError, match=r"grpo-cli\[vllm\].*make test-vllm"):
        vllm_backend.VllmBackend(str(tmp_path))


def test_checkpoint_weights_refuses_lora_parameters():
    import torch

    model = torch.nn.Module()
    model.lora_A = torch.nn.Parameter(torch.zeros(2, 2))
    with pytest.raises(NotImplementedError, match="merge"):
        list(vllm_backend.checkpoint_weights(model))
