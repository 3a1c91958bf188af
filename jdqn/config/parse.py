"""Typed parsing of config values: JSON dicts (``config.json``) and CLI ``--set`` strings.

The only place that turns strings into config values; everything else gets a validated ``Config``.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any, Literal

from jdqn.config.limits import check_section, field_types
from jdqn.config.sections import Config

# Keys that older config.json files hold and that no longer exist: they chose an implementation
# per GPU kernel (now ``accel.kernels``), never the numbers, so a run written with them resumes
# with the default choice.
RETIRED_KEYS = {"loss": ("projection_impl", "pick_impl"), "optim": ("update_impl",)}


def config_from_dict(raw: dict[str, Any]) -> Config:
    """Build a ``Config`` from a nested dict; unknown sections or keys raise ``ValueError``."""
    sections = {}
    for f in dataclasses.fields(Config):
        section_cls: Any = f.default_factory  # a section dataclass, differs per field
        given = raw.get(f.name, {})
        if not isinstance(given, dict):  # e.g. "train": [] would read as no values at all
            raise ValueError(
                f"section {f.name}: expected an object of keys, got {given!r}; fix: write it "
                f'like "{f.name}": {{"key": value}}'
            )
        values = dict(given)
        for key in RETIRED_KEYS.get(f.name, ()):
            values.pop(key, None)
        hints = field_types(section_cls)
        unknown_keys = sorted(set(values) - set(hints))
        if unknown_keys:
            raise ValueError(
                f"unknown key {f.name}.{unknown_keys[0]}; valid keys of {f.name}: {list(hints)}"
            )
        kwargs = {
            key: _coerce(values[key], annotation, f"{f.name}.{key}")
            for key, annotation in hints.items()
            if key in values
        }
        check_section(f.name, section_cls, kwargs)  # finite, in range: before its own checks
        sections[f.name] = section_cls(**kwargs)
    unknown = set(raw) - set(sections)
    if unknown:
        raise ValueError(f"unknown config section(s) {sorted(unknown)}; valid: {sorted(sections)}")
    return Config(**sections)


def _coerce(value: Any, annotation: Any, name: str) -> Any:
    """Convert a JSON value (or CLI string) to the field's declared type."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        is_none = value is None or (isinstance(value, str) and value.lower() in ("none", "null"))
        if is_none and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        return _coerce(value, non_none[0], name)
    if origin is Literal:
        if value not in args:
            raise ValueError(f"{name}: {value!r} is not one of {list(args)}")
        return value
    if origin is tuple:
        if isinstance(value, str) and value.strip().startswith("["):
            try:
                value = json.loads(value)
            except ValueError:
                raise ValueError(
                    f"{name}: {value!r} is not a JSON list; fix: write it like [64, 64]"
                ) from None
        elif isinstance(value, str):
            value = value.split(",")
        if not isinstance(value, list | tuple):
            raise ValueError(f"{name}: expected a list, e.g. [64, 64]; got {value!r}")
        return tuple(_coerce(v, args[0], name) for v in value)
    if annotation is bool:
        if isinstance(value, str):
            if value.lower() in ("true", "1", "yes", "on"):
                return True
            if value.lower() in ("false", "0", "no", "off"):
                return False
            raise ValueError(f"{name}: expected true/false; got {value!r}")
        return bool(value)
    if annotation in (int, float):
        if isinstance(value, bool):  # JSON true/false is not a number (Python's bool is an int)
            raise ValueError(f"{name}: expected {annotation.__name__}; got {value!r}")
        try:
            number = float(value)
            if annotation is int and not number.is_integer():
                raise ValueError
            return int(number) if annotation is int else number
        except (TypeError, ValueError):
            raise ValueError(f"{name}: expected {annotation.__name__}; got {value!r}") from None
    if annotation is str:
        return str(value)
    return value


def apply_overrides(cfg: Config, overrides: list[str]) -> Config:
    """Apply ``section.field=value`` strings; typed, validated, unknown keys rejected."""
    raw = cfg.to_dict()
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"override {item!r}: use section.field=value, e.g. optim.tau=0.01")
        section, dot, name = key.strip().partition(".")
        if not dot or section not in raw:
            raise ValueError(
                f"override {item!r}: unknown section {section!r}; valid sections: {sorted(raw)}"
            )
        if name not in raw[section]:
            raise ValueError(
                f"override {item!r}: unknown key {key!r}; valid keys of {section}: "
                f"{sorted(raw[section])}"
            )
        section_cls: type = type(getattr(cfg, section))
        raw[section][name] = _coerce(value.strip(), field_types(section_cls)[name], key)
    return config_from_dict(raw)
