"""Methods compared in the SPHERE paper (§5.1): a network variant plus a list of regularizers.

``--method`` picks one entry of :data:`METHODS`. MoE kinds are the bare networks; the plasticity
baselines and SPHERE sit on the Top-K MoE actor, as in the paper. Architecture baselines (LayerNorm,
spectral normalization, a wider dense net) are network options, not regularizers. A router or
regularizer that the table leaves out gets such a method by default, named after it (:func:`_defaults`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rl_moe.errors import UsageError
from rl_moe.nn.routing import ROUTERS
from rl_moe.regularizers import REGISTRY


@dataclass(frozen=True)
class Method:
    """A network variant and the regularizers trained with it.

    :param name: CLI name
    :param kind: :class:`rl_moe.nn.NetConfig` kind of the MoE side(s) (``mlp`` = dense)
    :param layer_norm: LayerNorm after every hidden layer (the LN baseline)
    :param activation: the activation of the method's network (None: ``net.activation``); a key
        of :data:`rl_moe.nn.activations.ACTIVATION_SPECS`
    :param param_ratio: dense width chosen for ``param_ratio`` x the dense actor's parameters
        (``dense10x`` = PPO(10x)); None keeps the width
    :param spectral_norm: roles (``actor``, ``critic``) whose networks get spectral normalization
        (:attr:`rl_moe.nn.NetConfig.spectral_norm`)
    :param bounded_mean: PPO's Gaussian mean is tanh-bounded to the action box
        (:class:`rl_moe.policies.ppo.BoundedMean`; TD3's actor is bounded already)
    :param regularizers: names in :data:`rl_moe.regularizers.REGISTRY`
    :param optimizer: a key of :data:`rl_moe.algos.trac.OPTIMIZERS` that replaces the learner's
        Adam (None: Adam, as SB3 builds it)
    :param settings: regularizer name -> settings that make the method what it is, above the
        suite's (``--set`` still changes them)
    :param description: one line for ``--help`` and the docs
    """

    name: str
    kind: str = "topk"
    layer_norm: bool = False
    activation: str | None = None
    param_ratio: float | None = None
    spectral_norm: tuple[str, ...] = ()
    bounded_mean: bool = False
    regularizers: tuple[str, ...] = ()
    optimizer: str | None = None
    settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    description: str = ""


def _reg(name: str, description: str) -> Method:
    return Method(name=name, regularizers=(name,), description=f"Top-K MoE + {description}")


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("topk", "topk", description="Top-K MoE actor (E=10, K=2), no regularizer"),
        Method("dense_moe", "dense_moe", description="Dense-MoE actor: every expert weighted by the softmax gate"),
        Method("ds", "ds", description="DeepSeek-MoE actor: shared + fine-grained routed experts"),
        Method("expert_choice", "expert_choice", description="Expert-choice routing actor"),
        Method("soft", "soft", description="Soft-MoE actor (slot mixing)"),
        Method("sdmoe", "sdmoe", regularizers=("sdmoe",), description="SD-MoE (spectral decomposition): expert layers W_c + W_u, rank 1%, Eq. 9-10 split, SVD every 16"),
        Method("sdmoe_sphere", "sdmoe", regularizers=("sdmoe", "sphere"), description="SD-MoE actor + SPHERE penalty"),
        Method("dsc", "dsc", regularizers=("dsc",), description="DSC (dynamic subspace composition): 3x256 trunk + K=4 rank-1 atom residuals, Eq. 9-12 losses"),
        Method("ssmoe", "ssmoe", description="SSMoE (eigenvector routers): Top-K of 0.7 P_EV + 0.3 P_gate (c=2 eigenvectors)"),
        Method("dense", "mlp", description="dense MLP actor (PPO baseline)"),
        Method("dense10x", "mlp", param_ratio=10.0, description="dense MLP actor with ~10x the parameters (PPO(10x))"),
        _reg("sphere", "SPHERE spectral-isotropy penalty (the paper's method)"),
        Method(
            "sphere_guard", regularizers=("sphere",), settings={"sphere": {"scale_invariant": True}},
            description="Top-K MoE + SPHERE penalizing the spectrum's shape, not its scale (scale_invariant): no feature collapse on an unsolved task",
        ),
        Method("ln", "topk", layer_norm=True, description="Top-K MoE with LayerNorm (LN baseline)"),
        Method(
            "topk_bounded", "topk", bounded_mean=True,
            description="Top-K MoE actor whose Gaussian mean is tanh-bounded to the action box (PPO; the log-probability stays Gaussian)",
        ),
        _reg("cbp", "continual backprop (Dohare et al., 2024)"),
        _reg("redo", "ReDo dormant-neuron resets (Sokar et al., 2023)"),
        _reg("parseval", "parseval weight regularization (Chung et al., 2024)"),
        _reg("cchain", "C-CHAIN churn reduction (Tang et al., 2025)"),
        Method("specnorm", "topk", spectral_norm=("actor",), description="Top-K MoE actor with spectrally normalised hidden layers (Miyato et al., 2018)"),
        _reg("specreg", "spectral regularization (Lewandowski et al., 2025)"),
        _reg("load_balance", "load-balancing auxiliary loss"),
        Method("trac", "topk", optimizer="trac", description="Top-K MoE trained by TRAC: Adam's displacement from the initial weights scaled by a parameter-free S (Muppidi et al., 2024)"),
        Method(
            "trac_authors", "topk", optimizer="trac_authors",
            description="TRAC as the authors' trac_optimizer steps it: Adam's displacement recovered from the played point each step (sticks at the initial weights once S <= 0)",
        ),
        Method(
            "nap", "topk", layer_norm=True, regularizers=("nap",),
            description="Top-K MoE, Normalize-and-Project: LayerNorm before each nonlinearity, each expert's and the gate's hidden weights projected back to their initial norms after every step (Lyle et al., 2024)",
        ),
        Method("crelu", "topk", activation="crelu", description="Top-K MoE with concatenated ReLUs [relu(z), relu(-z)] in experts and gate (Abbas et al., 2023)"),
        Method("fourier", "topk", activation="fourier", description="Top-K MoE with deep Fourier features [sin(z), cos(z)] in experts and gate (Lewandowski et al., 2024)"),
        _reg("ortho", "expert orthogonality penalty"),
    )
}


def _summary(obj: object) -> str:
    """First line of ``obj``'s docstring, lower-cased start, no full stop: a ``--list`` description."""
    line = (obj.__doc__ or "").strip().split("\n")[0].rstrip(".")
    return line[:1].lower() + line[1:]


def _defaults(named: Mapping[str, Method]) -> dict[str, Method]:
    """The bare network of every router kind no method in ``named`` uses, and the Top-K MoE + each
    regularizer with no method of its name."""
    kinds = {m.kind for m in named.values()}
    out = {k: Method(k, k, description=f"{k} MoE actor, router: {_summary(fn)}") for k, fn in ROUTERS.items() if k not in kinds}
    for name, cls in REGISTRY.items():
        out.setdefault(name, _reg(name, _summary(cls)))
    return {name: m for name, m in out.items() if name not in named}


METHODS.update(_defaults(METHODS))


def get_method(name: str) -> Method:
    """The method called ``name``; :class:`UsageError` naming the valid choices otherwise."""
    if name not in METHODS:
        raise UsageError(f"unknown method {name!r}; valid choices: {', '.join(METHODS)}")
    return METHODS[name]


def build_regularizers(names: tuple[str, ...], configs: Mapping[str, Any]) -> list[Any]:
    """The regularizers of a method, each from its typed config (``RunConfig.regularizers``)."""
    return [REGISTRY[name](configs[name]) for name in names]
