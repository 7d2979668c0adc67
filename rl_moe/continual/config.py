"""The whole configuration of a continual run, as frozen dataclasses saved to ``config.json``.

``--set section.field=value`` overrides any field (e.g. ``--set ppo.n_steps=64``,
``--set net.hidden=32,32``, ``--set reg.sphere.rho=0.01``); the value is parsed by the field's type.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rl_moe.atomic import write_json_atomic
from rl_moe.continual.intask import CheckpointSettings
from rl_moe.continual.learners import LEARNERS, PPOConfig, TD3Config, get_learner
from rl_moe.continual.methods import METHODS
from rl_moe.continual.networks import LAMBDA_ARITHMETICS, NETWORKS, arithmetic_name, network_name
from rl_moe.continual.values import dataclass_from_dict, jsonable, parse_value
from rl_moe.diagnostics.probe import ProbeConfig
from rl_moe.envs.suite_spec import current_task_fields
from rl_moe.envs.suites import Suite, suite_from_dict
from rl_moe.errors import UsageError, check_choice
from rl_moe.nn import NetConfig
from rl_moe.regularizers import REGISTRY
from rl_moe.regularizers.options import build_config


@dataclass(frozen=True)
class NetSettings(NetConfig):
    """The run's networks: a :class:`~rl_moe.nn.NetConfig` (its fields and defaults; SPHERE Table 2)
    plus which side carries the method's network.

    The method picks ``kind``, and adds LayerNorm, width and spectral normalization where it has
    them (:class:`~rl_moe.continual.methods.Method`). ``layer_norm`` and ``width_multiplier`` apply
    to the method's network; ``spectral_norm`` normalises every network of the run. Fields are
    checked together once all ``--set`` overrides are in, when the actor and critic configs are
    built (:func:`rl_moe.continual.agents.net_configs_for`).

    :param actor_moe: the actor is the method's network (else dense)
    :param critic_moe: the critic is the method's network; None = algo default (PPO dense
        critic as in the paper; TD3 MoE critics as in its Table 22)
    """

    actor_moe: bool = True
    critic_moe: bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))
        object.__setattr__(self, "gate_hidden", tuple(int(h) for h in self.gate_hidden))

    def network(self, **choices: Any) -> NetConfig:
        """The :class:`NetConfig` of one side: these fields with ``choices`` replacing some."""
        names = {f.name for f in dataclasses.fields(NetConfig)}
        fields = {k: v for k, v in dataclasses.asdict(self).items() if k in names}
        return NetConfig(**{**fields, **choices})


@dataclass(frozen=True)
class EvalSettings:
    """Evaluation schedule (deterministic actions).

    :param evals_per_task: periodic evaluations of the current task per task segment
    :param n_episodes: episodes per periodic evaluation
    :param matrix_episodes: episodes per cell of the tasks x checkpoints success matrix
    :param full_matrix: evaluate every checkpoint on every task; False: own task + final row only
    :param n_envs: parallel eval envs (episodes are split evenly over them)
    :param positions: which positions a task is scored on (:data:`EVAL_POSITIONS`): ``heldout``,
        eval envs with seeds of their own; ``train``, eval envs seeded like the first training
        envs (under MetaWorld's ``fixed`` positions: the training envs' positions, as the SPHERE
        authors' code evaluates); ``both``, the training envs' as the run's success and the
        held-out ones logged beside them (``eval/success_heldout``)
    :param clip_steps: at each task's end, log a clip of this many steps of the task's
        deterministic policy on its first eval position to TensorBoard (``video/<task>``,
        :mod:`rl_moe.recording`); 0 (the default): none. MetaWorld suites, with a headless OpenGL
    :param clip_stride: keep every this-many-th step's frame of the clip
    :param clip_size: the clip's width and height in pixels
    """

    evals_per_task: int = 10
    n_episodes: int = 10
    matrix_episodes: int = 10
    full_matrix: bool = True
    n_envs: int = 5
    positions: str = "heldout"
    clip_steps: int = 0
    clip_stride: int = 4
    clip_size: tuple[int, ...] = (160, 120)


#: ``eval.positions`` choices.
EVAL_POSITIONS: tuple[str, ...] = ("heldout", "train", "both")


def shared_task_fields(tasks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The fields every task of a suite sets alike (MetaWorld's ``position_rule``, ``reward_version``):
    protocol rules, as a suite file's ``task_defaults`` writes them, under today's field names
    (a config stored before a rename says ``positions``)."""
    tasks = [current_task_fields(t) for t in tasks]
    if not tasks:
        return {}
    return {k: v for k, v in tasks[0].items() if k not in ("name", "success_bar") and all(t.get(k) == v for t in tasks)}


def protocol_rules(episode_length: Any, tasks: Sequence[Mapping[str, Any]], learner_settings: Any, eval_positions: str) -> dict[str, Any]:
    """The rules a run's numbers hold under, the one place they are put together (for a run's
    config, :meth:`RunConfig.rules`, and for a suite run unchanged, ``resolve.suite_rules``): the
    episode length, the task fields every task shares (MetaWorld's ``position_rule``,
    ``reward_version``), PPO's gradient clipping and the evaluation's positions."""
    return {
        "episode_length": episode_length,
        "task_fields": shared_task_fields(tasks),
        "grad_clip": learner_settings.grad_clip if isinstance(learner_settings, PPOConfig) else None,
        "eval_positions": eval_positions,
    }


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a run; saved as ``config.json`` and reloaded by ``--resume``.

    :param suite: the ``--suite`` argument (name or path)
    :param suite_data: the resolved suite (so a resumed run does not depend on the file)
    :param tasks: task names trained, in order (a prefix of the suite with ``--tasks``)
    :param algo: a key of :data:`~rl_moe.continual.learners.LEARNERS` (``ppo`` or ``td3``)
    :param method: key of :data:`rl_moe.continual.methods.METHODS`
    :param protocol: ``crl`` (one agent through the tasks) or ``rl`` (fresh init per task)
    :param seed: run seed
    :param steps_per_task: env steps per task
    :param device: ``cpu``, ``cuda`` or ``auto``
    :param vec_env: resolved vectorized-env backend (``dummy``, ``subproc``, ``envpool``, or
        ``auto``: each task's training on the faster of the official envs and the pool, measured at
        its start, :mod:`rl_moe.envs.backend_choice`); a resume may not change it
    :param net: network settings
    :param ppo: PPO settings (resolved preset + overrides)
    :param td3: TD3 settings (resolved preset + overrides)
    :param eval: evaluation settings
    :param probe: plasticity-probe settings (:class:`~rl_moe.diagnostics.probe.ProbeConfig`)
    :param checkpoint: in-task checkpoint intervals (:class:`~rl_moe.continual.intask.CheckpointSettings`)
    :param regularizers: the method's regularizers, name -> typed config (every field stored in
        ``config.json``, so a resumed run is rebuilt from what it ran with)
    :param reference: RL-protocol run folder for forward transfer, or None
    :param preset: the ``--preset`` the run was made with (None: none; the suite's network and
        the default arithmetic). ``config.json`` also names the network and SPHERE's lambda
        arithmetic the settings amount to (:meth:`labels`)
    :param created: UTC timestamp ``YYYYmmdd-HHMMSS``
    :param code: the git commit and dirty flag of the code that created the run
        (:func:`rl_moe.provenance.code_version`); each stretch of training records its own in
        ``results.json`` (``provenance``), since a resume may run other code
    """

    suite: str
    suite_data: Mapping[str, Any]
    tasks: tuple[str, ...]
    algo: str = "ppo"
    method: str = "sphere"
    protocol: str = "crl"
    seed: int = 0
    steps_per_task: int = 1_000_000
    device: str = "auto"
    vec_env: str = "dummy"
    net: NetSettings = field(default_factory=NetSettings)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    td3: TD3Config = field(default_factory=TD3Config)
    eval: EvalSettings = field(default_factory=EvalSettings)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    checkpoint: CheckpointSettings = field(default_factory=CheckpointSettings)
    regularizers: Mapping[str, Any] = field(default_factory=dict)
    reference: str | None = None
    preset: str | None = None
    created: str = ""
    code: Mapping[str, Any] = field(default_factory=dict)

    @property
    def suite_name(self) -> str:
        return str(self.suite_data.get("name", self.suite))

    @functools.cached_property
    def suite_spec(self) -> Suite:
        """The typed suite of ``suite_data``, validated once per config (``suite_data`` is what
        ``config.json`` keeps, so that a resumed run does not depend on the suite file)."""
        return suite_from_dict(self.suite_data, source=self.suite)

    def sections(self) -> dict[str, Any]:
        """The ``--set``-able settings sections by name (the keys of :data:`SECTIONS`)."""
        return {"net": self.net, "ppo": self.ppo, "td3": self.td3, "eval": self.eval, "probe": self.probe, "checkpoint": self.checkpoint}

    @property
    def learner_settings(self) -> Any:
        """The settings section of the run's learner (its ``ppo`` or ``td3`` section)."""
        return self.sections()[get_learner(self.algo).name]

    def rules(self) -> dict[str, Any]:
        """The protocol a run's numbers hold under, written into ``results.json`` so that no
        table mixes protocols: the suite's episode length, the task fields every task shares
        (MetaWorld's ``position_rule``, ``reward_version``), PPO's gradient clipping and the
        evaluation's positions."""
        return protocol_rules(self.suite_data.get("episode_length"), self.suite_data.get("tasks", []), self.learner_settings, self.eval.positions)

    @property
    def effective_steps_per_task(self) -> int:
        """Env steps a task really runs: the learner's whole rollouts (PPO: n_envs * n_steps)."""
        return get_learner(self.algo).steps_per_task(self.learner_settings, self.steps_per_task)

    def labels(self) -> dict[str, str]:
        """What the settings amount to, by name: ``network`` (:data:`~rl_moe.continual.networks.NETWORKS`
        or ``custom``) and, for a method with SPHERE, ``lambda_arithmetic``. Derived, never read
        back: a config of any age is labelled from the fields it stored."""
        out = {"network": network_name(self.net)}
        if "sphere" in self.regularizers:
            out["lambda_arithmetic"] = arithmetic_name(self.regularizers["sphere"])
        return out

    def to_dict(self) -> dict[str, Any]:
        return jsonable({**dataclasses.asdict(self), **self.labels()})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunConfig:
        """Read ``config.json``; the regularizers' stored fields become their typed configs (only
        the method's: files of earlier versions also kept settings the method did not use).
        Fields a file predates take the value its run trained with (:data:`FIELDS_BEFORE_THEY_EXISTED`)."""
        cfg = dataclass_from_dict(cls, {k: v for k, v in data.items() if k != "regularizers"})
        stored = {name: {**FIELDS_BEFORE_THEY_EXISTED.get(name, {}), **dict(kw)} for name, kw in dict(data.get("regularizers") or {}).items()}
        method = METHODS.get(cfg.method)  # an unknown one is the resume checks' to report
        used = [name for name in (method.regularizers if method else ()) if name in stored]
        return dataclasses.replace(cfg, regularizers=regularizer_configs(used, stored))

    def save(self, path: str) -> None:
        """Write ``config.json`` atomically: a kill mid-write never leaves a partial file."""

        write_json_atomic(path, self.to_dict())


