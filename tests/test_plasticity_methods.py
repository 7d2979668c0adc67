"""CReLU, deep Fourier features, Normalize-and-Project and TRAC (issue 67): known answers, resume
state, and 2-task runs through the CLI that log each method's metrics."""

from __future__ import annotations

import copy
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


# --- Normalize-and-Project ---------------------------------------------------------------------


def _nap_learner(**nap: object):
    from stable_baselines3.common.env_util import make_vec_env

    from rl_moe.algos import MoEPPO
    from rl_moe.policies import MoEActorCriticPolicy
    from rl_moe.regularizers import NormalizeProject
    from tests.conftest import NETS

    env = make_vec_env("Pendulum-v1", n_envs=1, seed=0)
    kwargs = {"moe": "topk", **NETS["small"], "layer_norm": True}
    reg = NormalizeProject(**nap)
    return MoEPPO(MoEActorCriticPolicy, env, regularizers=[reg], n_steps=64, batch_size=32, n_epochs=2, learning_rate=1e-2, seed=0, device="cpu", policy_kwargs=kwargs), reg


def _matrix_norms(net: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Per matrix of the actor, by brute force: each expert's slice, each Linear weight."""
    out = {}
    for name, p in net.named_parameters():
        if name.startswith("experts.weights."):
            out[name] = torch.stack([p[e].detach().pow(2).sum().sqrt() for e in range(p.shape[0])])
        elif name.startswith("gate.") and name.endswith(".weight") and p.dim() == 2:
            out[name] = p.detach().pow(2).sum().sqrt()
    return out


def test_nap_projects_a_hand_made_matrix_back_to_its_initial_norm() -> None:
    from rl_moe.regularizers import NormalizeProject

    model, reg = _nap_learner()
    w = model.policy.actor_net.experts.weights[0]
    with torch.no_grad():
        w[0].zero_()
        w[0, 0, :2] = torch.tensor([3.0, 4.0])  # norm 5
        w[1].zero_()
        w[1, 1, 0] = 2.0  # norm 2
    reg = NormalizeProject()
    reg.on_training_start(model)
    with torch.no_grad():
        w.mul_(torch.tensor([2.0, 0.5] + [1.0] * (w.shape[0] - 2))[:, None, None])  # norms 10, 1
    reg.after_update(model, "ppo")
    assert torch.allclose(w[0, 0, :2], torch.tensor([3.0, 4.0])) and torch.allclose(w[1, 1, 0], torch.tensor(2.0))
    logs = reg.logs()
    n = sum(t.numel() for t in _matrix_norms(model.policy.actor_net).values()) - model.policy.actor_net.n_experts - 1  # no heads, no logits
    assert logs["nap_norm_growth_max"] == pytest.approx(1.0) and logs["nap_norm_growth"] == pytest.approx(0.5 / n)


def test_nap_settings_containers_log_windows_and_a_state_before_training() -> None:
    from rl_moe.regularizers.nap import NaPConfig, NormalizeProject, projected_weights

    assert NormalizeProject(NaPConfig(target="both", heads=True)).config == NaPConfig(target="both", heads=True)  # not the defaults
    model, reg = _nap_learner()
    net = model.policy.actor_net
    # the gate's logits are found by their own name, however deep the network sits
    names = {id(p): n for n, p in net.named_parameters()}
    alone = [names[id(w)] for w, _ in projected_weights(net, heads=False)]
    wrapped = [names[id(w)] for w, _ in projected_weights(torch.nn.Sequential(torch.nn.ModuleDict({"actor": net})), heads=False)]
    assert wrapped == alone and not any("logits" in n for n in alone)
    # each log is the mean over the steps since the last one, not since the first
    reg.on_training_start(model)
    w = net.experts.weights[0]
    n = sum(t.numel() for t in _matrix_norms(net).values()) - net.n_experts - 1  # no heads, no logits
    means = []
    for grow in (2.0, 4.0):
        with torch.no_grad():
            w[0].mul_(grow)
        reg.after_update(model, "ppo")
        means.append(reg.logs()["nap_norm_growth"])
    assert means == [pytest.approx((2.0 - 1.0) / n), pytest.approx((4.0 - 1.0) / n)]
    assert reg.logs() == {}  # nothing since the last log
    # a state saved before training starts has no norms; each saved norm goes to its weight's device

    class Spy:
        def __init__(self) -> None:
            self.to_args: list[object] = []

        def to(self, *args: object) -> "Spy":
            self.to_args.append(args)
            return self

    fresh = NormalizeProject()
    fresh.load_state_dict({}, model.policy)
    assert fresh._init == {}
    spy = Spy()
    name = next(iter(reg.state_dict(model.policy)["init"]))
    fresh.load_state_dict({"init": {name: spy}}, model.policy)
    assert spy.to_args == [(dict(model.policy.named_parameters())[name].device,)]


@pytest.mark.parametrize("heads", [False, True])
def test_nap_norms_after_training_equal_the_norms_at_init(heads: bool) -> None:
    model, reg = _nap_learner(heads=heads)
    net = model.policy.actor_net
    assert net.cfg.layer_norm
    before = _matrix_norms(net)
    weights = {k: v.detach().clone() for k, v in net.named_parameters()}
    model.learn(128)
    after = _matrix_norms(net)
    head = f"experts.weights.{len(net.experts.weights) - 1}"
    for name in before:
        assert not torch.equal(weights[name], dict(net.named_parameters())[name])  # trained
        if name == head or name == "gate.logits.weight":
            assert torch.allclose(after[name], before[name], rtol=1e-5) == heads, name
        else:
            assert torch.allclose(after[name], before[name], rtol=1e-5, atol=0), name


def test_nap_keeps_its_initial_norms_across_a_resume(tmp_path: Path) -> None:
    from rl_moe.continual.state_files import load_regularizer_state, save_regularizer_state

    a, _ = _nap_learner()
    a.learn(64)
    save_regularizer_state(tmp_path / "reg.pt", a.regularizer_state())
    b, reg = _nap_learner()
    with torch.no_grad():
        for p in b.policy.parameters():
            p.mul_(3.0)  # a learner whose weights now have other norms
    b.load_regularizer_state(load_regularizer_state(tmp_path / "reg.pt"))
    b.learn(64)
    saved = a.regularizer_state()["0:nap"]["init"]
    assert b.regularizer_state()["0:nap"]["init"].keys() == saved.keys()
    now = _matrix_norms(b.policy.actor_net)
    for name, norms in saved.items():
        assert torch.allclose(now[name.split("actor_net.")[-1]], norms, rtol=1e-5), name


def test_smoke_run_of_nap_logs_its_norm_growth(tmp_path: Path) -> None:
    tags = _run(tmp_path, "smoke", "nap")
    assert len(tags["train/nap_norm_growth"]) >= 2 and max(tags["train/nap_norm_growth_max"]) > 0


# --- TRAC --------------------------------------------------------------------------------------


def _erfi(x: float) -> float:
    """erfi by its power series 2/sqrt(pi) sum_k x^(2k+1) / (k! (2k+1)), summed to convergence."""
    return 2 / math.sqrt(math.pi) * sum(x ** (2 * k + 1) / (math.factorial(k) * (2 * k + 1)) for k in range(60))


def _trac_steps(opt, theta: torch.Tensor, n: int) -> list[list[float]]:
    out = []
    for _ in range(n):
        opt.zero_grad()
        (1.0 * theta).sum().backward()  # f(theta) = theta: g = 1 at every point
        opt.step()
        out.append(theta.detach().tolist())
    return out


def test_trac_scale_on_a_linear_loss_matches_the_hand_computed_tuners() -> None:
    from rl_moe.algos.trac import TRAC

    theta = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    # Adam with eps 0 on a constant gradient steps exactly lr: its iterate is 0, -0.1, -0.2, -0.3.
    # Two tuners and s_prior 1: the paper's s_j = s_prior erfi(.) / erfi(1/sqrt(2)) (not s_prior / n).
    opt = TRAC([theta], lr=0.1, betas_trac=(0.9, 0.5), s_prior=1.0, trac_eps=1e-8, eps=0.0)
    assert opt.param_groups is opt.base.param_groups  # a learning rate set on TRAC reaches Adam
    got = _trac_steps(opt, theta, 3)
    unit = _erfi(1 / math.sqrt(2))
    # step 1: h = <g, base - ref> = 0, so S = 0 and theta = ref = 0
    # step 2: h = -0.1: v_j = 0.01, sigma_j = 0.1 for both betas; each tuner's argument is
    # 0.1 / sqrt(0.02) = 1/sqrt(2) (less eps), so s_j ~ s_prior and S ~ 2
    s2 = 2 * _erfi(0.1 / (math.sqrt(0.02) + 1e-8)) / unit
    assert s2 == pytest.approx(2.0, rel=1e-6)
    # step 3: h = -0.2: v_j = beta_j^2 0.01 + 0.04, sigma_j = beta_j 0.1 + 0.2
    s3 = sum(_erfi((b * 0.1 + 0.2) / (math.sqrt(2 * (b * b * 0.01 + 0.04)) + 1e-8)) for b in (0.9, 0.5)) / unit
    assert got[0] == [0.0]
    assert got[1][0] == pytest.approx(s2 * -0.2, rel=1e-9)
    assert got[2][0] == pytest.approx(s3 * -0.3, rel=1e-9)
    assert opt.logs()["trac_scale"] == pytest.approx(s3, rel=1e-9)


def test_trac_plays_theta_ref_when_its_scale_is_negative() -> None:
    """The authors' code plays theta_ref + max(S, 0) (theta_base - theta_ref); the log keeps S."""
    from rl_moe.algos.trac import TRAC

    theta = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    opt = TRAC([theta], lr=0.1, betas_trac=(0.9, 0.5), s_prior=1.0, trac_eps=1e-8, eps=0.0)
    for sign in (1.0, -1.0):  # g = +1 moves Adam's iterate to -0.1; then g = -1 gives h = +0.1 > 0
        opt.zero_grad()
        (sign * theta).sum().backward()
        opt.step()
    # step 2: v_j = 0.01, sigma_j = -0.1, so S = -2 erfi(0.1 / (sqrt(0.02) + eps)) / erfi(1/sqrt(2)) < 0
    s2 = -2 * _erfi(0.1 / (math.sqrt(0.02) + 1e-8)) / _erfi(1 / math.sqrt(2))
    assert opt.logs()["trac_scale"] == pytest.approx(s2, rel=1e-9)
    assert theta.item() == 0.0  # theta_ref, not theta_ref + S (theta_base - theta_ref)


def _signed_steps(opt, theta: torch.Tensor, signs: list[float]) -> list[float]:
    out = []
    for sign in signs:
        opt.zero_grad()
        (sign * theta).sum().backward()
        opt.step()
        out.append(float(theta.detach().sum()))
    return out


def test_the_authors_recovered_displacement_equals_ours_while_s_is_large() -> None:
    """On the linear loss S is about 2 from the second step: (theta - ref) / (S + eps) is Adam's
    iterate to within eps / S, so both variants play the same points to 1e-7."""
    from rl_moe.algos.trac import TRAC, AuthorsTRAC

    kw = dict(lr=0.1, betas_trac=(0.9, 0.5), s_prior=1.0, trac_eps=1e-8, eps=0.0)
    a, b = (torch.nn.Parameter(torch.zeros(1, dtype=torch.float64)) for _ in range(2))
    ours, theirs = TRAC([a], **kw), AuthorsTRAC([b], **kw)
    assert (theirs.displacement, float(theirs.trac["sigma"][0])) == ("recovered", 1e-8)
    got_ours, got_theirs = _trac_steps(ours, a, 4), _trac_steps(theirs, b, 4)
    for x, y in zip(got_ours[1:], got_theirs[1:]):
        assert y[0] == pytest.approx(x[0], rel=1e-7)


def test_the_authors_trac_sticks_at_theta_ref_once_s_falls_below_0_and_ours_recovers() -> None:
    """One tuner: g = +1 then g = -1 drive S below 0 (the test above). Then the gradient points one
    way for good. The recovered displacement is 0 at theta_ref, so every later h is 0 and S keeps
    its sign: the authors' variant plays theta_ref at every step. Ours keeps Adam's iterate, whose
    h turns S positive again, and leaves theta_ref."""
    from rl_moe.algos.trac import TRAC, AuthorsTRAC

    kw = dict(lr=0.1, betas_trac=(0.9,), s_prior=1.0, trac_eps=1e-8, eps=0.0)
    signs = [1.0, -1.0] + [1.0] * 40
    a, b = (torch.nn.Parameter(torch.zeros(1, dtype=torch.float64)) for _ in range(2))
    ours, theirs = TRAC([a], **kw), AuthorsTRAC([b], **kw)
    got_ours, got_theirs = _signed_steps(ours, a, signs), _signed_steps(theirs, b, signs)
    assert got_theirs[1] == got_ours[1] == 0.0 and theirs.logs()["trac_scale"] <= 0.0
    assert all(x == 0.0 for x in got_theirs[1:])  # stuck at theta_ref
    assert ours.logs()["trac_scale"] > 0 and got_ours[-1] < -0.1  # moved on, downhill


def test_trac_rebuilt_for_a_grown_network_carries_its_tuners_and_adams_state() -> None:
    """rebuild_optimizers (plasticity injection) keeps what TRAC holds; a parameter that joins
    starts at its own value, and the old parameter's trajectory goes on as if nothing grew."""
    from rl_moe.algos.trac import TRAC
    from rl_moe.policies.structure import rebuilt_optimizer

    a, a2 = (torch.nn.Parameter(torch.zeros(1, dtype=torch.float64)) for _ in range(2))
    grown = torch.nn.Parameter(torch.full((2,), 0.5, dtype=torch.float64))
    first, second = TRAC([a], lr=0.1, s_prior=1.0, betas_trac=(0.9, 0.5)), TRAC([a2], lr=0.1, s_prior=1.0, betas_trac=(0.9, 0.5))
    _trac_steps(first, a, 3)
    _trac_steps(second, a2, 3)
    rebuilt = rebuilt_optimizer(first, [a, grown])
    assert isinstance(rebuilt, TRAC) and rebuilt.trac["betas"].tolist() == [0.9, 0.5] and rebuilt.trac["s_prior"] == 1.0
    assert torch.equal(rebuilt.trac["sigma"], first.trac["sigma"]) and rebuilt.base.state[a] is first.base.state[a]
    assert torch.equal(rebuilt.state[grown]["ref"], grown.detach()) and torch.equal(rebuilt.state[grown]["base"], grown.detach())
    assert rebuilt.param_groups[0]["params"] == [a, grown] and rebuilt.param_groups[0]["lr"] == 0.1
    assert _trac_steps(rebuilt, a, 3) == _trac_steps(second, a2, 3)  # grown has no gradient: a's steps are unchanged
    from rl_moe.algos.trac import AuthorsTRAC

    theirs = AuthorsTRAC([a2], lr=0.1)
    again = rebuilt_optimizer(theirs, [a2, grown])
    assert (again.displacement, again._settings, again.base.defaults["lr"]) == ("recovered", theirs._settings, 0.1)


def test_trac_state_dict_resumes_the_same_trajectory() -> None:
    from rl_moe.algos.trac import TRAC

    def fresh(value: float) -> tuple[torch.nn.Parameter, TRAC]:
        theta = torch.nn.Parameter(torch.full((3,), value, dtype=torch.float64))
        return theta, TRAC([theta], lr=0.05, s_prior=1.0)

    a, opt_a = fresh(1.0)
    _trac_steps(opt_a, a, 4)
    b, opt_b = fresh(7.0)  # other weights, other reference point
    with torch.no_grad():
        b.copy_(a)
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))  # as the in-task checkpoint does
    assert _trac_steps(opt_b, b, 3) == _trac_steps(opt_a, a, 3)


