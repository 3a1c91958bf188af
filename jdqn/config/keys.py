"""The ``--set`` keys: every config field with its type, value and the one-line description
its declaration carries (the comment on the field's line and any comment lines just above it),
read from the section dataclasses' source, so the list cannot drift from the fields."""

from __future__ import annotations

import dataclasses
import inspect
import io
import json
import tokenize
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from jdqn.config.limits import field_types
from jdqn.config.sections import Config


@dataclass(frozen=True)
class ConfigKey:
    """One ``section.field`` key."""

    key: str  # "optim.learning_rate"
    type: str  # "float", "int | None", "tuple[int, ...]", "str"
    value: Any  # its value in the config listed (JSON-ready)
    description: str  # one line, from the field's comments; "" when it has none


def config_keys(cfg: Config | None = None) -> list[ConfigKey]:
    """Every key of ``cfg`` (default: the dataclass defaults), in declaration order."""
    cfg = cfg if cfg is not None else Config()
    raw = cfg.to_dict()
    keys = []
    for section in raw:
        section_cls: type = type(getattr(cfg, section))
        comments = field_comments(section_cls)
        for name, annotation in field_types(section_cls).items():
            description = comments.get(name, "") + _choices(annotation)
            key = f"{section}.{name}"
            keys.append(ConfigKey(key, type_name(annotation), raw[section][name], description))
    return keys


def field_comments(section_cls: Any) -> dict[str, str]:
    """Field name -> its comments (lines just above, then the one on its line), one line."""
    source = inspect.getsource(section_cls)
    comments = {  # line number -> comment text
        token.start[0]: token.string.lstrip("#").strip()
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    }
    names = {f.name for f in dataclasses.fields(section_cls)}
    found: dict[str, str] = {}
    above: list[str] = []  # the comment-only lines just above the current one
    for number, line in enumerate(source.splitlines(), start=1):
        if line.lstrip().startswith("#") and number in comments:
            above.append(comments[number])
            continue
        name = line.strip().split(":", 1)[0]
        if name in names and name not in found and line.startswith("    " + name):
            found[name] = " ".join(above + ([comments[number]] if number in comments else []))
        above = []
    return found


def _choices(annotation: Any) -> str:
    if typing.get_origin(annotation) is Literal:
        return f" (one of: {', '.join(str(a) for a in typing.get_args(annotation))})"
    return ""


def type_name(annotation: Any) -> str:
    """A field's type as a user writes it (a Literal is a str; its choices join the
    description)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return "str"
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is tuple:
        return f"tuple[{type_name(args[0])}, ...]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))


def format_keys(keys: list[ConfigKey]) -> str:
    """An aligned table: key, type, value, description."""
    rows = [("key", "type", "value", "description")] + [
        (k.key, k.type, json.dumps(k.value), k.description) for k in keys
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join("  ".join([*map(str.ljust, row[:3], widths), row[3]]) for row in rows)