#: Regularizer fields whose default changed after runs were recorded without them: the value
#: those runs trained with. SPHERE's lambda arithmetic became the authors' (issue 70); a
#: ``config.json`` without ``norm_eps`` ran with the plain norms.
FIELDS_BEFORE_THEY_EXISTED: dict[str, Mapping[str, Any]] = {"sphere": LAMBDA_ARITHMETICS["ours"]}


def _sphere_sets(arithmetic: str) -> tuple[str, ...]:
    return tuple(f"reg.sphere.{k}={str(v).lower()}" for k, v in LAMBDA_ARITHMETICS[arithmetic].items())


#: ``--preset NAME``: named bundles of ``--set`` overrides, applied before the user's own.
#: ``tiny`` shrinks networks, rollouts and evaluation so a run takes seconds (tests, demos).
#: ``authors`` builds the networks and SPHERE's lambda as the SPHERE authors' code does
#: (sphere-rl/sphere, ``src/algorithms/moe/policies.py`` and ``moe_ppo.py``): Flax's LeCun-normal
#: init on every dense layer, heads and gate logits included, with zero biases; a gate of three
#: hidden layers of 256, as their ``GatingActor(net_arch=(256, 256, 256))``; their gradient norms,
#: sqrt(sum g^2 + 1e-8) divided with + 1e-8, over the actor's log-std as well. Their log-std init
#: (0) and ReLU are already ours. It is what ``cw10``, ``cw20`` and ``hb5`` build with no preset.
#: The KL-adaptive rate (``ppo.target_kl``) is not in it: only their HumanoidBench script sets it
#: (docs/reproduce.md, "Differences from the authors' code"). ``sb3`` is the network before the
#: paper's protocols took the authors' (orthogonal init, a 1 x 256 gate); SPHERE keeps its
#: default (the authors') arithmetic under it. Our former arithmetic is a setting:
#: ``--set reg.sphere.norm_eps=0 --set reg.sphere.log_std_in_theta=false``.
OVERRIDE_PRESETS: dict[str, tuple[str, ...]] = {
    "tiny": (
        "net.hidden=32,32", "net.n_experts=4", "net.gate_hidden=16",
        "ppo.n_envs=2", "ppo.n_steps=64", "ppo.batch_size=64", "ppo.n_epochs=2",
        "td3.learning_starts=100", "td3.batch_size=32", "td3.buffer_size=10000",
        "eval.evals_per_task=2", "eval.n_episodes=2", "eval.matrix_episodes=2", "eval.n_envs=2",
        "probe.n_states=32",
    ),
    "authors": (*NETWORKS["authors"].overrides(), *_sphere_sets("authors")),
    "sb3": NETWORKS["sb3"].overrides(),
}
#: One line per ``--preset`` for ``--list`` and ``--help``.
PRESET_DESCRIPTIONS: dict[str, str] = {
    "tiny": "small networks, rollouts and evaluation: a run takes seconds (tests, demos)",
    "authors": f"{NETWORKS['authors'].description}; SPHERE's lambda with the authors' arithmetic (the default)",
    "sb3": f"{NETWORKS['sb3'].description}",
}


