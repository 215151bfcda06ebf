"""Read a scenario YAML file into a validated :class:`Scenario`, or fail with one clear line.

Every failure (missing file, YAML syntax, wrong shape, a pydantic validation error, a cross
check) becomes a single :class:`~fabricpilot.errors.ScenarioError` about the *first* problem:
``FILE: FIELD: PROBLEM``, where ``FIELD`` is a path such as ``jobs[0].collectives[1].size_bytes``.

Files are read by the YAML 1.2 core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution),
not PyYAML's YAML 1.1 rules: ``010`` is 10 (``0o10`` is octal 8), ``1e6`` is a number, and
``12:30``, ``on``, ``yes``, ``no`` or ``1_000`` are text.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from fabricpilot.errors import ScenarioError
from fabricpilot.scenario.models import FaultsSpec, FieldProblem, Scenario, check_fits
from fabricpilot.textfiles import UnreadableFile, kind_of, read_text_file

__all__ = [
    "check_gpu_count",
    "default_scenario",
    "default_scenario_path",
    "fault_events",
    "format_loc",
    "load_scenario",
    "load_strict_yaml",
    "scenario_from_dict",
    "yaml_problem",
]

_MAX_REPR = 60


# --- YAML -----------------------------------------------------------------------------------


class _DuplicateKey(yaml.MarkedYAMLError):
    """A mapping repeats a key (PyYAML would silently keep the last one)."""


# The YAML 1.2 core schema's plain scalars (https://yaml.org/spec/1.2.2/#1032-tag-resolution);
# any other plain scalar is a string. (``match`` anchors at the start, ``\Z`` at the end.)
_CORE_NULL = re.compile(r"(?:null|Null|NULL|~|)\Z")
_CORE_BOOL = re.compile(r"(?:true|True|TRUE|false|False|FALSE)\Z")
_CORE_INT = re.compile(r"(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)\Z")
_CORE_FLOAT = re.compile(  # (matches a decimal integer too: the int resolver is tried first)
    r"(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))\Z"
)
_DIGITS = list("0123456789")
_CORE_RESOLVERS: list[tuple[str, re.Pattern[str], list[str]]] = [  # (tag, regexp, first chars)
    ("tag:yaml.org,2002:null", _CORE_NULL, ["~", "n", "N", ""]),
    ("tag:yaml.org,2002:bool", _CORE_BOOL, list("tTfF")),
    ("tag:yaml.org,2002:int", _CORE_INT, ["-", "+", *_DIGITS]),
    ("tag:yaml.org,2002:float", _CORE_FLOAT, ["-", "+", ".", *_DIGITS]),
]
_MERGE_TAG = "tag:yaml.org,2002:merge"  # (``<<: *base``: a merge key, as SafeLoader has it)


_MOST_INT_DIGITS = 4300  # (Python's limit on reading an integer from text)


class _StrictLoader(yaml.SafeLoader):
    """``SafeLoader`` that resolves plain scalars by the YAML 1.2 core schema and refuses
    duplicate keys in a mapping."""

    # A copy (lists included) of SafeLoader's resolvers without its YAML 1.1 ones (bool, int,
    # float, null, timestamp, value): yaml.SafeLoader itself is left as it is.
    yaml_implicit_resolvers: ClassVar[dict[str | None, list[tuple[str, re.Pattern[str]]]]] = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag == _MERGE_TAG]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        # Duplicates among the keys the mapping writes itself; a merge (``<<: *base``) is
        # not a key, and a key written here overrides a merged one (that is its point):
        # SafeLoader's construct_mapping flattens the merges afterwards.
        seen: set[Any] = set()
        merges = 0
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                merges += 1
                if merges > 1:  # (several merged mappings go in one list: <<: [*a, *b])
                    raise _DuplicateKey(
                        problem="duplicate key '<<' (merge several mappings as "
                                "<<: [*a, *b])", problem_mark=key_node.start_mark)
                continue
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            try:
                if key in seen:
                    raise _DuplicateKey(
                        problem=f"duplicate key {key!r}", problem_mark=key_node.start_mark
                    )
                seen.add(key)
            except TypeError:  # an unhashable key: PyYAML reports it below
                continue
        return super().construct_mapping(node, deep=deep)

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        """Replace the merges (``<<: *base``, ``<<: [*a, *b]``) of ``node`` by the pairs they
        bring, lowest precedence first (the mapping's own keys win, then the first merged
        mapping, as the merge key's definition says: https://yaml.org/type/merge.html).
        PyYAML 6.0.4's own lets the last merged mapping of a list win."""
        node.value = self._merged_pairs(node, set())

    def _merged_pairs(self, node: yaml.MappingNode, path: set[int]
                      ) -> list[tuple[yaml.Node, yaml.Node]]:
        if id(node) in path:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark,
                "a mapping merges itself", node.start_mark)
        own: list[tuple[yaml.Node, yaml.Node]] = []
        sources: list[yaml.MappingNode] = []
        for key_node, value_node in node.value:
            if key_node.tag != _MERGE_TAG:
                own.append((key_node, value_node))
                continue
            subs = (value_node.value if isinstance(value_node, yaml.SequenceNode)
                    else [value_node])
            for sub in subs:
                if not isinstance(sub, yaml.MappingNode):
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"expected a mapping or list of mappings for merging, but found {sub.id}",
                        sub.start_mark)
                sources.append(sub)
        out: list[tuple[yaml.Node, yaml.Node]] = []
        for sub in reversed(sources):
            out.extend(self._merged_pairs(sub, path | {id(node)}))
        return out + own

    def construct_core_int(self, node: yaml.ScalarNode) -> int:
        """A YAML 1.2 core integer: decimal (``010`` is 10), ``0o`` octal or ``0x`` hex.

        (SafeLoader's reads a leading 0 as octal and ``0o10`` not at all.)
        """
        text = str(self.construct_scalar(node))  # type: ignore[no-untyped-call]
        if not _CORE_INT.match(text):  # (an explicit ``!!int`` on other text)
            raise yaml.constructor.ConstructorError(
                None, None, f"{text!r} is not an integer", node.start_mark
            )
        digits = len(text.lstrip("+-")) - (2 if text[:2] in ("0o", "0x") else 0)
        if digits > _MOST_INT_DIGITS:  # (int() would refuse it in Python's own words)
            raise yaml.constructor.ConstructorError(
                None, None, f"an integer of {digits} digits (at most {_MOST_INT_DIGITS})",
                node.start_mark)
        if text.startswith("0o"):
            return int(text[2:], 8)
        if text.startswith("0x"):
            return int(text[2:], 16)
        return int(text, 10)


