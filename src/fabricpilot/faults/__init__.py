"""Faults of the fabric: link and switch failures, flapping links and gray (lossy) links.

A scenario's ``faults`` section (:class:`~fabricpilot.scenario.models.FaultsSpec`) is resolved
against the compiled topology by :func:`resolve_faults` into a :class:`FaultTimeline`: a sorted
list of :class:`FaultEvent` over *directed* link ids, one :class:`FaultInfo` per fault, and the
detection / reaction parameters (:class:`FaultParams`) the engine applies.

>>> from fabricpilot.topology import compile_topology, leaf_spine
>>> from fabricpilot.scenario.models import FaultsSpec
>>> ct = compile_topology(leaf_spine(hosts=4, gpus_per_host=1, nics_per_leaf=2))
>>> spec = FaultsSpec.model_validate(
...     {"events": [{"kind": "link_down", "link": "leaf0-spine1", "at_ns": "2ms"}]})
>>> timeline = resolve_faults(spec, ct, seed=1)
>>> [(e.time_ns, e.kind, [ct.link_name(i) for i in e.links]) for e in timeline.events]
[(2000000, 'down', ['leaf0->spine1', 'spine1->leaf0'])]
>>> timeline.faults[0].label
'link leaf0<->spine1 down at 2 ms'
"""

from fabricpilot.faults.model import (
    FaultError,
    FaultEvent,
    FaultInfo,
    FaultParams,
    FaultTimeline,
    gray_drop_probability,
    random_faults,
    remaining_events,
    resolve_faults,
)

__all__ = [
    "FaultError",
    "FaultEvent",
    "FaultInfo",
    "FaultParams",
    "FaultTimeline",
    "gray_drop_probability",
    "random_faults",
    "remaining_events",
    "resolve_faults",
]
