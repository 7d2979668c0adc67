"""Metric families evaluated on a batch of states, returned as ``{tag: value}`` with TensorBoard
group prefixes (``plasticity/``, ``routing/``, ``spectral/``). See docs/metrics.md for every tag."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from rl_moe.diagnostics.coupling import gate_expert_coupling
from rl_moe.diagnostics.entk import entk_gram
from rl_moe.diagnostics.features import dormant_metrics, feature_metrics
from rl_moe.diagnostics.geometry import geometry_metrics
from rl_moe.diagnostics.linalg import effective_rank, stable_rank
from rl_moe.diagnostics.routing import routing_metrics
from rl_moe.diagnostics.slq import SlqConfig, slq_entk_rank
from rl_moe.diagnostics.spectral import gate_input_directions, sdmoe_metrics
from rl_moe.diagnostics.ssmoe import ssmoe_metrics
from rl_moe.diagnostics.views import NetView
from rl_moe.nn import MoENetwork, MoEOutput, StackedExperts
from rl_moe.nn.ssmoe import gate_directions


def _prefixed(group: str, values: dict[str, float], suffix: str = "") -> dict[str, float]:
    return {f"{group}/{k}{suffix}": v for k, v in values.items()}


def _exact_rank(module: nn.Module, x: Tensor, slq: SlqConfig) -> float:
    return effective_rank(entk_gram(module, x).gram)


def _slq_rank(module: nn.Module, x: Tensor, slq: SlqConfig) -> float:
    return slq_entk_rank(module, x, cfg=slq).effective_rank


#: How r_e(K) is computed: the exact layerwise identity (default) or the paper's SLQ estimate.
ENTK_METHODS = {"exact": _exact_rank, "slq": _slq_rank}


def ntk_effective_rank(module: nn.Module, x: Tensor, method: str = "exact", slq: SlqConfig | None = None) -> float:
    """r_e(K) of ``module``'s eNTK on network inputs ``x`` (SPHERE Eq. 7; Eqs. 28-29 for ``slq``).

    :param method: one of :data:`ENTK_METHODS`
    :param slq: probes and Lanczos steps for ``slq``
    """
    if method not in ENTK_METHODS:
        raise ValueError(f"unknown eNTK method {method!r}; valid choices: {', '.join(ENTK_METHODS)}")
    return ENTK_METHODS[method](module, x, slq or SlqConfig())


def entk_rank(view: NetView, obs: Tensor) -> float:
    """Exact r_e(K) of the network's eNTK on ``obs`` (layerwise Gram identity)."""
    return effective_rank(entk_gram(view.module, view.inputs(obs)).gram)


def plasticity_group(view: NetView, obs: Tensor, suffix: str = "") -> dict[str, float]:
    """eNTK rank, A_last rank/condition/norm and dormant ratios (``plasticity/``)."""
    x = view.inputs(obs).detach()
    out = {"entk_rank": effective_rank(entk_gram(view.module, x).gram)}
    with torch.no_grad():
        result = view.module(x)
    out.update(feature_metrics(result))
    out.update(dormant_metrics(result))
    return _prefixed("plasticity", out, suffix)


def routing_group(view: NetView, obs: Tensor, knn: int = 10, suffix: str = "") -> dict[str, float]:
    """J.11 specialization and load metrics (``routing/``); empty for dense networks."""
    if not view.is_moe:
        return {}
    with torch.no_grad():
        result = view.module(view.inputs(obs))
    return _prefixed("routing", routing_metrics(result, knn), suffix)


def routed_experts(module: nn.Module) -> StackedExperts | None:
    """The routed expert stack of a MoE network, if any."""
    return module.routed_experts() if isinstance(module, MoENetwork) else None


def gate_rows(module: nn.Module) -> Tensor | None:
    """Learned router rows (E, G): the gate's logit layer, or SoftMoE's slot keys."""
    return module.router_rows() if isinstance(module, MoENetwork) else None


def _routed_k(module: nn.Module, result: MoEOutput) -> int:
    """Experts per state of the learned router (DS-MoE: its routed top-k)."""
    return module.routed_top_k() if isinstance(module, MoENetwork) else int(result.indices.shape[1])


def spectral_group(
    view: NetView, obs: Tensor, expert_grads: Sequence[Tensor | None] | None = None, ssmoe_c: int = 2
) -> dict[str, float]:
    """SD-MoE, MSO/DSC, SSMoE and stable-rank metrics of the routed experts (``spectral/``); empty
    when dense.

    :param expert_grads: per linear layer, the actor-loss gradient of the stacked expert weights
    """
    experts = routed_experts(view.module)
    if not view.is_moe or experts is None:
        return {}
    x = view.inputs(obs).detach()
    weights = [w.detach() for w in experts.weights]
    rows = gate_rows(view.module)
    gate_dirs = gate_input_directions(view.module, x)
    out = sdmoe_metrics(weights, list(expert_grads) if expert_grads is not None else None, gate_dirs)
    out.update(geometry_metrics(weights, rows))
    srank = stable_rank(weights[-2])  # (E,) each expert's last hidden layer
    out.update(expert_stable_rank=float(srank.mean()), expert_stable_rank_min=float(srank.min()))
    gate = view.module.gate_mlp() if isinstance(view.module, MoENetwork) else None
    if gate is not None:
        # The EV router as SSMoE's layer builds it (the gate's linear pull-back, which depends on
        # the weights only), compared with the learned gate's own logits s(x), not the network's
        # routing logits (log P on an SSMoE net).
        with torch.no_grad():
            result = view.module(x)
            _, gate_logits = gate(x)  # (N, E) s(x)
            router_dirs = gate_directions(gate)  # (E, in)
        out.update(ssmoe_metrics(weights[0], weights[-1], router_dirs, rows, x, gate_logits, _routed_k(view.module, result), ssmoe_c))
    return _prefixed("spectral", out)


def slq_group(view: NetView, obs: Tensor, cfg: SlqConfig | None = None) -> dict[str, float]:
    """SLQ estimate of r_e(K) (``plasticity/entk_rank_slq``)."""
    return {"plasticity/entk_rank_slq": slq_entk_rank(view.module, view.inputs(obs).detach(), cfg=cfg or SlqConfig()).effective_rank}


def coupling_group(view: NetView, obs: Tensor) -> dict[str, float]:
    """Gate-expert Gauss-Newton coupling (``spectral/gn_coupling``); empty when dense."""
    if not view.is_moe:
        return {}
    return _prefixed("spectral", gate_expert_coupling(view.module, view.inputs(obs).detach()))
