"""Values that are functions of a network's weights alone, reused while the weights are held fixed.

A rollout calls the policy once per env step, and an evaluation once per episode step, and no
weight is written in between. A value derived from the weights alone (a spectrally normalized
weight, SSMoE's EV router, SD-MoE's composed W_c + W_u) is then the same in every such call.

The reuse rests on a declared scope, not on the tensors' versions: fused Adam (the package's
default optimizer), SB3's ``polyak_update`` (which writes through ``.data``) and CUDA-graph replays
all change parameters without bumping ``Tensor._version``, so no key built from the tensors alone
can see every update. :func:`weights_fixed` declares that no weight is written until the block ends;
the rollout and evaluation loops (and the offline tools' episodes) enter it, the updates never
run inside it. Code that runs inside one (an SB3 callback during a collection) must not write
weights, or must write them in place through ordinary tensor ops (``load_state_dict``,
``copy_``), which move the version. A :class:`ScopedValue` returns its last value only within the scope it was computed in, for the same
tensors at the same storage and version (so a ``torch.func.functional_call`` with other weights, or
an in-place load inside the scope, still recomputes), and never inside a ``torch.func`` transform,
a CUDA graph's capture or inference mode, and lets it go when the scope closes.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Generic, TypeVar

import torch
from torch import Tensor

T = TypeVar("T")

_scopes = itertools.count(1)


class _Scope(threading.local):
    """This thread's open scope: its number (0 outside any), how deeply it is nested, and the
    values that stored an entry in it (released when it closes)."""

    token: int = 0
    depth: int = 0

    def __init__(self) -> None:
        self.holders: set[ScopedValue[object]] = set()


_scope = _Scope()


@contextmanager
def weights_fixed() -> Iterator[None]:
    """Declare that no weight is written until the block ends, so that values of the weights alone
    may be reused across the block's forward passes. Nested blocks share the outermost one's scope
    (an evaluation inside a rollout's callback); each outermost entry opens a new one, so nothing
    computed before an update is returned after it."""
    if _scope.depth == 0:
        _scope.token = next(_scopes)
    _scope.depth += 1
    try:
        yield
    finally:
        _scope.depth -= 1
        if _scope.depth == 0:
            closed, _scope.token = _scope.token, 0
            # Nothing stored in the scope can be returned after it, so its values (spectrally
            # normalized weights, say, as large as the weights) are let go now, not at the next scope.
            holders, _scope.holders = _scope.holders, set()  # emptied first: an interrupt cannot keep them
            for holder in holders:
                holder.release(closed)


def in_scope() -> bool:
    """Whether this thread is inside :func:`weights_fixed` (a caller may skip gathering the
    tensors of a value it could not reuse anyway)."""
    return _scope.token != 0


def reuse_key(tensors: Sequence[Tensor]) -> tuple[int, ...] | None:
    """The open scope and each tensor's identity, storage and version; None where a value must not
    be reused: outside :func:`weights_fixed`, inside a ``torch.func`` transform (wrapped tensors
    stand for other values), during a CUDA graph's capture (the graph must read the tensors on
    every replay), in inference mode or of an inference tensor (those have no version)."""
    if _scope.token == 0 or torch.is_inference_mode_enabled():
        return None
    for t in tensors:
        if t.is_inference() or torch._C._functorch.is_functorch_wrapped_tensor(t) or (t.is_cuda and torch.cuda.is_current_stream_capturing()):
            return None
    return (_scope.token, *(x for t in tensors for x in (id(t), t.data_ptr(), t._version)))


class ScopedValue(Generic[T]):
    """The last value computed from ``tensors`` in the open :func:`weights_fixed` scope."""

    def __init__(self) -> None:
        # (key, value, the tensors): they stay referenced beside their ids, so no other tensor can
        # take one of those ids while the entry lives.
        self._entry: tuple[tuple[int, ...], T, tuple[Tensor, ...]] | None = None

    def get(self, tensors: Callable[[], Sequence[Tensor]], compute: Callable[[], T]) -> T:
        """``compute()``, or its last result when this scope computed it from the same tensors.
        ``tensors`` is only called inside a scope: outside one, nothing is gathered."""
        if not in_scope():
            return compute()
        sources = tuple(tensors())
        key = reuse_key(sources)
        if key is None:
            return compute()
        entry = self._entry  # read once: the key and the value must come from one entry
        if entry is not None and entry[0] == key:
            return entry[1]
        value = compute()
        self._entry = (key, value, sources)
        _scope.holders.add(self)  # type: ignore[arg-type]
        return value

    def release(self, token: int) -> None:
        """Drop the stored value if scope ``token`` (now closed) stored it; a value another
        thread's open scope stored since stays."""
        entry = self._entry
        if entry is not None and entry[0][0] == token:
            self._entry = None

    def __getstate__(self) -> dict[str, object]:
        return {"_entry": None}  # a copy holds other tensors: the ids would not be theirs
