"""Static-shape mode: MoE layers run every expert on every state instead of sorting routed rows.

On a GPU, small kernels and host syncs dominate a MoE update: sorting the routed rows needs
``nonzero``/``tolist`` (a sync each) and one small matmul per expert. In static mode a layer
computes all E experts with batched matmuls and weights them by the routing (exactly 0 off the
selected set, so unselected experts get exactly zero gradient), and every shape depends only on
(N, E): the step can be captured in a CUDA graph. On a CPU the routed dispatch is cheaper (cost
proportional to the routed rows), so the mode is off unless a learner turns it on.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

class _State(threading.local):
    enabled = False  # each thread starts in the routed layout


_STATE = _State()


def static_shapes_enabled() -> bool:
    """Whether MoE layers called now use the static (all-experts) layout."""
    return _STATE.enabled


@contextmanager
def static_shapes(enabled: bool = True) -> Iterator[None]:
    """Run MoE layers in the static layout inside the ``with`` block (thread-local, nestable)."""
    previous = static_shapes_enabled()
    _STATE.enabled = enabled
    try:
        yield
    finally:
        _STATE.enabled = previous
