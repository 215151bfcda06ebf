"""The exception hierarchy of fabricpilot, in one place.

``FabricpilotError``            base of every error the library raises on purpose
 ├─ ``ScenarioError``           a scenario / topology file is unreadable or invalid:
 │                              carries ``source`` (file), ``field`` (dotted path) and ``problem``
 ├─ ``TopologyError``           a topology cannot be built or routed (e.g. no path)
 └─ ``SimulationError``         the engine reached an impossible state (a bug or a deadlock)

The CLI maps every ``FabricpilotError`` to one line on stderr and a non-zero exit; anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

import re


class FabricpilotError(Exception):
    """Base of every error fabricpilot raises on purpose."""


class ScenarioError(FabricpilotError):
    """A scenario or topology file is invalid.

    ``str(err)`` is the one-line message shown to users: ``FILE: FIELD: PROBLEM``.

    >>> str(ScenarioError("a.yaml", "jobs[0].gpus", "must be > 0"))
    'a.yaml: jobs[0].gpus: must be > 0'
    """

    def __init__(self, source: str, field: str, problem: str) -> None:
        self.source = source
        self.field = field
        self.problem = problem = shorten_quoted(problem)
        where = f"{source}: {field}" if field else source
        super().__init__(f"{where}: {problem}")


# a quoted value: an apostrophe no letter or digit precedes, up to one none follows (the
# apostrophes of "the GPUs' rates" or "the twin's" quote nothing)
_LONG_QUOTE = re.compile(r"(?<!\w)'([^'\n]{61,})'(?!\w)")


def shorten_quoted(problem: str) -> str:
    """``problem`` with every quoted value past 60 characters cut to its first 40 and its
    length: an error repeats what it refuses, not a whole 5 000-digit number.

    >>> shorten_quoted("expected a size, got '" + "9" * 5000 + "'")
    "expected a size, got '9999999999999999999999999999999999999999...' (5000 characters)"
    >>> text = "at its GPUs' fastest rates" + "," * 60 + " beyond the twin's limit"
    >>> shorten_quoted(text) == text
    True
    """
    return _LONG_QUOTE.sub(lambda m: f"'{m.group(1)[:40]}...' ({len(m.group(1))} characters)",
                           problem)


class TopologyError(FabricpilotError):
    """A topology cannot be built, or two endpoints have no path between them."""


class SimulationError(FabricpilotError):
    """The engine reached a state it cannot continue from."""
