"""Continual task suites: JSON data files loaded into frozen dataclasses.

The built-in suites (``cw10``, ``cw20``, ``cw10-cw``, ``cw20-cw``, ``hb5``, ``smoke``) ship inside
the package in ``envs/suites/*.json``. A path to any JSON file with the same schema loads a user
suite. ``cw10`` is the SPHERE paper's protocol; until 2026-11-26 that name meant Continual World's
rules, which are ``cw10-cw`` now (:func:`current_suite_name` maps what a run recorded).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from rl_moe.envs.families import FAMILIES, load_family_module
from rl_moe.envs.suite_spec import SUCCESS_TYPES, Suite, TaskSpec, current_task_fields
from rl_moe.errors import UsageError, check_keys

__all__ = [
    "SUCCESS_TYPES", "SUITE_ALIASES", "Suite", "TaskSpec", "builtin_suites", "current_suite_name", "load_suite",
    "suite_from_dict",
]  # fmt: skip

#: Other names of a built-in suite; a run started under one records the suite's own name.
SUITE_ALIASES: dict[str, str] = {"cw10-paper": "cw10"}
#: Built-in names whose rules changed on 2026-11-26 -> the suite that holds their old rules now.
#: Runs recorded under the old name are told apart by their episode length.
RENAMED_SUITES: dict[str, str] = {"cw10": "cw10-cw", "cw20": "cw20-cw"}

def builtin_suites() -> tuple[str, ...]:
    """Names of the suites shipped with the package."""
    folder = resources.files("rl_moe.envs") / "suites"
    return tuple(sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json")))


def _builtin_data(name: str) -> dict[str, Any]:
    ref = resources.files("rl_moe.envs") / "suites" / f"{name}.json"
    return dict(json.loads(ref.read_text()))


def current_suite_name(name: str, episode_length: int | None) -> str:
    """Today's name of the suite a run recorded as ``name``: an alias becomes its suite, and a
    renamed suite's old name becomes the suite holding its old rules when the run's episode
    length is the old one. ``episode_length`` None (a run from before results recorded their
    rules, so from before the rename) counts as the old rules."""
    if name in SUITE_ALIASES:  # never renamed: an alias's rules are its suite's
        return SUITE_ALIASES[name]
    old = RENAMED_SUITES.get(name)
    if old is None:
        return name
    then = _builtin_data(old)["episode_length"]
    return old if episode_length is None or episode_length == then else name


def _whole(value: Any, name: str) -> int:
    """A JSON integer (``1.5`` or ``"100"`` must not silently become 1 or pass)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    return value


def _probe_tasks(data: Mapping[str, Any]) -> tuple[TaskSpec, ...]:
    """``probe_tasks`` (a list), or the single ``probe_task`` of suite files and run configs
    written before the probe batch spanned several tasks."""
    if "probe_tasks" in data:
        if isinstance(data["probe_tasks"], (str, Mapping)):
            raise TypeError("probe_tasks must be a list of tasks")
        return tuple(TaskSpec.from_dict(t) for t in data["probe_tasks"])
    if "probe_task" in data:
        return (TaskSpec.from_dict(data["probe_task"]),)
    raise KeyError("probe_tasks")


def _with_defaults(task: TaskSpec, defaults: Mapping[str, Any]) -> TaskSpec:
    """``task`` with the suite's ``task_defaults`` beneath its own fields (a protocol rule such as
    MetaWorld's ``position_rule`` written once for the suite; each task keeps it in ``to_dict``)."""
    if not defaults:
        return task
    if "name" in defaults or "success_bar" in defaults:
        raise ValueError("task_defaults may not set name or success_bar")
    return dataclasses.replace(task, params={**current_task_fields(defaults), **task.params})


#: Top-level keys of a suite file (``probe_task``: files written before ``probe_tasks``).
SUITE_KEYS: tuple[str, ...] = (
    "name", "description", "family", "family_module", "steps_per_task", "episode_length", "success", "task_defaults",
    "probe_tasks", "probe_task", "presets", "regularizers", "net", "network", "eval", "tasks",
)  # fmt: skip
#: Keys of a suite's ``success`` object.
SUCCESS_KEYS: tuple[str, ...] = ("type",)


