"""Rollouts with a hand-written decode loop over a preallocated KV cache (`rollout.backend=hf_static`).

Same contract and batch layout as `HFGenerateBackend` (left-padded prompts, completions through
EOS, sampler log-probs = log-softmax of the raw logits at the sampled token), but faster:

- the R completions of a prompt share one prefill: each prompt is run once, so the prefill costs
  B rows, not B*R; its keys and values are kept once per prompt (decode_cache.py), and a
  one-token step attends to them with each group's R queries stacked
  (`attention_routing.shared_prefix_attention`, a two-part softmax over prompt and completion
  keys) instead of reading R copies of the prompt cache;
- completion keys and values go into buffers preallocated to max_new_tokens and written in place
  (no per-token `torch.cat`); the 4-D attention mask is a view of one buffer (no per-token mask
  building);
- no logits processors, stopping criteria or output bookkeeping: one `model(...)` per token
  (for Llama-architecture models, the same arithmetic as plain tensor functions without the
  module stack: `llama_decode.py`), sampling with temperature and top-p exactly as transformers' warpers do, greedy when the
  temperature is 0, drawn from a `torch.Generator` seeded by `generator_seed` (by `multinomial`,
  or with `draw="inverse_cdf"` by one uniform per row: the same law, another stream; sampling.py);
- the loop stops when every row has emitted EOS, checked every `check_every` tokens (1 on CPU,
  where the check costs nothing; more on CUDA to avoid a host sync per token).

`cuda_graphs=True` decodes with graph_decode.py instead: fixed-shape buckets, sampling on the
device without host reads (the exponential race that `multinomial` itself runs for one sample),
k tokens per CUDA graph replay on CUDA, the same step run eagerly elsewhere (the CPU tests).
With `graphs_fallback` (`rollout.cuda_graphs` left at auto), a graph decode that fails (a model
without a graph-ready step, a capture CUDA refuses, non-finite log-probs) warns once and the loop decodes eagerly from
then on, with the draws the graphs would have made (multinomial's stream for the seed).

`compile=True` wraps the one-token step in `torch.compile` instead; the cache is then one
preallocated buffer per layer (prompt cache repeated R times) that always exposes its full,
masked capacity, so every step has the same shapes. Models whose config declares
non-full-attention layers (sliding windows, linear attention) or logit soft-capping use
transformers' DynamicCache (repeated R times) and their own attention.
"""

from __future__ import annotations

import warnings

import torch
from transformers.cache_utils import Cache

from grpo_cli.rollout.attention_routing import (
    DECODE_MATH_ATTENTION,
    SHARED_PREFIX_ATTENTION,
    attention_routed,
    shared_prefix_calls,
    supports_shared_prefix,
)
from grpo_cli.rollout.base import SamplingSettings
from grpo_cli.rollout.batch import RolloutBatch, assemble_batch, left_pad
from grpo_cli.rollout.decode_cache import SharedPrefixLayer, make_cache, num_layers
from grpo_cli.rollout.graph_decode import GraphDecoder
from grpo_cli.rollout.hf_backend import completion_mask_through_eos
from grpo_cli.rollout.llama_decode import (
    LlamaDecodeStep,
    rope_depends_on_position_only,
    supports_llama_step,
)
from grpo_cli.rollout.sampling import DRAWS
from grpo_cli.rollout.stop_tokens import is_stop
from grpo_cli.runtime.transformers_api import cache_argument

CAPACITY_BUCKET = 64  # compiled decode: cache capacity rounded up to a multiple of this
# A repack of the decode weights for fewer rows (MKL, fp32 on a CPU) costs about as much as
# decoding this many row-tokens: on SmolLM2, one thread, a pack took 0.3-1.1 s in a rollout and a
# row ~2.7 ms of matmul a token (docs/speed_log.md); packing and the matmuls both scale with the weights
REPACK_ROW_TOKENS = 192

def graph_decode_problem(model, device: torch.device) -> str | None:
    """Why `rollout.cuda_graphs` cannot decode `model` on `device` (None: it can)."""
    if device.type != "cuda":
        return f"CUDA graphs need device=cuda (this run's device is {device})"
    return graph_ready_model_problem(model)


