"""A counter of host reads: ops that copy a tensor's value to the host or size their output by
its data, each a device sync on CUDA. Counted on CPU, so the tests that use it run anywhere.

Two layers see them: the dispatcher (`.item()`, `bool(t)`, `float(t)`, `int(t)` reach
`_local_scalar_dense`; `nonzero`, `unique`, `masked_select`, `equal`, indexing with a boolean
mask) and the Python API, where a CPU run never reaches the dispatcher (`.tolist()`,
`.numpy()`, `.cpu()`, `torch.tensor` of a list holding tensors). Not seen: `.to("cpu")` (a CPU
run cannot tell it from `.to(device)`), and reads made inside C++ kernels below the dispatcher.
Each read is recorded with its innermost grpo_cli frame, so a test can say where it came from.
"""

from __future__ import annotations

import collections
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

PACKAGE = str(Path(__file__).resolve().parents[1] / "grpo_cli")

# aten ops (overload packet names) that read a value back or size their output by the data
DISPATCH_READS = ("_local_scalar_dense", "is_nonzero", "item", "nonzero", "masked_select", "_unique2",
                  "unique_dim", "unique_consecutive", "equal")
# aten indexing ops: a read when one of the indices is a boolean mask (its nonzero runs inside)
MASK_INDEXING = ("index", "index_put", "index_put_", "_index_put_impl_")
# Python-level Tensor methods that copy to the host without reaching the dispatcher on CPU
PYTHON_READS = ("tolist", "numpy", "cpu")


@dataclass(frozen=True)
class Read:
    op: str
    site: str  # innermost grpo_cli frame, "grpo_cli/path.py:line (function)", or "outside grpo_cli"
    codes: tuple  # code objects of every frame on the stack (for `within`)


def _read(op: str) -> Read:
    frame, codes, site = sys._getframe(2), [], None
    while frame is not None:
        codes.append(frame.f_code)
        filename = frame.f_code.co_filename
        if site is None and filename.startswith(PACKAGE):
            relative = "grpo_cli" + filename[len(PACKAGE):]
            site = f"{relative}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return Read(op, site or "outside grpo_cli", tuple(codes))


def _holds_tensor(data) -> bool:
    if isinstance(data, torch.Tensor):
        return data.dim() == 0  # a 0-d tensor as an element of a list
    return isinstance(data, (list, tuple)) and any(_holds_tensor(item) for item in data)


class _PythonReads(TorchFunctionMode):
    def __init__(self, reads: list[Read]):
        super().__init__()
        self.reads = reads

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in PYTHON_READS and args and isinstance(args[0], torch.Tensor):
            self.reads.append(_read(name))
        elif func in (torch.tensor, torch.as_tensor) and args and isinstance(args[0], (list, tuple)) \
                and _holds_tensor(args[0]):
            self.reads.append(_read(f"{name}(list of tensors)"))
        return func(*args, **(kwargs or {}))


class _DispatchReads(TorchDispatchMode):
    def __init__(self, reads: list[Read]):
        super().__init__()
        self.reads = reads

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in DISPATCH_READS:
            self.reads.append(_read(name))
        elif name in MASK_INDEXING and len(args) > 1 and any(
            isinstance(index, torch.Tensor) and index.dtype == torch.bool for index in args[1] or ()
        ):
            self.reads.append(_read(f"{name}(boolean mask)"))
        return func(*args, **(kwargs or {}))


def sites(reads: list[Read]) -> collections.Counter:
    """"grpo_cli/path.py:line (function) op" -> how many of `reads` were made there."""
    return collections.Counter(f"{read.site} {read.op}" for read in reads)


class HostReads:
    """`with HostReads() as reads:` counts the host reads of the block (see the module doc)."""

    def __init__(self):
        self.reads: list[Read] = []
        self._modes = (_PythonReads(self.reads), _DispatchReads(self.reads))

    def __enter__(self) -> HostReads:
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)

    @property
    def counts(self) -> collections.Counter:  # op name -> reads
        return collections.Counter(read.op for read in self.reads)

    @property
    def total(self) -> int:
        return len(self.reads)

    def sites(self) -> collections.Counter:  # "site op" -> reads
        return sites(self.reads)

    def within(self, function) -> list[Read]:
        """The reads made while `function` (a Python function or method) was on the stack."""
        code = getattr(function, "__func__", function).__code__
        return [read for read in self.reads if code in read.codes]

    def outside(self, function) -> list[Read]:
        code = getattr(function, "__func__", function).__code__
        return [read for read in self.reads if code not in read.codes]
