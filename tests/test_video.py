"""Videos of a run's checkpoints (``python -m rl_moe.evaluate RUN_DIR --video``): the headless
backend it picks, frames the right way up against a known camera view, and a tiny run's MP4s."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rl_moe.errors import UsageError
from rl_moe.recording import INSTALL_HINT, choose_backend, upright


def _backend() -> str:
    try:
        return choose_backend()
    except UsageError as exc:  # CI installs OSMesa (.ci/run); elsewhere the reason is the hint
        pytest.skip(str(exc))


def test_the_backend_is_the_users_else_egl_with_a_gpu_else_osmesa() -> None:
    assert choose_backend({"MUJOCO_GL": "osmesa"}, lambda name: None) == "osmesa"
    with pytest.raises(UsageError, match="MUJOCO_GL='glfw' is not a headless backend; valid choices for videos: egl, osmesa"):
        choose_backend({"MUJOCO_GL": "glfw"}, lambda name: None)
    assert choose_backend({}, lambda name: "libOSMesa.so" if name == "OSMesa" else None) == "osmesa"
    with pytest.raises(UsageError) as err:
        choose_backend({}, lambda name: None)
    assert INSTALL_HINT in str(err.value) and "apt-get install libosmesa6" in str(err.value)


def test_upright_flips_only_a_camera_whose_up_axis_points_down() -> None:
    frame = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    assert upright(frame, 0.3) is frame
    assert np.array_equal(upright(frame, -0.3), frame[::-1])


def _project(model, data, cam: int, point: np.ndarray, width: int, height: int) -> tuple[float, float]:
    """Pixel (row, column) of a world point in an upright frame of fixed camera ``cam``: MuJoCo's
    pinhole model (the camera looks along its -z, its y axis up, vertical field of view fovy)."""
    rot = data.cam_xmat[cam].reshape(3, 3)
    v = rot.T @ (point - data.cam_xpos[cam])
    f = (height / 2) / np.tan(np.deg2rad(model.cam_fovy[cam]) / 2)
    row, col = height / 2 - f * v[1] / -v[2], width / 2 + f * v[0] / -v[2]
    return (height - 1 - row, col) if rot[2, 1] < 0 else (row, col)  # an upside-down camera's frame is flipped


@pytest.mark.parametrize("camera", ["corner", "corner3", "topview"])
def test_frames_show_the_scene_where_the_camera_model_puts_it_and_up_is_up(camera: str) -> None:
    """The hammer, painted pure green, appears where the pinhole model projects it, in the frame
    as written; and a point above the table appears above it (``corner`` is an upside-down
    camera: without the flip this fails)."""
    import gymnasium as gym
    import metaworld  # noqa: F401
    import mujoco

    from rl_moe.recording import SceneRenderer

    backend = _backend()
    env = gym.make("Meta-World/goal_observable", env_name="hammer-v3", seed=0, disable_env_checker=True)
    env.reset()
    model, data = env.unwrapped.model, env.unwrapped.data
    body = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, "hammer")
    for g in range(model.ngeom):
        if model.geom_bodyid[g] == body:
            model.geom_rgba[g], model.geom_matid[g] = (0.0, 1.0, 0.0, 1.0), -1
    width, height = 160, 120
    renderer = SceneRenderer(model, width, height, camera, backend)
    try:
        frame = renderer.frame(data)
    finally:
        renderer.close()
    assert frame.shape == (height, width, 3) and frame.dtype == np.uint8
    green = (frame[..., 1] > 150) & (frame[..., 0] < 80) & (frame[..., 2] < 80)
    rows, cols = np.nonzero(green)
    assert green.sum() > 20
    cam = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
    want_row, want_col = _project(model, data, cam, data.xpos[body], width, height)
    assert abs(rows.mean() - want_row) < 10 and abs(cols.mean() - want_col) < 10, (rows.mean(), cols.mean(), want_row, want_col)
    if abs(data.cam_xmat[cam].reshape(3, 3)[2, 1]) > 0.3:  # a camera that sees the vertical: up is up
        high = _project(model, data, cam, data.xpos[body] + np.array([0.0, 0.0, 0.2]), width, height)
        assert high[0] < want_row
    env.close()


def test_a_tiny_runs_videos_are_mp4s_of_changing_frames(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import imageio.v2 as imageio

    from rl_moe.crl import main as crl
    from rl_moe.evaluate import main

    _backend()
    pytest.importorskip("imageio_ffmpeg")
    run = tmp_path / "run"
    few = ["--set", "eval.evals_per_task=1", "--set", "eval.n_episodes=1", "--set", "eval.matrix_episodes=1", "--set", "eval.n_envs=2"]
    assert crl(["--suite", "cw10", "--method", "topk", "--tasks", "1", "--steps-per-task", "256", "--preset", "tiny", *few,
                "--vec-env", "dummy", "--threads", "1", "--no-progress", "--run-dir", str(run)]) == 0  # fmt: skip
    assert main([str(run), "--video", "--video-steps", "6", "--video-size", "96x64", "--video-stride", "2", "--video-episodes", "2"]) == 0
    files = sorted((run / "videos").glob("*.mp4"))
    assert [f.name.split("_ep")[0] for f in files] == ["after-01-hammer-v3_on-hammer-v3"] * 2
    own = json.loads((run / "results.json").read_text())["success_matrix"][0][0]
    for f in files:
        assert f"_success-{int(own > 0)}_" in f.name or own not in (0.0, 1.0)  # the name carries the episode's success
        frames = imageio.mimread(f)
        assert len(frames) == 4 and frames[0].shape == (64, 96, 3)  # the first frame, then every 2nd of 6 steps
        assert max(float(np.abs(fr.astype(int) - frames[0].astype(int)).mean()) for fr in frames[1:]) > 0.5  # the arm moved
    capsys.readouterr()
    for bad, message in ((["--video-size", "big"], "--video-size 'big' is not WIDTHxHEIGHT"), (["--camera", "nope"], "unknown camera 'nope'; valid choices: ")):
        assert main([str(run), "--video", "--video-steps", "2", *bad]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_a_clip_per_task_in_tensorboard_leaves_training_unchanged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``eval.clip_steps``: at each task's end an animated clip of the task's policy goes to
    TensorBoard as ``video/<task>``; the weights and results equal a run without it."""
    import io

    import imageio.v2 as imageio
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rl_moe.crl import main as crl
    from rl_moe.fingerprint import fingerprint

    _backend()
    few = ["--set", "eval.evals_per_task=1", "--set", "eval.n_episodes=1", "--set", "eval.matrix_episodes=1", "--set", "eval.n_envs=2"]
    base = ["--suite", "cw10", "--method", "topk", "--tasks", "2", "--steps-per-task", "256", "--preset", "tiny", *few, "--vec-env", "dummy", "--threads", "1", "--no-progress"]
    assert crl([*base, "--run-dir", str(tmp_path / "plain")]) == 0
    clip = ["--set", "eval.clip_steps=8", "--set", "eval.clip_stride=2", "--set", "eval.clip_size=64,48"]
    assert crl([*base, *clip, "--run-dir", str(tmp_path / "clip")]) == 0
    plain, clipped = fingerprint(tmp_path / "plain"), fingerprint(tmp_path / "clip")
    assert (clipped["weights"], clipped["results"]) == (plain["weights"], plain["results"])
    acc = EventAccumulator(str(tmp_path / "clip" / "tb"), size_guidance={"images": 0})
    acc.Reload()
    assert sorted(acc.Tags()["images"]) == ["video/hammer-v3", "video/push-wall-v3"]
    (event,) = acc.Images("video/hammer-v3")
    frames = imageio.mimread(io.BytesIO(event.encoded_image_string), format="GIF")
    assert len(frames) == 5 and frames[0].shape[:2] == (48, 64) and (event.width, event.height) == (64, 48)
    for bad, message in (
        (["--suite", "smoke", "--set", "eval.clip_steps=5"], "eval.clip_steps renders MetaWorld scenes; suite 'smoke'"),
        (["--suite", "cw10", "--set", "eval.clip_steps=5", "--set", "eval.clip_stride=0"], "eval.clip_stride >= 1"),
    ):
        assert crl([*bad, "--out", str(tmp_path / "bad")]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "bad").exists()
