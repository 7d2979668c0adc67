"""rl_moe.nn.reuse: a value of some tensors is reused exactly while they are unchanged."""

from __future__ import annotations

import copy

import torch

from rl_moe.nn.reuse import LastValue, reuse_key


def test_last_value_is_reused_until_a_tensor_changes() -> None:
    w, b = torch.nn.Parameter(torch.randn(3, 4)), torch.randn(4)
    calls = []

    def compute() -> torch.Tensor:
        calls.append(1)
        return (w.detach() * 2 + b).sum(0)

    cache = LastValue()
    first = cache.get((w, b), compute)
    assert cache.get((w, b), compute) is first and len(calls) == 1
    with torch.no_grad():
        w.add_(1.0)  # in place: the version moves
    second = cache.get((w, b), compute)
    assert len(calls) == 2 and torch.equal(second, (w.detach() * 2 + b).sum(0))
    w.data = torch.randn(3, 4)  # new storage
    third = cache.get((w, b), compute)
    assert len(calls) == 3 and torch.equal(third, (w.detach() * 2 + b).sum(0))
    other = b.clone()  # equal values, another tensor
    cache.get((w, other), compute)
    assert len(calls) == 4


def test_no_reuse_inside_a_torch_func_transform_or_in_a_copy() -> None:
    w = torch.randn(5)
    cache = LastValue()
    cache.get((w,), lambda: w * 2)
    seen = []

    def f(x: torch.Tensor) -> torch.Tensor:
        seen.append(reuse_key((x,)))
        return cache.get((x,), lambda: x * 3)

    out = torch.func.vmap(f)(torch.randn(2, 5))
    assert seen == [None] and out.shape == (2, 5)  # each batch's own value, not the cached one
    copied = copy.deepcopy(cache)
    calls = []
    copied.get((w,), lambda: calls.append(1) or w * 2)
    assert calls == [1]  # a copy starts empty: its tensors would be other tensors