def graph_ready_model_problem(model) -> str | None:
    """Why graph_decode.py's step cannot decode `model` (None: it can, on any device)."""
    if (supports_shared_prefix(model) and supports_llama_step(model)
            and rope_depends_on_position_only(model)):
        return None
    kind = getattr(model.config, "model_type", None)
    return (f"{type(model).__name__} (model_type {kind}) has no graph-ready decode step; it "
            "needs a Llama, Qwen2, Mistral or Nemotron model with full attention, plain nn.Linear "
            "projections (no LoRA) and a position-only RoPE")


def prefill_mask(prompt_mask: torch.Tensor, kv_width: int | None = None) -> torch.Tensor:
    """[B, 1, P, S] bool: causal attention to real prompt tokens; pad queries see themselves.

    S = `kv_width` (default P); columns past P (an unfilled cache) are never attended.

    Letting a pad query attend to itself keeps every softmax row non-empty (no NaN in the cache);
    real queries never attend to pad keys, so their outputs are those of the unpadded prompt.
    """
    width = prompt_mask.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=prompt_mask.device).tril()
    keys_real = prompt_mask.bool()[:, None, None, :]  # [B, 1, 1, P]
    diagonal = torch.eye(width, dtype=torch.bool, device=prompt_mask.device)
    mask = (causal & keys_real) | diagonal  # [B, 1, P, P]
    if kv_width is not None and kv_width > width:
        mask = torch.nn.functional.pad(mask, (0, kv_width - width), value=False)
    return mask