@pytest.mark.parametrize("algo", ["ppo", "td3"])
@pytest.mark.parametrize("method", ["trac", "trac_authors"])
def test_the_trac_method_builds_its_learners_optimizers_around_adam(algo: str, method: str) -> None:
    from rl_moe.algos.trac import TRAC
    from rl_moe.continual.agents import build_model
    from rl_moe.continual.resolve import RunRequest, resolve, suite_of
    from rl_moe.envs.factories import make_vec_env, task_factories
    from rl_moe.policies import policy_roles

    cfg = resolve(RunRequest(suite="smoke", algo=algo, method=method, tasks=1, steps_per_task=64, preset="tiny"))
    suite = suite_of(cfg)
    model = build_model(cfg, make_vec_env(task_factories(suite, suite.tasks[0], 1, 0), "dummy"), "cpu")
    opts = {name: role.optimizer for name, role in policy_roles(model.policy).items()}
    assert all(isinstance(o, TRAC) for o in opts.values())
    assert {o.displacement for o in opts.values()} == {"kept" if method == "trac" else "recovered"}
    assert opts["actor"].base.defaults["eps"] == (1e-5 if algo == "ppo" else 1e-8)  # SB3's Adam settings kept


def test_smoke_run_of_trac_logs_its_scale(tmp_path: Path) -> None:
    tags = _run(tmp_path, "smoke", "trac")
    scale = tags["train/trac_scale"]
    assert len(scale) >= 2 and 0 < scale[0] < scale[-1]


