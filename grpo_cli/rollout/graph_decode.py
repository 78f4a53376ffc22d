"""A decode loop with fixed shapes and no host sync per token, captured in CUDA graphs on CUDA
(`rollout.cuda_graphs=true` with `rollout.backend=hf_static`; replay checked against eager on
an H100 and an H200, but full runs with it met a NaN at step 0 on 2026-11-28:
docs/gpu_report_2026-11-28b_H200.md).

On a GPU, one token step of a small model is a few hundred kernel launches whose host cost
exceeds their GPU time (issue 16). Here the token step is made capturable and replayed:

- fixed shapes per bucket: B prompts x R rows (a training run samples the same B every step;
  held-out evaluation has its own bucket), prompt capacity rounded up to PROMPT_BUCKET,
  completion capacity = max_new_tokens rounded up to `tokens_per_replay`. Rows are not padded to
  a bucket of rows: the draws of a row would then depend on the padding (the generator's stream
  is laid out over all rows), and they match the hf_static loop's only without it;
- all state in preallocated buffers written in place: sampled tokens, their log-probs, the
  logits, the done flags, the attention mask, positions, the write column, and the KV cache
  (prompt part once per group, completion part per row), attended over their full capacity with
  the unfilled columns masked (their softmax weight is exactly 0);
- the functional Llama step (llama_decode.py): its fused q/k/v and gate/up copies are refreshed in
  place before every rollout (`refresh_weights`), and every other tensor it reads is a policy
  parameter that the optimizer updates in place, so one captured graph serves every optimizer
  step; if the policy's tensors move (a new model, `.to()`), the graphs are rebuilt;
- sampling inside the step: temperature and top-p as the eager sampler applies them, the draw by
  the exponential race (sampling.race_tokens) from a device generator registered with each graph
  (`CUDAGraph.register_generator_state`; a replay reads the generator's current seed and offset,
  so seeding it before a rollout makes the graph's draws those of the eager step);
- `tokens_per_replay` (k) tokens per replay, then one host read of "all rows done";
- one more host read a rollout: its log-probs must be finite, else `decode` raises (the rollout
  then falls back to the eager loop at `rollout.cuda_graphs` auto, and is an error at `true`),
  so a graph that reads or writes the wrong memory stops at its own output, not later as a NaN
  gradient norm.

The prefill (one eager forward per rollout, its shape varies with the prompts) stays outside the
graphs. Off CUDA the same `advance` runs eagerly: that is what the CPU tests check against the
hf_static loop (tests/test_graph_decode.py): the same tokens, greedy and sampled (the race is
`multinomial`'s own one-sample draw, sampling.py), log-probs within 1e-5 in fp32.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from grpo_cli.rollout.base import SamplingSettings
from grpo_cli.rollout.decode_cache import ATTENDED_DTYPE
from grpo_cli.rollout.llama_decode import LlamaDecodeStep
from grpo_cli.rollout.sampling import race_tokens
from grpo_cli.rollout.stop_tokens import is_stop

PROMPT_BUCKET = 64  # prompt capacity of a bucket: the padded prompt width rounded up to this
MIN_ROPE_POSITIONS = 256  # the RoPE table grows by doubling from here (a new table: new graphs)


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class BucketKey:
    groups: int  # B prompt groups
    group_size: int  # R rows per group
    prompt_capacity: int  # prompt columns of the cache (a multiple of PROMPT_BUCKET)
    completion_capacity: int  # completion columns (a multiple of tokens_per_replay)
    temperature: float
    top_p: float
    autocast: bool  # captured under torch.autocast


class GraphKVLayer:
    """One layer's cache at full capacity; `update` writes column `column` and returns the whole
    completion part (the caller's mask hides the unwritten columns)."""

    def __init__(self, prompt_keys, prompt_values, keys, values, column: torch.Tensor):
        self.prompt_keys = prompt_keys  # [G, H_kv, P_cap, D]
        self.prompt_values = prompt_values  # [G, H_kv, P_cap, D]
        self.keys = keys  # [N, H_kv, T_cap, D]
        self.values = values  # [N, H_kv, T_cap, D]
        self.column = column  # [1] long, shared by all layers

    def update(self, key: torch.Tensor, value: torch.Tensor):  # [N, H_kv, 1, D] each
        self.keys.index_copy_(2, self.column, key.to(self.keys.dtype))
        self.values.index_copy_(2, self.column, value.to(self.values.dtype))
        return self.keys, self.values


class GraphCache:
    def __init__(self, layers: list[GraphKVLayer]):
        self.layers = layers


class DecodeBucket:
    """The buffers of one bucket and `advance`, k token steps that read and write only them."""

    def __init__(self, key: BucketKey, step: LlamaDecodeStep, model, prefill_layers, vocab: int,
                 stop: torch.Tensor, pad_id: int, generator: torch.Generator,
                 tokens_per_replay: int, device: torch.device):
        self.key, self.step, self.model = key, step, model
        self.stop, self.pad_id, self.generator = stop, pad_id, generator
        self.tokens_per_replay = tokens_per_replay
        rows, width = key.groups * key.group_size, key.completion_capacity
        self.column = torch.zeros(1, dtype=torch.long, device=device)  # [1] next completion column
        self.tokens = torch.full((rows, width), pad_id, dtype=torch.long, device=device)  # [N, T_cap]
        self.logprobs = torch.zeros(rows, width, device=device)  # [N, T_cap]
        self.logits = torch.zeros(rows, vocab, device=device)  # [N, V] float32, next token's
        self.done = torch.zeros(rows, dtype=torch.bool, device=device)  # [N]
        capacity = key.prompt_capacity + width
        self.mask = torch.zeros(rows, 1, 1, capacity, dtype=torch.bool, device=device)  # [N, 1, 1, S]
        self.start_positions = torch.zeros(rows, 1, dtype=torch.long, device=device)  # [N, 1]
        layers = []
        for source in prefill_layers:
            _, kv_heads, _, key_dim = source.prompt_keys.shape
            value_dim = source.prompt_values.shape[-1]
            layers.append(GraphKVLayer(
                torch.zeros(key.groups, kv_heads, key.prompt_capacity, key_dim, dtype=ATTENDED_DTYPE, device=device),
                torch.zeros(key.groups, kv_heads, key.prompt_capacity, value_dim, dtype=ATTENDED_DTYPE, device=device),
                torch.zeros(rows, kv_heads, width, key_dim, dtype=ATTENDED_DTYPE, device=device),
                torch.zeros(rows, kv_heads, width, value_dim, dtype=ATTENDED_DTYPE, device=device),
                self.column,
            ))
        self.cache = GraphCache(layers)
        self.graph: torch.cuda.CUDAGraph | None = None

    def load(self, prefill_layers, prompt_mask: torch.Tensor, first_logits: torch.Tensor) -> None:
        """Reset every buffer for a rollout of the B prompts: their prefill keys and values, the
        prompt mask [B, P], positions, the first logits [B, V]. Writes in place only (the graph
        reads these addresses)."""
        group_size = self.key.group_size
        prompt_length = prompt_mask.shape[1]
        for layer, source in zip(self.cache.layers, prefill_layers, strict=True):
            for target, prompt in ((layer.prompt_keys, source.prompt_keys),
                                   (layer.prompt_values, source.prompt_values)):
                target.zero_()
                target[:, :, :prompt_length].copy_(prompt)
            layer.keys.zero_()  # finite values under the masked columns (0 * NaN would be NaN)
            layer.values.zero_()
        self.mask.zero_()
        self.mask[:, 0, 0, :prompt_length] = prompt_mask.bool().repeat_interleave(group_size, dim=0)
        self.start_positions.copy_(prompt_mask.sum(dim=1, keepdim=True).repeat_interleave(group_size, dim=0))
        self.logits.copy_(first_logits.repeat_interleave(group_size, dim=0))
        self.done.zero_()
        self.tokens.fill_(self.pad_id)
        self.logprobs.zero_()
        self.column.zero_()

    def advance(self) -> None:
        """k tokens: draw from the current logits, record, run the model on the drawn token."""
        for _ in range(self.tokens_per_replay):
            self._one_token()

    def _one_token(self) -> None:
        key, column = self.key, self.column
        token = race_tokens(self.logits, key.temperature, key.top_p, self.generator)  # [N]
        token = torch.where(self.done, self.pad_id, token)
        self.tokens.index_copy_(1, column, token[:, None])
        logprob = torch.log_softmax(self.logits, dim=-1).gather(1, token[:, None])  # [N, 1]
        self.logprobs.index_copy_(1, column, logprob)
        self.done |= is_stop(token, self.stop)
        self.mask.index_fill_(3, column + key.prompt_capacity, True)
        logits = self.step(self.model, token[:, None], self.mask, self.start_positions + column,
                           self.cache)  # [N, V] float32
        self.logits.copy_(logits)
        self.column.add_(1)

    def run(self) -> None:
        """k tokens: the captured graph where there is one, else `advance` eagerly."""
        if self.graph is not None:
            self.graph.replay()
        else:
            self.advance()


class GraphDecoder:
    """Decodes from a shared-prefix prefill (decode_cache.SharedPrefixLayer) with one
    DecodeBucket per shape, captured in a CUDA graph when `capture` (default: on CUDA)."""

    def __init__(self, model, device: torch.device, stop_ids: list[int], pad_id: int,
                 tokens_per_replay: int = 8, capture: bool | None = None):
        self.model = model
        self.device = device
        self.stop = torch.tensor(stop_ids, device=device)  # [S]
        self.pad_id = pad_id
        self.tokens_per_replay = tokens_per_replay
        self.capture = device.type == "cuda" if capture is None else capture
        self.generator = torch.Generator(device=device)  # registered with every graph
        self.step: LlamaDecodeStep | None = None
        self.buckets: dict[BucketKey, DecodeBucket] = {}
        self.captures = 0  # graphs captured so far (tests: cached per bucket)
        self._tensor_addresses: tuple[int, ...] = ()

    def decode(self, prefill_layers, prompt_mask: torch.Tensor, first_logits: torch.Tensor,
               settings: SamplingSettings, generator_seed: int):
        """prompt_mask [B, P]; first_logits [B, V] (the prefill's last position). Returns the
        completion tokens [B*R, T] (pad after a stop token) and their log-probs [B*R, T] under
        the raw logits, T = max_new_tokens, as the hf_static loop does."""
        groups, prompt_length = prompt_mask.shape
        max_new, group_size = settings.max_new_tokens, settings.group_size
        key = BucketKey(
            groups=groups, group_size=group_size,
            prompt_capacity=round_up(prompt_length, PROMPT_BUCKET),
            completion_capacity=round_up(max_new, self.tokens_per_replay),
            temperature=float(settings.temperature), top_p=float(settings.top_p),
            autocast=torch.is_autocast_enabled(self.device.type),
        )
        self._check_tensors_unmoved()
        self._ensure_step(key.prompt_capacity + key.completion_capacity)
        self.step.refresh_weights()
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = self._build(key, prefill_layers, first_logits.shape[-1])
        bucket.load(prefill_layers, prompt_mask, first_logits)
        self.generator.manual_seed(generator_seed)
        replays = math.ceil(max_new / self.tokens_per_replay)
        for replay in range(replays):
            bucket.run()
            if replay < replays - 1 and bool(bucket.done.all()):  # the one host read per k tokens
                break
        tokens, logprobs = bucket.tokens[:, :max_new].clone(), bucket.logprobs[:, :max_new].clone()
        finite = torch.isfinite(logprobs).all(dim=1)  # [N]
        if not bool(finite.all()):  # one host read a rollout
            rows = (~finite).nonzero().flatten().tolist()
            raise RuntimeError(
                f"the graph decode gave non-finite log-probs in {len(rows)} of {finite.numel()} rows "
                f"(first: {rows[:5]}); the policy's own forward decides whether the weights or "
                "the graphs are at fault (docs/gpu_report_2026-11-28b_H200.md)")
        return tokens, logprobs

    def _check_tensors_unmoved(self) -> None:
        """Drop every bucket if a parameter of the policy now lives at another address (graphs
        read the old one)."""
        addresses = tuple(p.data_ptr() for p in self.model.parameters())
        if addresses != self._tensor_addresses:
            self.step, self.buckets = None, {}
            self._tensor_addresses = addresses

    def _ensure_step(self, positions: int) -> None:
        """The functional step with a RoPE table of at least `positions` rows; a larger table is
        a new step, so the buckets captured with the old one are dropped."""
        table = None if self.step is None else self.step.rope_table
        if self.step is not None and (table is None or table[0].shape[0] >= positions):
            return  # (no table: a rope type that is computed per step; never captured)
        size = max(MIN_ROPE_POSITIONS, 1 << (positions - 1).bit_length())
        self.step, self.buckets = LlamaDecodeStep(self.model, max_positions=size), {}

    def _build(self, key: BucketKey, prefill_layers, vocab: int) -> DecodeBucket:
        bucket = DecodeBucket(key, self.step, self.model, prefill_layers, vocab, self.stop,
                              self.pad_id, self.generator, self.tokens_per_replay, self.device)
        if self.capture:
            bucket.graph = self._capture(bucket)
            self.captures += 1
        return bucket

    def _capture(self, bucket: DecodeBucket) -> torch.cuda.CUDAGraph:
        """One warm-up `advance` on a side stream (lazy library set-up stays out of the graph),
        then the capture. Under autocast the weight-cast cache is off: a cached cast would freeze
        the weights the graph reads at their capture-time values."""
        device = self.device

        def autocast():
            if not bucket.key.autocast:
                return nullcontext()
            dtype = torch.get_autocast_dtype(device.type)
            return torch.autocast(device.type, dtype=dtype, cache_enabled=False)

        stream = torch.cuda.Stream(device=device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream), autocast():
            bucket.advance()  # on the zeroed buffers; `load` resets them before every rollout
        torch.cuda.current_stream(device).wait_stream(stream)
        bucket.column.zero_()
        graph = torch.cuda.CUDAGraph()
        graph.register_generator_state(self.generator)
        clear_cublas_workspaces()  # the capture allocates its own workspace, in its private pool
        with torch.cuda.graph(graph), autocast():
            bucket.advance()
        clear_cublas_workspaces()  # and no later capture reuses it
        return graph


def clear_cublas_workspaces() -> None:
    """Drop cuBLAS's cached per-(handle, stream) workspaces (a no-op without CUDA).

    torch caches one cuBLAS workspace per handle and stream, and a graph captured on a stream
    embeds that workspace's address. `torch.cuda.graph` captures every graph on one shared
    stream, so a later capture reuses the workspace an earlier one allocated inside its own
    private pool. torch versions with pytorch/pytorch#175276 (2026-02) release the workspaces of
    a graph's stream when the graph is destroyed (#193402 reports the clash); that memory can go to
    other tensors while a live graph still writes its GEMM scratch there: a graph destroyed
    mid-run (a finished test's decoder, collected by the garbage collector) would corrupt the
    run that holds the other. Cleared before a capture, the workspace is allocated in the new
    graph's private pool and lives as long as that graph; cleared after, no other capture
    shares it. torch's own CUDA-graph trees do this (torch/_inductor/cudagraph_trees.py,
    `clear_cublass_cache`), as torch's maintainers advised in #192061. A suspect, not a proven
    cause, of the NaN that full runs with graphs met in the gpu tier on an H200
    (docs/gpu_report_2026-11-28b_H200.md): scripts/cublas_graph_clash.py says whether a torch
    has the clash, and tests/test_graph_decode.py's
    `test_a_graph_outlives_another_graph_captured_on_the_same_stream` checks the decoder."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)  # absent from CPU-only builds
    if clear is not None and torch.cuda.is_available():
        clear()
