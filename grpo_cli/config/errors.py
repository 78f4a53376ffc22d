"""The error every value check raises (grpo_cli/validate.py, and checks that need the model)."""

import os


class ConfigError(ValueError):
    """An unusable setting. The message is one line per problem, each naming its key."""


def debug() -> bool:
    """GRPO_DEBUG=1: refusals (bad values, a held run directory) raise with their traceback."""
    return os.environ.get("GRPO_DEBUG", "") not in ("", "0", "false")