def test_a_td3_run_of_trac_logs_each_optimizers_scale(tmp_path: Path) -> None:
    tags = _run(tmp_path, "smoke", "trac", "--algo", "td3", "--set", "td3.learning_starts=32")
    assert tags["train/trac_scale_actor"] and tags["train/trac_scale_critic"]


# --- MetaWorld ---------------------------------------------------------------------------------

#: Each method's own tags (the activations' are the probe's metrics over their widened features).
OWN_TAGS = {
    "crelu": "plasticity/dormant_ratio",
    "fourier": "plasticity/feature_erank",
    "nap": "train/nap_norm_growth",
    "trac": "train/trac_scale",
}


@pytest.mark.slow  # MetaWorld's 500-step evaluation episodes: about 30 s a run
@pytest.mark.parametrize("method", list(OWN_TAGS))
def test_a_two_task_cw10_tiny_run_logs_the_methods_metrics(tmp_path: Path, method: str) -> None:
    pytest.importorskip("metaworld")
    tags = _run(tmp_path, "cw10", method, "--set", "eval.n_episodes=1", "--set", "eval.matrix_episodes=1", "--set", "eval.n_envs=1")
    assert tags[OWN_TAGS[method]] and all(math.isfinite(v) for v in tags[OWN_TAGS[method]])
