"""Every regularizer's settings: one typed config dataclass, settable from ``--set reg.<name>.<field>``."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Any

import pytest

from rl_moe.continual.config import apply_overrides, regularizer_fields
from rl_moe.errors import UsageError
from rl_moe.regularizers import REGISTRY, make_regularizer

#: A valid non-default value per field type, written as on the command line.
OTHER: dict[Any, tuple[str, Any]] = {float: ("0.5", 0.5), int: ("3", 3), bool: ("false", False), float | None: ("none", None)}


def _set(name: str, field: str, text: str) -> Any:
    _, regs = apply_overrides({}, {}, [f"reg.{name}.{field}={text}"], used=(name,))
    return dataclasses.asdict(regs[name])[field]


@pytest.mark.parametrize("name", list(REGISTRY))
def test_config_is_the_one_source_of_settings(name: str) -> None:
    cls = REGISTRY[name]
    config_class = cls.config_class
    assert dataclasses.is_dataclass(config_class) and config_class.__dataclass_params__.frozen  # type: ignore[attr-defined]
    assert list(inspect.signature(cls.__init__).parameters) == ["self", "config", "overrides"]  # no defaults of its own
    assert make_regularizer(name).config == config_class()
    hints = typing.get_type_hints(config_class)
    assert regularizer_fields(name) == hints
    for field in dataclasses.fields(config_class):
        hint = hints[field.name]
        if hint is str:  # a choice: target/placement takes "both", the others keep their default
            text = "both" if field.name in ("target", "placement") else field.default
            value = text
        else:
            text, value = OTHER[hint]
        parsed = _set(name, field.name, text)
        assert parsed == value and type(parsed) is type(value), (field.name, parsed)
        assert getattr(make_regularizer(name, **{field.name: parsed}).config, field.name) == value


@pytest.mark.parametrize("name", list(REGISTRY))
def test_bad_settings_are_one_line_errors(name: str) -> None:
    config_class = REGISTRY[name].config_class
    hints = regularizer_fields(name)
    numeric = next((f for f, h in hints.items() if h in (int, float)), None)
    if numeric is not None:  # NaP has no numeric setting
        with pytest.raises(UsageError, match=f"bad value 'abc' for reg.{name}.{numeric}") as err:
            _set(name, numeric, "abc")
        assert "\n" not in str(err.value)
    with pytest.raises(UsageError, match=f"valid fields of reg.{name}: {', '.join(hints)}"):
        _set(name, "nosuchfield", "1")
    with pytest.raises(ValueError, match=f"valid choices: {', '.join(hints)}") as err_kw:
        make_regularizer(name, nosuchfield=1)
    assert "\n" not in str(err_kw.value)
    where = "placement" if "placement" in hints else "target"
    with pytest.raises(ValueError, match=f"unknown {where} 'gate'; valid choices: actor, critic, both") as err_range:
        config_class(**{where: "gate"})
    assert "\n" not in str(err_range.value)


@pytest.mark.parametrize(
    ("name", "kwargs", "message"),
    [
        ("cbp", dict(replacement_rate=1.5), r"replacement_rate must be in \[0, 1\], got 1.5"),
        ("cbp", dict(decay=1.0), r"decay must be in \(0, 1\), got 1.0"),
        ("redo", dict(frequency=0), "frequency must be >= 1, got 0"),
        ("sdmoe", dict(svd_every=0), "svd_every must be >= 1, got 0"),
        ("cchain", dict(window=0), "window must be >= 1, got 0"),
        ("cchain", dict(warmup=-1), "warmup must be >= 0, got -1"),
        ("cbp", dict(replacement_rate=-0.1), r"replacement_rate must be in \[0, 1\], got -0.1"),
        ("cbp", dict(decay=0.0), r"decay must be in \(0, 1\), got 0.0"),
        ("sphere", dict(ratio_every=0), "ratio_every must be >= 1, got 0"),
    ],
)
def test_range_checks_live_in_the_configs(name: str, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        REGISTRY[name].config_class(**kwargs)
    with pytest.raises(ValueError, match=message):
        make_regularizer(name, **kwargs)
    config = REGISTRY[name].config_class()
    assert make_regularizer(name, config=config).config is config


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("cbp", dict(replacement_rate=0.0)),
        ("cbp", dict(replacement_rate=1.0)),
        ("cbp", dict(decay=0.999)),
        ("redo", dict(frequency=1)),
        ("cchain", dict(warmup=0, window=1)),
        ("sdmoe", dict(svd_every=1)),
        ("sphere", dict(ratio_every=1)),
    ],
)
def test_range_checks_admit_their_bounds(name: str, kwargs: dict[str, Any]) -> None:
    """The closed ends of each documented range are valid settings."""
    config = REGISTRY[name].config_class(**kwargs)
    assert all(getattr(config, k) == v for k, v in kwargs.items())


def test_settings_of_the_wrong_json_type_are_refused_naming_the_type() -> None:
    """A suite file's or ``--set``'s value must fit the field: floats take ints, ints refuse
    bools, an optional field also takes null, a str field refuses numbers; the message names the
    regularizer, the field, the type wanted and the value."""
    from rl_moe.errors import check_choice
    from rl_moe.regularizers.options import build_config
    from rl_moe.regularizers.sphere_config import SphereConfig

    assert build_config(SphereConfig, None, {"rho": 1}, "sphere").rho == 1  # an int is a float
    assert build_config(SphereConfig, None, {"alpha": None}, "sphere").alpha is None
    assert build_config(SphereConfig, None, {"alpha": 0.5, "per_expert": True}, "sphere").per_expert is True
    for overrides, message in (
        ({"rho": "abc"}, "sphere option 'rho' must be float, got 'abc'"),
        ({"rho": True}, "sphere option 'rho' must be float, got True"),
        ({"rank_every": True}, "sphere option 'rank_every' must be int, got True"),
        ({"rank_every": 2.5}, "sphere option 'rank_every' must be int, got 2.5"),
        ({"alpha": "x"}, "sphere option 'alpha' must be float or null, got 'x'"),
        ({"per_expert": 1}, "sphere option 'per_expert' must be bool, got 1"),
        ({"coef_mode": 3}, "sphere option 'coef_mode' must be str, got 3"),
    ):
        with pytest.raises(ValueError) as err:
            build_config(SphereConfig, None, overrides, "sphere")
        assert str(err.value) == message
    base = SphereConfig(rho=0.3)
    assert build_config(SphereConfig, base, {}, "sphere") is base
    with pytest.raises(ValueError) as err:
        check_choice("gate", ("actor", "critic", "both"), "placement")
    assert str(err.value) == "unknown placement 'gate'; valid choices: actor, critic, both"
    with pytest.raises(ValueError, match="valid choices: 1, 2$"):
        check_choice(3, (1, 2), "level")
