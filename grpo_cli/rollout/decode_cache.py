"""KV caches of the hf_static decode loop (static_decode.py), as transformers `Cache` layers.

- `SharedPrefixLayer`: the R completions of a prompt share its prefill; its keys and values are
  kept once per prompt and the completion keys per row in buffers preallocated to
  max_new_tokens and written in place (attention_routing.shared_prefix_attention and
  llama_decode.py read both parts).
- `PreallocatedLayer`: one buffer per layer (the prompt cache repeated R times), for models that
  attend with their own attention and for the compiled step (`full_view`: fixed shapes).
- `make_cache`: which one a model gets (transformers' DynamicCache for models with sliding-window
  or other non-full-attention layers).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer


def _write_next_columns(layer, key_states: torch.Tensor, value_states: torch.Tensor):
    """Write the new columns [N, H, new, D] at `layer.length` into its buffers in place; the
    filled part of each buffer becomes `layer.keys` / `layer.values` and is returned."""
    new = key_states.shape[-2]
    layer.key_buffer[:, :, layer.length : layer.length + new] = key_states
    layer.value_buffer[:, :, layer.length : layer.length + new] = value_states
    layer.length += new
    layer.keys = layer.key_buffer[:, :, : layer.length]
    layer.values = layer.value_buffer[:, :, : layer.length]
    return layer.keys, layer.values


class PreallocatedLayer(DynamicLayer):
    """A KV cache layer with room for `capacity` positions, written in place.

    `update` returns views of the filled part, or with `full_view` the whole buffer (fixed shapes
    for torch.compile; the caller masks the unfilled columns).
    """

    def __init__(self, capacity: int, full_view: bool = False):
        super().__init__()
        self.capacity = capacity
        self.full_view = full_view
        self.length = 0
        self.position: torch.Tensor | None = None  # [1] long, next write column (compile path)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, heads, _, head_dim = key_states.shape
        self.dtype, self.device = key_states.dtype, key_states.device
        shape = (batch, heads, self.capacity, head_dim)
        self.key_buffer = key_states.new_zeros(shape)  # [N, H, capacity, D]
        self.value_buffer = value_states.new_zeros(shape[:3] + (value_states.shape[-1],))
        self.position = torch.zeros(1, dtype=torch.long, device=self.device)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.full_view:  # no Python-side counters: the compiled step must not guard on them
            new = key_states.shape[-2]
            columns = self.position + torch.arange(new, device=self.device)  # [new]
            self.key_buffer.index_copy_(2, columns, key_states)
            self.value_buffer.index_copy_(2, columns, value_states)
            self.position.add_(new)
            self.keys, self.values = self.key_buffer, self.value_buffer
            return self.keys, self.values
        return _write_next_columns(self, key_states, value_states)

    def get_seq_length(self) -> int:
        if self.full_view:
            return int(self.position.item()) if self.position is not None else 0
        return self.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return (self.capacity if self.full_view else self.length + query_length), 0

    def get_max_length(self) -> int:
        return self.capacity

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            self.key_buffer = self.key_buffer.repeat_interleave(repeats, dim=0)
            self.value_buffer = self.value_buffer.repeat_interleave(repeats, dim=0)
            filled = self.capacity if self.full_view else self.length
            self.keys = self.key_buffer[:, :, :filled]
            self.values = self.value_buffer[:, :, :filled]


# The dtype the decode caches keep keys and values in, on every device.
#
# decode_attention.two_part_attention attends in float32. A bf16 cache (the model's dtype) made
# it cast every cached key and value on every call: on a CPU ~0.5 s of a SmolLM2 rollout's 6 s
# (the prefill's keys are a transposed view, copied and cast by every layer and token); on
# CUDA, in the graph decoder (which attends over the bucket's whole capacity), ~13 GB of casts
# and ~9 GB of float32 reads a token at the paper rehearsal's shape against the weights' ~8.4 GB
# (docs/speed.md, "Where the time goes now"). Stored float32 once, when written (bf16 -> float32
# is exact: the same values, so the same attention), the cast is gone and each call reads the
# cache once. The price is memory: twice a bf16 cache's, 256 KiB a token for Nemotron-Mini-4B
# (8 GiB for the rehearsal's 64 rows x 512 tokens, against 4 GiB).
ATTENDED_DTYPE = torch.float32


def _as_attended(states: torch.Tensor) -> torch.Tensor:
    return states.to(ATTENDED_DTYPE).contiguous()


class SharedPrefixLayer(DynamicLayer):
    """Prompt keys/values once per prompt [B, H_kv, P, D]; completion ones per row [N, H_kv, T, D].

    The first `update` (the prefill, B rows) stores the prompt part (contiguous, in
    `ATTENDED_DTYPE`) and returns the prefill's own keys and values; later ones (N = B*R rows,
    one token) write the completion buffers (same dtype) in place and return the filled part.
    `shared_prefix_attention` reads the prompt part from here.
    """

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity  # completion tokens
        self.length = 0  # completion tokens written
        self.prompt_keys: torch.Tensor | None = None
        self.prompt_values: torch.Tensor | None = None
        self.key_buffer: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.prompt_keys is None:  # the prefill: its own attention reads key_states as given
            self.prompt_keys, self.prompt_values = _as_attended(key_states), _as_attended(value_states)
            self.keys, self.values = key_states, value_states
            return key_states, value_states
        if self.key_buffer is None:
            rows, heads, _, head_dim = key_states.shape
            self.key_buffer = key_states.new_zeros(rows, heads, self.capacity, head_dim, dtype=ATTENDED_DTYPE)
            self.value_buffer = value_states.new_zeros(rows, heads, self.capacity, value_states.shape[-1],
                                                       dtype=ATTENDED_DTYPE)
        return _write_next_columns(self, key_states, value_states)

    def get_seq_length(self) -> int:
        prompt = 0 if self.prompt_keys is None else self.prompt_keys.shape[-2]
        return prompt + self.length

    def keep_rows(self, keep: torch.Tensor, prompt_of_kept: torch.Tensor | None) -> None:
        """Drop the completion rows not in `keep` [n'] (indices into the current rows). The
        prompt part becomes one copy per kept row, `prompt_of_kept` [n'] (indices into the
        current prompt rows), or, once it is per row (None), follows `keep`."""
        self.prompt_keys = self.prompt_keys[keep if prompt_of_kept is None else prompt_of_kept]
        self.prompt_values = self.prompt_values[keep if prompt_of_kept is None else prompt_of_kept]
        if self.key_buffer is not None:  # else no completion token is cached yet
            self.key_buffer, self.value_buffer = self.key_buffer[keep], self.value_buffer[keep]
            self.keys = self.key_buffer[:, :, : self.length]
            self.values = self.value_buffer[:, :, : self.length]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return -1


def full_attention_only(config) -> bool:
    text = config.get_text_config(decoder=True)
    layer_types = getattr(text, "layer_types", None)
    return not layer_types or all(kind == "full_attention" for kind in layer_types)


def num_layers(model) -> int:
    return model.config.get_text_config(decoder=True).num_hidden_layers


def make_cache(config, capacity: int, full_view: bool) -> Cache:
    if not full_attention_only(config):
        return DynamicCache(config=config)
    layers = config.get_text_config(decoder=True).num_hidden_layers
    return Cache(layers=[PreallocatedLayer(capacity, full_view) for _ in range(layers)])