def preset_overrides(name: str, used: tuple[str, ...]) -> tuple[str, ...]:
    """The ``--set`` overrides of preset ``name`` for a method whose regularizers are ``used``:
    a preset's ``reg.<name>.*`` entries apply only where the method has that regularizer, so one
    preset serves every method (``authors`` sets SPHERE's lambda arithmetic and Top-K's network).

    :raises UsageError: for an unknown preset, naming the valid ones
    """
    bundle = OVERRIDE_PRESETS[check_choice(name, tuple(OVERRIDE_PRESETS), "preset")]
    return tuple(o for o in bundle if not o.startswith("reg.") or o.split(".")[1] in used)


#: ``--set`` sections -> dataclass types (``reg`` is handled separately).
SECTIONS: dict[str, type] = {
    "net": NetSettings, **{s.name: s.config_cls for s in LEARNERS.values()}, "eval": EvalSettings, "probe": ProbeConfig,
    "checkpoint": CheckpointSettings,
}  # fmt: skip


def regularizer_fields(name: str) -> dict[str, Any]:
    """The typed settings of regularizer ``name``: field -> type hint of its config dataclass."""

    return typing.get_type_hints(REGISTRY[name].config_class)


def parse_regularizer_override(name: str, field_name: str, text: str, used: tuple[str, ...]) -> Any:
    """Parse ``--set reg.<name>.<field>=<text>`` by the field's type.

    :param used: the regularizers of the run's method (others take no overrides)
    :raises UsageError: for a regularizer the method does not use, an unknown field or a bad value
    """

    key = f"reg.{name}.{field_name}"
    if name not in REGISTRY:
        raise UsageError(f"unknown regularizer {name!r} in --set {key}; valid choices: {', '.join(REGISTRY)}")
    if name not in used:
        raise UsageError(f"--set {key}: this method does not use {name!r}; its regularizers: {', '.join(used) or 'none'}")
    fields = regularizer_fields(name)
    if field_name not in fields:
        raise UsageError(f"unknown --set key {key!r}; valid fields of reg.{name}: {', '.join(fields)}")
    return parse_value(text.strip(), fields[field_name], key)


