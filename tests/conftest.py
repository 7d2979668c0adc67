"""Test setup: one thread per process (SB3 tests slow down ~100x when two processes fight over cores).

No test renders, so MUJOCO_GL is left as the machine has it (EGL fails on some GPU machines).
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

# SB3 makes an empty /tmp/SB3-<time> folder for every model that logs nowhere (thousands per test
# session); point it at one scratch folder that goes away with the session.
if "SB3_LOGDIR" not in os.environ:
    os.environ["SB3_LOGDIR"] = tempfile.mkdtemp(prefix="rl_moe-tests-sb3-")
    atexit.register(shutil.rmtree, os.environ["SB3_LOGDIR"], True)

import torch  # noqa: E402

torch.set_num_threads(1)

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

SUITES = Path(__file__).resolve().parents[1] / "envs" / "suites"

from rl_moe.envs.envpool_env import envpool_installed  # noqa: E402

#: Real-EnvPool tests: skipped where the ``envpool`` extra is not installed.
needs_envpool = pytest.mark.skipif(not envpool_installed(), reason="envpool is not installed (pip install 'rl_moe[envpool]')")


@pytest.fixture
def faucet_suite(tmp_path: Path) -> Path:
    """A suite file: CW10's episode rules and PPO preset on faucet-close-v3 alone (the learning
    guards of test_learning.py and test_learning_slow.py)."""
    data = json.loads((SUITES / "cw10-cw.json").read_text())
    data.update(name="faucet", tasks=[{"name": "faucet-close-v3"}])
    path = tmp_path / "faucet.json"
    path.write_text(json.dumps(data))
    return path


def import_error_from(cause: BaseException) -> ImportError:
    """What a C extension's import raises when ``cause`` interrupts it: pybind11 (MuJoCo) raises
    ``ImportError: initialization failed`` from it."""
    failed = ImportError("initialization failed")
    failed.__cause__ = cause
    return failed


def _stop_before_task(argv: list[str], task: int) -> int:
    from rl_moe.continual import scheduler
    from rl_moe.crl import main

    original = scheduler.ContinualScheduler._train_task

    def stop(self: scheduler.ContinualScheduler, run: scheduler.TaskRun, probe: object) -> None:
        if run.index == task:
            raise KeyboardInterrupt
        original(self, run, probe)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(scheduler.ContinualScheduler, "_train_task", stop)
        return main(argv)


@pytest.fixture(scope="session")
def stop_before_task():
    """``stop_before_task(argv, i)``: run ``rl_moe.crl`` with a Ctrl-C at the start of task ``i``
    (a resumable partial run); returns its exit code (130)."""
    return _stop_before_task


@pytest.fixture(autouse=True)
def _one_thread_per_test():
    """``rl_moe.crl.main`` sets torch's process-wide thread count (``--threads auto`` gives torch 2
    with EnvPool); put it back so that no test runs with what an earlier one chose."""
    yield
    torch.set_num_threads(1)


# ---- shared sizes and the small PPO model (import them: ``from tests.conftest import NETS, moe_ppo``)

#: MoE network sizes the unit tests train: "tiny" where only shapes and plumbing matter, "small"
#: where gradients and optimizer steps are compared, "three" with an odd number of experts.
NETS: dict[str, dict[str, object]] = {
    "tiny": {"n_experts": 4, "top_k": 2, "hidden": (16, 16), "gate_hidden": (8,)},
    "small": {"n_experts": 4, "top_k": 2, "hidden": (32, 32), "gate_hidden": (16,)},
    "three": {"n_experts": 3, "top_k": 2, "hidden": (16, 16), "gate_hidden": (16,)},
}
#: ``rl_moe.crl`` arguments of a run that takes seconds.
CLI_TINY: list[str] = ["--preset", "tiny", "--no-progress"]


def moe_ppo(env: object = "Pendulum-v1", *, net: str = "small", kind: str | None = "topk", policy: object = None, n_envs: int = 2, **kwargs: object):
    """A small :class:`~rl_moe.algos.MoEPPO` on CPU (n_steps 64, batch 32, 2 epochs, seed 0 unless
    given): ``env`` an env id (made as ``n_envs`` vectorized envs, seed 0) or an env; ``net`` a key of
    :data:`NETS` with the router ``kind`` (None: the policy's default); ``policy`` another policy
    class (then ``net`` and ``kind`` are not passed)."""
    from stable_baselines3.common.env_util import make_vec_env

    from rl_moe.algos import MoEPPO
    from rl_moe.policies import MoEActorCriticPolicy

    if isinstance(env, str):
        env = make_vec_env(env, n_envs=n_envs, seed=0)
    if policy is None:
        policy = MoEActorCriticPolicy
        net_kwargs = dict(NETS[net]) if kind is None else {"moe": kind, **NETS[net]}
        kwargs["policy_kwargs"] = {**net_kwargs, **dict(kwargs.get("policy_kwargs") or {})}
    settings = {"n_steps": 64, "batch_size": 32, "n_epochs": 2, "seed": 0, "device": "cpu", **kwargs}
    return MoEPPO(policy, env, **settings)
