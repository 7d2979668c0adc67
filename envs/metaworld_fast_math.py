"""MetaWorld's numerical helpers on the fast path's hot spots, bit for bit: scipy's
matrix-to-quaternion, ``reward_utils.tolerance`` on scalars, ``numpy.linalg.norm`` and
``numpy.clip`` without their argument handling (rl_moe.envs.metaworld_fast).

Each computes the same IEEE operations in the same order as the function it stands for, and
hands every input it was not written for to that function. Nothing here imports MetaWorld.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy._core import umath

#: scipy's tolerances for "already orthogonal" (``isclose(M M^T, I, rtol=1e-5, atol=1e-12)``),
#: each taken 10x tighter: a matrix within these is orthogonal to scipy whatever the rounding of
#: the Gram matrix, so scipy never orthogonalizes it by SVD.
_OFF_DIAGONAL_TOL = 1e-13
_DIAGONAL_TOL = 1e-6
#: The ufunc ``numpy.clip(a, lo, hi)`` ends in for float arrays and scalars (``_methods._clip``):
#: the same kernel, without the Python layers above it, which cost more than clipping one
#: observation.
clip = umath.clip


def norm(x: Any) -> Any:
    """``numpy.linalg.norm(x)`` with its default arguments: for a real floating-point array its own
    steps (``ravel(order="K")``, ``dot``, ``sqrt``), anything else to numpy itself."""
    if type(x) is not np.ndarray or x.dtype != np.float64:
        return np.linalg.norm(x)
    flat = x.ravel(order="K")
    return np.sqrt(flat.dot(flat))


# ---- the object quaternion -----------------------------------------------------------------------
def _scipy_quat(matrix: Any) -> np.ndarray:
    from scipy.spatial.transform import Rotation  # lazy: only matrices scipy must orthogonalize get here

    return Rotation.from_matrix(matrix).as_quat()


def quat_from_matrix(matrix: Any) -> np.ndarray:
    """``scipy.spatial.transform.Rotation.from_matrix(matrix).as_quat()``, bit for bit, for one
    3x3 float64 matrix (scalar-last ``x, y, z, w``); other inputs go to scipy."""
    m = np.asarray(matrix)
    if m.shape != (3, 3) or m.dtype != np.float64:
        return _scipy_quat(matrix)
    m00, m01, m02, m10, m11, m12, m20, m21, m22 = m.ravel().tolist()
    g01 = m00 * m10 + m01 * m11 + m02 * m12
    g02 = m00 * m20 + m01 * m21 + m02 * m22
    g12 = m10 * m20 + m11 * m21 + m12 * m22
    g00 = m00 * m00 + m01 * m01 + m02 * m02
    g11 = m10 * m10 + m11 * m11 + m12 * m12
    g22 = m20 * m20 + m21 * m21 + m22 * m22
    orthogonal = max(abs(g01), abs(g02), abs(g12)) <= _OFF_DIAGONAL_TOL and max(abs(g00 - 1.0), abs(g11 - 1.0), abs(g22 - 1.0)) <= _DIAGONAL_TOL
    # Orthogonal to 1e-6 means det = +-1 to ~1e-6: the sign decides whether scipy refuses it.
    det = m00 * (m11 * m22 - m12 * m21) - m01 * (m10 * m22 - m12 * m20) + m02 * (m10 * m21 - m11 * m20)
    if not (orthogonal and det > 0.5):  # also false for NaN
        return _scipy_quat(matrix)
    trace = m00 + m11 + m22
    # scipy's argmax over (m00, m11, m22, trace): the first index of the largest value.
    choice, best = 0, m00
    for i, v in ((1, m11), (2, m22), (3, trace)):
        if v > best:
            choice, best = i, v
    if choice == 0:
        q = (1 - trace + 2 * m00, m10 + m01, m20 + m02, m21 - m12)
    elif choice == 1:
        q = (m01 + m10, 1 - trace + 2 * m11, m21 + m12, m02 - m20)
    elif choice == 2:
        q = (m02 + m20, m12 + m21, 1 - trace + 2 * m22, m10 - m01)
    else:
        q = (m21 - m12, m02 - m20, m10 - m01, 1 + trace)
    magnitude = math.sqrt(q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3])
    return np.array([q[0] / magnitude, q[1] / magnitude, q[2] / magnitude, q[3] / magnitude])


class _MatrixRotation:
    """What ``Rotation.from_matrix(m)`` returns, for the one use MetaWorld's envs make of it."""

    __slots__ = ("matrix",)

    def __init__(self, matrix: Any) -> None:
        self.matrix = matrix

    def as_quat(self) -> np.ndarray:
        return quat_from_matrix(self.matrix)


class ExactRotation:
    """Stands in for scipy's ``Rotation`` inside a MetaWorld env module while a fast env reads its
    object quaternion; anything but ``from_matrix(m).as_quat()`` is scipy's own."""

    @staticmethod
    def from_matrix(matrix: Any) -> _MatrixRotation:
        return _MatrixRotation(matrix)


# ---- reward_utils.tolerance on scalars -----------------------------------------------------------
def fast_tolerance(original: Callable[..., Any], sigmoids: Callable[..., Any]) -> Callable[..., Any]:
    """``reward_utils.tolerance`` with its scalar case unwrapped (arrays and other dtypes go to the
    original, which also raises its errors)."""

    def tolerance(x: Any, bounds: tuple[float, float] = (0.0, 0.0), margin: Any = 0.0, sigmoid: str = "gaussian", value_at_margin: float = 0.1) -> Any:
        lower, upper = bounds
        # Python floats and float64 scalars only: a float32 x would make numpy compute in float32.
        if type(x) not in (float, np.float64) or type(margin) not in (float, int, np.float64) or not lower <= upper or margin < 0:
            return original(x, bounds=bounds, margin=margin, sigmoid=sigmoid, value_at_margin=value_at_margin)
        in_bounds = lower <= x <= upper
        if margin == 0:
            return 1.0 if in_bounds else 0.0
        if in_bounds:  # the original also evaluates the sigmoid here, then discards it
            return 1.0
        d = np.float64((lower - x if x < lower else x - upper) / margin)
        return float(sigmoids(d, value_at_margin, sigmoid))

    return tolerance
