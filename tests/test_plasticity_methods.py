"""CReLU, deep Fourier features, Normalize-and-Project and TRAC (issue 67): known answers, resume
state, and 2-task runs through the CLI that log each method's metrics."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from rl_moe.crl import main
from rl_moe.nn import NetConfig, build_network
from rl_moe.nn.activations import crelu, fourier
from rl_moe.nn.experts import StackedExperts
from rl_moe.nn.gate import GateMLP
from rl_moe.nn.ssmoe import gate_directions
from tests.conftest import CLI_TINY


def _tags(run: Path) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _run(tmp_path: Path, suite: str, method: str, *extra: str) -> dict[str, list[float]]:
    out = tmp_path / "runs"
    argv = ["--suite", suite, "--method", method, "--tasks", "2", "--steps-per-task", "128", *CLI_TINY, "--out", str(out), *extra]
    assert main(argv) == 0
    (run,) = [p for p in out.glob("*/*") if p.is_dir()]
    return _tags(run)


# --- activations -------------------------------------------------------------------------------


def test_crelu_and_fourier_known_values() -> None:
    z = torch.tensor([[-1.0, 0.0, 2.0]])
    assert torch.equal(crelu(z), torch.tensor([[0.0, 0.0, 2.0, 1.0, 0.0, 0.0]]))
    got = fourier(torch.tensor([[0.0, math.pi / 2, math.pi]]))
    want = torch.tensor([[0.0, 1.0, 0.0, 1.0, 0.0, -1.0]])
    assert torch.allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("activation", ["crelu", "fourier"])
def test_a_widening_activation_doubles_the_next_layers_inputs_and_gives_the_hand_computed_output(activation: str) -> None:
    stack = StackedExperts(1, 2, (2,), 1, activation)
    assert [tuple(w.shape) for w in stack.weights] == [(1, 2, 2), (1, 4, 1)]  # H = 2 linear units, 2H features
    with torch.no_grad():
        stack.weights[0].copy_(torch.tensor([[[1.0, 0.0], [0.0, -1.0]]]))
        stack.biases[0].copy_(torch.tensor([[0.5, 0.0]]))
        stack.weights[1].copy_(torch.tensor([[[1.0], [2.0], [3.0], [4.0]]]))
        stack.biases[1].fill_(0.25)
    x = torch.tensor([[1.0, 2.0]])  # z = (1.5, -2)
    sp = stack(x, (1,), None)
    if activation == "crelu":
        features, out = [1.5, 0.0, 0.0, 2.0], 1.5 + 4 * 2.0 + 0.25
    else:
        features = [math.sin(1.5), math.sin(-2.0), math.cos(1.5), math.cos(-2.0)]
        out = features[0] + 2 * features[1] + 3 * features[2] + 4 * features[3] + 0.25
    assert torch.allclose(sp.pre[0], torch.tensor([[1.5, -2.0]]))
    assert torch.allclose(sp.hidden[0], torch.tensor([features]), atol=1e-6)
    assert torch.allclose(sp.out, torch.tensor([[out]]), atol=1e-6)
    assert torch.allclose(stack.forward_all(x).out, sp.out, atol=1e-6)  # the static-shape layout agrees


def test_the_crelu_gate_embedding_is_twice_its_width_and_its_linear_pull_back_folds_the_halves() -> None:
    cfg = NetConfig(activation="crelu", gate_hidden=(3,), n_experts=4)
    gate = GateMLP(5, 4, cfg)
    emb, logits = gate(torch.randn(7, 5))
    assert emb.shape == (7, 6) and logits.shape == (7, 4) and gate.logits.weight.shape == (4, 6)
    # ReLU taken as the identity: [z, -z] -> W_logits [z; -z] = (W[:, :3] - W[:, 3:]) z
    w1, wl = gate.body[0].weight, gate.logits.weight
    assert torch.allclose(gate_directions(gate), (wl[:, :3] - wl[:, 3:]) @ w1)


@pytest.mark.parametrize("kind", ["topk", "ds", "dense_moe", "expert_choice", "soft", "sdmoe", "mlp"])
@pytest.mark.parametrize("activation", ["crelu", "fourier"])
def test_every_widening_kind_runs_forward_and_backward(kind: str, activation: str) -> None:
    net = build_network(5, 3, NetConfig(kind=kind, activation=activation, hidden=(8, 8), gate_hidden=(6,), n_experts=4))
    out = net(torch.randn(7, 5))
    out.out.sum().backward()
    assert out.out.shape == (7, 3) and out.groups[0].expert.hidden[0].shape[1] == 16


@pytest.mark.parametrize("kind", ["dsc", "ssmoe"])
def test_kinds_that_cannot_widen_exit_2_naming_the_valid_activations(tmp_path: Path, capsys: pytest.CaptureFixture, kind: str) -> None:
    assert main(["--suite", "smoke", "--method", kind, "--set", "net.activation=crelu", "--out", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "activation 'crelu'" in err and "valid choices for it: relu, tanh" in err


@pytest.mark.parametrize("method", ["crelu", "fourier"])
def test_the_activation_methods_set_the_actor_and_keep_the_dense_critic(method: str) -> None:
    from rl_moe.continual.agents import net_configs_for
    from rl_moe.continual.resolve import RunRequest, resolve

    nets = net_configs_for(resolve(RunRequest(suite="smoke", method=method, tasks=1, preset="tiny")), 4, 2)
    assert (nets.actor.kind, nets.actor.activation) == ("topk", method)
    assert (nets.critic.kind, nets.critic.activation) == ("mlp", "relu")


@pytest.mark.parametrize("method", ["crelu", "fourier"])
def test_smoke_run_of_an_activation_method_logs_the_probe_over_its_widened_features(tmp_path: Path, method: str) -> None:
    tags = _run(tmp_path, "smoke", method)
    for tag in ("plasticity/dormant_ratio", "plasticity/feature_erank", "spectral/expert_stable_rank"):
        assert tag in tags and all(math.isfinite(v) for v in tags[tag])
