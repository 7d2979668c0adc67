"""The networks and lambda arithmetics by name (:mod:`rl_moe.continual.networks`): ``cw10``, ``cw20``
and ``hb5`` build the SPHERE authors' network with no preset, SPHERE takes the authors' lambda
arithmetic on every suite, ``--preset sb3`` keeps the former network, and ``config.json`` names
the preset, the network and the arithmetic, for runs of any age."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from rl_moe.continual.agents import net_configs_for
from rl_moe.continual.config import RunConfig
from rl_moe.continual.networks import LAMBDA_ARITHMETICS, NETWORKS, arithmetic_name, network_name, suite_network
from rl_moe.continual.resolve import RunRequest, moved_settings, resolve
from rl_moe.crl import main
from rl_moe.errors import UsageError
from rl_moe.regularizers.sphere_config import SphereConfig

ROOT = Path(__file__).resolve().parents[1]


def _cfg(suite: str, method: str, preset: str | None = None, *overrides: str) -> RunConfig:
    return resolve(RunRequest(suite=suite, method=method, tasks=1, device="cpu", vec_env="dummy", preset=preset, overrides=overrides))


@pytest.mark.parametrize("method", ["topk", "sphere", "ln", "dense"])
def test_the_paper_suites_build_the_authors_network_with_no_preset(method: str) -> None:
    cfg = _cfg("cw10", method)
    nets = net_configs_for(cfg, 39, 4)
    assert (nets.actor.init, nets.critic.init) == ("lecun", "lecun")
    assert cfg.net.gate_hidden == (256, 256, 256)
    assert cfg.preset is None
    assert cfg.labels()["network"] == "authors"
    # the same settings as --preset authors gave before it became the default
    assert dataclasses.asdict(cfg.net) == dataclasses.asdict(_cfg("cw10", method, "authors").net)


def test_sphere_takes_the_authors_arithmetic_on_every_suite_and_ours_is_a_setting() -> None:
    assert {k: getattr(SphereConfig(), k) for k in LAMBDA_ARITHMETICS["authors"]} == dict(LAMBDA_ARITHMETICS["authors"])
    for suite in ("cw10", "cw10-cw", "smoke"):
        cfg = _cfg(suite, "sphere")
        assert (cfg.regularizers["sphere"].norm_eps, cfg.regularizers["sphere"].log_std_in_theta) == (1e-8, True)
        assert cfg.labels()["lambda_arithmetic"] == "authors"
    ours = _cfg("cw10", "sphere", None, "reg.sphere.norm_eps=0", "reg.sphere.log_std_in_theta=false")
    assert ours.labels() == {"network": "authors", "lambda_arithmetic": "ours"}
    half = _cfg("cw10", "sphere", None, "reg.sphere.norm_eps=0")
    assert half.labels()["lambda_arithmetic"] == "custom"
    assert "lambda_arithmetic" not in _cfg("cw10", "topk").labels()
    # the arithmetic is named by its label, not as a moved setting of the method
    assert moved_settings(ours) == {}
    assert moved_settings(_cfg("cw10", "sphere", None, "reg.sphere.rho=0.05")) == {"sphere.rho": 0.05}


def test_preset_sb3_is_the_former_network_and_other_suites_keep_it() -> None:
    sb3 = _cfg("cw10", "sphere", "sb3")
    assert (sb3.net.init, sb3.net.gate_hidden, sb3.preset) == ("orthogonal", (256,), "sb3")
    assert sb3.labels() == {"network": "sb3", "lambda_arithmetic": "authors"}
    assert _cfg("cw10-cw", "topk").labels()["network"] == "sb3"
    assert _cfg("smoke", "topk", "tiny").labels()["network"] == "custom"  # tiny's 16-wide gate
    with pytest.raises(UsageError, match="'sb4'.*tiny, authors, sb3"):
        _cfg("cw10", "topk", "sb4")


def test_a_kind_the_authors_network_cannot_build_gets_sb3s_and_says_so() -> None:
    assert suite_network("authors", "topk") == "authors"
    assert suite_network("authors", "soft") == suite_network(None, "topk") == "sb3"
    cfg = _cfg("cw10", "soft")
    assert (cfg.net.init, cfg.labels()["network"]) == ("orthogonal", "sb3")
    with pytest.raises(UsageError, match="init 'lecun' does not cover network kind 'soft'"):
        _cfg("cw10", "soft", "authors")


def test_config_json_names_the_preset_the_network_and_the_arithmetic(tmp_path: Path) -> None:
    data = _cfg("cw10", "sphere", "sb3").to_dict()
    assert (data["preset"], data["network"], data["lambda_arithmetic"]) == ("sb3", "sb3", "authors")
    back = RunConfig.from_dict(json.loads(json.dumps(data)))
    assert back.labels() == {"network": "sb3", "lambda_arithmetic": "authors"} and back.preset == "sb3"


def test_a_config_from_before_the_arithmetic_field_reads_as_ours() -> None:
    """The committed slice ran our arithmetic on the sb3 network; its config.json has no norm_eps."""
    stored = json.loads((ROOT / "results/cw10-paper/ppo-sphere-crl-s0/config.json").read_text())
    assert "norm_eps" not in stored["regularizers"]["sphere"]
    cfg = RunConfig.from_dict(stored)
    assert (cfg.regularizers["sphere"].norm_eps, cfg.regularizers["sphere"].log_std_in_theta) == (0.0, False)
    assert cfg.labels() == {"network": "sb3", "lambda_arithmetic": "ours"}
    screen = json.loads((ROOT / "results/sphere-authors/sphere-authors-s0/config.json").read_text())
    assert RunConfig.from_dict(screen).labels() == {"network": "authors", "lambda_arithmetic": "authors"}


def test_network_names_match_fields_exactly() -> None:
    assert network_name(_cfg("cw10", "topk", None, "net.gate_hidden=256,256").net) == "custom"
    assert arithmetic_name(SphereConfig(norm_eps=1e-6)) == "custom"
    assert NETWORKS["authors"].overrides() == ("net.init=lecun", "net.gate_hidden=256,256,256")


def test_list_and_help_name_the_presets_and_each_suites_network(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "presets (--preset" in out and "  sb3 " in out and "  authors " in out
    assert [line.split(",")[1].strip() for line in out.splitlines() if line.startswith(("  cw10:", "  cw10 ", "  cw10-cw:"))] == [
        "authors network", "sb3 network",
    ]  # fmt: skip


def test_the_report_labels_runs_by_network_and_splits_a_mixed_table() -> None:
    from rl_moe.report.grouping import describe_network, split_by_network
    from rl_moe.report.loading import load_runs

    old = ROOT / "results/cw10-paper/ppo-sphere-crl-s0"
    screen = ROOT / "results/sphere-authors/sphere-authors-s0"
    runs = {r.path.name: r for r in load_runs([old, screen]).runs}
    assert (runs[old.name].network, runs[old.name].arithmetic) == ("sb3", "ours")
    assert (runs[screen.name].network, runs[screen.name].arithmetic) == ("authors", "authors")
    assert describe_network(runs.values()).startswith("authors (the SPHERE authors' network")
    assert describe_network([runs[old.name]]).endswith("SPHERE's lambda arithmetic: ours")
    # the same suite, learner and method on two networks: two tables, and two rows for two arithmetics
    a = runs[old.name]
    b = dataclasses.replace(a, network="authors", arithmetic="authors", seed=1)
    split = split_by_network([a, b])
    assert [r.key.suite for r in split] == [f"{a.key.suite} [sb3 network]", f"{a.key.suite} [authors network]"]
    assert [r.key.method for r in split] == ["sphere [ours lambda]", "sphere [authors lambda]"]
    assert split_by_network([a, dataclasses.replace(a, seed=1)])[1].key == a.key
