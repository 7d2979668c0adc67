"""Render and record one episode headless: MuJoCo's own renderer on EGL or OSMesa
(:func:`choose_backend`), frames the world's up at the top (:func:`upright`), MP4 files and
TensorBoard clips. Used by the task-end clips of a run (``eval.clip_steps``) and by
:mod:`rl_moe.video`, which renders a finished run's checkpoints.

Frames come out the right way up: MetaWorld's ``corner`` cameras are defined with their up axis
pointing down in the world, so a frame is flipped whenever the camera's up axis does.
"""

from __future__ import annotations

import ctypes.util
import importlib
import io
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import imageio.v2 as imageio
import numpy as np
from stable_baselines3.common.logger import TensorBoardOutputFormat
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize
from tensorboard.compat.proto.summary_pb2 import Summary

from rl_moe.cli import reraise_interrupt
from rl_moe.errors import MissingDependencyError, UsageError
from rl_moe.nn.reuse import weights_fixed


#: Headless OpenGL backends of MuJoCo's Python bindings (``MUJOCO_GL``), in order of preference.
HEADLESS: tuple[str, ...] = ("egl", "osmesa")
#: What a machine without either needs, in one line.
INSTALL_HINT = "install OSMesa (Debian/Ubuntu: apt-get install libosmesa6), or set MUJOCO_GL=egl on a machine with a GPU"


@dataclass(frozen=True)
class VideoSettings:
    """What to render.

    :param width: frame width in pixels
    :param height: frame height in pixels
    :param episodes: episodes per (checkpoint, task), each on the next eval position
    :param stride: keep every ``stride``-th step's frame (the first and the last always)
    :param steps: stop an episode after this many steps (None: the suite's episode length)
    :param camera: a MuJoCo camera of the scene (MetaWorld: ``corner``, ``corner2``, ``corner3``,
        ``topview``, ``behindGripper``, ``gripperPOV``)
    :param fps: frames per second of the written video
    """

    width: int = 320
    height: int = 240
    episodes: int = 1
    stride: int = 2
    steps: int | None = None
    camera: str = "corner"
    fps: int = 25

    def check(self) -> None:
        """:class:`UsageError` naming the first bad value."""
        for name in ("width", "height", "episodes", "stride", "fps"):
            if getattr(self, name) < 1:
                raise UsageError(f"--video-{name} must be >= 1, got {getattr(self, name)}")
        if self.steps is not None and self.steps < 1:
            raise UsageError(f"--video-steps must be >= 1, got {self.steps}")


def choose_backend(environ: dict[str, str] | None = None, find: Callable[[str], str | None] = ctypes.util.find_library) -> str:
    """The headless OpenGL backend to render with: ``MUJOCO_GL`` where it names one of
    :data:`HEADLESS`; else EGL where a GPU device node and libEGL are present (EGL without a
    GPU fails on these machines), else OSMesa where libOSMesa is.

    :raises UsageError: one line naming what to install
    """
    env = os.environ if environ is None else environ
    asked = env.get("MUJOCO_GL", "").strip().lower()
    if asked:
        if asked not in HEADLESS:
            raise UsageError(f"MUJOCO_GL={asked!r} is not a headless backend; valid choices for videos: {', '.join(HEADLESS)}")
        return asked
    gpu = any(Path(p).exists() for p in ("/dev/nvidia0", "/dev/dri/renderD128"))
    if gpu and find("EGL"):
        return "egl"
    if find("OSMesa"):
        return "osmesa"
    raise UsageError(f"no headless OpenGL to render videos with: {INSTALL_HINT}")


def upright(frame: np.ndarray, camera_up_z: float) -> np.ndarray:
    """``frame`` as seen with the world's up at the top: flipped top to bottom when the camera's
    up axis (its y axis, ``cam_xmat``'s second column) points down in the world (``camera_up_z`` < 0)."""
    return np.ascontiguousarray(frame[::-1]) if camera_up_z < 0 else frame


class SceneRenderer:
    """Offscreen frames of one MuJoCo model's fixed camera, through MuJoCo's own rendering
    context (``mjr_render``), on a headless GL context of ``backend``."""

    def __init__(self, model: Any, width: int, height: int, camera: str, backend: str) -> None:
        import mujoco  # lazy: only videos need it here

        self.mujoco, self.model, self.width, self.height = mujoco, model, width, height
        cam = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
        if cam < 0:
            names = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_CAMERA, i) for i in range(model.ncam)]
            raise UsageError(f"unknown camera {camera!r}; valid choices: {', '.join(n for n in names if n)}")
        buffer = (int(model.vis.global_.offwidth), int(model.vis.global_.offheight))
        if width > buffer[0] or height > buffer[1]:
            raise UsageError(f"--video-size {width}x{height} exceeds the scene's offscreen buffer {buffer[0]}x{buffer[1]}; valid: at most that")
        try:
            self.gl = importlib.import_module(f"mujoco.{backend}").GLContext(width, height)
        except (ImportError, RuntimeError, OSError) as exc:
            reraise_interrupt(exc)
            raise UsageError(f"cannot open a {backend} OpenGL context ({exc}): {INSTALL_HINT}") from None
        self.gl.make_current()
        self.context = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self.context)
        self.scene = mujoco.MjvScene(model, maxgeom=10_000)
        self.option = mujoco.MjvOption()
        self.camera = mujoco.MjvCamera()
        self.camera.type = mujoco.mjtCamera.mjCAMERA_FIXED
        self.camera.fixedcamid = cam
        self.cam_id = cam
        self.viewport = mujoco.MjrRect(0, 0, width, height)

    def frame(self, data: Any) -> np.ndarray:
        """(height, width, 3) uint8 RGB of ``data``'s state, the world's up at the top."""
        mj = self.mujoco
        self.gl.make_current()
        mj.mjv_updateScene(self.model, data, self.option, None, self.camera, mj.mjtCatBit.mjCAT_ALL, self.scene)
        mj.mjr_render(self.viewport, self.scene, self.context)
        rgb = np.empty((self.height, self.width, 3), dtype=np.uint8)
        mj.mjr_readPixels(rgb, None, self.viewport, self.context)
        image = np.ascontiguousarray(rgb[::-1])  # OpenGL's rows run bottom to top
        return upright(image, float(data.cam_xmat[self.cam_id].reshape(3, 3)[2, 1]))

    def close(self) -> None:
        self.context.free()
        self.gl.free()


