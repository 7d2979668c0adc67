"""Continual backprop (Dohare et al. 2024, "Loss of plasticity in deep continual learning", Nature).

Per hidden unit: contribution utility u = |h| * mean_k |w_out,ik|, kept as a running average with
decay eta=0.99 and read bias-corrected as u / (1 - eta^age). Each gradient step, a layer adds
``replacement_rate`` x (its mature units, age > ``maturity``) to a fractional budget; whole units
of the budget are spent on the mature units of lowest corrected utility. A replaced unit gets
fresh input weights, zero bias and zero output weights; its bias-corrected running mean
activation times its old output weights is first folded into the next layer's bias, so the
network's output is kept on average. The Adam moments of the touched entries are zeroed.

Choices: for MoE every expert is a separate layer (own budget, utilities over the rows routed to
it; an expert with no rows this step keeps its running averages but still ages). Defaults are
the paper's RL (PPO) settings: rate 1e-4, maturity 10000, eta 0.99. Expert hidden layers only;
the gate is not reset.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from rl_moe.nn import StackedExperts
from rl_moe.regularizers.base import LossContext, Penalty, Regularizer
from rl_moe.regularizers.targets import active_roles, check_target, expert_stacks, module_names, optimizers, role_outputs
from rl_moe.regularizers.units import layer_stats, reinit_units


class _LayerState:
    """Running utility, mean activation, age and replacement budget of one stacked hidden layer."""

    def __init__(self, stack: StackedExperts, layer: int) -> None:
        e, h = stack.n_experts, stack.hidden_dims[layer]
        dev = stack.weights[layer].device
        self.stack, self.layer = stack, layer
        self.util = torch.zeros(e, h, device=dev)
        self.mean = torch.zeros(e, h, device=dev)
        self.age = torch.zeros(e, h, dtype=torch.long, device=dev)
        self.budget = torch.zeros(e, dtype=torch.float64, device=dev)

    #: The tensors that make up the state, in :meth:`ContinualBackprop.state_dict` order.
    FIELDS = ("util", "mean", "age", "budget")


class ContinualBackprop(Regularizer):
    """Selective reinitialisation of low-utility mature units (no loss term).

    :param replacement_rate: units replaced per eligible unit per step (1e-4)
    :param maturity: steps a unit is protected after (re)initialisation (10000)
    :param decay: running-average decay eta (0.99)
    :param target: ``actor``, ``critic`` or ``both``
    """

    name = "cbp"

    def __init__(
        self, replacement_rate: float = 1e-4, maturity: int = 10000, decay: float = 0.99, target: str = "actor"
    ) -> None:
        if not 0.0 <= replacement_rate <= 1.0:
            raise ValueError(f"replacement_rate must be in [0, 1], got {replacement_rate}")
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        self.rate, self.maturity, self.decay = replacement_rate, maturity, decay
        self.roles = check_target(target)
        self._states: dict[tuple[int, int], _LayerState] = {}
        self._touched: dict[str, list[_LayerState]] = {}
        self.n_replaced = 0

    def _state(self, stack: StackedExperts, layer: int) -> _LayerState:
        key = (id(stack), layer)
        if key not in self._states:
            self._states[key] = _LayerState(stack, layer)
        return self._states[key]

    @torch.no_grad()
    def penalty(self, ctx: LossContext) -> list[Penalty]:
        for role in active_roles(ctx.phase, self.roles):
            touched = []
            for net, out in role_outputs(ctx, role):
                for stack, group in zip(expert_stacks(net), out.groups):
                    for layer in range(len(group.expert.hidden)):
                        st = self._state(stack, layer)
                        self.update_utility(st, *layer_stats(group.dispatch, group.expert, layer))
                        touched.append(st)
            self._touched[role] = touched
        return []

    def update_utility(self, st: _LayerState, mean_abs: Tensor, mean: Tensor, rows: Tensor) -> None:
        """One running-average step for experts that received rows; every unit ages."""
        w_out = st.stack.weights[st.layer + 1].detach()  # (E, H, out)
        new_util = mean_abs * w_out.abs().mean(dim=2)  # (E, H)
        seen = (rows > 0)[:, None]  # (E, 1)
        d = self.decay
        st.util = torch.where(seen, d * st.util + (1 - d) * new_util, st.util)
        st.mean = torch.where(seen, d * st.mean + (1 - d) * mean, st.mean)
        st.age += 1

    def after_update(self, algo: Any, phase: str) -> None:
        opts = None
        for role in active_roles(phase, self.roles):
            for st in self._touched.pop(role, []):
                if opts is None:
                    opts = optimizers(algo)
                self.n_replaced += self.replace(st, opts)

    @torch.no_grad()
    def replace(self, st: _LayerState, opts: list[Any]) -> int:
        """Spend the layer's budget on its lowest-utility mature units; returns units replaced."""
        mature = st.age > self.maturity  # (E, H)
        st.budget += self.rate * mature.sum(dim=1).double()
        n_new = torch.minimum(st.budget.floor(), mature.sum(dim=1).double()).long()  # (E,)
        st.budget -= n_new.double()
        count = 0
        for e in torch.nonzero(n_new).flatten().tolist():
            corr = 1 - self.decay ** st.age[e].double()  # (H,) bias correction
            util = torch.where(mature[e], st.util[e].double() / corr, torch.full_like(corr, float("inf")))
            units = torch.topk(util, int(n_new[e]), largest=False).indices
            self._fold_mean(st, e, units, corr[units])
            reinit_units(st.stack, st.layer, e, units, opts)
            st.util[e, units] = 0.0
            st.mean[e, units] = 0.0
            st.age[e, units] = 0
            count += units.numel()
        return count

    @staticmethod
    def _fold_mean(st: _LayerState, e: int, units: Tensor, corr: Tensor) -> None:
        # The next layer (or head) sees h_i W_out[i] on average; move that into its bias.
        w_out = st.stack.weights[st.layer + 1]  # (E, H, out)
        mean = (st.mean[e, units].double() / corr).to(w_out.dtype)  # (k,)
        st.stack.biases[st.layer + 1][e] += (mean[:, None] * w_out[e][units, :]).sum(dim=0)

    def logs(self) -> dict[str, float]:
        return {"cbp_units_replaced": float(self.n_replaced)}

    def state_dict(self, policy: Any) -> dict[str, Any]:
        names = module_names(policy)
        layers = {
            f"{names[id(st.stack)]}/{st.layer}": {f: getattr(st, f).clone() for f in _LayerState.FIELDS}
            for st in self._states.values()
        }
        return {"n_replaced": self.n_replaced, "layers": layers}

    def load_state_dict(self, state: dict[str, Any], policy: Any) -> None:
        modules = dict(policy.named_modules())
        self.n_replaced = int(state["n_replaced"])
        for key, saved in state["layers"].items():
            name, layer = key.rsplit("/", 1)
            st = self._state(modules[name], int(layer))
            for f in _LayerState.FIELDS:
                setattr(st, f, saved[f].to(getattr(st, f).device))
