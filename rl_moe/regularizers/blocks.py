"""The input of the Gram kernels: one expert stack's routed feature rows (SPHERE Eq. 26).

Its own module, below :mod:`rl_moe.regularizers.gram` and :mod:`rl_moe.regularizers.gram_kernels`,
which both use it.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from rl_moe.nn import Dispatch


class FeatureBlock(NamedTuple):
    """Rows of one expert stack, sorted by expert as in ``dispatch``.

    The row scale (the routing weight h_ie for the weighted Phi) is kept apart from the features
    because applying it to the (C, C) products is cheaper than to the (C, H) features.
    """

    dispatch: Dispatch
    feats: Tensor  # (R, H) unscaled features
    scale: Tensor | None = None  # (R,) row scale, None for 1

    def scaled(self) -> Tensor:
        return self.feats if self.scale is None else self.feats * self.scale[:, None]  # (R, H)
