"""The errors a run answers with one line instead of a traceback.

ConfigError: every value check raises it (grpo_cli/validate.py, and checks that need the model).
InputError: a file or path the config names cannot be used (a malformed data line, a missing
model directory); its message names the file and line, or the path.
RunStopped: training met something it cannot go on from (a NaN loss); the message names the step.
"""

import dataclasses
import difflib
import os
import re


class ConfigError(ValueError):
    """An unusable setting. The message is one line per problem, each naming its key."""


class InputError(Exception):
    """Unusable input named by the config; the message is one line naming the file:line or path."""


class RunStopped(Exception):
    """A run stopped by what training met, not by a bug (a NaN loss): its message says what and
    where, so `grpo run` ends with that line (status failed, exit 1) and no traceback."""


def debug() -> bool:
    """GRPO_DEBUG=1: refusals (bad values, a held run directory) and input errors raise with their traceback."""
    return os.environ.get("GRPO_DEBUG", "") not in ("", "0", "false")


def unknown_key_hint(error: Exception) -> str | None:
    """For an override of a key the schema lacks (OmegaConf's ConfigKeyError or
    ConfigAttributeError under Hydra's composition error): 'did you mean rollout.group_size?'
    from the schema node's own fields, or where to find them; None for any other error."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    cause = error.__cause__ if error.__cause__ is not None else error
    if not isinstance(cause, (ConfigKeyError, ConfigAttributeError)):
        return None  # a bad value, a missing config group option: Hydra's own words name them
    key, owner = getattr(cause, "key", None), getattr(cause, "object_type", None)
    full_key = str(getattr(cause, "full_key", None) or key)
    if not isinstance(key, str) or not (isinstance(owner, type) and dataclasses.is_dataclass(owner)):
        return None
    override = re.search(r"override '([^']+)'", str(error))  # the key as typed, e.g. rolout.group_size
    typed = override.group(1).lstrip("+~") if override else full_key
    head = full_key[: -len(key)]  # the path down to the unknown key ("" at the top)
    tail = typed[len(full_key):] if typed.startswith(full_key) else ""  # what follows it
    close = difflib.get_close_matches(key, [field.name for field in dataclasses.fields(owner)], n=3, cutoff=0.6)
    if close:
        return "did you mean " + " or ".join(f"{head}{name}{tail}" for name in close) + "?"
    node = head.rstrip(".") or "the top level"
    return f"{node} has no key {key!r} (`grpo config` lists every key)"
