"""Optional HumanoidBench (H1) integration with the compatibility fixes listed in docs/continual.md.

HumanoidBench is not on PyPI; install it with::

    pip install dm_control imageio
    pip install --no-deps git+https://github.com/carlosferrazza/humanoid-bench

Fixes applied on import: a stub ``jax`` when jax is absent (the H1 tasks never call it), the
dm_control index tables of ``humanoid_bench.dmc_deps`` pointed at the installed dm_control
(mujoco >= 3.3), ``render_mode=None`` (the default opens an OpenGL viewer), and a Python-bool
``terminated`` (see :class:`rl_moe.continual.wrappers.ReturnSuccess`).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any

import gymnasium as gym

from rl_moe.continual.errors import MissingDependencyError

INSTALL_HINT = (
    "HumanoidBench is not installed; install it with: pip install dm_control imageio && "
    "pip install --no-deps git+https://github.com/carlosferrazza/humanoid-bench"
)


class _JaxStub(types.ModuleType):
    """Stands in for jax: attribute access works, any call fails loudly."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        child = _JaxStub(f"{self.__name__}.{name}")
        setattr(self, name, child)
        return child

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self.__name__} is a stub: install jax to use HumanoidBench tasks that need it")


def _install_jax_stub() -> None:
    if "jax" in sys.modules or importlib.util.find_spec("jax") is not None:
        return
    root = _JaxStub("jax")
    root.__path__ = []  # type: ignore[attr-defined]  # a package, so "import jax.numpy" resolves
    sys.modules["jax"] = root
    for sub in ("numpy", "random", "nn", "lax", "tree_util"):
        module = getattr(root, sub)
        sys.modules[f"jax.{sub}"] = module


def import_humanoid_bench() -> types.ModuleType:
    """Import ``humanoid_bench`` with the fixes applied; raises :class:`MissingDependencyError`."""
    if importlib.util.find_spec("humanoid_bench") is None or importlib.util.find_spec("dm_control") is None:
        raise MissingDependencyError(INSTALL_HINT)
    _install_jax_stub()
    module = importlib.import_module("humanoid_bench")
    try:
        dmc_index = importlib.import_module("humanoid_bench.dmc_deps.dmc_index")
        mjbindings = importlib.import_module("dm_control.mujoco.wrapper.mjbindings")
        dmc_index.sizes = mjbindings.sizes  # type: ignore[attr-defined]
    except ImportError:
        pass  # layouts without the bundled index tables need no fix
    return module


def check_available() -> None:
    """Raise :class:`MissingDependencyError` when HumanoidBench cannot be imported (no import side effects)."""
    if importlib.util.find_spec("humanoid_bench") is None or importlib.util.find_spec("dm_control") is None:
        raise MissingDependencyError(INSTALL_HINT)


def make_h1(task_id: str, **kwargs: Any) -> gym.Env:
    """A HumanoidBench env by gym id (e.g. ``h1-walk-v0``), headless."""
    import_humanoid_bench()
    return gym.make(task_id, render_mode=None, disable_env_checker=True, **kwargs)