def regularizer_configs(names: Iterable[str], settings: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The typed config of each regularizer in ``names``, built through its
    ``REGISTRY[name].config_class`` from keyword ``settings`` (a learner's defaults, a suite file,
    ``config.json``); the config's own checks run. The one place regularizer settings become
    configs, for new runs and resumed ones alike.

    :raises UsageError: for an unknown regularizer, field or value
    """
    configs: dict[str, Any] = {}
    for name in names:
        if name not in REGISTRY:
            raise UsageError(f"unknown regularizer {name!r}; valid choices: {', '.join(REGISTRY)}")
        try:
            configs[name] = build_config(REGISTRY[name].config_class, None, dict(settings.get(name, {})), name)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"bad settings for regularizer {name!r}: {exc}") from None
    return configs


def apply_overrides(
    sections: dict[str, Any], regs: Mapping[str, Any], overrides: list[str], used: tuple[str, ...]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Apply ``section.field=value`` strings to section dataclasses and regularizer configs.

    :param sections: section name -> dataclass instance (keys of :data:`SECTIONS`)
    :param regs: regularizer name -> its typed config (:func:`regularizer_configs`); one missing
        here starts from its defaults
    :param overrides: the ``--set`` arguments
    :param used: the method's regularizers: ``reg.*`` values are parsed by the field's type and
        overrides of any other regularizer are an error
    """
    sections, regs = dict(sections), dict(regs)
    valid = ", ".join([f"{s}.<field>" for s in SECTIONS] + ["reg.<regularizer>.<kwarg>"])
    for item in overrides:
        key, sep, text = item.partition("=")
        parts = key.strip().split(".")
        if not sep or len(parts) < 2:
            raise UsageError(f"bad --set {item!r}: expected KEY=VALUE with KEY one of {valid}")
        if parts[0] == "reg":
            if len(parts) != 3:
                raise UsageError(f"bad --set key {key!r}: expected reg.<regularizer>.<kwarg>")
            name = parts[1]
            value = parse_regularizer_override(name, parts[2], text, used)
            base = regs[name] if name in regs else regularizer_configs((name,), {})[name]
            try:
                regs[name] = build_config(type(base), base, {parts[2]: value}, name)
            except ValueError as exc:  # the config's own range checks
                raise UsageError(str(exc)) from None
            continue
        if parts[0] not in SECTIONS or len(parts) != 2:
            raise UsageError(f"unknown --set key {key!r}; valid choices: {valid}")
        cls = SECTIONS[parts[0]]
        hints = typing.get_type_hints(cls)
        names = [f.name for f in dataclasses.fields(cls) if not dataclasses.is_dataclass(hints[f.name])]  # nested ones are not --set
        if parts[1] not in names:
            raise UsageError(f"unknown --set key {key!r}; valid fields of {parts[0]}: {', '.join(names)}")
        value = parse_value(text.strip(), hints[parts[1]], key)
        try:
            sections[parts[0]] = dataclasses.replace(sections[parts[0]], **{parts[1]: value})
        except ValueError as exc:  # the section's own range checks
            raise UsageError(str(exc)) from None
    return sections, regs
