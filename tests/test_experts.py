"""``python -m rl_moe.experts``: routed shares per expert from a router built by hand, expert
movement from known weight changes, and a tiny run's ``experts.json``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from rl_moe.experts import expert_vectors, movement, routed_shares
from rl_moe.nn import NetConfig, build_network


def _net():
    torch.manual_seed(0)
    return build_network(5, 2, NetConfig(kind="topk", n_experts=4, top_k=2, hidden=(8, 8), gate_hidden=(8,)))


def test_a_gate_fixed_by_hand_routes_every_state_to_its_two_experts() -> None:
    net = _net()
    with torch.no_grad():
        net.gate.logits.weight.zero_()
        net.gate.logits.bias.copy_(torch.tensor([0.0, 1.0, 5.0, 4.0]))  # every state: experts 2 and 3
    out = net(torch.randn(64, 5))
    assert routed_shares(out, 4).tolist() == [0.0, 0.0, 0.5, 0.5]
    # a batch routed to known experts: 3 rows to expert 0, 1 to expert 1, 2 to expert 3 (-1: padding)
    out = out._replace(indices=torch.tensor([[0, 1], [0, 3], [0, 3], [-1, -1]]))
    assert routed_shares(out, 4).tolist() == pytest.approx([3 / 6, 1 / 6, 0.0, 2 / 6])


def test_movement_is_each_experts_relative_weight_change() -> None:
    net = _net()
    before = expert_vectors(net)
    assert before.shape[0] == 4
    with torch.no_grad():
        for w in (*net.experts.weights, *net.experts.biases):
            w[2].mul_(1.5)  # expert 2 scaled by 1.5: moved by half its norm
    got = movement(before, expert_vectors(net))
    assert got.tolist() == pytest.approx([0.0, 0.0, 0.5, 0.0])


def test_a_tiny_runs_experts_json(tmp_path: Path) -> None:
    from rl_moe.crl import main as crl
    from rl_moe.experts import main
    from tests.conftest import CLI_TINY

    run = tmp_path / "run"
    assert crl(["--suite", "smoke", "--method", "topk", "--tasks", "2", "--steps-per-task", "256", *CLI_TINY, "--run-dir", str(run)]) == 0
    assert main([str(run), "--steps", "20"]) == 0
    data = json.loads((run / "experts.json").read_text())
    e = data["n_experts"]
    assert data["tasks"] == ["pendulum-0", "pendulum-1"] and data["checkpoints"] == [0, 1] and e == 4
    for row in data["shares"]:
        for cell in row:
            assert len(cell) == e and sum(cell) == pytest.approx(1.0) and min(cell) >= 0
    assert data["movement"][0] is None and len(data["movement"][1]) == e and max(data["movement"][1]) > 0
    assert data["states"][0][0] > 0 and data["scored_by"]["tool"] == "python -m rl_moe.experts"
    assert main([str(tmp_path / "nothing")]) == 2


def test_the_report_draws_each_methods_expert_usage(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from rl_moe.crl import main as crl
    from rl_moe.experts import main
    from rl_moe.report.__main__ import main as report
    from rl_moe.report.loading import read_experts
    from rl_moe.report.runs import ReportError
    from tests.conftest import CLI_TINY

    runs = tmp_path / "runs"
    for method in ("topk", "sphere"):
        run = runs / "smoke" / f"ppo-{method}-crl-s0"
        assert crl(["--suite", "smoke", "--method", method, "--tasks", "2", "--steps-per-task", "256", *CLI_TINY, "--run-dir", str(run)]) == 0
        assert main([str(run), "--steps", "10"]) == 0
    out = tmp_path / "rep"
    assert report([str(runs), "--out", str(out), "--reps", "200"]) == 0
    md = (out / "report.md").read_text()
    assert "the experts each task uses" in md and "topk, seed 0" not in md  # the labels are in the figure, the caption explains it
    png = out / "experts_smoke_ppo_crl.png"
    assert png.read_bytes()[:4] == b"\x89PNG"
    bad = runs / "smoke" / "ppo-topk-crl-s0" / "experts.json"
    data = json.loads(bad.read_text())
    data["shares"][0][0] = data["shares"][0][0][:2]
    bad.write_text(json.dumps(data))
    with pytest.raises(ReportError, match="do not match its 4 experts"):
        read_experts(bad.parent)