@dataclass(frozen=True)
class Episode:
    """One rendered episode: its frames, whether it succeeded (at any step, as the run scores it)
    and its return."""

    frames: list[np.ndarray]
    success: bool
    ret: float


def record_episode(model: Any, env: Any, renderer_for: Callable[[Any], SceneRenderer], settings: VideoSettings, max_steps: int, obs_rms: Any = None) -> Episode:
    """Play one deterministic episode of ``model`` on ``env`` (a single gym env, reset by the
    caller's factory seed) and keep every ``stride``-th frame."""
    normalize: Callable[[np.ndarray], np.ndarray] = lambda x: x  # noqa: E731
    if obs_rms is not None:  # SB3's own rule (epsilon, clip), as the run's VecNormalize applied it
        norm = VecNormalize(DummyVecEnv([lambda: env]), training=False, norm_obs=True, norm_reward=False)
        norm.obs_rms, normalize = obs_rms, norm.normalize_obs
    obs, _ = env.reset()
    inner = env.unwrapped
    renderer = renderer_for(inner.model)
    frames, success, ret = [renderer.frame(inner.data)], False, 0.0
    steps = max_steps if settings.steps is None else min(settings.steps, max_steps)
    with weights_fixed():  # no weight changes during the episode: reusable values are kept
        for t in range(steps):
            action, _ = model.predict(np.asarray(normalize(obs), dtype=np.float32)[None], deterministic=True)
            obs, reward, terminated, truncated, info = env.step(action[0])
            ret += float(reward)
            success = success or bool(info.get("success", info.get("is_success", False)))
            last = terminated or truncated or t == steps - 1
            if (t + 1) % settings.stride == 0 or last:
                frames.append(renderer.frame(inner.data))
            if terminated or truncated:
                break
    return Episode(frames, success, ret)


def write_mp4(path: Path, frames: Sequence[np.ndarray], fps: int) -> None:
    """H.264 MP4 through imageio's ffmpeg plugin, written to a temporary name and moved into place."""
    try:  # an optional plugin: a missing one is one line here, not a traceback inside imageio
        import imageio_ffmpeg  # noqa: F401
    except ImportError as exc:
        reraise_interrupt(exc)
        raise MissingDependencyError("videos need imageio with its ffmpeg plugin: pip install 'rl_moe[video]' (imageio, imageio-ffmpeg)") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.mp4")
    imageio.mimwrite(tmp, list(frames), fps=fps, codec="libx264", quality=7, macro_block_size=1)
    tmp.replace(path)


def encode_gif(frames: Sequence[np.ndarray], fps: int) -> bytes:
    """An animated GIF of ``frames`` (what TensorBoard's image plugin plays), through imageio's
    pillow plugin."""
    buf = io.BytesIO()
    imageio.mimwrite(buf, list(frames), format="GIF", duration=1000.0 / fps, loop=0)
    return buf.getvalue()


def log_clip(logger: Any, tag: str, frames: Sequence[np.ndarray], step: int, fps: int) -> bool:
    """Write ``frames`` to the TensorBoard writers of SB3's ``logger`` as an animated image under
    ``tag`` at ``step`` (as torch's ``add_video`` writes one, without its moviepy dependency);
    False when the logger has no TensorBoard output."""
    height, width = frames[0].shape[:2]
    image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=encode_gif(frames, fps))
    written = False
    for fmt in logger.output_formats:
        if isinstance(fmt, TensorBoardOutputFormat):
            fmt.writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), step)
            fmt.writer.flush()
            written = True
    return written


def clip(model: Any, factory: Callable[[], Any], settings: VideoSettings, max_steps: int, obs_rms: Any = None) -> Episode:
    """One short episode of ``model`` on the env ``factory`` builds, rendered (``settings.steps``)."""
    backend = choose_backend()
    env = factory()
    renderers: list[SceneRenderer] = []

    def renderer_for(model_: Any) -> SceneRenderer:
        if not renderers:
            renderers.append(SceneRenderer(model_, settings.width, settings.height, settings.camera, backend))
        return renderers[0]

    try:
        return record_episode(model, env, renderer_for, settings, max_steps, obs_rms)
    finally:
        for r in renderers:
            r.close()
        env.close()
