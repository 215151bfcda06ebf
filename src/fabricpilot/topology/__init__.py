"""Topologies: declarative builders (leaf-spine, fat-tree, rail-optimised hosts) returning a
plain graph, its compiled array form with ECMP tables, path algorithms and JSON import/export."""

from fabricpilot.topology.builders import BUILDERS, build_topology, fat_tree, leaf_spine
from fabricpilot.topology.compiled import CompiledTopology, compile_topology
from fabricpilot.topology.model import LinkKind, NodeKind, Topology, gpu_name, validate_topology
from fabricpilot.topology.paths import equal_cost_paths, split_fractions, walk_paths

__all__ = [
    "BUILDERS",
    "CompiledTopology",
    "LinkKind",
    "NodeKind",
    "Topology",
    "build_topology",
    "compile_topology",
    "equal_cost_paths",
    "fat_tree",
    "gpu_name",
    "leaf_spine",
    "split_fractions",
    "validate_topology",
    "walk_paths",
]
