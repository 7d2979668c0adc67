"""Plasticity, routing and spectral diagnostics (docs/metrics.md) and the ``PlasticityProbe`` callback.

Every metric is a pure function returning ``dict[str, float]`` (or a float); the probe logs them
under ``plasticity/``, ``routing/`` and ``spectral/``. docs/metrics.md defines every tag.
"""

from rl_moe.diagnostics.coupling import block_cosine, gate_expert_coupling
from rl_moe.diagnostics.entk import EntkGram, entk_gram
from rl_moe.diagnostics.features import dormant_metrics, feature_metrics, unit_scores
from rl_moe.diagnostics.geometry import FrameStats, frame_stats, geometry_metrics, mso
from rl_moe.diagnostics.linalg import (
    condition_number,
    effective_rank,
    effective_rank_from_eigvals,
    small_gram,
)
from rl_moe.diagnostics.probe import (
    PROBE_FILE,
    PlasticityProbe,
    ProbeConfig,
    collect_states,
    load_or_create_states,
)
from rl_moe.diagnostics.routing import (
    knn_jaccard,
    load_metrics,
    routing_metrics,
    silhouette,
    specialization_metrics,
)
from rl_moe.diagnostics.slq import (
    SlqConfig,
    SlqEstimate,
    ntk_matvec,
    slq_entk_rank,
    slq_estimate,
)
from rl_moe.diagnostics.spectral import (
    gate_input_directions,
    principal_similarity,
    sdmoe_metrics,
    top_basis,
)
from rl_moe.diagnostics.groups import ENTK_METHODS, entk_rank, ntk_effective_rank
from rl_moe.diagnostics.ssmoe import ev_embeddings, ssmoe_metrics, topk_overlap
from rl_moe.diagnostics.views import NetView, SequentialAsMoE, actor_view, critic_view

__all__ = [
    "ENTK_METHODS",
    "PROBE_FILE",
    "EntkGram",
    "FrameStats",
    "NetView",
    "PlasticityProbe",
    "ProbeConfig",
    "SequentialAsMoE",
    "SlqConfig",
    "SlqEstimate",
    "actor_view",
    "block_cosine",
    "collect_states",
    "condition_number",
    "critic_view",
    "dormant_metrics",
    "effective_rank",
    "effective_rank_from_eigvals",
    "entk_gram",
    "entk_rank",
    "ev_embeddings",
    "feature_metrics",
    "frame_stats",
    "gate_expert_coupling",
    "gate_input_directions",
    "geometry_metrics",
    "knn_jaccard",
    "load_metrics",
    "load_or_create_states",
    "mso",
    "ntk_effective_rank",
    "ntk_matvec",
    "principal_similarity",
    "routing_metrics",
    "sdmoe_metrics",
    "silhouette",
    "slq_entk_rank",
    "slq_estimate",
    "small_gram",
    "specialization_metrics",
    "ssmoe_metrics",
    "top_basis",
    "topk_overlap",
    "unit_scores",
]
