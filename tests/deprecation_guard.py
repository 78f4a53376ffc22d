"""Fail a test when grpo_cli itself calls an API (torch, transformers, or any other dependency)
that warns it is deprecated. grpo_cli issues no DeprecationWarning/FutureWarning of its own.

A DeprecationWarning or FutureWarning is *ours* when the deprecated API was called from grpo_cli:
the frame the warning is attributed to (the caller a library names through `stacklevel`), or, for a
warning issued with stacklevel=1 from the deprecated function itself, that function's caller;
either after skipping the dispatch frames between a call and the deprecated function:
`torch.nn.Module.__call__` (transformers' `@deprecate_kwarg("past_key_values", ...)` on `forward`
is attributed there) and functools/contextlib wrappers. Warnings attributed to a library's own code (transformers calling
torch, say) are third-party-internal: they pass through unchanged, so an upgrade cannot fail the
suite for code we do not own.

Installed by tests/conftest.py for every test through `warnings.showwarning` (called while the
warning's stack is still live); pyproject's filterwarnings lets both categories reach it.
Warnings from a subprocess (`grpo` run as a command) are not seen here.
"""

from __future__ import annotations

import sys
import warnings

DEPRECATIONS = (DeprecationWarning, FutureWarning)
DISPATCH_MODULES = ("torch.nn.modules.module", "functools", "contextlib", "torch.utils._contextlib")


class OwnDeprecation(AssertionError):
    """grpo_cli called a deprecated torch/transformers API."""


def _module(frame) -> str:
    return frame.f_globals.get("__name__", "") or ""


def _outward_past_dispatch(frame):
    while frame is not None and _module(frame).startswith(DISPATCH_MODULES):
        frame = frame.f_back
    return frame


def deprecated_call_site(frame, filename: str, lineno: int):
    """The frame that called the deprecated API, given the innermost frame of the warning.

    A library names the caller through `stacklevel` (the warning's filename:line is then an
    outer frame), or warns with stacklevel=1 from the deprecated function itself (the warning's
    site is the innermost frame; its caller made the call). None if the site is not on the stack.
    """
    innermost = frame
    while frame is not None and not (frame.f_code.co_filename == filename and frame.f_lineno == lineno):
        frame = frame.f_back
    if frame is None:
        return None
    if frame is innermost and not _module(frame).startswith("grpo_cli"):
        return _outward_past_dispatch(frame.f_back)
    return _outward_past_dispatch(frame)


def check(message, category, filename, lineno, frame) -> None:
    if not issubclass(category, DEPRECATIONS):
        return
    caller = deprecated_call_site(frame, filename, lineno)
    if caller is not None and _module(caller).startswith("grpo_cli"):
        where = f"{caller.f_code.co_filename}:{caller.f_lineno}"
        raise OwnDeprecation(f"{where} calls a deprecated API: {category.__name__}: {message}")


def install():
    """Wrap `warnings.showwarning` (returns the previous one, for restoring)."""
    previous = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        innermost = sys._getframe(1)
        while innermost is not None and _module(innermost) == "warnings":
            innermost = innermost.f_back
        check(message, category, filename, lineno, innermost)
        if issubclass(category, DeprecationWarning):
            return  # third-party-internal deprecations stay silent, as before this guard
        previous(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    return previous
