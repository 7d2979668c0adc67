"""Counting what a piece of training code asks of the host: ops, kernel launches and host syncs.

A host sync is an op whose result the CPU must wait for (``.item()``, ``nonzero``, a tensor
used in an ``if``, a device-to-host copy); on a GPU each one stalls the launch queue. The counts
come from the torch profiler, so they are measurable on a CPU too (the ops are the same).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch.profiler import ProfilerActivity, profile

#: Ops that read a tensor's value on the host.
SYNC_OPS: frozenset[str] = frozenset(
    {"aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero", "aten::equal", "aten::unique"}
)
#: CUDA runtime calls that block the host until the device catches up.
SYNC_CALLS: frozenset[str] = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy"})
#: Profiler scopes whose scalar reads are internal to a CPU kernel: on a CPU every Adam reads its
#: step counters with ``.item()`` and ``std`` reads its count; on CUDA the capturable Adam and
#: ``std`` read nothing, so these are not host syncs of the update.
CPU_INTERNAL_SCOPES: tuple[str, ...] = ("Optimizer.step", "aten::std")
#: CUDA runtime calls that put work on the device.
LAUNCH_CALLS: frozenset[str] = frozenset(
    {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch", "cudaMemcpyAsync", "cudaMemsetAsync"}
)


class OpCounts(NamedTuple):
    """What ``fn`` did, summed over its calls."""

    ops: int  # aten ops
    launches: int  # CUDA runtime launch calls (kernels, graph replays, async copies)
    syncs: int  # host syncs: value reads and blocking runtime calls
    sync_names: dict[str, int]  # which

    def per(self, n: int) -> tuple[float, float, float]:
        """(ops, launches, syncs) per call."""
        return self.ops / n, self.launches / n, self.syncs / n


def _inside(event: object, scopes: tuple[str, ...]) -> bool:
    parent = getattr(event, "cpu_parent", None)  # torch.profiler events: only some have a parent
    while parent is not None:
        if parent.name.startswith(scopes):
            return True
        parent = getattr(parent, "cpu_parent", None)  # as above
    return False


def count_ops(fn: Callable[[], object], repeat: int = 1, exclude_scopes: tuple[str, ...] = ()) -> OpCounts:
    """Run ``fn`` ``repeat`` times under the profiler and count ops, launches and syncs.

    :param exclude_scopes: leave out events under profiler scopes whose names start with these,
        e.g. ``("Optimizer.step",)``: on a CPU every Adam reads its step counters with ``.item()``
        (no device is waited for there); on CUDA the capturable Adam reads nothing
    """
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        for _ in range(repeat):
            fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    events = [e for e in prof.events() if not (exclude_scopes and _inside(e, exclude_scopes))]
    names = Counter(e.name for e in events)
    syncs = Counter({k: v for k, v in names.items() if k in SYNC_OPS or k in SYNC_CALLS})
    # The profiler's own final synchronize is not the code's.
    if torch.cuda.is_available() and syncs.get("cudaDeviceSynchronize"):
        syncs["cudaDeviceSynchronize"] -= 1
        syncs = +syncs
    ops = sum(v for k, v in names.items() if k.startswith("aten::"))
    launches = sum(v for k, v in names.items() if k in LAUNCH_CALLS)
    return OpCounts(ops, launches, sum(syncs.values()), dict(syncs))
