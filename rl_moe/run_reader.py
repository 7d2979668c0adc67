"""A run folder read back by the tools that score or show its checkpoints (``rl_moe.evaluate``,
``rl_moe.positions``, ``rl_moe.video``, ``rl_moe.experts``): its config and results, and a
finished task's checkpoint loaded into a learner."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rl_moe.continual.agents import build_model
from rl_moe.continual.config import RunConfig
from rl_moe.continual.run_view import RunView
from rl_moe.errors import UsageError
from rl_moe.rundir import RunDir


def read_run(run_dir: Path) -> tuple[Any, dict[str, Any]]:
    """A run folder's config and results; :class:`UsageError` when it is not one."""
    files = RunDir(run_dir)
    for path in (files.config, files.results):
        if not path.is_file():
            raise UsageError(f"{str(run_dir)!r} is not a run folder (no {path.name})")
    try:
        cfg = RunConfig.from_dict(json.loads(files.config.read_text()))
        results = json.loads(files.results.read_text())
    except (json.JSONDecodeError, TypeError, ValueError) as exc:
        raise UsageError(f"cannot read run {str(run_dir)!r}: {exc}") from None
    return cfg, results


def load_task_model(view: RunView, i: int, env: Any, device: str) -> tuple[Any, Any]:
    """Finished task ``i``'s checkpoint loaded into a learner built on ``env``, and the observation
    statistics saved with it (None without ``VecNormalize``)."""
    model = build_model(view.cfg, env, device)
    model.set_parameters(str(view.checkpoint(i)), exact_match=True, device=device)
    norm = view.load_vecnormalize(i)
    return model, None if norm is None else norm.obs_rms
