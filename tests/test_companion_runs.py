"""SD-MoE, DSC and SSMoE as ``--method``s: PPO and TD3 through the CLI on the smoke suite and a
real MetaWorld task, their TensorBoard terms, the training-free re-routing command, sweep and report."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rl_moe import evaluate, sweep
from rl_moe.crl import main as crl_main
from rl_moe.report.__main__ import main as report_main
from tests.conftest import CLI_TINY

METHODS = ("sdmoe", "dsc", "ssmoe")
ALGOS = ("ppo", "td3")
TINY = CLI_TINY
#: TensorBoard scalars each method must log (beyond the learner's own).
METHOD_TAGS = {
    "sdmoe": {"train/sdmoe_refreshes"},
    "dsc": {f"train/{kind}_dsc_{t}" for kind in ("loss", "coef") for t in ("balance", "budget", "frame", "z")},
    "ssmoe": {"spectral/ssmoe_topk_overlap", "routing/active_ratio"},  # no loss term of its own
}


def _expected_tags(method: str, algo: str) -> set[str]:
    """TD3 applies the DSC losses to actor and critics: their terms carry a role suffix."""
    if method == "dsc" and algo == "td3":
        return {f"{t}_{role}" for t in METHOD_TAGS[method] for role in ("actor", "critic")}
    return METHOD_TAGS[method]


def _only_run(root: Path) -> Path:
    dirs = [p for p in root.glob("*/*") if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def _scalars(run: Path) -> dict[str, list[float]]:
    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """One tiny two-task smoke run per (method, algo), each in its own root."""
    runs = {}
    for method in METHODS:
        for algo in ALGOS:
            root = tmp_path_factory.mktemp(f"{method}-{algo}")
            argv = ["--suite", "smoke", "--algo", algo, "--method", method, "--tasks", "2", "--steps-per-task", "128",
                    "--out", str(root), *TINY, "--set", "reg.sdmoe.svd_every=2"]  # fmt: skip
            if method != "sdmoe":
                argv = argv[:-2]
            assert crl_main(argv) == 0
            runs[(method, algo)] = _only_run(root)
    return runs


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("method", METHODS)
def test_method_trains_on_smoke_without_nan_and_logs_its_terms(smoke_runs: dict, method: str, algo: str) -> None:
    run = smoke_runs[(method, algo)]
    res = json.loads((run / "results.json").read_text())
    assert res["complete"] and res["method"] == method and res["algo"] == algo
    scalars = _scalars(run)
    expected = _expected_tags(method, algo)
    assert expected <= set(scalars), expected - set(scalars)
    train = [v for tag, vals in scalars.items() if tag.startswith(("train/", "eval/return")) for v in vals]
    assert train and all(math.isfinite(v) for v in train)
    if method == "sdmoe":
        assert scalars["train/sdmoe_refreshes"][-1] > 0  # the SVD refresh ran
    if method == "dsc":
        sfx = "_actor" if algo == "td3" else ""
        assert all(v > 0 for v in scalars[f"train/loss_dsc_frame{sfx}"]) and scalars[f"train/coef_dsc_z{sfx}"][-1] == pytest.approx(1e-4)
        if algo == "td3":  # TD3's critics carry the method's network, and its losses
            assert "train/loss_dsc_balance_critic" in scalars and "train/loss_dsc_balance" not in scalars


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("method", METHODS)
def test_method_trains_on_a_real_metaworld_task(tmp_path: Path, method: str, algo: str) -> None:
    argv = ["--suite", "cw10-cw", "--algo", algo, "--method", method, "--tasks", "1", "--steps-per-task", "128",
            "--out", str(tmp_path), *TINY, "--set", "eval.n_episodes=1", "--set", "eval.matrix_episodes=1",
            "--set", "eval.n_envs=1", "--set", "eval.evals_per_task=1", "--set", "probe.enabled=false"]  # fmt: skip
    assert crl_main(argv) == 0
    run = _only_run(tmp_path)
    assert json.loads((run / "results.json").read_text())["tasks"] == ["hammer-v3"]
    scalars = _scalars(run)
    assert {t for t in _expected_tags(method, algo) if t.startswith("train/")} <= set(scalars)  # no probe here
    assert all(math.isfinite(v) for tag, vals in scalars.items() if tag.startswith("train/") for v in vals)


def _hashes(run: Path) -> dict[str, str]:
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(run.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(("method", "algo"), [("sdmoe", "ppo"), ("ssmoe", "ppo"), ("ssmoe", "td3")])
def test_training_free_ssmoe_evaluation_writes_a_second_matrix(smoke_runs: dict, method: str, algo: str, capsys: pytest.CaptureFixture) -> None:
    run = smoke_runs[(method, algo)]
    before = _hashes(run)
    assert evaluate.main([str(run), "--router", "ssmoe", "--alpha", "0.7"]) == 0
    assert evaluate.main([str(run), "--router", "own"]) == 0
    new = {evaluate.output_path(run, "ssmoe", 0.7).name, evaluate.output_path(run, "own", 0.7).name}
    after = _hashes(run)
    assert {k: v for k, v in after.items() if k not in new} == before and new <= set(after)  # the run is untouched
    original = json.loads((run / "results.json").read_text())["success_matrix"]
    ev = json.loads(evaluate.output_path(run, "ssmoe", 0.7).read_text())
    assert ev["alpha"] == 0.7 and ev["original_success_matrix"] == original
    assert [[v is None for v in row] for row in ev["success_matrix"]] == [[v is None for v in row] for row in original]
    assert all(0.0 <= v <= 1.0 for row in ev["success_matrix"] for v in row if v is not None)
    # the run's own router on the same eval envs and seeds reproduces the run's own matrix
    assert json.loads(evaluate.output_path(run, "own", 0.7).read_text())["success_matrix"] == original
    assert "re-routed (ssmoe, alpha=0.7)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--router", "magic"], "unknown router 'magic'; valid choices: ssmoe, own"),
        (["--alpha", "1.5"], "--alpha must be in [0, 1], got 1.5"),
        (["--top-c", "0"], "--top-c must be >= 1, got 0"),
    ],
)
def test_evaluate_bad_input_exits_2(smoke_runs: dict, args: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    run = smoke_runs[("ssmoe", "ppo")]
    assert evaluate.main([str(run), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("method", "setting", "message"),
    [
        ("ssmoe", "net.ssmoe_alpha=1.5", "ssmoe_alpha must be in [0, 1], got 1.5"),
        ("ssmoe", "net.ssmoe_top_c=0", "ssmoe_top_c must be >= 1, got 0"),
        ("sdmoe", "net.sd_rank_fraction=0", "sd_rank_fraction must be in (0, 1], got 0.0"),
        ("sdmoe", "reg.sdmoe.svd_every=0", "svd_every must be >= 1, got 0"),
        ("dsc", "net.dsc_top_k=0", "dsc_top_k must be >= 1, got 0"),
        ("dsc", "reg.dsc.target=gate", "unknown target 'gate'; valid choices: actor, critic, both"),
    ],
)
def test_bad_method_settings_exit_2_and_write_nothing(tmp_path: Path, capsys: pytest.CaptureFixture, method: str, setting: str, message: str) -> None:
    assert crl_main(["--suite", "smoke", "--method", method, "--set", setting, "--out", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_evaluate_refuses_runs_without_a_topk_router(smoke_runs: dict, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert evaluate.main([str(smoke_runs[("dsc", "ppo")])]) == 2
    assert "has a 'dsc' actor; --router needs a Top-K routed actor: topk, sdmoe, ssmoe" in capsys.readouterr().err
    assert evaluate.main([str(tmp_path)]) == 2
    assert "is not a run folder (no config.json)" in capsys.readouterr().err


def test_list_describes_the_new_methods(capsys: pytest.CaptureFixture) -> None:
    assert crl_main(["--list"]) == 0
    out = capsys.readouterr().out
    for name in (*METHODS, "sdmoe_sphere"):
        assert f"  {name} " in out


def test_sweep_and_report_accept_the_new_methods(smoke_runs: dict, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert sweep.main(["--suite", "smoke", "--method", *METHODS, "sdmoe_sphere", "--algo", "ppo", "td3", "--out", str(tmp_path / "s"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("-m rl_moe.crl") == 8 and "td3-dsc-crl-s0: to run" in out
    roots = [str(run) for (method, algo), run in smoke_runs.items() if algo == "ppo"]
    assert report_main([*roots, "--baseline", "ssmoe", "--method", "dsc", "--out", str(tmp_path / "rep"), "--reps", "100"]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert all(m in md for m in METHODS)


def test_sdmoe_with_sphere_on_top_trains(tmp_path: Path) -> None:
    argv = ["--suite", "smoke", "--method", "sdmoe_sphere", "--tasks", "1", "--steps-per-task", "128", "--out", str(tmp_path),
            *TINY, "--set", "reg.sdmoe.svd_every=2"]  # fmt: skip
    assert crl_main(argv) == 0
    scalars = _scalars(_only_run(tmp_path))
    assert {"train/loss_sphere", "train/coef_sphere", "train/sdmoe_refreshes"} <= set(scalars)
    assert all(math.isfinite(v) for v in scalars["train/loss_sphere"]) and scalars["train/sdmoe_refreshes"][-1] > 0


@pytest.mark.parametrize("algo", ALGOS)
def test_reroute_actor_swaps_in_the_ev_router_with_the_same_parameters(algo: str) -> None:
    import gymnasium as gym
    import torch

    from rl_moe.nn import EVRerouted
    from rl_moe.policies import MoEActorCriticPolicy, MoETD3Policy

    obs_space, act_space = gym.spaces.Box(-1, 1, (6,)), gym.spaces.Box(-1, 1, (2,))
    arch = dict(n_experts=4, top_k=2, hidden=(16, 16), gate_hidden=(8,))
    cls = MoEActorCriticPolicy if algo == "ppo" else MoETD3Policy
    policy = cls(obs_space, act_space, lambda _: 1e-3, **arch)
    params = {id(p) for p in policy.parameters()}
    obs = torch.randn(32, 6)
    before = policy._predict(obs, deterministic=True)
    evaluate.reroute_actor(policy, "ssmoe", 0.0, 2)  # alpha = 0: the learned router exactly
    net = policy.mlp_extractor.actor_net if algo == "ppo" else policy.actor.net
    assert isinstance(net, EVRerouted) and {id(p) for p in policy.parameters()} == params
    assert torch.equal(policy._predict(obs, deterministic=True), before)
    net.alpha = 1.0  # eigenvectors only: some states now pick other experts
    assert not torch.equal(policy._predict(obs, deterministic=True), before)
