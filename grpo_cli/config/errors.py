"""The errors a run answers with one line instead of a traceback.

ConfigError: every value check raises it (grpo_cli/validate.py, and checks that need the model).
InputError: a file or path the config names cannot be used (a malformed data line, a missing
model directory); its message names the file and line, or the path.
"""

import os


class ConfigError(ValueError):
    """An unusable setting. The message is one line per problem, each naming its key."""


class InputError(Exception):
    """Unusable input named by the config; the message is one line naming the file:line or path."""


def debug() -> bool:
    """GRPO_DEBUG=1: refusals (bad values, a held run directory) and input errors raise with their traceback."""
    return os.environ.get("GRPO_DEBUG", "") not in ("", "0", "false")
