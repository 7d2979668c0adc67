"""Rollout videos of a run's task checkpoints: ``python -m rl_moe.evaluate RUN_DIR --video``.

Each finished task's checkpoint plays its own task, and the last checkpoint plays every task,
on the protocol's evaluation positions and seeds (:meth:`RunView.eval_factories`: episode ``e``
on eval env ``e``), with deterministic actions as the run's evaluation takes them. Frames are
rendered headless with MuJoCo's own renderer (EGL where a GPU is, else OSMesa in software;
``MUJOCO_GL`` chooses where set) and written as MP4 under ``RUN_DIR/videos/``, one file per
episode, named by checkpoint, task, episode, success and return.

Rendering and encoding are :mod:`rl_moe.recording`'s. MetaWorld suites only: other families have
no MuJoCo scene to render here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stable_baselines3.common.vec_env import DummyVecEnv

from rl_moe.continual.run_view import RunView
from rl_moe.envs.families import get_family
from rl_moe.errors import UsageError
from rl_moe.recording import Episode, SceneRenderer, VideoSettings, choose_backend, record_episode, write_mp4
from rl_moe.run_reader import load_task_model, read_run


def video_name(checkpoint: int, checkpoint_task: str, task: str, episode: int, result: Episode) -> str:
    """``after-01-hammer-v3_on-hammer-v3_ep0_success-1_return-4521.mp4``: the checkpoint (after
    task ``checkpoint``), the task played, the episode, its success and its return."""
    safe = lambda s: re.sub(r"[^A-Za-z0-9_.-]", "_", s)  # noqa: E731
    ret = "nan" if not math.isfinite(result.ret) else f"{result.ret:.0f}"
    return f"after-{checkpoint + 1:02d}-{safe(checkpoint_task)}_on-{safe(task)}_ep{episode}_success-{int(result.success)}_return-{ret}.mp4"


def render_run(run_dir: Path, settings: VideoSettings, device: str = "cpu", log: Callable[[str], None] = print) -> list[Path]:
    """Every video of a run (module docstring); returns the files written."""
    settings.check()
    cfg, results = read_run(run_dir)
    if not get_family(cfg.suite_spec.family, cfg.suite_spec.family_module).metaworld_scenes:
        raise UsageError(f"--video renders MetaWorld suites; run {str(run_dir)!r} is on {cfg.suite_spec.family!r}")
    finished = int(results.get("finished_tasks", 0))
    if finished < 1:
        raise UsageError(f"run {str(run_dir)!r} has no finished task (no checkpoint to render)")
    backend = choose_backend()
    view = RunView(cfg, run_dir)
    names = [t.name for t in view.tasks]
    last = finished - 1
    pairs = [(i, i) for i in range(finished)] + [(last, j) for j in range(len(names)) if j != last]
    out_dir = run_dir / "videos"
    written: list[Path] = []
    renderers: dict[int, SceneRenderer] = {}

    def renderer_for(model: Any) -> SceneRenderer:  # one GL context per scene model
        if id(model) not in renderers:
            renderers[id(model)] = SceneRenderer(model, settings.width, settings.height, settings.camera, backend)
        return renderers[id(model)]

    holder = DummyVecEnv(view.eval_factories(0)[:1])
    try:
        loaded: dict[int, tuple[Any, Any]] = {}
        for ckpt, task in pairs:
            if ckpt not in loaded:
                loaded = {ckpt: load_task_model(view, ckpt, holder, device)}
            model, rms = loaded[ckpt]
            factories = view.eval_factories(task)
            for e in range(settings.episodes):
                env = factories[e % len(factories)]()
                try:
                    episode = record_episode(model, env, renderer_for, settings, int(cfg.suite_data["episode_length"]), rms)
                finally:
                    for key in [k for k in renderers if k == id(env.unwrapped.model)]:
                        renderers.pop(key).close()
                    env.close()
                path = out_dir / video_name(ckpt, names[ckpt], names[task], e, episode)
                write_mp4(path, episode.frames, settings.fps)
                written.append(path)
                log(f"{path} ({len(episode.frames)} frames, success {int(episode.success)}, return {episode.ret:.1f})")
    finally:
        holder.close()
        for r in renderers.values():
            r.close()
    return written
