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
        if hasattr(gen, "graphsafe_set_state"):
            gen.graphsafe_set_state(gen.clone_state())


def capture_failed(what: str, exc: BaseException) -> None:
    """Repair the generators after a refused capture and say that ``what`` runs without graphs."""
    reset_cuda_generators()
    warnings.warn(f"CUDA graph capture of the {what} failed ({exc}); it runs without graphs", stacklevel=3)
