"""Gate-expert coupling in the Gauss-Newton matrix (SPHERE appendix J.13).

With J the per-sample gradient of g(x) = sum_d f_d(x) (the eNTK's scalar projection) and G = J^T J
/ N, the block norms need no materialized J: ||J_a^T J_b||_F^2 = <J_a J_a^T, J_b J_b^T>_F, i.e. the
Frobenius inner product of the eNTKs restricted to parameter groups a and b. Both come exactly from
the layerwise identity, so cos(a, b) = ||G_ab||_F / sqrt(||G_aa||_F ||G_bb||_F) is exact and cheap.
"""

from __future__ import annotations

import math

from torch import Tensor, nn

from rl_moe.diagnostics.entk import ForwardFn, entk_gram
from rl_moe.nn import StackedExperts


def expert_and_gate_params(module: nn.Module) -> tuple[list[Tensor], list[Tensor]]:
    """Split trainable parameters into expert stacks and everything else (the router)."""
    expert_ids = {id(p) for m in module.modules() if isinstance(m, StackedExperts) for p in m.parameters()}
    params = [p for p in module.parameters() if p.requires_grad]
    return [p for p in params if id(p) in expert_ids], [p for p in params if id(p) not in expert_ids]


def block_cosine(k_a: Tensor, k_b: Tensor) -> float:
    """cos(a, b) from the restricted eNTKs K_a = J_a J_a^T and K_b = J_b J_b^T (N cancels)."""
    cross = float((k_a * k_b).sum().clamp_min(0.0).sqrt())  # ||J_a^T J_b||_F
    denom = math.sqrt(float(k_a.norm()) * float(k_b.norm()))  # sqrt(||J_a^T J_a||_F ||J_b^T J_b||_F)
    return cross / denom if denom > 0 else math.nan


def gate_expert_coupling(module: nn.Module, x: Tensor, forward: ForwardFn | None = None) -> dict[str, float]:
    """``gn_coupling`` = cos(gate, expert) of the Gauss-Newton blocks on states ``x``."""
    experts, gate = expert_and_gate_params(module)
    if not experts or not gate:
        return {}
    k_e = entk_gram(module, x, forward, experts).gram
    k_g = entk_gram(module, x, forward, gate).gram
    return {"gn_coupling": block_cosine(k_g, k_e)}
