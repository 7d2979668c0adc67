"""Where a run's numbers came from: the code's git commit (with a dirty flag), the env backend
each task actually stepped on and the CPU model it ran on. Written into ``config.json`` and
``results.json`` so that no table mixes commits, backends or machines without saying so
(docs/continual.md, "Run folder")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

#: The repository root of an editable install (the package's parent folder).
_ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(_ROOT), *args], capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def code_version() -> dict[str, Any]:
    """``{"commit": sha, "dirty": bool}`` of the checkout the package runs from; both None where
    it is not a git checkout (an installed wheel). Dirty means a tracked file differs from the
    commit (untracked files such as run folders do not count)."""
    commit = _git("rev-parse", "HEAD")
    if not commit:
        return {"commit": None, "dirty": None}
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def cpu_model() -> str:
    """The CPU model this process runs on, as the training fingerprints name it
    (:func:`rl_moe.fingerprint.kernel_machine`): training is bit-identical on one model, not across
    models, so each stretch of a run records the one it trained on."""
    from rl_moe.fingerprint import kernel_machine  # lazy: config resolution imports this module

    return kernel_machine()["cpu"]


def vec_env_backend(env: Any, family: str) -> str:
    """What steps a task's vectorized env: ``envpool``, or ``dummy``/``subproc`` followed by
    ``+fast`` where its MetaWorld envs run on the fast path (rl_moe.envs.metaworld_fast). In-process
    envs are asked directly; for worker processes, ``family``'s ``fast_path`` decides."""
    # lazy: config resolution imports this module, and must not load SB3's vec envs or MuJoCo
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnvWrapper

    while isinstance(env, VecEnvWrapper):  # VecNormalize
        env = env.venv
    if not isinstance(env, (DummyVecEnv, SubprocVecEnv)):
        return "envpool" if type(env).__name__ == "EnvPoolMetaWorld" else type(env).__name__
    if isinstance(env, DummyVecEnv):
        # The envs themselves say, whatever the family is called. Whatever put a fast env in this
        # process loaded the module; without it nothing is fast, and MuJoCo is not loaded here.
        module = sys.modules.get("rl_moe.envs.metaworld_fast")
        return "dummy+fast" if module is not None and module.is_fast(env.envs[0]) else "dummy"
    from rl_moe.envs.families import FAMILIES, metaworld_fast_enabled  # lazy: as above

    if family not in FAMILIES or not FAMILIES[family].fast_path:  # the envs live in worker processes, out of this process's reach
        return "subproc"
    from rl_moe.envs import metaworld_fast  # lazy: as above

    # the workers build their envs under the same environment variable and metaworld release
    fast = metaworld_fast_enabled() and metaworld_fast.unsupported_reason() is None
    return "subproc+fast" if fast else "subproc"
