"""The environments as their own package: a task family added in two files (a family module and a
suite file), and a built wheel that installs ``rl_moe.envs`` with its suite files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from rl_moe.crl import main
from rl_moe.envs.families import FAMILIES
from rl_moe.envs.suites import load_suite
from rl_moe.errors import UsageError

REPO = Path(__file__).resolve().parents[1]

TOY_FAMILY = '''
"""A toy family: MountainCarContinuous with its action scaled per task."""
import gymnasium as gym

from rl_moe.envs.families import EnvFamily, register_family


class Scaled(gym.ActionWrapper):
    def __init__(self, env, scale):
        super().__init__(env)
        self.scale = scale

    def action(self, action):
        return action * self.scale


def make(task, seed):
    env = Scaled(gym.make("MountainCarContinuous-v0", disable_env_checker=True), float(task.params.get("scale", 1.0)))
    env.reset(seed=seed)
    env.action_space.seed(seed)
    return env


register_family(EnvFamily(name="toycar", make=make, task_fields=("scale",)))
'''


def _toy_suite(folder: Path, module: str) -> Path:
    suite = {
        "name": "toy", "family": "toycar", "family_module": module, "steps_per_task": 512, "episode_length": 100,
        "success": {"type": "return"},
        "probe_tasks": [{"name": "probe", "scale": 0.5, "success_bar": 50.0}],
        "presets": {"ppo": "smoke", "td3": "smoke"}, "net": {"hidden": [16]},
        "tasks": [{"name": "car-1", "scale": 1.0, "success_bar": 50.0}, {"name": "car-2", "scale": -1.0, "success_bar": 50.0}],
    }  # fmt: skip
    path = folder / "toy.json"
    path.write_text(json.dumps(suite))
    return path


def test_a_family_module_and_a_suite_file_add_a_task_family(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = "toycar_family_for_test"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(TOY_FAMILY))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))  # worker processes
    monkeypatch.delitem(FAMILIES, "toycar", raising=False)
    path = _toy_suite(tmp_path, module)
    suite = load_suite(str(path))  # imports the module, which registers the family
    assert suite.family == "toycar" and "toycar" in FAMILIES and suite.to_dict()["family_module"] == module
    out = tmp_path / "runs"
    for vec_env in ("dummy", "subproc"):  # a subprocess worker imports the family module itself
        rc = main(["--suite", str(path), "--method", "topk", "--tasks", "2", "--steps-per-task", "256", "--vec-env", vec_env, "--out", str(out / vec_env), "--preset", "tiny", "--no-progress"])
        assert rc == 0
        (run,) = [p for p in (out / vec_env).glob("*/*") if p.is_dir()]
        res = json.loads((run / "results.json").read_text())
        assert res["complete"] and res["tasks"] == ["car-1", "car-2"]
    monkeypatch.delitem(FAMILIES, "toycar")  # as in a new process
    monkeypatch.delitem(sys.modules, module)
    assert main(["--resume", str(run), "--no-progress"]) == 0  # config.json names the module: it is imported again
    assert "toycar" in FAMILIES
    data = json.loads(path.read_text())
    data["family_module"] = "no_such_family_module"
    data["family"] = "nocar"
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError, match="cannot import family module 'no_such_family_module'"):
        load_suite(str(path))


def test_built_wheel_installs_envs_with_their_suites(tmp_path: Path) -> None:
    """Build the wheel, install it without dependencies into a folder, and run the smoke suite
    from there, outside the repository."""
    dist = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(REPO)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = dist.glob("rl_moe-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "rl_moe/envs/families.py" in names and "rl_moe/envs/suites/cw10-cw.json" in names
    assert not any(n.startswith("envs/") for n in names)
    target = tmp_path / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(wheel)], capture_output=True, text=True, timeout=300, check=False)
    assert install.returncode == 0, install.stderr[-2000:]
    env = {**os.environ, "PYTHONPATH": str(target), "OMP_NUM_THREADS": "1"}
    script = (
        "import rl_moe, rl_moe.envs.suites as s; assert rl_moe.__file__.startswith(%r), rl_moe.__file__; "
        "print(','.join(s.builtin_suites())); "
        "from rl_moe.crl import main; raise SystemExit(main(['--suite', 'smoke', '--tasks', '1', '--steps-per-task', '256', '--preset', 'tiny', '--no-progress', '--out', %r]))"
    ) % (str(target), str(tmp_path / "runs"))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "cw10,cw10-cw,cw20,cw20-cw,hb5,smoke" in run.stdout
    assert list((tmp_path / "runs" / "smoke").glob("*/results.json"))
