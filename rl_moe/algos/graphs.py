"""Capturing a piece of training code as a CUDA graph, and recovering when a capture fails.

A replayed graph launches all of its kernels at once, so a step bound by Python's kernel launches
(a MoE update or policy call is a few hundred small kernels) runs at the device's speed.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import torch

T = TypeVar("T")

#: Warm-up calls before a capture: the allocator and cuBLAS settle, an optimizer creates its state.
WARMUP = 3
#: First-replay check: a replay must match an eager call within float32 round-off of the order of
#: its kernels (reductions may run in another order); a stale input or a missed op is far larger.
REPLAY_RTOL, REPLAY_ATOL = 1e-3, 1e-6


def capture(fn: Callable[[], T], device: torch.device, warmup: int = WARMUP) -> tuple[Any, T]:
    """Run ``fn`` ``warmup`` times on a side stream, then capture one call.

    :return: the ``torch.cuda.CUDAGraph`` and what the captured call returned (static tensors that
        every replay overwrites)
    :raises RuntimeError: the capture refused an op (see :func:`capture_failed`)
    """
    # A collection during the capture can free an earlier graph (its memory pool), a CUDA call the
    # capture forbids: it would invalidate this capture and leave the CUDA generator mid-capture.
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        stream = torch.cuda.Stream(device=device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn()
    finally:
        if gc_was_enabled:
            gc.enable()
    return graph, out


def reset_cuda_generators() -> None:
    """Leave the CUDA generators usable after a failed capture.

    A capture registers the default generators and marks them capturing; a capture that fails
    never unmarks them, and every later random op on the device would raise. A cloned state
    keeps the seed and offset without the mark.
    """
    for gen in torch.cuda.default_generators:
        if hasattr(gen, "graphsafe_set_state"):  # feature detection: newer torch only
            gen.graphsafe_set_state(gen.clone_state())


def capture_failed(what: str, exc: BaseException) -> None:
    """Repair the generators after a refused capture and say that ``what`` runs without graphs."""
    reset_cuda_generators()
    warnings.warn(f"CUDA graph capture of the {what} failed ({exc}); it runs without graphs", stacklevel=3)


def replay_mismatch(replayed: list[torch.Tensor], eager: list[torch.Tensor]) -> float | None:
    """None when every replayed tensor matches its eager twin (:data:`REPLAY_RTOL`,
    :data:`REPLAY_ATOL`), else the largest absolute difference. One host read: run once, on a
    graph's first replay."""
    if all(torch.allclose(r, e, rtol=REPLAY_RTOL, atol=REPLAY_ATOL) for r, e in zip(replayed, eager, strict=True)):
        return None
    return max(float((r.double() - e.double()).abs().max()) for r, e in zip(replayed, eager))


def replay_failed(what: str, diff: float) -> None:
    """Say that ``what`` runs without graphs because its first replay disagreed with eager."""
    warnings.warn(f"CUDA graph of the {what} disagreed with an eager call on its first replay (max |difference| {diff:.3g}); it runs without graphs", stacklevel=3)
