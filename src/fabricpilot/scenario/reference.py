"""Every key a scenario file takes, with its default and what it does, read from the
validated models (one source of truth): ``python -m fabricpilot.scenario.reference`` prints
the table ``docs/scenario-keys.md`` holds (a test keeps the two equal).

>>> keys = scenario_keys()
>>> next(k for k in keys if k.path == "topology.nic_rate_gbps").default
'400.0'
>>> next(k for k in keys if k.path == "jobs[].name").default
'required'
>>> next(k for k in keys if k.path == "policies").default
'["ecmp", "ideal"]'
"""

from __future__ import annotations

import json
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from fabricpilot.scenario.models import Scenario

__all__ = ["ScenarioKey", "reference_markdown", "scenario_keys"]


@dataclass(frozen=True)
class ScenarioKey:
    """One key: its path (``jobs[].collectives[].op``), its default as written in a file
    (``required``, ``null`` for unset) and its description."""

    path: str
    default: str
    description: str


def _model_in(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """The model a field holds (itself, in an optional, or as list items), and whether as a
    list."""
    if typing.get_origin(annotation) is list:
        (item,) = typing.get_args(annotation)
        return (item, True) if isinstance(item, type) and issubclass(item, BaseModel) else (
            None, False)
    for arg in typing.get_args(annotation) or (annotation,):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg, False
    return None, False


def _written(field: FieldInfo) -> str:
    """A field's default as a scenario file would write it."""
    value = field.default
    if value is PydanticUndefined and field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    if value is PydanticUndefined:
        return "required"
    try:
        return json.dumps(value)
    except TypeError:  # (a model instance: its section's own defaults)
        return "(see its keys)"


def scenario_keys(model: type[BaseModel] = Scenario, prefix: str = "") -> list[ScenarioKey]:
    """Every leaf key of ``model`` (a section's keys, not the section), in file order."""
    out: list[ScenarioKey] = []
    for name, field in model.model_fields.items():
        sub, many = _model_in(field.annotation)
        if sub is not None:
            out += scenario_keys(sub, f"{prefix}{name}{'[]' if many else ''}.")
            continue
        out.append(ScenarioKey(f"{prefix}{name}", _written(field),
                               " ".join((field.description or "").split())))
    return out


def reference_markdown() -> str:
    """The keys as a Markdown table, by section."""
    lines = ["# Scenario keys", "",
             "Every key a scenario file takes (`fabricpilot validate` refuses any other), "
             "with its default and what it does; units are in the names (`_gbps`, `_ns`, "
             "`_bytes`), and a string may carry its own unit of the same kind. Generated "
             "from the scenario models by `python -m fabricpilot.scenario.reference`.", ""]
    section = None
    for key in scenario_keys():
        top = key.path.split(".", 1)[0] if "." in key.path else ""
        if top != section:
            section = top
            lines += ["", f"## {top or 'top level'}", "", "| key | default | what |",
                      "|---|---|---|"]
        what = key.description.replace("|", "\\|")
        lines.append(f"| `{key.path}` | `{key.default}` | {what} |")
    return "\n".join(lines).replace("\n\n\n", "\n\n") + "\n"


if __name__ == "__main__":  # pragma: no cover - prints the reference
    print(reference_markdown(), end="")