class StaticDecodeBackend:
    """Batched sampling with a manual KV-cached loop; shares weights with the policy."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        device: torch.device,
        compile: bool = False,
        check_every: int | None = None,
        share_prompt_cache: bool = True,
        functional_step: bool = True,
        stop_ids: list[int] | None = None,
        cuda_graphs: bool = False,
        capture_graphs: bool | None = None,
        graphs_fallback: bool = False,
        draw: str = "multinomial",
        compact_rows: bool | None = None,
        prepare_weights: bool = True,
        repack_row_tokens: int = REPACK_ROW_TOKENS,
    ):
        if draw not in DRAWS:
            raise ValueError(f"rollout.draw={draw!r} is not one of {', '.join(DRAWS)}")
        self.draw = DRAWS[draw]  # sampling.py: the categorical draw of each token
        self.draw_name = draw  # what run.json records (train/setup.py resolved_rollout)
        # Stop computing rows that have emitted EOS (functional shared-prefix loop): only where
        # the draw of the other rows stays that of the full loop (inverse_cdf draws N uniforms
        # and keeps the live rows'); None: on with inverse_cdf
        self.compact_rows = (draw == "inverse_cdf") if compact_rows is None else compact_rows
        self.compactions = 0  # times the last `generate` dropped finished rows (a reading for tests)
        # The functional step's matmul weights prepared once a rollout (llama_decode.RolloutLinear:
        # cast under autocast, MKL-packed for the B*R rows in fp32 on a CPU); the same products
        self.prepare_weights = prepare_weights
        self.repack_row_tokens = repack_row_tokens  # with packed weights, when dropping rows pays
        if self.compact_rows and draw != "inverse_cdf":
            raise ValueError("compact_rows needs draw='inverse_cdf' (multinomial's stream depends on every row)")
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.compile = compile
        self.check_every = check_every or (1 if device.type == "cpu" else 8)
        self.share_prompt_cache = share_prompt_cache  # shared_prefix_attention (else R copies)
        self.functional_step = functional_step  # llama_decode.py's step where it is exact
        self.stop_ids = stop_ids or [tokenizer.eos_token_id]  # stop_tokens.py
        self._compiled_step = None
        self.cuda_graphs = cuda_graphs  # graph_decode.py: k = check_every tokens per replay
        self.capture_graphs = capture_graphs  # None: capture on CUDA, run eagerly elsewhere
        self.graphs_fallback = graphs_fallback  # a failed graph decode: warn, then decode eagerly
        self.graph_decoder: GraphDecoder | None = None

    def sync_weights(self, model: torch.nn.Module) -> None:
        if model is not self.model:
            self._compiled_step = None  # compiled without module guards: recompile for a new model
            self.graph_decoder = None  # its graphs read the old model's tensors
        self.model = model

    def _decode_step(self, model, tokens, mask, positions, cache):  # [N, 1], [N, 1, 1, S], [N, 1]
        output = model(
            input_ids=tokens, attention_mask=mask, position_ids=positions,
            use_cache=True, **cache_argument(cache),
        )
        return output.logits[:, -1].float()  # [N, V]

    def _step_function(self):
        if not self.compile:
            return self._decode_step
        if self._compiled_step is None:
            # The policy's weights change in place between steps; guards on module attributes
            # would only cost time on every call (the model object is checked in sync_weights).
            options = {"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}
            self._compiled_step = torch.compile(self._decode_step, dynamic=False, options=options)
        return self._compiled_step

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], settings: SamplingSettings, generator_seed: int
    ) -> RolloutBatch:
        pad_id, stop_ids = self.tokenizer.pad_token_id, self.stop_ids
        group_size, max_new = settings.group_size, settings.max_new_tokens
        unique_ids, unique_mask = left_pad(prompts, pad_id)  # [B, P]
        unique_ids, unique_mask = unique_ids.to(self.device), unique_mask.to(self.device)
        prompt_length = unique_ids.shape[1]
        capacity = prompt_length + max_new
        if self.compile:  # a few cache sizes, so the compiled step is not rebuilt for every width
            capacity = -(-capacity // CAPACITY_BUCKET) * CAPACITY_BUCKET
        generator = torch.Generator(device=self.device).manual_seed(generator_seed)
        self.compactions = 0
        model = self.model
        was_training = model.training
        model.eval()
        try:
            graphed = None
            if self.cuda_graphs:
                graphed = self._graph_sample_or_fall_back(model, unique_ids, unique_mask, settings,
                                                          generator_seed)
            if graphed is not None:
                completion_ids, logprobs = graphed
            else:
                completion_ids, logprobs = self._sample(
                    model, unique_ids, unique_mask, group_size, max_new, capacity, settings,
                    generator, stop_ids, pad_id,
                )
        finally:
            model.train(was_training)
        prompt_ids = unique_ids.repeat_interleave(group_size, dim=0)  # [N, P]
        prompt_mask = unique_mask.repeat_interleave(group_size, dim=0)  # [N, P]
        completion_mask = completion_mask_through_eos(completion_ids, stop_ids)  # [N, T]
        width = int(completion_mask.sum(dim=1).max().item()) if completion_ids.numel() else 0
        completion_ids, completion_mask = completion_ids[:, :width], completion_mask[:, :width]
        logprobs = logprobs[:, :width]
        ids, keep = completion_ids.tolist(), completion_mask.bool().tolist()  # one copy to the host
        texts = self.tokenizer.batch_decode(
            [[token for token, kept in zip(row, flags, strict=True) if kept]
             for row, flags in zip(ids, keep, strict=True)],
            skip_special_tokens=True,
        )
        return assemble_batch(
            prompt_ids, prompt_mask, completion_ids, completion_mask, logprobs, group_size, texts,
            pad_id=pad_id,
        )

    def _sample(self, model, unique_ids, unique_mask, group_size, max_new, capacity, settings,
                generator, stop_ids, pad_id):
        """Prefill each prompt once, then decode all B*R rows token by token."""
        if self.share_prompt_cache and not self.compile and supports_shared_prefix(model):
            cache = Cache(layers=[SharedPrefixLayer(max_new) for _ in range(num_layers(model))])
            step = None
            if self.functional_step and supports_llama_step(model):
                rows = unique_ids.shape[0] * group_size
                step = LlamaDecodeStep(model, max_positions=capacity,
                                       rollout_rows=rows if self.prepare_weights else 0)
            with attention_routed(model, SHARED_PREFIX_ATTENTION, cache):
                return self._loop(model, cache, False, unique_ids, unique_mask, group_size, max_new,
                                  capacity, settings, generator, stop_ids, pad_id, step,
                                  compact=self.compact_rows and step is not None)
        cache = make_cache(model.config, capacity, full_view=self.compile)
        if self.compile and supports_shared_prefix(model):
            with attention_routed(model, DECODE_MATH_ATTENTION):
                return self._loop(model, cache, True, unique_ids, unique_mask, group_size, max_new,
                                  capacity, settings, generator, stop_ids, pad_id)
        return self._loop(model, cache, self.compile, unique_ids, unique_mask, group_size, max_new,
                          capacity, settings, generator, stop_ids, pad_id)

    def _graph_sample_or_fall_back(self, model, unique_ids, unique_mask, settings, generator_seed):
        """`_graph_sample`, or None once it has failed with `graphs_fallback` (class docstring)."""
        try:
            return self._graph_sample(model, unique_ids, unique_mask, settings, generator_seed)
        except (RuntimeError, ValueError) as error:
            if not self.graphs_fallback:
                raise
            warnings.warn(f"rollout.cuda_graphs (auto): the graph decode failed ({error}); this run "
                          "decodes eagerly from now on (set rollout.cuda_graphs=false to skip the "
                          "attempt, or true to make it an error)", RuntimeWarning, stacklevel=2)
            self.cuda_graphs, self.graph_decoder = False, None
            return None

    def _graph_sample(self, model, unique_ids, unique_mask, settings, generator_seed):
        """Prefill each prompt once into a shared-prefix cache, then graph_decode.py's loop."""
        if self.graph_decoder is None:
            problem = graph_ready_model_problem(model)
            if problem is not None:
                raise ValueError(f"rollout.cuda_graphs: {problem}")
            self.graph_decoder = GraphDecoder(model, self.device, self.stop_ids,
                                               self.tokenizer.pad_token_id, self.check_every,
                                               capture=self.capture_graphs)
        cache = Cache(layers=[SharedPrefixLayer(1) for _ in range(num_layers(model))])
        with attention_routed(model, SHARED_PREFIX_ATTENTION, cache):
            logits = self._prefill(model, cache, False, unique_ids, unique_mask, None)  # [B, V]
        return self.graph_decoder.decode(cache.layers, unique_mask, logits, settings, generator_seed)

    def _prefill(self, model, cache, full_view, unique_ids, unique_mask, capacity):
        """Run the B prompts once into `cache`; the last position's raw logits [B, V] float32."""
        shared = isinstance(cache.layers[0], SharedPrefixLayer) if cache.layers else False
        positions = (unique_mask.cumsum(-1) - 1).clamp(min=0)  # [B, P]
        shared_prefix_calls[0] = 0
        output = model(
            input_ids=unique_ids,
            attention_mask=prefill_mask(unique_mask, capacity if full_view else None),
            position_ids=positions,
            use_cache=True, logits_to_keep=1, **cache_argument(cache),
        )
        if shared and shared_prefix_calls[0] != len(cache.layers):
            raise RuntimeError(
                f"{type(model).__name__} does not route attention through transformers' "
                "AttentionInterface; use rollout.backend=hf"
            )
        return output.logits[:, -1].float()

    def _loop(self, model, cache, full_view, unique_ids, unique_mask, group_size, max_new, capacity,
              settings, generator, stop_ids, pad_id, step_function=None, compact=False):
        """Decode all B*R rows token by token. `compact` (functional step on the shared-prefix
        cache, inverse_cdf draw): rows that have emitted EOS are dropped from the step's batch and
        cache (`SharedPrefixLayer.keep_rows`) when `_drop_finished` says so; the draw keeps the full loop's
        uniforms, so tokens and log-probs are the full loop's up to the round-off of smaller
        matmuls."""
        shared = isinstance(cache.layers[0], SharedPrefixLayer) if cache.layers else False
        prompt_length = unique_ids.shape[1]
        logits = self._prefill(model, cache, full_view, unique_ids, unique_mask, capacity)
        logits = logits.repeat_interleave(group_size, dim=0)  # [N, V]
        if not shared:
            cache.batch_repeat_interleave(group_size)
        rows = logits.shape[0]
        mask = torch.zeros(rows, 1, 1, capacity, dtype=torch.bool, device=self.device)  # [N, 1, 1, S]
        mask[:, 0, 0, :prompt_length] = unique_mask.bool().repeat_interleave(group_size, dim=0)
        next_position = unique_mask.sum(dim=1, keepdim=True).repeat_interleave(group_size, dim=0)  # [N, 1]
        tokens = torch.full((rows, max_new), pad_id, dtype=torch.long, device=self.device)  # [N, T]
        logprobs = torch.zeros(rows, max_new, device=self.device)  # [N, T]
        done = torch.zeros(rows, dtype=torch.bool, device=self.device)  # [N]
        step_function = step_function or self._step_function()
        stop = torch.tensor(stop_ids, device=self.device)  # [S] stop token ids
        if compact:
            return self._compacting_loop(model, cache, logits, mask, next_position, tokens, logprobs,
                                         prompt_length, group_size, max_new, settings, generator,
                                         stop, pad_id, step_function)
        for t in range(max_new):
            token = self.draw(logits, settings.temperature, settings.top_p, generator)  # [N]
            token = torch.where(done, pad_id, token)
            tokens[:, t] = token
            logprobs[:, t] = torch.log_softmax(logits, dim=-1).gather(1, token[:, None]).squeeze(1)
            done |= is_stop(token, stop)
            last = t == max_new - 1
            if last or ((t + 1) % self.check_every == 0 and bool(done.all())):
                break
            column = prompt_length + t
            mask[:, 0, 0, column] = True
            step_mask = mask if full_view else mask[..., : column + 1]
            logits = step_function(model, token[:, None], step_mask, next_position + t, cache)
        return tokens, logprobs

    def _drop_finished(self, finished: int, rows: int, tokens_left: int, packed: bool) -> bool:
        """Whether the compacting loop drops its `finished` rows (of `rows`) now. Unpacked: once
        an eighth of the rows are done. With MKL-packed weights the rows left need a new pack,
        which costs about as much as decoding `repack_row_tokens` row-tokens (REPACK_ROW_TOKENS);
        so only when the finished rows could otherwise still be decoded that many times."""
        if packed:
            return finished * tokens_left >= self.repack_row_tokens
        return finished * 8 >= rows

    def _compacting_loop(self, model, cache, logits, mask, next_position, tokens, logprobs,
                         prompt_length, group_size, max_new, settings, generator, stop, pad_id,
                         step_function):
        """`_loop` that stops computing finished rows (its docstring). One host read (how many
        rows are done) every `check_every` tokens: every token on a CPU, where it costs nothing;
        every 8 on CUDA, where each is a sync that stalls the kernel queue. A row that finishes
        between reads is decoded on (pad tokens, as in the full loop) until the next one."""
        rows = tokens.shape[0]
        live = torch.arange(rows, device=self.device)  # [n] the batch rows still decoded
        done = torch.zeros(rows, dtype=torch.bool, device=self.device)  # [n] of those, finished
        per_row_prompts = False  # the cache's prompt part: per group until the first compaction
        packed = step_function.packed  # a LlamaDecodeStep here (`_sample`)
        for t in range(max_new):
            token = self.draw(logits, settings.temperature, settings.top_p, generator, (rows, live))  # [n]
            token = torch.where(done, pad_id, token)
            tokens[live, t] = token
            logprobs[live, t] = torch.log_softmax(logits, dim=-1).gather(1, token[:, None]).squeeze(1)
            done |= is_stop(token, stop)
            if t == max_new - 1:
                break
            count = int(done.sum()) if (t + 1) % self.check_every == 0 else None  # the host read
            if count == live.numel():
                break
            if count is not None and self._drop_finished(count, live.numel(), max_new - t - 1, packed):
                keep = (~done).nonzero().flatten()  # [n']
                live, token, done = live[keep], token[keep], done[keep]
                mask, next_position = mask[keep], next_position[keep]
                prompt_of_kept = None if per_row_prompts else live // group_size
                for layer in cache.layers:
                    layer.keep_rows(keep, prompt_of_kept)
                per_row_prompts = True
                self.compactions += 1
                if packed:
                    step_function.prepare(live.numel())
            column = prompt_length + t
            mask[:, 0, 0, column] = True
            logits = step_function(model, token[:, None], mask[..., : column + 1], next_position + t, cache)
        return tokens, logprobs
