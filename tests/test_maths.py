"""Known answers for the shared maths in rl_moe.maths."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rl_moe.maths import (
    SingularPair,
    dormant_scores,
    effective_rank,
    grads_norm,
    power_iteration,
    top_singular_value,
)


def test_effective_rank_matches_the_entropy_formula() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 9, generator=gen, dtype=torch.float64)
    gram = x.T @ x  # (9, 9) of rank 6
    lam = np.clip(np.linalg.eigvalsh(gram.numpy()), 0.0, None)
    p = lam[lam > 0] / lam.sum()
    assert effective_rank(gram) == pytest.approx(math.exp(-(p * np.log(p)).sum()), rel=1e-9)
    assert effective_rank(torch.eye(5)) == pytest.approx(5.0)
    assert effective_rank(torch.zeros(4, 4)) == 0.0


def test_effective_rank_of_a_float32_rank_one_gram_is_one() -> None:
    # Round-off leaves eigenvalues ~1e-7 of the top one; they add almost no entropy.
    v = torch.randn(64, 1, generator=torch.Generator().manual_seed(1))
    assert effective_rank(v @ v.T) == pytest.approx(1.0, rel=1e-5)


def test_power_iteration_finds_the_spectral_norm() -> None:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(3, 7, 5, generator=gen, dtype=torch.float64)  # (E, a, b)
    start = SingularPair(torch.zeros(3, 7, dtype=torch.float64), torch.randn(3, 5, generator=gen, dtype=torch.float64))
    pair = power_iteration(w, start, steps=200)
    torch.testing.assert_close(top_singular_value(w, pair), torch.linalg.matrix_norm(w, ord=2))
    idle = power_iteration(w, start, steps=0)
    assert idle.u is start.u and idle.v is start.v


def test_top_singular_value_gradient_is_u_v_transpose() -> None:
    w = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    pair = power_iteration(w.detach(), SingularPair(torch.zeros(2, 4, dtype=torch.float64), torch.ones(2, 3, dtype=torch.float64)), 50)
    (grad,) = torch.autograd.grad(top_singular_value(w, pair).sum(), w)
    torch.testing.assert_close(grad, pair.u[:, :, None] * pair.v[:, None, :])


def test_dormant_scores_hand_computed() -> None:
    mean_abs = torch.tensor([[0.0, 1.0, 2.0, 5.0], [0.0, 0.0, 0.0, 0.0]])  # layer means 2 and 0
    expected = torch.tensor([[0.0, 0.5, 1.0, 2.5], [0.0, 0.0, 0.0, 0.0]])  # a silent layer scores 0
    torch.testing.assert_close(dormant_scores(mean_abs), expected)


def test_grads_norm_is_the_joint_l2_norm() -> None:
    grads = [torch.tensor([3.0]), None, torch.tensor([[4.0, 0.0], [0.0, 12.0]])]
    out = grads_norm(grads)
    assert torch.is_tensor(out) and out.ndim == 0
    assert float(out) == pytest.approx(13.0)
    assert float(grads_norm([None])) == 0.0