for _tag, _regexp, _first in _CORE_RESOLVERS:  # (in this order: int before float)
    _StrictLoader.add_implicit_resolver(_tag, _regexp, _first)  # type: ignore[no-untyped-call]
_StrictLoader.add_constructor(  # type: ignore[no-untyped-call]
    "tag:yaml.org,2002:int", _StrictLoader.construct_core_int
)
# (SafeLoader's float, bool and null constructors read every core form right: ``1e6``, ``1.``,
# ``.5``, ``-.inf``, ``.NaN``, ``TRUE``, ``~``.)


def load_strict_yaml(text: str) -> Any:
    """``text`` as YAML (safe tags only, plain scalars by the YAML 1.2 core schema), refusing a
    mapping that gives a key twice.

    >>> load_strict_yaml("a: 1\\nb: [2]")
    {'a': 1, 'b': [2]}
    >>> load_strict_yaml("a: 010\\nb: 1e6\\nc: on")
    {'a': 10, 'b': 1000000.0, 'c': 'on'}
    >>> load_strict_yaml("base: &b {gpus: 8, op: alltoall}\\njob: {<<: *b, gpus: 16}")
    {'base': {'gpus': 8, 'op': 'alltoall'}, 'job': {'gpus': 16, 'op': 'alltoall'}}
    >>> load_strict_yaml("role: tenant\\nrole: operator")
    Traceback (most recent call last):
    ...
    fabricpilot.scenario.loader._DuplicateKey: duplicate key 'role'
      in "<unicode string>", line 2, column 1:
        role: operator
        ^
    """
    return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass


def yaml_problem(err: yaml.YAMLError) -> str:
    """One line describing a YAML error, with its (1-based) line and column.

    >>> try:
    ...     load_strict_yaml("a: 1\\na: 2")
    ... except yaml.YAMLError as e:
    ...     yaml_problem(e)
    "invalid YAML at line 2, column 1: duplicate key 'a'"
    """
    return _yaml_problem(err)


def _yaml_problem(err: yaml.YAMLError, language: str = "YAML") -> str:
    """One line describing a YAML error, with its (1-based) line and column (``language``:
    what the file is named as, ``JSON`` for a ``.json`` file: JSON is read as YAML)."""
    if isinstance(err, yaml.MarkedYAMLError):
        what = err.problem or err.context or "syntax error"
        mark = err.problem_mark or err.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        return f"invalid {language}{where}: {' '.join(str(what).split())}"
    return f"invalid {language}: {' '.join(str(err).split())}"


