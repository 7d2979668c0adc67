"""The gate MLP of the routed networks: observation -> gate embedding -> E logits."""

from __future__ import annotations

from torch import Tensor, nn

from rl_moe.nn.activations import ACTIVATION_SPECS
from rl_moe.nn.config import NetConfig
from rl_moe.nn.experts import ACTIVATION_FNS, ACTIVATION_GAINS


class GateMLP(nn.Module):
    """Gate network: observation -> hidden (the gate embedding) -> E logits.

    A widening activation (``crelu``, ``fourier``) doubles each hidden layer's features, and with
    them the gate embedding's width G and the next layer's inputs.
    """

    def __init__(self, in_dim: int, n_experts: int, cfg: NetConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        last = in_dim
        for width in cfg.gate_hidden:
            layers.append(nn.Linear(last, width))
            if cfg.layer_norm:
                layers.append(nn.LayerNorm(width))
            layers.append(GateActivation(cfg.activation))
            last = width * ACTIVATION_SPECS[cfg.activation].width
        self.body = nn.Sequential(*layers)
        self.logits = nn.Linear(last, n_experts)
        for module in self.body:
            if isinstance(module, nn.Linear):
                nn.init.orthogonal_(module.weight, gain=ACTIVATION_GAINS[cfg.activation])
                nn.init.zeros_(module.bias)
        nn.init.orthogonal_(self.logits.weight, gain=1.0)
        nn.init.zeros_(self.logits.bias)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        emb = self.body(x)  # (N, G)
        return emb, self.logits(emb)  # (N, E)


class GateActivation(nn.Module):
    """The gate's activation, by name (a key of :data:`~rl_moe.nn.activations.ACTIVATION_SPECS`)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def forward(self, x: Tensor) -> Tensor:
        return ACTIVATION_FNS[self.name](x)
