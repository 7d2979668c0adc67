"""Optional HumanoidBench (H1) integration with the compatibility fixes listed in docs/continual.md.

HumanoidBench is not on PyPI; install it with (checked with the real package)::

    pip install mujoco==3.3.0 dm_control==1.0.28 imageio
    git clone https://github.com/carlosferrazza/humanoid-bench
    pip install --no-deps -e humanoid-bench

``dm_control==1.0.28`` is the last release that accepts mujoco 3.3.0; an unpinned dm_control pulls
mujoco 4, which breaks MuJoCo's bindings and MetaWorld itself. The install of the upstream clone
must be editable: a regular one, the ``git+`` form included, leaves out the package's ``envs/``
and ``dmc_deps/`` folders (an archive that packages them installs with ``--no-deps`` as it is).

Fixes applied on import: a stub ``jax`` when jax is absent (the H1 tasks never call it), the
dm_control index tables of ``humanoid_bench.dmc_deps`` pointed at the installed dm_control
(mujoco >= 3.3), ``render_mode=None`` (the default opens an OpenGL viewer), and a Python-bool
``terminated`` (see :class:`rl_moe.envs.wrappers.ReturnSuccess`).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

import gymnasium as gym

from rl_moe.cli import reraise_interrupt
from rl_moe.errors import MissingDependencyError

INSTALL_COMMAND = (
    "pip install mujoco==3.3.0 dm_control==1.0.28 imageio && git clone https://github.com/carlosferrazza/humanoid-bench "
    "&& pip install --no-deps -e humanoid-bench"
)
INSTALL_HINT = f"HumanoidBench is not installed; install it with: {INSTALL_COMMAND}"
#: Folders of the ``humanoid_bench`` package that a non-editable install leaves out.
REQUIRED_FOLDERS: tuple[str, ...] = ("envs", "dmc_deps")


class _JaxStub(types.ModuleType):
    """Stands in for jax: attribute access works, any call fails loudly."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        child = _JaxStub(f"{self.__name__}.{name}")
        setattr(self, name, child)  # the stub stands in for any jax attribute HumanoidBench imports
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
        module = getattr(root, sub)  # the stub's attribute access creates the submodule
        sys.modules[f"jax.{sub}"] = module


def _broken_install_reason() -> str | None:
    """Why an importable ``humanoid_bench`` cannot work (None when it looks complete)."""
    spec = importlib.util.find_spec("humanoid_bench")
    if spec is None or not spec.submodule_search_locations:
        return None
    roots = [Path(p) for p in spec.submodule_search_locations]
    missing = [name for name in REQUIRED_FOLDERS if not any((root / name).is_dir() for root in roots)]
    if missing:
        return f"its {', '.join(f'{m}/' for m in missing)} folder{'s are' if len(missing) > 1 else ' is'} missing (a non-editable install)"
    return None


def check_available() -> None:
    """Raise :class:`MissingDependencyError` when HumanoidBench is absent or its install is broken
    (no import side effects)."""
    if importlib.util.find_spec("humanoid_bench") is None or importlib.util.find_spec("dm_control") is None:
        raise MissingDependencyError(INSTALL_HINT)
    reason = _broken_install_reason()
    if reason is not None:
        raise MissingDependencyError(f"HumanoidBench is installed but broken: {reason}; reinstall it editable: {INSTALL_COMMAND}")


def import_humanoid_bench() -> types.ModuleType:
    """Import ``humanoid_bench`` with the fixes applied; raises :class:`MissingDependencyError`."""
    check_available()
    _install_jax_stub()
    try:
        module = importlib.import_module("humanoid_bench")
    except ImportError as exc:  # e.g. dm_control built against another mujoco
        reraise_interrupt(exc)
        raise MissingDependencyError(f"HumanoidBench fails to import ({exc}); reinstall with: {INSTALL_COMMAND}") from None
    try:
        dmc_index = importlib.import_module("humanoid_bench.dmc_deps.dmc_index")
        mjbindings = importlib.import_module("dm_control.mujoco.wrapper.mjbindings")
        dmc_index.sizes = mjbindings.sizes  # type: ignore[attr-defined]
    except ImportError as exc:  # layouts without the bundled index tables need no fix
        reraise_interrupt(exc)
    return module


def make_h1(task_id: str, **kwargs: Any) -> gym.Env:
    """A HumanoidBench env by gym id (e.g. ``h1-walk-v0``), headless."""
    import_humanoid_bench()
    return gym.make(task_id, render_mode=None, disable_env_checker=True, **kwargs)
