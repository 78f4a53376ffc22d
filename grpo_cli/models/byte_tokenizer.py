"""A byte-level tokenizer sized to a model's vocabulary, for models whose real tokenizer is absent
(`model.weights=random` rehearsals): every UTF-8 byte is one token, so any text encodes, and
every id below the vocabulary size decodes, so a random policy's samples always detokenize.

Layout: the specials first (<pad>, <unk>, <s>, </s>, then any `model.stop_tokens`, e.g.
Nemotron's `<extra_id_1>`), the 256 byte tokens, then `<filler_i>` entries up to `vocab_size`
(never produced by encoding; they decode to their own name). Built with `tokenizers` (a BPE with
no merges over the byte-level alphabet, as GPT-2's byte-level BPE would be without merges) and
wrapped for transformers like `char_tokenizer.py`.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<s>", "</s>"
BYTES = 256


def build_byte_tokenizer(vocab_size: int, extra_special_tokens=()) -> PreTrainedTokenizerFast:
    """A byte-level tokenizer whose ids cover exactly range(vocab_size)."""
    specials = [PAD, UNK, BOS, EOS] + [t for t in extra_special_tokens if t not in (PAD, UNK, BOS, EOS)]
    if vocab_size < len(specials) + BYTES:
        raise ValueError(
            f"vocab_size={vocab_size} is too small for a byte-level tokenizer "
            f"({len(specials)} special tokens + {BYTES} bytes)"
        )
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # the 256 bytes as printable characters
    tokens = specials + alphabet
    tokens += [f"<filler_{index}>" for index in range(vocab_size - len(tokens))]
    vocab = {token: index for index, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD,
        unk_token=UNK,
        bos_token=BOS,
        eos_token=EOS,
        additional_special_tokens=specials[4:],
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    return wrapped
