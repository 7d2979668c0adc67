"""Values that are functions of a network's weights alone, reused while the weights stay unchanged.

A rollout calls the policy once per env step, and an evaluation once per episode step, with the
weights fixed in between; a value derived from the weights alone (a spectrally normalized weight,
SSMoE's EV router) is then the same in every call. :class:`LastValue` keeps the last one and
returns it while every tensor it was computed from is the same tensor, at the same storage and the
same version: any in-place change (an optimizer step, a loaded state, a reset) bumps the version,
so the value returned is always the one a fresh computation would give, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor


def reuse_key(tensors: Sequence[Tensor]) -> tuple[int, ...] | None:
    """Identity, storage and version of each tensor; None where a value must not be reused: inside
    a torch.func transform (wrapped tensors stand for other values) or a CUDA graph's capture (the
    graph must read the tensors themselves on every replay)."""
    for t in tensors:
        if torch._C._functorch.is_functorch_wrapped_tensor(t) or (t.is_cuda and torch.cuda.is_current_stream_capturing()):
            return None
    return tuple(x for t in tensors for x in (id(t), t.data_ptr(), t._version))


class LastValue:
    """The last value computed from ``tensors``, returned again while they are unchanged."""

    def __init__(self) -> None:
        # (key, value, the tensors): they stay referenced beside their ids, so no other tensor can
        # take one of those ids while the entry lives.
        self._entry: tuple[tuple[int, ...], Tensor, tuple[Tensor, ...]] | None = None

    def get(self, tensors: Sequence[Tensor], compute: Callable[[], Tensor]) -> Tensor:
        """``compute()``, or its last result when ``tensors`` are the same tensors, unchanged."""
        key = reuse_key(tensors)
        if key is not None and self._entry is not None and self._entry[0] == key:
            return self._entry[1]
        value = compute()
        if key is not None:
            self._entry = (key, value, tuple(tensors))
        return value

    def __getstate__(self) -> dict[str, object]:
        return {"_entry": None}  # a copy holds other tensors: the ids would not be theirs
