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
    for section_field in dataclasses.fields(Config):
        section_cls = type(getattr(cfg, section_field.name))
        comments = field_comments(section_cls)
        for f in dataclasses.fields(section_cls):
            keys.append(
                ConfigKey(
                    key=f"{section_field.name}.{f.name}",
                    type=type_name(f.type),
                    value=raw[section_field.name][f.name],
                    description=comments.get(f.name, "") + _choices(f.type),
                )
            )
    return keys


def field_comments(section_cls: type) -> dict[str, str]:
    """Field name -> its comments (lines above, then the one on its line), one line."""
    source = inspect.getsource(section_cls)
    comments: dict[int, str] = {}  # line number -> comment text
    code_lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
        elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code_lines.add(token.start[0])
    names = {f.name for f in dataclasses.fields(section_cls)}  # type: ignore[arg-type]
    found: dict[str, str] = {}
    lines = source.splitlines()
    for number, line in enumerate(lines, start=1):
        name = line.strip().split(":", 1)[0]
        if name not in names or name in found or not line.startswith("    " + name):
            continue
        above: list[str] = []
        previous = number - 1
        while previous in comments and previous not in code_lines:
            above.insert(0, comments[previous])
            previous -= 1
        own = [comments[number]] if number in comments else []
        found[name] = " ".join(above + own)
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
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True))
        + "  "
        + row[3]
        for row in rows
    )
