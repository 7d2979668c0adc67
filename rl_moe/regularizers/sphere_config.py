"""SPHERE's settings (:class:`SphereConfig`, the paper's MetaWorld setup by default, Table 2) and
their valid choices; :mod:`rl_moe.regularizers.sphere` is the regularizer that reads them."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from rl_moe.errors import check_choice
from rl_moe.regularizers.options import build_config
from rl_moe.regularizers.targets import check_target

COEF_MODES: tuple[str, ...] = ("adaptive", "fixed", "loss_ratio")
LAYERS: tuple[str, ...] = ("last", "all", "joint")
FEATURES: tuple[str, ...] = ("weighted", "unweighted")
GRAMS: tuple[str, ...] = ("features", "gradients", "both")
GRAD_SITES: tuple[str, ...] = ("hidden", "head")
SPACES: tuple[str, ...] = ("auto", "sample", "feature")


@dataclass(frozen=True)
class SphereConfig:
    """SPHERE settings (defaults: the paper's MetaWorld setup, Table 2).

    :param rho: ratio rho of the coefficient (the coefficient itself in ``fixed`` mode); < 0 flips the sign
    :param coef_mode: ``adaptive`` (gradient-norm ratio), ``fixed`` or ``loss_ratio``
    :param placement: regularized network: ``actor`` (paper), ``critic`` (TD3 Table 22) or ``both``
    :param layer: ``last`` hidden expert layer (paper), ``all`` (sum of per-layer penalties) or
        ``joint`` (one Gram of the features of all hidden layers concatenated, Table 18)
    :param features: ``weighted`` by the routing weights h_ie (paper) or ``unweighted``
    :param per_expert: sum of per-expert penalties, dropping the cross-expert blocks of A
    :param gram: penalise the feature Gram A (``features``), the backprop-gradient Gram G_last
        (``gradients``) or both (Table 18)
    :param grad_site: where G_last's per-sample gradients are taken: ``hidden`` = the last hidden
        layer's activation inputs (``ExpertPass.pre[-1]``, width H), ``head`` = the expert head
        outputs (``ExpertPass.linear[-1]``, the Kronecker partner of A_last)
    :param alpha: fixed target scale: penalise ||A - alpha I||_F^2 instead (None = adaptive tr(A)/m)
    :param scale_invariant: divide the penalty by tr(A)^2, i.e. penalise the shape of A's spectrum
        and not its scale. Off in the paper. With N < m (MetaWorld: 256 < 2560) the raw penalty's
        only minimiser is Phi = 0, since L >= tr(A)^2 (1/N - 1/m); the normalised one is minimised by
        N equal eigenvalues at any scale (docs/regularizers.md, "SPHERE's scale on MetaWorld")
    :param space: Gram space: ``auto`` (feature space iff m <= N), ``sample`` or ``feature``
    :param eps: epsilon of the adaptive ratio, added to the penalty's gradient norm
    :param norm_eps: added to each squared gradient norm under its square root in ``adaptive``
        mode (0: the plain norm). The SPHERE authors' code (sphere-rl/sphere, ``moe_ppo.py``,
        ``tree_l2_norm``) adds 1e-8 there and eps = 1e-8 again in the division, which floors the
        penalty's norm at 1e-4 and so caps lambda (:func:`~rl_moe.regularizers.hooks.adaptive_coef`);
        the default is theirs, 0 our former arithmetic (:mod:`rl_moe.continual.networks`)
    :param log_std_in_theta: in ``adaptive`` mode, take the actor's gradient norms over its
        log-std as well as its experts and gate, as the authors' code does (their theta is the
        whole actor parameter tree); on by default, off in our former arithmetic. The penalty
        does not depend on the log-std, so this raises only the reference norm, and with it lambda
    :param rank_every: log r_e(A_last) every this many calls (0 = never; an N x N eigvalsh)
    :param ratio_every: ``adaptive`` mode recomputes the gradient-norm ratio every this many
        minibatches and reuses the last one in between (1 = every minibatch, the paper's rule; a
        larger value trades exactness for the extra backward pass)
    :param gating_ratio: ratio of a second term on the routing weights (the SPHERE authors'
        ``sphere_gating_ratio``; 0 = off, as in their configs): L_gate = (||G||_F^2 - tr(G)^2/E) / E,
        G = P^T P / N for the (N, E) routing weights P, logged as ``loss_sphere_gate``; its
        coefficient follows ``coef_mode`` with ``gating_ratio`` in the place of ``rho``
    :param max_coef: ceiling on |lambda| (None: none), a guard against the collapse on a task the
        agent does not solve (docs/regularizers.md, "SPHERE's scale on MetaWorld")
    :param pcgrad: where the penalty's gradient points against the actor loss's, remove its
        component along the actor-loss gradient (the authors' ``sphere_use_pcgrad``; ``adaptive`` only)
    :param warn_coef: one line on stderr when lambda stays above this for ``warn_updates`` updates
        in a row (a collapse is seen while it happens)
    :param warn_updates: see ``warn_coef``
    """

    rho: float = 0.1
    coef_mode: str = "adaptive"
    placement: str = "actor"
    layer: str = "last"
    features: str = "weighted"
    per_expert: bool = False
    gram: str = "features"
    grad_site: str = "hidden"
    alpha: float | None = None
    scale_invariant: bool = False
    space: str = "auto"
    eps: float = 1e-8
    norm_eps: float = 1e-8
    log_std_in_theta: bool = True
    rank_every: int = 50
    ratio_every: int = 1
    gating_ratio: float = 0.0
    max_coef: float | None = None
    pcgrad: bool = False
    warn_coef: float = 1e4
    warn_updates: int = 20

    def __post_init__(self) -> None:
        if self.max_coef is not None and self.max_coef <= 0:
            raise ValueError(f"max_coef must be > 0 or null, got {self.max_coef}")
        if self.pcgrad and self.coef_mode != "adaptive":
            raise ValueError(f"pcgrad projects gradients, which coef_mode 'adaptive' computes; got coef_mode={self.coef_mode!r}")
        if self.norm_eps < 0:
            raise ValueError(f"norm_eps must be >= 0, got {self.norm_eps}")
        if self.warn_updates < 1:
            raise ValueError(f"warn_updates must be >= 1, got {self.warn_updates}")
        check_choice(self.coef_mode, COEF_MODES, "coef_mode")
        check_target(self.placement, "placement")
        check_choice(self.layer, LAYERS, "layer")
        check_choice(self.features, FEATURES, "features")
        check_choice(self.gram, GRAMS, "gram")
        check_choice(self.grad_site, GRAD_SITES, "grad_site")
        check_choice(self.space, SPACES, "space")
        if self.rank_every < 0:
            raise ValueError(f"rank_every must be >= 0, got {self.rank_every}")
        if self.ratio_every < 1:
            raise ValueError(f"ratio_every must be >= 1, got {self.ratio_every}")
        if self.scale_invariant and self.alpha is not None:
            raise ValueError(f"scale_invariant penalises no scale, alpha={self.alpha} fixes one; set one of them")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sphere_config(**overrides: Any) -> SphereConfig:
    """The default config (the paper's MetaWorld setup) with ``overrides`` applied; an unknown
    option is a ``ValueError`` naming the valid ones. Per-suite values (HumanoidBench's rho=1e-3)
    live in the suite files (``envs/suites/*.json``, ``regularizers.sphere``)."""
    return build_config(SphereConfig, None, overrides, "SPHERE")