def _check_fields(suite: Suite, where: str) -> None:
    """Each task's own fields are ones its family reads (``name``, ``success_bar`` and the
    family's :attr:`~rl_moe.envs.families.EnvFamily.task_fields`)."""
    family = FAMILIES[suite.family]
    for t in (*suite.tasks, *suite.probe_tasks):
        check_keys(t.params, ("name", "success_bar", *family.task_fields), "field", f" of {family.name} task {t.name!r}{where}")


def suite_from_dict(data: Mapping[str, Any], source: str = "") -> Suite:
    """Validate and build a :class:`Suite`; raises :class:`UsageError` naming the bad field."""
    where = f" in {source}" if source else ""
    if isinstance(data, Mapping):
        check_keys(data, SUITE_KEYS, "suite key", where)
        if isinstance(data.get("success"), Mapping):
            check_keys(data["success"], SUCCESS_KEYS, "key", f" of success{where}")
    try:
        family = data["family"]
        defaults = dict(data.get("task_defaults", {}))
        tasks = tuple(_with_defaults(TaskSpec.from_dict(t), defaults) for t in data["tasks"])
        probe = tuple(_with_defaults(t, defaults) for t in _probe_tasks(data))
        success_type = data.get("success", {}).get("type", "info")
        suite = Suite(
            name=str(data["name"]),
            family=str(family),
            tasks=tasks,
            probe_tasks=probe,
            steps_per_task=_whole(data["steps_per_task"], "steps_per_task"),
            episode_length=_whole(data["episode_length"], "episode_length"),
            success_type=str(success_type),
            presets=dict(data.get("presets", {})),
            regularizers={k: dict(v) for k, v in data.get("regularizers", {}).items()},
            net=dict(data.get("net", {})),
            network=str(data.get("network", "")),
            eval=dict(data.get("eval", {})),
            family_module=str(data.get("family_module", "")),
            description=str(data.get("description", "")),
            source=source,
        )
    except KeyError as exc:
        raise UsageError(f"suite{where} lacks the required field {exc.args[0]!r}") from None
    except (TypeError, ValueError, AttributeError) as exc:
        raise UsageError(f"malformed suite{where}: {exc}") from None
    # The name becomes a folder under --out: one plain path component, so no run lands outside it.
    if suite.name in ("", ".", "..") or any(c in suite.name for c in "/\\\0"):
        raise UsageError(f"suite name {suite.name!r}{where} must be one folder name (no '/', '\\', '.' or '..')")
    if suite.family_module and suite.family not in FAMILIES:
        load_family_module(suite.family_module)
    if suite.family not in FAMILIES:
        raise UsageError(f"unknown env family {suite.family!r}{where}; valid choices: {', '.join(FAMILIES)}")
    _check_fields(suite, where)
    if suite.success_type not in SUCCESS_TYPES:
        raise UsageError(f"unknown success type {suite.success_type!r}{where}; valid choices: {', '.join(SUCCESS_TYPES)}")
    if not suite.tasks:
        raise UsageError(f"suite{where} has no tasks")
    if suite.steps_per_task <= 0 or suite.episode_length <= 0:
        raise UsageError(f"suite{where}: steps_per_task and episode_length must be > 0")
    if suite.success_type == "return":
        missing = [t.name for t in (*suite.tasks, *suite.probe_tasks) if t.success_bar is None]
        if missing:
            raise UsageError(f"suite{where} uses return success but tasks {missing} have no success_bar")
    if not suite.probe_tasks:
        raise UsageError(f"suite{where}: probe_tasks is empty; name at least one held-out task")
    inside = [t.name for t in suite.probe_tasks if t.name in suite.task_names]
    if inside:
        raise UsageError(f"suite{where}: the probe tasks {inside} must lie outside the task sequence")
    return suite


def load_suite(name_or_path: str) -> Suite:
    """A built-in suite by name, or a user suite from a JSON file path.

    :param name_or_path: a built-in suite (:func:`builtin_suites`), an alias of one
        (:data:`SUITE_ALIASES`) or a path to a ``.json`` file
    """
    names = builtin_suites()
    name = SUITE_ALIASES.get(name_or_path, name_or_path)
    if name in names:
        return suite_from_dict(_builtin_data(name), source=f"builtin:{name}")
    path = Path(name_or_path)
    if not path.is_file():
        raise UsageError(f"unknown suite {name_or_path!r}; valid choices: {', '.join((*names, *SUITE_ALIASES))} or a path to a suite .json file")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"cannot read suite file {str(path)!r}: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"suite file {str(path)!r} must hold a JSON object")
    return suite_from_dict(data, source=str(path.resolve()))
