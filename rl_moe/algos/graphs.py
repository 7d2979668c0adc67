"""Capturing a piece of training code as a CUDA graph, and recovering when a capture fails.

A replayed graph launches all of its kernels at once, so a step bound by Python's kernel launches
(a MoE update or policy call is a few hundred small kernels) runs at the device's speed.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

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


class GraphGuard:
    """The one fallback rule of every graphed piece of code (the PPO update's minibatch step, the
    rollout's policy call): a capture that refuses an op, or a first replay that disagrees with an
    eager call, gives one warning, and the code runs eagerly from then on.

    :param what: the code's name in the warnings ("PPO update", "rollout acting")
    :param enabled: False: always eager
    """

    def __init__(self, what: str, enabled: bool = True) -> None:
        self.what, self.enabled = what, enabled

    def captured(self, build: Callable[[], T]) -> T | None:
        """``build()``, a capture; None (with the warning, and eager from now on) when it is refused."""
        try:
            return build()
        except RuntimeError as exc:  # an op the capture refuses
            capture_failed(self.what, exc)
            self.enabled = False
            return None

    def replay_agrees(self, diff: float | None) -> bool:
        """Whether a first replay matched its eager twin (``diff`` from :func:`replay_mismatch`);
        on a mismatch, the warning, and eager from now on."""
        if diff is None:
            return True
        replay_failed(self.what, diff)
        self.enabled = False
        return False


class StateOps(NamedTuple):
    """How a :class:`GraphedStep` saves and restores everything its step writes."""

    snapshot: Callable[[], Any]  # copies of every tensor the step writes
    restore: Callable[[Any], None]  # puts a snapshot back
    outputs: Callable[[], list[torch.Tensor]]  # what a replay is compared on (e.g. the weights)


class GraphedStep:
    """``step(index)`` replayed from a CUDA graph per index length, or called eagerly.

    A wrapper around the eager step, not a second implementation: it captures ``step`` itself (on a
    copy of the index, which each replay refills), undoes what the capture's warm-up calls did,
    checks each graph's first replay against an eager call from the same state, and from the first
    refused capture or mismatch on calls ``step`` eagerly, with one warning.

    :param what: the step's name in warnings ("PPO update")
    :param step: the eager step on a device index tensor
    :param state: save, restore and compare what the step writes
    :param key: what a graph bakes in (hyperparameters, object identities); a change recaptures
    :param before_capture: called before each capture (drops tensors a capture must not see)
    :param enabled: False: always eager
    """

    def __init__(
        self,
        what: str,
        step: Callable[[torch.Tensor], None],
        state: StateOps,
        key: Callable[[], tuple[Any, ...]],
        before_capture: Callable[[], None] = lambda: None,
        enabled: bool = True,
    ) -> None:
        self.what, self.step, self.state, self.key, self.before_capture = what, step, state, key, before_capture
        self.guard = GraphGuard(what, enabled)
        self.graphs: dict[int, tuple[Any, torch.Tensor]] = {}  # index length -> (graph, its index buffer)
        self.verified: set[int] = set()  # index lengths whose graph passed its first-replay check
        self._key: tuple[Any, ...] | None = None

    @property
    def enabled(self) -> bool:
        return self.guard.enabled

    @enabled.setter
    def enabled(self, value: bool) -> None:
        self.guard.enabled = value

    def __call__(self, index: torch.Tensor) -> None:
        if not self.enabled:
            self.step(index)
            return
        key = self.key()
        if key != self._key:
            self.graphs.clear()
            self.verified.clear()
            self._key = key
        size = index.shape[0]
        if size not in self.graphs:
            built = self.guard.captured(lambda: self._capture(index))
            if built is None:  # refused: eager from now on
                self._disable()
                self.step(index)
                return
            self.graphs[size] = built
        graph, buffer = self.graphs[size]
        if size not in self.verified:
            self._first_replay(graph, buffer, index)
            return
        buffer.copy_(index)
        graph.replay()

    def _capture(self, index: torch.Tensor) -> tuple[Any, torch.Tensor]:
        """Warm up on a side stream, capture the step, then undo the warm-up's effects (capturing
        records kernels without running them; the warm-up calls did run)."""
        saved = self.state.snapshot()
        buffer = index.clone()
        self.before_capture()
        try:
            graph, _ = capture(lambda: self.step(buffer), index.device)
        finally:
            self.state.restore(saved)
        return graph, buffer

    def _first_replay(self, graph: Any, buffer: torch.Tensor, index: torch.Tensor) -> None:
        """Replay a new graph once against an eager step from the same state; on a mismatch keep
        the eager step and stop using graphs. A GPU is rarely at hand to test on, so a graph
        checks itself where it runs."""
        saved = self.state.snapshot()
        self.step(index)
        eager = [t.clone() for t in self.state.outputs()]
        self.state.restore(saved)
        buffer.copy_(index)
        graph.replay()
        if self.guard.replay_agrees(replay_mismatch(self.state.outputs(), eager)):
            self.verified.add(index.shape[0])
            return
        self.state.restore(saved)
        self.step(index)
        self._disable()

    def _disable(self) -> None:
        self.enabled = False
        self.graphs.clear()
        self.verified.clear()
