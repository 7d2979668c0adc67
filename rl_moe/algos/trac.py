"""TRAC, a parameter-free optimizer wrapper for lifelong RL (Muppidi, Zhang and Yang 2024,
"Fast TRAC: A parameter-free optimizer for lifelong reinforcement learning", NeurIPS,
arXiv:2405.16642), around Adam.

Adam steps its own iterate theta_base from the gradients taken at the played point theta; TRAC
plays theta = theta_ref + S (theta_base - theta_ref), theta_ref the parameters at the start. S is a
sum of n one-dimensional tuners, one per discount beta_j, each fed the scalar h = <g, theta_base -
theta_ref> (all parameters of the optimizer together):

    v_j <- beta_j^2 v_j + h^2,    sigma_j <- beta_j sigma_j - h,
    s_j = (s_prior / erfi(1/sqrt(2))) erfi(sigma_j / (sqrt(2 v_j) + eps)),    S = sum_j s_j,

and the point played is theta_ref + max(S, 0) (theta_base - theta_ref). The factor 1/erfi(1/sqrt(2))
is the paper's (the authors' project page and their trac_optimizer package): a tuner's first
non-zero h gives |s_j| ~ s_prior. S starts at 0 (the first step plays theta_ref) and grows while
Adam's steps keep lowering the loss; it shrinks back toward theta_ref when they stop helping, which
is TRAC's answer to lost plasticity.

On a MoE TRAC acts on the whole optimizer: one S for all experts and the gate (and, under PPO, the
critic, which shares the policy's optimizer; TD3's actor and critic optimizers each have their
own S). Choices: betas (0.9, ..., 0.999999), s_prior = eps = 1e-8 are the paper's; the played scale
is clipped at 0 as in the authors' code (the update as the paper states it, S theta_base + (1 - S) theta_ref, is unclipped; a negative S
would reflect Adam's displacement through theta_ref), while ``trac_scale`` logs S itself; sigma
starts at 0 (the authors' code starts it at 1e-8); S is computed in
float64 with scipy's erfi, its argument capped at 20 (erfi(20) ~ 5e172, far past any useful S);
theta_ref is taken once when the optimizer is built and kept across task boundaries, as the paper's
lifelong setting keeps it; the learning rate schedule acts on Adam, inside TRAC.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from scipy.special import erfi
from torch import Tensor

#: The paper's discounts beta_1..beta_n.
TRAC_BETAS: tuple[float, ...] = (0.9, 0.99, 0.999, 0.9999, 0.99999, 0.999999)
_ERFI_CAP = 20.0
#: How Adam's displacement theta_base - theta_ref is carried between steps (:class:`TRAC`).
DISPLACEMENTS: tuple[str, ...] = ("kept", "recovered")
#: erfi(1/sqrt(2)): a tuner s_j is s_prior erfi(.) / erfi(1/sqrt(2)) (Muppidi et al. 2024; their trac_optimizer package).
_ERFI_UNIT = float(erfi(2.0**-0.5))


@runtime_checkable
class ReportingOptimizer(Protocol):
    """An optimizer with scalars of its own to log (under ``train/``)."""

    def logs(self) -> dict[str, float]: ...


class TRAC(torch.optim.Optimizer):
    """TRAC around Adam (Muppidi et al., 2024): Adam's step scaled by a parameter-free S about the initial parameters.

    :param params: parameters (or groups) to optimize
    :param lr: Adam's learning rate
    :param betas_trac: the tuners' discounts beta_j
    :param s_prior: s_prior, the scale of S's growth
    :param trac_eps: eps in the tuners' denominator
    :param displacement: ``kept`` (ours): Adam's iterate theta_base is kept from step to step;
        ``recovered`` (the authors' ``trac_optimizer``): each step recovers it from the played
        point as theta_ref + (theta - theta_ref) / (S_prev + eps), which bends it while S is near
        eps and loses it for good once S <= 0 (theta = theta_ref, so the displacement and every
        later h are 0: the played point sticks at theta_ref). docs/regularizers.md, "TRAC"
    :param sigma_init: the tuners' sigma_j at the start (ours 0; the authors' code 1e-8, which keeps
        their first S above 0, where the recovered displacement would otherwise stick at once)
    :param adam_kwargs: Adam's other settings (``eps``, ``betas``, ``weight_decay``, ...)
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas_trac: Sequence[float] = TRAC_BETAS,
        s_prior: float = 1e-8,
        trac_eps: float = 1e-8,
        displacement: str = "kept",
        sigma_init: float = 0.0,
        **adam_kwargs: Any,
    ) -> None:
        if displacement not in DISPLACEMENTS:
            raise ValueError(f"unknown TRAC displacement {displacement!r}; valid choices: {', '.join(DISPLACEMENTS)}")
        self.displacement = displacement
        self._settings = {
            "betas_trac": tuple(betas_trac), "s_prior": float(s_prior), "trac_eps": float(trac_eps), "displacement": displacement,
            "sigma_init": float(sigma_init),
        }  # fmt: skip
        params = list(params)
        self.base = torch.optim.Adam(params, lr=lr, **adam_kwargs)
        super().__init__(params, dict(self.base.defaults))
        # One set of groups: a learning rate written to this optimizer's groups reaches Adam.
        self.param_groups = self.base.param_groups
        self.trac = {
            "betas": torch.tensor(list(betas_trac), dtype=torch.float64),
            "v": torch.zeros(len(betas_trac), dtype=torch.float64),
            "sigma": torch.full((len(betas_trac),), float(sigma_init), dtype=torch.float64),
            "scale": torch.zeros((), dtype=torch.float64),
            "s_prior": float(s_prior),
            "eps": float(trac_eps),
        }
        for p in self._params():
            self.state[p]["ref"] = p.detach().clone()
            self.state[p]["base"] = p.detach().clone()

    def _params(self) -> list[Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = [p for p in self._params() if p.grad is not None]
        if not params:
            return loss
        if self.displacement == "recovered":  # the authors' code: theta_base from the point played
            divisor = float(self.trac["scale"]) + self.trac["eps"]
            for p in params:
                ref = self.state[p]["ref"]
                self.state[p]["base"].copy_(ref + (p - ref) / divisor)
        h = float(torch.stack([torch.sum(p.grad * (self.state[p]["base"] - self.state[p]["ref"])) for p in params]).double().sum())
        for p in params:  # Adam steps its own iterate with the gradient taken at the played point
            p.copy_(self.state[p]["base"])
        self.base.step()
        t = self.trac
        t["v"] = t["betas"] ** 2 * t["v"] + h * h
        t["sigma"] = t["betas"] * t["sigma"] - h
        arg = (t["sigma"] / (torch.sqrt(2.0 * t["v"]) + t["eps"])).clamp(-_ERFI_CAP, _ERFI_CAP)
        t["scale"] = (t["s_prior"] / _ERFI_UNIT) * torch.from_numpy(erfi(arg.numpy())).sum()
        scale = max(float(t["scale"]), 0.0)  # the point played: the authors' code clips S at 0
        for p in params:
            state = self.state[p]
            state["base"].copy_(p)
            p.copy_(state["ref"] + scale * (state["base"] - state["ref"]))
        return loss

    def logs(self) -> dict[str, float]:
        """``trac_scale``: S, the sum of the tuners (the factor on Adam's displacement from theta_ref is max(S, 0))."""
        return {"trac_scale": float(self.trac["scale"])}

    def rebuilt(self, params: list[Tensor]) -> TRAC:
        """A TRAC of these settings over ``params`` (a network that grew), carrying what this one
        holds: the tuners, theta_ref and theta_base, and the inner Adam's state of every parameter
        it held. A new parameter starts with theta_ref = theta_base = its value, so the point
        played for it is its value until Adam moves it."""
        group = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        new = TRAC(params, **{k: v for k, v in group.items() if k in self.base.defaults}, **self._settings)
        new.param_groups[0].update(group)
        new.trac = {k: v.clone() if isinstance(v, Tensor) else v for k, v in self.trac.items()}
        for p in params:
            if p in self.state:
                new.state[p] = self.state[p]
            if p in self.base.state:
                new.base.state[p] = self.base.state[p]
        return new

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        trac = {k: v.clone() if isinstance(v, Tensor) else v for k, v in self.trac.items()}
        return {"trac": super().state_dict(), "tuners": trac, "base": self.base.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        self.base.load_state_dict(state_dict["base"])
        self.param_groups = self.base.param_groups
        super().load_state_dict(state_dict["trac"])
        self.param_groups = self.base.param_groups
        self.trac = {k: v.clone() if isinstance(v, Tensor) else v for k, v in state_dict["tuners"].items()}


class AuthorsTRAC(TRAC):
    """TRAC as the authors' ``trac_optimizer`` steps it: the displacement recovered from the point
    played (``displacement="recovered"``) and the tuners' sigma starting at 1e-8."""

    def __init__(self, params: Iterable[Any], **kwargs: Any) -> None:
        super().__init__(params, **{"displacement": "recovered", "sigma_init": 1e-8, **kwargs})


#: ``Method.optimizer`` name -> the optimizer class the policies take as SB3's ``optimizer_class``.
OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {"trac": TRAC, "trac_authors": AuthorsTRAC}
