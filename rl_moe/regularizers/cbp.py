"""Continual backprop (Dohare et al. 2024, "Loss of plasticity in deep continual learning", Nature).

Per hidden unit: contribution utility u = |h| * mean_k |w_out,ik|, kept as a running average with
decay eta=0.99 and read bias-corrected as u / (1 - eta^age). Each gradient step, a layer adds
``replacement_rate`` x (its mature units, age > ``maturity``) to a fractional budget; whole units
of the budget are spent on the mature units of lowest corrected utility. A replaced unit gets
fresh input weights, zero bias and zero output weights; its bias-corrected running mean
activation times its old output weights is first folded into the next layer's bias, so the
network's output is kept on average. The Adam moments of the touched entries are zeroed.

Choices: for MoE every expert is a separate layer (own budget, utilities over the rows routed to
it; an expert with no rows this step keeps its running averages but still ages). The gate's last
hidden layer (its embedding, feeding the logits) is one more layer over all states (``gate=True``;
earlier gate layers are not tracked). Defaults are the paper's RL (PPO) settings: rate 1e-4,
maturity 10000, eta 0.99.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rl_moe.regularizers.hooks import LossContext
from rl_moe.regularizers.targets import Targeted, active_roles, check_target, module_names
from rl_moe.regularizers.units import ExpertUnits, GateUnits, UnitLayer, unit_layers

#: Tag of the gate layer in saved state (expert layers use their index).
_GATE = "gate"


def _key(units: UnitLayer) -> tuple[int, int | str]:
    return (id(units.stack), units.layer) if isinstance(units, ExpertUnits) else (id(units.gate), _GATE)


class _LayerState:
    """Running utility, mean activation, age and replacement budget of one hidden layer."""

    #: The tensors that make up the state, in :meth:`ContinualBackprop.state_dict` order.
    FIELDS = ("util", "mean", "age", "budget")

    def __init__(self, units: UnitLayer) -> None:
        e, h = units.shape
        dev = units.out_weights().device
        self.units = units
        self.util = torch.zeros(e, h, device=dev)
        self.mean = torch.zeros(e, h, device=dev)
        self.age = torch.zeros(e, h, dtype=torch.long, device=dev)
        self.budget = torch.zeros(e, dtype=torch.float64, device=dev)


@dataclass(frozen=True)
class CBPConfig:
    """Continual backprop settings.

    :param replacement_rate: units replaced per eligible unit per step
    :param maturity: steps a unit is protected after (re)initialisation
    :param decay: running-average decay eta
    :param target: ``actor``, ``critic`` or ``both``
    :param gate: also replace units of the gate's last hidden layer
    """

    replacement_rate: float = 1e-4
    maturity: int = 10000
    decay: float = 0.99
    target: str = "actor"
    gate: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.replacement_rate <= 1.0:
            raise ValueError(f"replacement_rate must be in [0, 1], got {self.replacement_rate}")
        if not 0.0 < self.decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), got {self.decay}")
        check_target(self.target)


class ContinualBackprop(Targeted):
    """Selective reinitialisation of low-utility mature units (no loss term)."""

    name = "cbp"
    config_class = CBPConfig
    config: CBPConfig

    def __init__(self, config: CBPConfig | None = None, **overrides: Any) -> None:
        super().__init__(config, **overrides)
        self._states: dict[tuple[int, int | str], _LayerState] = {}
        #: Per role, the layers updated by the latest :meth:`observe` and the role's optimizer.
        self._touched: dict[str, tuple[list[_LayerState], list[Any]]] = {}
        self.n_replaced = 0

    def _state(self, units: UnitLayer) -> _LayerState:
        key = _key(units)
        if key not in self._states:
            self._states[key] = _LayerState(units)
        return self._states[key]

    @torch.no_grad()
    def observe(self, ctx: LossContext) -> None:
        for step in ctx.active(self.roles):
            touched = []
            for net, out in step.pairs():
                for units, stats in unit_layers(net, out, self.config.gate):
                    st = self._state(units)
                    self.update_utility(st, *stats)
                    touched.append(st)
            opts = [step.role.optimizer] if step.role.optimizer is not None else []
            self._touched[step.role.name] = (touched, opts)

    def update_utility(self, st: _LayerState, mean_abs: Tensor, mean: Tensor, rows: Tensor) -> None:
        """One running-average step for groups (experts) that received rows; every unit ages."""
        new_util = mean_abs * st.units.out_weights().detach().abs().mean(dim=2)  # (E, H)
        seen = (rows > 0)[:, None]  # (E, 1)
        d = self.config.decay
        st.util = torch.where(seen, d * st.util + (1 - d) * new_util, st.util)
        st.mean = torch.where(seen, d * st.mean + (1 - d) * mean, st.mean)
        st.age += 1

    def after_update(self, algo: Any, phase: str) -> None:
        for role in active_roles(phase, self.roles):
            touched, opts = self._touched.pop(role, ([], []))
            for st in touched:
                self.n_replaced += self.replace(st, opts)

    @torch.no_grad()
    def replace(self, st: _LayerState, opts: list[Any]) -> int:
        """Spend the layer's budget on its lowest-utility mature units; returns units replaced."""
        mature = st.age > self.config.maturity  # (E, H)
        st.budget += self.config.replacement_rate * mature.sum(dim=1).double()
        n_new = torch.minimum(st.budget.floor(), mature.sum(dim=1).double()).long()  # (E,)
        st.budget -= n_new.double()
        count = 0
        for e in torch.nonzero(n_new).flatten().tolist():
            corr = 1 - self.config.decay ** st.age[e].double()  # (H,) bias correction
            util = torch.where(mature[e], st.util[e].double() / corr, torch.full_like(corr, float("inf")))
            units = torch.topk(util, int(n_new[e]), largest=False).indices
            # The next layer (or head, or logits) sees h_i w_out[i] on average; move that into its bias.
            mean = (st.mean[e, units].double() / corr[units]).to(st.mean.dtype)
            st.units.add_to_next_bias(e, units, mean)
            st.units.reinit(e, units, opts)
            st.util[e, units] = 0.0
            st.mean[e, units] = 0.0
            st.age[e, units] = 0
            count += units.numel()
        return count

    def logs(self) -> dict[str, float]:
        return {"cbp_units_replaced": float(self.n_replaced)}

    def state_dict(self, policy: Any) -> dict[str, Any]:
        names = module_names(policy)
        layers = {
            # _LayerState.FIELDS are the tensor fields a checkpoint carries, by name
            f"{names[key[0]]}/{key[1]}": {f: getattr(st, f).clone() for f in _LayerState.FIELDS}
            for key, st in self._states.items()
        }
        return {"n_replaced": self.n_replaced, "layers": layers}

    def load_state_dict(self, state: dict[str, Any], policy: Any) -> None:
        modules = dict(policy.named_modules())
        self.n_replaced = int(state["n_replaced"])
        for key, saved in state["layers"].items():
            name, tag = key.rsplit("/", 1)
            module = modules[name]
            st = self._state(GateUnits(module) if tag == _GATE else ExpertUnits(module, int(tag)))
            for f in _LayerState.FIELDS:
                setattr(st, f, saved[f].to(getattr(st, f).device))  # by name, as saved above