# --- validation errors ----------------------------------------------------------------------


def format_loc(loc: Sequence[int | str]) -> str:
    """Field path of a pydantic location: ``('jobs', 0, 'gpus')`` → ``jobs[0].gpus``.

    >>> format_loc(("jobs", 0, "collectives", 1, "size_bytes"))
    'jobs[0].collectives[1].size_bytes'
    """
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            part = str(part)
            if not part.isprintable():  # (a key with a newline: the error stays one line)
                part = repr(part)
            out += f".{part}" if out else part
    return out


def _join(prefix: str, field: str) -> str:
    """Append a relative field path (``"gpu_ids[3]"`` or ``"[3]"``) to ``prefix``."""
    if not prefix:
        return field
    if not field:
        return prefix
    return prefix + field if field.startswith("[") else f"{prefix}.{field}"


def _model_classes(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation may hold, looking inside lists and optionals."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, list, tuple, typing.Annotated):
        found: list[type[BaseModel]] = []
        for arg in typing.get_args(annotation):
            found += _model_classes(arg)
        return found
    return []


def _model_at(loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The model class that holds the keys at ``loc`` (from :class:`Scenario`), if any."""
    model: type[BaseModel] = Scenario
    for part in loc:
        if isinstance(part, int):
            continue  # an index into a list: the element model is already selected
        field = model.model_fields.get(part)
        if field is None:
            return None
        candidates = _model_classes(field.annotation)
        if not candidates:
            return None
        model = candidates[0]
    return model


def _short(value: Any) -> str:
    """A short repr of a user value for an error message."""
    text = repr(value)
    return text if len(text) <= _MAX_REPR else text[: _MAX_REPR - 3] + "..."


def _readable(error: ErrorDetails) -> tuple[str, str]:
    """``(field path, problem)`` of one pydantic error, in the words of a scenario file."""
    loc = error["loc"]
    field = format_loc(loc)
    kind = error["type"]
    ctx = error.get("ctx") or {}
    got = error.get("input")
    cause = ctx.get("error")
    if isinstance(cause, FieldProblem):
        return _join(field, cause.field), cause.problem
    if isinstance(cause, Exception):
        return field, " ".join(str(cause).split())
    if kind == "extra_forbidden":
        model = _model_at(loc[:-1])
        if model is None:
            return field, "unknown key"
        allowed = list(model.model_fields)
        problem = f"unknown key (allowed: {', '.join(allowed)})"
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
        return field, problem + (f"; did you mean {close[0]!r}?" if close else "")
    if kind == "missing":
        return field, "required key is missing"
    if kind == "invalid_key":  # (YAML reads 1, true or null as such, not as text)
        yaml_text = ("null" if got is None else str(got).lower() if isinstance(got, bool)
                     else _short(got))
        what = ("no value" if got is None else "a boolean" if isinstance(got, bool)
                else "a number" if isinstance(got, int | float) else "not text")
        return format_loc(loc[:-1]), (f"key {yaml_text} is {what} to YAML, not a name "
                                      f"(quote it if it is meant as one)")
    if kind == "literal_error":
        return field, f"must be {ctx.get('expected')} (got {_short(got)})"
    comparisons = {
        "greater_than": ">",
        "greater_than_equal": ">=",
        "less_than": "<",
        "less_than_equal": "<=",
    }
    if kind in comparisons:
        bound = next(iter(ctx.values()), "?")
        return field, f"must be {comparisons[kind]} {bound} (got {_short(got)})"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return field, f"must be an integer (got {_short(got)})"
    if kind in ("float_type", "float_parsing", "finite_number"):
        return field, f"must be a finite number (got {_short(got)})"
    if kind in ("bool_type", "bool_parsing"):
        return field, f"must be true or false (got {_short(got)})"
    if kind in ("string_type",):
        return field, f"must be a string (got {_short(got)})"
    if kind in ("list_type", "tuple_type"):
        return field, f"must be a list (got {_short(got)})"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return field, f"must be a mapping of keys (got {_short(got)})"
    if kind == "string_too_short":
        least = ctx.get("min_length", 1)
        return field, ("must not be empty" if least == 1 else
                       f"must have at least {least} characters (got {_short(got)})")
    if kind == "too_short":
        least = ctx.get("min_length", 1)
        noun = "character" if isinstance(got, str) else "item"
        return field, f"must have at least {least} {noun}{'s' if least != 1 else ''}"
    message = error["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    return field, " ".join(message.split())


# --- public API -----------------------------------------------------------------------------


def scenario_from_dict(
    data: Any, source: str = "<scenario>", base_dir: str | Path | None = None
) -> Scenario:
    """Validate parsed YAML ``data`` into a :class:`Scenario`.

    ``source`` names the origin in error messages. A ``kind: file`` topology path is resolved
    against ``base_dir`` (the current directory if ``None``) and must exist; the returned
    scenario carries the absolute path. Raises :class:`ScenarioError` on the first problem.
    """
    if not isinstance(data, dict):
        raise ScenarioError(source, "", f"the top level must be a mapping of keys (got "
                                        f"{kind_of(data)})")
    if {"format", "nodes", "links"} <= data.keys() and "topology" not in data:
        raise ScenarioError(source, "", "a topology file, not a scenario: a scenario names it "
                                        "as topology: {kind: file, path: ...}")
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        # (an unknown key first: a misspelt one also reads as the right one missing)
        first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        field, problem = _readable(first)
        raise ScenarioError(source, field, problem) from None
    topology = scenario.topology
    if topology.kind == "file":
        assert topology.path is not None
        base = Path(base_dir) if base_dir is not None else Path.cwd()
        resolved = (base / Path(topology.path).expanduser()).resolve()
        if not resolved.exists():
            raise ScenarioError(source, "topology.path", f"file not found: {resolved}")
        if not resolved.is_file():  # (a directory, a named pipe, a device)
            raise ScenarioError(source, "topology.path", f"not a regular file: {resolved}")
        scenario = scenario.model_copy(
            update={"topology": topology.model_copy(update={"path": str(resolved)})}
        )
    return scenario


def fault_events(events: Any, source: str) -> FaultsSpec:
    """Fault events given apart from a scenario (e.g. a drill sent to the service's twin),
    checked as a scenario's ``faults.events``: a :class:`FaultsSpec` with them and default
    settings. Raises :class:`ScenarioError` (``SOURCE: faults.events[i].FIELD: PROBLEM``) on
    the first problem.

    >>> fault_events([{"kind": "link_down", "link": "leaf0-spine0", "at_ns": "1ms"}],
    ...              "drill").events[0].at_ns
    1000000
    >>> fault_events([{"kind": "link_down", "at_ns": 0}], "drill")
    Traceback (most recent call last):
    ...
    fabricpilot.errors.ScenarioError: drill: faults.events[0].link: required for kind \
link_down
    """
    try:
        return FaultsSpec.model_validate({"events": events})
    except ValidationError as exc:
        field, problem = _readable(exc.errors(include_url=False)[0])
        raise ScenarioError(source, f"faults.{field}" if field else "faults", problem) from None


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate the scenario file at ``path``.

    Raises :class:`ScenarioError` (``FILE: FIELD: PROBLEM``) on the first problem.
    """
    file = Path(path)
    source = str(path)
    try:
        text = read_text_file(file)
    except UnreadableFile as exc:
        raise ScenarioError(source, "", str(exc)) from None
    try:
        data = load_strict_yaml(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(source, "", _yaml_problem(
            exc, "JSON" if file.suffix.lower() == ".json" else "YAML")) from None
    except RecursionError:
        raise ScenarioError(source, "", "nested too deeply to read") from None
    except ValueError as exc:  # (e.g. an integer of more digits than Python converts)
        raise ScenarioError(source, "", f"cannot read a value: {exc}") from None
    return scenario_from_dict(data, source, base_dir=file.parent)


def check_gpu_count(scenario: Scenario, n_gpus: int, source: str = "<scenario>") -> None:
    """Raise :class:`ScenarioError` unless the jobs and mice fit ``n_gpus`` GPUs.

    Built-in topologies are checked on load; the engine calls this for a ``kind: file``
    topology once the file is built and its GPU count is known.
    """
    try:
        check_fits(scenario, n_gpus)
    except FieldProblem as problem:
        raise ScenarioError(source, problem.field, problem.problem) from None


def default_scenario_path() -> Path:
    """Path of the built-in default scenario (``scenario/data/default.yaml``)."""
    return Path(str(resources.files("fabricpilot.scenario") / "data" / "default.yaml"))


def default_scenario() -> Scenario:
    """The built-in default scenario: 128 GPUs, three concurrent jobs and mice."""
    return load_scenario(default_scenario_path())
