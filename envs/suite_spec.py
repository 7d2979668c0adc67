"""The data of a continual task suite: its tasks and protocol facts, as frozen dataclasses.

Loading and validating suite files is :mod:`rl_moe.envs.suites`; the env families
(:mod:`rl_moe.envs.families`) build envs from a :class:`TaskSpec` and check a :class:`Suite`.
Both import these types from here, below them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: How episode success is decided: ``info`` = ``info["success"]`` at any step (MetaWorld);
#: ``return`` = episode return >= the task's ``success_bar`` (HumanoidBench, smoke).
SUCCESS_TYPES: tuple[str, ...] = ("info", "return")


#: Task fields renamed since suite files and run folders were written: old name -> today's. They
#: are read under either name, from suite files, stored configs and results alike.
#: ``positions`` (MetaWorld's ``fixed``/``resample`` rule) became ``position_rule``, so that it cannot
#: be confused with ``eval.positions`` (which positions a task is scored on).
RENAMED_TASK_FIELDS: dict[str, str] = {"positions": "position_rule"}


def current_task_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """``fields`` (a task, a suite's ``task_defaults`` or a run's recorded ``task_fields``) under
    today's field names (:data:`RENAMED_TASK_FIELDS`)."""
    return {RENAMED_TASK_FIELDS.get(k, k): v for k, v in fields.items()}


@dataclass(frozen=True)
class TaskSpec:
    """One task of a suite.

    :param name: task id shown to users (MetaWorld env name, HumanoidBench gym id, smoke label)
    :param success_bar: episode-return threshold for ``return`` success (None for ``info``)
    :param params: family-specific extra fields (smoke: ``env_id``, ``permutation``, ``action_sign``)
    """

    name: str
    success_bar: float | None = None
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # however it is built, a task holds today's field names (a frozen dataclass: set once here)
        object.__setattr__(self, "params", current_task_fields(self.params))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | str) -> TaskSpec:
        if isinstance(data, str):
            return cls(name=data)
        data = current_task_fields(data)
        name = data.pop("name")
        bar = data.pop("success_bar", None)
        return cls(name=str(name), success_bar=None if bar is None else float(bar), params=data)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, **dict(self.params)}
        if self.success_bar is not None:
            out["success_bar"] = self.success_bar
        return out


@dataclass(frozen=True)
class Suite:
    """A task sequence with its protocol facts.

    :param name: suite name (``cw10``, ...)
    :param family: env family, a key of :data:`~rl_moe.envs.families.FAMILIES`
    :param tasks: the tasks in training order
    :param probe_tasks: held-out tasks (outside the sequence) whose states form the probe batch, in
        equal shares; several tasks so that the batch spans what a policy of the suite meets
    :param steps_per_task: env steps per task of the full protocol (CW: 1M, HB: 10M)
    :param episode_length: steps per episode (CW: 200, HB: 1000)
    :param success_type: one of :data:`SUCCESS_TYPES`
    :param presets: algo -> preset name (an env family whose presets the learner takes)
    :param regularizers: per-suite regularizer kwargs (e.g. SPHERE rho, paper Table 2)
    :param net: per-suite network defaults (:class:`~rl_moe.continual.config.NetSettings` fields,
        e.g. Pendulum-sized layers for the smoke suite), applied before ``--preset`` and ``--set``
    :param network: the named network the suite builds (``authors``, ``sb3``; empty: ``sb3``),
        before its ``net`` defaults (:mod:`rl_moe.continual.networks`)
    :param eval: per-suite evaluation defaults (:class:`~rl_moe.continual.config.EvalSettings`
        fields, e.g. the paper protocol's ``positions``), applied like ``net``
    :param family_module: a module to import before the family is looked up, which registers a
        family of the user's (:func:`~rl_moe.envs.families.register_family`); empty for built-ins
    :param description: one line for ``--help`` and the docs
    :param source: where the suite was loaded from
    """

    name: str
    family: str
    tasks: tuple[TaskSpec, ...]
    probe_tasks: tuple[TaskSpec, ...]
    steps_per_task: int
    episode_length: int
    success_type: str = "info"
    presets: Mapping[str, str] = field(default_factory=dict)
    regularizers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    net: Mapping[str, Any] = field(default_factory=dict)
    network: str = ""
    eval: Mapping[str, Any] = field(default_factory=dict)
    family_module: str = ""
    description: str = ""
    source: str = ""

    @property
    def task_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tasks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "family": self.family,
            **({"family_module": self.family_module} if self.family_module else {}),
            "steps_per_task": self.steps_per_task,
            "episode_length": self.episode_length,
            "success": {"type": self.success_type},
            "probe_tasks": [t.to_dict() for t in self.probe_tasks],
            "presets": dict(self.presets),
            "regularizers": {k: dict(v) for k, v in self.regularizers.items()},
            "net": dict(self.net),
            **({"network": self.network} if self.network else {}),
            "eval": dict(self.eval),
            "tasks": [t.to_dict() for t in self.tasks],
        }
