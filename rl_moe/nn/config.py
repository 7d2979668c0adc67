"""Network configuration for MoE and dense actors/critics."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from rl_moe.nn.activations import ACTIVATION_SPECS
from rl_moe.nn.init import INITS
from rl_moe.nn.routing import ROUTERS

#: Kinds that route through no :data:`~rl_moe.nn.routing.ROUTERS` entry: SoftMoE mixes slots, DSC
#: routes per layer over its atom bank, and ``mlp`` is the dense baseline.
UNROUTED_KINDS: tuple[str, ...] = ("soft", "dsc", "mlp")
#: Network kinds understood by :func:`rl_moe.nn.build_network`: every router is a kind, so a new
#: router is one entry in ``ROUTERS``.
NETWORK_KINDS: tuple[str, ...] = (*ROUTERS, *UNROUTED_KINDS)
ACTIVATIONS: tuple[str, ...] = tuple(ACTIVATION_SPECS)
#: Kinds whose layers assume features as wide as the linear layers (DSC's atom branches, SSMoE's
#: eigenvector router on the gate embedding): no widening activation.
_NARROW_KINDS: tuple[str, ...] = ("dsc", "ssmoe")


@dataclass(frozen=True)
class NetConfig:
    """Architecture of one network (actor or critic).

    :param kind: one of :data:`NETWORK_KINDS`; ``mlp`` is the dense baseline.
    :param n_experts: number of experts E (routed experts for ``ds``; ignored for ``mlp``).
    :param top_k: experts per state K (Top-K, DS routed top-k base, expert-choice capacity).
    :param hidden: widths of each expert's hidden layers (the paper uses 3 x 256).
    :param activation: ``relu`` (paper default), ``tanh``, ``crelu`` (Abbas et al. 2023) or
        ``fourier`` (Lewandowski et al. 2024); the last two emit 2H features per layer of width H
        (:mod:`rl_moe.nn.activations`), in the experts and the gate alike.
    :param layer_norm: LayerNorm after every hidden linear layer (the LN baseline).
    :param temperature: gate softmax temperature tau.
    :param gate_hidden: hidden widths of the gate MLP; its last hidden layer is the gate embedding.
    :param n_shared: DS-MoE shared (always active) experts, each of full width.
    :param ds_granularity: DS-MoE fine-grained factor m: routed experts have width hidden/m and
        m*K of them are active; their count is chosen to match the Top-K parameter count.
    :param width_multiplier: scales the hidden widths of ``mlp`` (``dense10x`` uses ~sqrt(10)).
    :param sd_rank_fraction: ``sdmoe`` shared rank k as a fraction of min(in, out) of each expert
        layer, at least 1 (SD-MoE: the top 1% of singular directions).
    :param dsc_atoms: ``dsc`` basis-bank size M per branch; 0 = solved to match the Top-K MoE's
        active parameter count (:func:`rl_moe.nn.dsc.dsc_layout`).
    :param dsc_top_k: ``dsc`` atoms composed per state K (DSC §3.2 uses 4).
    :param dsc_clamp: ``dsc`` router logit bound tau (Algorithm 2; the paper gives no value).
    :param dsc_scale: ``dsc`` initial channel scale gamma (Algorithm 2, Case 2).
    :param ssmoe_alpha: ``ssmoe`` weight of the eigenvector router in P = alpha P_EV + (1 - alpha)
        P_R (SSMoE Eq. 5; 0 = the learned Top-K gate, 1 = eigenvectors only).
    :param ssmoe_top_c: ``ssmoe`` eigenvectors averaged into each expert's embedding (top-c).
    :param spectral_norm: every hidden layer is W / sigma_max(W) (Miyato et al. 2018): expert layers
        but the heads, and the gate body (:mod:`rl_moe.nn.specnorm`).
    :param init: weight initialisation, a key of :data:`rl_moe.nn.init.INITS`: ``orthogonal`` (the
        SB3 convention, each network's own) or ``lecun`` (Flax's default, as the SPHERE authors' code)
    """

    kind: str = "topk"
    n_experts: int = 10
    top_k: int = 2
    hidden: tuple[int, ...] = (256, 256, 256)
    activation: str = "relu"
    layer_norm: bool = False
    temperature: float = 1.0
    gate_hidden: tuple[int, ...] = (256,)
    n_shared: int = 1
    ds_granularity: int = 2
    width_multiplier: float = 1.0
    sd_rank_fraction: float = 0.01
    dsc_atoms: int = 0
    dsc_top_k: int = 4
    dsc_clamp: float = 5.0
    dsc_scale: float = 0.1
    ssmoe_alpha: float = 0.7
    ssmoe_top_c: int = 2
    spectral_norm: bool = False
    init: str = "orthogonal"

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))
        object.__setattr__(self, "gate_hidden", tuple(int(h) for h in self.gate_hidden))
        if self.kind not in NETWORK_KINDS:
            raise ValueError(f"unknown network kind {self.kind!r}; valid choices: {', '.join(NETWORK_KINDS)}")
        if self.init not in INITS:
            raise ValueError(f"unknown init {self.init!r}; valid choices: {', '.join(INITS)}")
        kinds = INITS[self.init].kinds
        if kinds is not None and self.kind not in kinds:
            raise ValueError(f"init {self.init!r} does not cover network kind {self.kind!r}; valid kinds for it: {', '.join(kinds)}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {self.activation!r}; valid choices: {', '.join(ACTIVATIONS)}")
        if ACTIVATION_SPECS[self.activation].width > 1 and self.kind in _NARROW_KINDS:
            valid = ", ".join(a for a, spec in ACTIVATION_SPECS.items() if spec.width == 1)
            raise ValueError(f"activation {self.activation!r} widens each layer, which network kind {self.kind!r} does not support; valid choices for it: {valid}")
        if self.n_experts < 1:
            raise ValueError(f"n_experts must be >= 1, got {self.n_experts}")
        if self.top_k < 1 or self.top_k > self.n_experts:
            raise ValueError(f"top_k must be in [1, n_experts={self.n_experts}], got {self.top_k}")
        if not self.hidden or min(self.hidden) < 1:
            raise ValueError(f"hidden must be a non-empty tuple of positive widths, got {self.hidden}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.kind == "ds":
            if self.n_shared < 0:
                raise ValueError(f"n_shared must be >= 0, got {self.n_shared}")
            if self.ds_granularity < 1 or any(h % self.ds_granularity for h in self.hidden):
                raise ValueError(
                    f"ds_granularity must be >= 1 and divide every hidden width {self.hidden}, got {self.ds_granularity}"
                )
        if not 0.0 < self.sd_rank_fraction <= 1.0:
            raise ValueError(f"sd_rank_fraction must be in (0, 1], got {self.sd_rank_fraction}")
        if self.dsc_atoms < 0:
            raise ValueError(f"dsc_atoms must be >= 0 (0 = matched to Top-K), got {self.dsc_atoms}")
        if self.dsc_top_k < 1:
            raise ValueError(f"dsc_top_k must be >= 1, got {self.dsc_top_k}")
        if self.dsc_clamp <= 0:
            raise ValueError(f"dsc_clamp must be > 0, got {self.dsc_clamp}")
        if not 0.0 <= self.ssmoe_alpha <= 1.0:
            raise ValueError(f"ssmoe_alpha must be in [0, 1], got {self.ssmoe_alpha}")
        if self.ssmoe_top_c < 1:
            raise ValueError(f"ssmoe_top_c must be >= 1, got {self.ssmoe_top_c}")
        if self.width_multiplier <= 0:
            raise ValueError(f"width_multiplier must be > 0, got {self.width_multiplier}")

    @property
    def is_moe(self) -> bool:
        return self.kind != "mlp"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "NetConfig":
        return cls(**data)
