"""The fault model: scenario ``faults`` sections resolved into events over directed links.

Expected link sets and event times are derived by hand from the topology (a leaf-spine with
L = 3 leaves, S = 4 spines and 4 single-GPU hosts per leaf) and the fault definitions; the
post-FEC loss is recomputed independently with exact binomial sums in ``decimal``.
"""

from __future__ import annotations

import copy
import itertools
import math
import subprocess
import sys
from decimal import Decimal, localcontext
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from fabricpilot.errors import FabricpilotError, ScenarioError
from fabricpilot.faults import (
    FaultError,
    FaultEvent,
    FaultParams,
    FaultTimeline,
    gray_drop_probability,
    random_faults,
    resolve_faults,
)
from fabricpilot.runner import prepare
from fabricpilot.scenario import load_scenario, scenario_from_dict
from fabricpilot.scenario.models import FaultsSpec
from fabricpilot.topology import CompiledTopology, compile_topology, leaf_spine

ROOT = Path(__file__).resolve().parents[1]
LEAVES, SPINES, GPUS_PER_LEAF = 3, 4, 4

BASE: dict[str, Any] = {
    "name": "faults", "seed": 3, "policies": ["ecmp", "ideal"],
    "topology": {"kind": "leaf_spine", "hosts": LEAVES * GPUS_PER_LEAF, "gpus_per_host": 1,
                 "nics_per_leaf": GPUS_PER_LEAF, "rail_optimized": False},
    "jobs": [{"name": "a", "gpus": 8,
              "collectives": [{"op": "allreduce", "size_bytes": "1MiB"}]}],
}


@pytest.fixture(scope="module")
def ct() -> CompiledTopology:
    """3 leaves x 4 spines; 4 GPUs (one per host) under each leaf."""
    return compile_topology(leaf_spine(hosts=LEAVES * GPUS_PER_LEAF, gpus_per_host=1,
                                       nics_per_leaf=GPUS_PER_LEAF, rail_optimized=False))


def link(ct: CompiledTopology, a: str, b: str) -> int:
    return ct.link_id[(ct.node_index[a], ct.node_index[b])]


def resolve(ct: CompiledTopology, *events: dict[str, Any], seed: int = 1,
            **settings: Any) -> FaultTimeline:
    spec = FaultsSpec.model_validate({"events": list(events), **settings})
    return resolve_faults(spec, ct, seed, source="s.yaml")


def names(ct: CompiledTopology, links: tuple[int, ...]) -> set[str]:
    return {ct.link_name(i) for i in links}


# --- resolution of each kind ----------------------------------------------------------------


def test_cable_is_both_directions_and_arrow_one(ct: CompiledTopology) -> None:
    t = resolve(ct, {"kind": "link_down", "link": "leaf0-spine1", "at_ns": "2ms"},
                {"kind": "link_down", "link": "leaf0->spine1", "at_ns": "2ms"},
                {"kind": "link_down", "link": "spine1 -> leaf0", "at_ns": "2ms"},
                {"kind": "link_down", "link": "spine1-leaf0", "at_ns": "2ms"})
    cable, fwd, back, cable2 = (e.links for e in t.events)
    assert names(ct, cable) == {"leaf0->spine1", "spine1->leaf0"}
    assert fwd == (link(ct, "leaf0", "spine1"),)
    assert back == (link(ct, "spine1", "leaf0"),)
    assert set(cable2) == set(cable)
    assert [e.kind for e in t.events] == ["down"] * 4
    assert [e.fault_id for e in t.events] == [0, 1, 2, 3]
    assert all(e.time_ns == 2_000_000 for e in t.events)
    assert [f.label for f in t.faults[:2]] == ["link leaf0<->spine1 down at 2 ms",
                                               "link leaf0->spine1 down at 2 ms"]
    assert t.faults[0].end_ns is None and t.faults[0].kind == "link_down"


def test_link_down_until_and_link_up(ct: CompiledTopology) -> None:
    t = resolve(ct, {"kind": "link_down", "link": "leaf2-spine3", "at_ns": "2ms",
                     "until_ns": "5ms"},
                {"kind": "link_up", "link": "leaf2-spine3", "at_ns": "7ms"})
    cable = (link(ct, "leaf2", "spine3"), link(ct, "spine3", "leaf2"))
    assert [(e.time_ns, e.kind, e.fault_id) for e in t.events] == [
        (2_000_000, "down", 0), (5_000_000, "up", 0), (7_000_000, "up", 1)]
    assert all(set(e.links) == set(cable) for e in t.events)
    assert (t.faults[0].start_ns, t.faults[0].end_ns) == (2_000_000, 5_000_000)
    assert t.faults[0].label == "link leaf2<->spine3 down at 2 ms until 5 ms"
    assert (t.faults[1].kind, t.faults[1].start_ns, t.faults[1].end_ns) == (
        "link_up", 7_000_000, 7_000_000)


def test_switch_down_covers_exactly_the_switch_links(ct: CompiledTopology) -> None:
    t = resolve(ct, {"kind": "switch_down", "switch": "spine2", "at_ns": "3ms",
                     "until_ns": "9ms"},
                {"kind": "switch_down", "switch": "leaf1", "at_ns": "4ms"})
    spine = t.faults[0].links
    # a spine of a leaf-spine has one cable to every leaf: 2 L directed links
    assert len(spine) == 2 * LEAVES
    expected = {f"leaf{i}->spine2" for i in range(LEAVES)} | {
        f"spine2->leaf{i}" for i in range(LEAVES)}
    assert names(ct, spine) == expected
    # a leaf: one cable to every spine and to each of its GPUs
    leaf = t.faults[1].links
    assert len(leaf) == 2 * (SPINES + GPUS_PER_LEAF)
    assert all("leaf1" in name for name in names(ct, leaf))
    assert [(e.time_ns, e.kind, e.fault_id) for e in t.events] == [
        (3_000_000, "down", 0), (4_000_000, "down", 1), (9_000_000, "up", 0)]
    assert t.events[0].links == t.events[2].links == spine
    assert t.faults[0].label == "switch spine2 down at 3 ms until 9 ms"


def test_flap_times_by_hand(ct: CompiledTopology) -> None:
    t = resolve(ct, {"kind": "flap", "link": "leaf1-spine0", "at_ns": "1ms",
                     "down_ns": "200us", "up_ns": "300us", "count": 4})
    # cycle i: down at 1 ms + i * 500 us, up 200 us later
    expected = []
    for i in range(4):
        expected += [(1_000_000 + i * 500_000, "down"), (1_200_000 + i * 500_000, "up")]
    assert [(e.time_ns, e.kind) for e in t.events] == expected
    assert expected[-1] == (2_700_000, "up")
    assert {e.fault_id for e in t.events} == {0}
    assert len(t.faults) == 1
    assert (t.faults[0].start_ns, t.faults[0].end_ns) == (1_000_000, 2_700_000)


def test_gray_derives_drop_from_ber_unless_given(ct: CompiledTopology) -> None:
    t = resolve(ct, {"kind": "gray", "link": "leaf2-spine1", "at_ns": 0, "ber": 1e-3,
                     "until_ns": "20ms"},
                {"kind": "gray", "link": "leaf0->spine0", "at_ns": "1ms", "ber": 1e-3,
                 "drop_probability": 0.05},
                {"kind": "gray", "link": "leaf1-spine1", "at_ns": "1ms",
                 "drop_probability": 0.01})
    gray, explicit, silent, clear = t.events
    assert (gray.kind, gray.ber, gray.time_ns) == ("gray", 1e-3, 0)
    assert gray.drop_probability == gray_drop_probability(1e-3, 4096)
    assert (explicit.ber, explicit.drop_probability) == (1e-3, 0.05)
    assert (silent.ber, silent.drop_probability) == (0.0, 0.01)  # invisible to FEC counters
    assert (clear.kind, clear.time_ns, clear.fault_id) == ("clear", 20_000_000, 0)
    assert clear.links == gray.links and len(gray.links) == 2
    # the frame size the loss applies to is the caller's
    spec = FaultsSpec.model_validate({"events": [
        {"kind": "gray", "link": "leaf2-spine1", "at_ns": 0, "ber": 1e-3}]})
    small = resolve_faults(spec, ct, 1, packet_bytes=64).events[0]
    assert small.drop_probability == gray_drop_probability(1e-3, 64) < gray.drop_probability


def test_equal_times_ordered_by_fault_id(ct: CompiledTopology) -> None:
    t = resolve(ct, {"kind": "link_down", "link": "leaf0-spine0", "at_ns": "5ms"},
                {"kind": "link_down", "link": "leaf1-spine0", "at_ns": "2ms", "until_ns": "5ms"},
                {"kind": "gray", "link": "leaf2-spine0", "at_ns": "5ms", "ber": 1e-5})
    assert [(e.time_ns, e.fault_id, e.kind) for e in t.events] == [
        (2_000_000, 1, "down"), (5_000_000, 0, "down"), (5_000_000, 1, "up"),
        (5_000_000, 2, "gray")]


def test_overlapping_faults_replay(ct: CompiledTopology) -> None:
    """A link held down by two faults is up only when both have ended."""
    t = resolve(ct, {"kind": "switch_down", "switch": "spine2", "at_ns": "3ms",
                     "until_ns": "6ms"},
                {"kind": "link_down", "link": "leaf0-spine2", "at_ns": "4ms", "until_ns": "9ms"})
    cable = {link(ct, "leaf0", "spine2"), link(ct, "spine2", "leaf0")}
    down, _ = t.links_at(5_000_000)
    assert len(down) == 2 * LEAVES
    down, _ = t.links_at(7_000_000)
    assert down == cable
    down, gray = t.links_at(9_000_000)
    assert not down and not gray


def test_fault_events_are_frozen_slotted() -> None:
    e = FaultEvent(1, "down", (1, 2), 0)
    with pytest.raises(AttributeError):
        e.time_ns = 2  # type: ignore[misc]
    assert not hasattr(e, "__dict__")


def test_params_from_the_section_and_defaults() -> None:
    assert FaultsSpec().to_params() == FaultParams()
    p = FaultParams()
    assert (p.detection_delay_ns, p.convergence_delay_ns, p.rdma_timeout_ns) == (
        100_000, 200_000_000, 4_000_000)
    assert (p.fec_threshold, p.debounce_count, p.debounce_window_ns) == (1e-6, 3, 500_000_000)
    assert (p.telemetry_interval_ns, p.noise_spike_probability, p.noise_spike_ber) == (
        1_000_000, 0.0, 0.0)
    spec = FaultsSpec.model_validate({
        "detection_delay_ns": "50us", "convergence_delay_ns": "1s", "rdma_timeout_ns": "8ms",
        "fec_threshold": 1e-7, "debounce": {"count": 1, "window_ns": "10ms"},
        "telemetry_interval_ns": "100us", "noise": {"spike_probability": 0.01,
                                                    "spike_ber": 5e-6},
        "local_repair": True})
    assert spec.to_params() == FaultParams(50_000, 1_000_000_000, 8_000_000, 1e-7, 1,
                                           10_000_000, 100_000, 0.01, 5e-6, local_repair=True)
    assert not p.local_repair  # (the routing-protocol baseline)


# --- random faults --------------------------------------------------------------------------

RATES = {"link_mtbf_ns": 10_000_000, "repair_ns": 1, "horizon_ns": 20_000_000}


def test_random_faults_deterministic_per_seed(ct: CompiledTopology) -> None:
    a = random_faults(ct, 5, **RATES, gray_fraction=0.5)
    assert a == random_faults(ct, 5, **RATES, gray_fraction=0.5)
    assert a != random_faults(ct, 6, **RATES, gray_fraction=0.5)
    events, faults = a
    assert faults and len(events) == 2 * len(faults)
    # the gray share does not move the failure times
    times = [(f.start_ns, f.links) for f in faults]
    assert times == [(f.start_ns, f.links) for f in random_faults(ct, 5, **RATES)[1]]


def test_random_faults_shape(ct: CompiledTopology) -> None:
    events, faults = random_faults(ct, 2, link_mtbf_ns=5e6, repair_ns=300_000,
                                   horizon_ns=20_000_000, gray_fraction=0.5, gray_ber=1e-3,
                                   first_id=7)
    assert [f.fault_id for f in faults] == list(range(7, 7 + len(faults)))
    assert [f.start_ns for f in faults] == sorted(f.start_ns for f in faults)
    fabric = {link(ct, f"leaf{i}", f"spine{j}") for i in range(LEAVES) for j in range(SPINES)}
    per_cable: dict[tuple[int, ...], list[tuple[int, int]]] = {}
    for f in faults:
        assert 0 <= f.start_ns < 20_000_000 and f.end_ns == f.start_ns + 300_000
        assert f.kind in ("link_down", "gray") and f.label.startswith("random: link ")
        assert len(f.links) == 2 and f.links[0] in fabric
        per_cable.setdefault(f.links, []).append((f.start_ns, f.end_ns or 0))
        mine = [e for e in events if e.fault_id == f.fault_id]
        start, end = mine
        assert (start.time_ns, end.time_ns) == (f.start_ns, f.end_ns)
        if f.kind == "gray":
            assert (start.kind, end.kind) == ("gray", "clear")
            assert start.ber == 1e-3
            assert start.drop_probability == gray_drop_probability(1e-3)
        else:
            assert (start.kind, end.kind) == ("down", "up")
    # a cable does not fail again before it is repaired
    for spans in per_cable.values():
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start > end
    assert {f.kind for f in faults} == {"link_down", "gray"}


def test_random_fault_count_matches_the_rate(ct: CompiledTopology) -> None:
    """With repairs negligible, each cable fails as a Poisson process of rate 1 / MTBF."""
    cables = LEAVES * SPINES
    mean = cables * RATES["horizon_ns"] / RATES["link_mtbf_ns"]  # 12 cables x 2 = 24
    n_seeds = 300
    counts, grays = [], 0
    for seed in range(n_seeds):
        _, faults = random_faults(ct, seed, **RATES, gray_fraction=0.25)
        counts.append(len(faults))
        grays += sum(f.kind == "gray" for f in faults)
    sigma = math.sqrt(mean / n_seeds)  # Poisson: variance = mean
    assert abs(np.mean(counts) - mean) < 4 * sigma
    assert 0.6 < np.var(counts) / mean < 1.4
    total = sum(counts)
    assert abs(grays / total - 0.25) < 4 * math.sqrt(0.25 * 0.75 / total)


def test_random_scope_all_includes_nic_cables(ct: CompiledTopology) -> None:
    rates = {"link_mtbf_ns": 1e6, "repair_ns": 1, "horizon_ns": 10_000_000}
    _, fabric = random_faults(ct, 1, **rates)
    _, every = random_faults(ct, 1, **rates, scope="all")
    gpu_links = {f.links for f in every if any("gpu" in n for n in names(ct, f.links))}
    assert gpu_links and not any("gpu" in ct.link_name(f.links[0]) for f in fabric)
    cables = {f.links for f in every}
    assert len(cables) <= LEAVES * SPINES + LEAVES * GPUS_PER_LEAF


def test_random_faults_through_the_spec_follow_the_events(ct: CompiledTopology) -> None:
    t = resolve(ct, {"kind": "link_down", "link": "leaf0-spine0", "at_ns": "1ms"},
                random={"link_mtbf_ns": "5ms", "repair_ns": "100us", "horizon_ns": "20ms"},
                seed=4)
    assert len(t.faults) > 1 and t.faults[0].kind == "link_down"
    assert [f.fault_id for f in t.faults] == list(range(len(t.faults)))
    drawn = random_faults(ct, 4, link_mtbf_ns=5e6, repair_ns=100_000, horizon_ns=20_000_000,
                          first_id=1)[1]
    assert t.faults[1:] == drawn
    assert [(e.time_ns, e.fault_id) for e in t.events] == sorted(
        (e.time_ns, e.fault_id) for e in t.events)
    assert t.seed == 4


def test_too_many_random_faults_is_an_error(ct: CompiledTopology) -> None:
    with pytest.raises(FaultError, match=r"faults\.random\.link_mtbf_ns"):
        random_faults(ct, 1, link_mtbf_ns=1, repair_ns=1, horizon_ns=10**9)


# --- post-FEC loss --------------------------------------------------------------------------


def exact_drop(ber: float, packet_bytes: int) -> float:
    """RS(544,514): more than 15 of 544 10-bit symbols wrong; exact sums at 80 digits."""
    with localcontext() as ctx:
        ctx.prec = 80
        b = Decimal(ber)
        p = 1 - (1 - b) ** 10
        q = 1 - p
        fail = sum((Decimal(math.comb(544, k)) * p**k * q ** (544 - k)
                    for k in range(16, 545)), Decimal(0))
        n_codewords = -(-8 * packet_bytes // 5140)
        return float(1 - (1 - fail) ** n_codewords)


@pytest.mark.parametrize("ber", [1e-8, 1e-5, 2.4e-4, 1e-3, 2e-3, 1e-2])
@pytest.mark.parametrize("packet_bytes", [64, 4096, 4154, 9000])
def test_gray_drop_probability_matches_exact_binomial(ber: float, packet_bytes: int) -> None:
    assert gray_drop_probability(ber, packet_bytes) == pytest.approx(
        exact_drop(ber, packet_bytes), rel=1e-9)


def test_gray_drop_probability_hand_value() -> None:
    # a 4096-byte packet spans ceil(32768 / 5140) = 7 codewords
    assert math.ceil(8 * 4096 / 5140) == 7
    assert gray_drop_probability(1e-3) == pytest.approx(1.0706893851780e-3, rel=1e-9)
    assert gray_drop_probability(1e-8) < 1e-20
    assert gray_drop_probability(0.0) == 0.0 and gray_drop_probability(0.5) == pytest.approx(1)
    values = [gray_drop_probability(b) for b in (1e-6, 1e-5, 1e-4, 1e-3, 1e-2)]
    assert values == sorted(values)
    with pytest.raises(ValueError):
        gray_drop_probability(-1e-3)


# --- the scenario: schema, names and the CLI ------------------------------------------------

FULL_YAML = """
faults:
  detection_delay_ns: 100us
  convergence_delay_ns: 200ms
  rdma_timeout_ns: 4ms
  fec_threshold: 1e-6
  debounce: {count: 3, window_ns: 500ms}
  telemetry_interval_ns: 1ms
  noise: {spike_probability: 0.01, spike_ber: 5e-6}
  events:
    - {kind: link_down, link: leaf0-spine1, at_ns: 2ms}      # a cable
    - {kind: link_up, link: leaf0-spine1, at_ns: 5ms}
    - {kind: switch_down, switch: spine2, at_ns: 3ms, until_ns: 9ms}
    - {kind: flap, link: leaf1-spine0, at_ns: 1ms, down_ns: 200us, up_ns: 300us, count: 4}
    - {kind: gray, link: leaf2-spine1, at_ns: 0, ber: 1e-5, until_ns: 20ms}
  random:
    link_mtbf_ns: 1s
    repair_ns: 2ms
    gray_fraction: 0.5
    gray_ber: 1e-5
    horizon_ns: 50ms
"""


def write(tmp_path: Path, faults: Any, name: str = "s.yaml") -> Path:
    data = copy.deepcopy(BASE)
    text = yaml.safe_dump(data, sort_keys=False)
    if isinstance(faults, str):
        text += faults
    else:
        text += yaml.safe_dump({"faults": faults}, sort_keys=False)
    path = tmp_path / name
    path.write_text(text)
    return path


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fabricpilot", *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)


def test_full_section_loads_and_prepares(tmp_path: Path) -> None:
    path = write(tmp_path, FULL_YAML)
    scenario = load_scenario(path)
    assert scenario.faults is not None
    f = scenario.faults
    assert (f.detection_delay_ns, f.convergence_delay_ns, f.rdma_timeout_ns) == (
        100_000, 200_000_000, 4_000_000)
    assert f.fec_threshold == 1e-6 and f.debounce.window_ns == 500_000_000
    assert f.random is not None and f.random.link_mtbf_ns == 10**9
    prep = prepare(scenario, str(path))
    t = prep.faults
    assert t is not None and t.seed == BASE["seed"]
    assert t.params == f.to_params()
    assert [x.kind for x in t.faults[:5]] == ["link_down", "link_up", "switch_down", "flap",
                                               "gray"]
    listed = [e for e in t.events if e.fault_id < 5]
    assert len(listed) == 1 + 1 + 2 + 8 + 2
    gray = next(e for e in t.events if e.kind == "gray" and e.fault_id == 4)
    # the frame is the fabric's MTU plus headers (4096 + 58 bytes)
    assert gray.drop_probability == gray_drop_probability(1e-5, 4096 + 58)
    assert prepare(scenario_from_dict(copy.deepcopy(BASE))).faults is None


def test_validate_accepts_the_full_section(tmp_path: Path) -> None:
    res = cli("validate", str(write(tmp_path, FULL_YAML)))
    assert res.returncode == 0, res.stderr


OK_EVENT = {"kind": "link_down", "link": "leaf0-spine1", "at_ns": "2ms"}

CLI_CASES: dict[str, tuple[dict[str, Any], str, str]] = {
    "unknown link": ({"events": [OK_EVENT, {"kind": "link_down", "link": "leaf9-spine1",
                                            "at_ns": 0}]},
                     "faults.events[1].link", "no link 'leaf9-spine1'"),
    "not a link": ({"events": [OK_EVENT, {"kind": "flap", "link": "leaf0-leaf1", "at_ns": 0,
                                          "down_ns": 1, "up_ns": 1, "count": 1}]},
                   "faults.events[1].link", "not connected"),
    "unknown switch": ({"events": [{"kind": "switch_down", "switch": "spine9", "at_ns": 0}]},
                       "faults.events[0].switch", "no switch 'spine9'"),
    "until before at": ({"events": [{**OK_EVENT, "until_ns": "1ms"}]},
                        "faults.events[0].until_ns", "must be after at_ns"),
    "down_ns zero": ({"events": [{"kind": "flap", "link": "leaf0-spine1", "at_ns": 0,
                                  "down_ns": 0, "up_ns": "1us", "count": 2}]},
                     "faults.events[0].down_ns", "> 0"),
    "count zero": ({"events": [{"kind": "flap", "link": "leaf0-spine1", "at_ns": 0,
                                "down_ns": "1us", "up_ns": "1us", "count": 0}]},
                   "faults.events[0].count", ">= 1"),
    "ber too large": ({"events": [{"kind": "gray", "link": "leaf0-spine1", "at_ns": 0,
                                   "ber": 0.7}]},
                      "faults.events[0].ber", "(0, 0.5]"),
    "debounce count": ({"debounce": {"count": 0}}, "faults.debounce.count", ">= 1"),
    "empty link": ({"events": [{**OK_EVENT, "link": ""}]}, "faults.events[0].link",
                   "must not be empty"),
}


@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_validate_names_the_fault_field(case: str, tmp_path: Path) -> None:
    faults, field, problem = CLI_CASES[case]
    path = write(tmp_path, faults, "bad.yaml")
    res = cli("validate", str(path))
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "bad.yaml" in lines[0] and field in lines[0] and problem in lines[0]
    assert "Traceback" not in res.stderr


SCHEMA_CASES: dict[str, tuple[Any, str, str]] = {
    "ber zero": ({"events": [{"kind": "gray", "link": "a-b", "at_ns": 0, "ber": 0}]},
                 "faults.events[0].ber", "must be a bit error rate in (0, 0.5] (got 0.0)"),
    "gray without ber": ({"events": [{"kind": "gray", "link": "a-b", "at_ns": 0}]},
                         "faults.events[0].ber",
                         "required for kind gray (or give drop_probability)"),
    "key of another kind": ({"events": [{**OK_EVENT, "switch": "spine0"}]},
                            "faults.events[0].switch",
                            "not valid for kind link_down (only for switch_down)"),
    "until on link_up": ({"events": [{"kind": "link_up", "link": "a-b", "at_ns": 0,
                                      "until_ns": 5}]},
                         "faults.events[0].until_ns",
                         "not valid for kind link_up (only for link_down, switch_down, gray)"),
    "flap without count": ({"events": [{"kind": "flap", "link": "a-b", "at_ns": 0,
                                        "down_ns": 1, "up_ns": 1}]},
                           "faults.events[0].count", "required for kind flap"),
    "switch_down without switch": ({"events": [{"kind": "switch_down", "at_ns": 0}]},
                                   "faults.events[0].switch", "required for kind switch_down"),
    "unknown kind": ({"events": [{**OK_EVENT, "kind": "crash"}]}, "faults.events[0].kind",
                     "must be 'link_down', 'link_up', 'switch_down', 'flap' or 'gray'"),
    "time unit": ({"events": [{**OK_EVENT, "at_ns": "5Gbps"}]}, "faults.events[0].at_ns",
                  "wrong unit 'Gbps' for a time"),
    "missing at": ({"events": [{"kind": "link_down", "link": "a-b"}]},
                   "faults.events[0].at_ns", "required key is missing"),
    "unknown key": ({"events": [{**OK_EVENT, "at": 1}]}, "faults.events[0].at",
                    "unknown key (allowed: kind, at_ns,"),
    "drop above 1": ({"events": [{"kind": "gray", "link": "a-b", "at_ns": 0,
                                  "drop_probability": 2}]},
                     "faults.events[0].drop_probability", "must be <= 1"),
    "noise without ber": ({"noise": {"spike_probability": 0.1}}, "faults.noise.spike_ber",
                          "must be > 0 when spike_probability is > 0"),
    "random gray_ber": ({"random": {"link_mtbf_ns": "1s", "repair_ns": "1ms",
                                    "horizon_ns": "1ms", "gray_ber": 1}},
                        "faults.random.gray_ber", "must be a bit error rate"),
    "random repair missing": ({"random": {"link_mtbf_ns": "1s", "horizon_ns": "1ms"}},
                              "faults.random.repair_ns", "required key is missing"),
    "fec threshold": ({"fec_threshold": 0}, "faults.fec_threshold", "must be > 0"),
}


@pytest.mark.parametrize("case", sorted(SCHEMA_CASES))
def test_schema_errors_name_the_field(case: str, tmp_path: Path) -> None:
    faults, field, problem = SCHEMA_CASES[case]
    with pytest.raises(ScenarioError) as info:
        load_scenario(write(tmp_path, faults, "bad.yaml"))
    err = info.value
    assert (err.field, err.source.endswith("bad.yaml")) == (field, True)
    assert err.problem.startswith(problem), err.problem
    assert "\n" not in str(err)


@pytest.mark.parametrize(("name", "problem"), [
    ("leaf9-spine1", "no link 'leaf9-spine1': no node 'leaf9'"),
    ("leaf0->spine9", "no link 'leaf0->spine9': no node 'spine9'"),
    ("leaf0-leaf1", "no link 'leaf0-leaf1': leaf0 and leaf1 are not connected"),
    ("leaf0", "no link 'leaf0': write a cable as 'a-b'"),
])
def test_link_names_checked_against_the_topology(name: str, problem: str,
                                                 ct: CompiledTopology) -> None:
    with pytest.raises(FaultError) as info:
        resolve(ct, OK_EVENT, {"kind": "link_down", "link": name, "at_ns": 0})
    err = info.value
    assert isinstance(err, FabricpilotError)
    assert err.field == "faults.events[1].link"
    message = str(err)
    assert message.startswith(f"s.yaml: faults.events[1].link: {problem}")
    assert message.endswith(" (links look like 'leaf0-spine0', 'leaf0->spine0')")


def test_switch_names_checked_against_the_topology(ct: CompiledTopology) -> None:
    with pytest.raises(FaultError) as info:
        resolve(ct, {"kind": "switch_down", "switch": "gpu0", "at_ns": 0})
    assert str(info.value) == ("s.yaml: faults.events[0].switch: 'gpu0' is not a switch "
                               "(switches are e.g. leaf0, spine0)")


def test_a_link_up_ends_what_holds_the_link_down_as_in_the_twin(ct: CompiledTopology) -> None:
    """A ``link_up`` brings back a link an open-ended ``link_down`` took down (the twin
    counts the faults holding a link: the replay did not, and kept it down); one that
    finds its link up changes nothing and is named for a warning."""
    t = resolve(ct, {"kind": "link_down", "link": "leaf0-spine0", "at_ns": "1ms"},
                {"kind": "link_up", "link": "leaf0-spine0", "at_ns": "3ms"},
                {"kind": "link_up", "link": "leaf1-spine0", "at_ns": "4ms"})
    cable = {link(ct, "leaf0", "spine0"), link(ct, "spine0", "leaf0")}
    assert t.links_at(2_000_000)[0] == cable
    assert t.links_at(3_000_000)[0] == frozenset()
    assert [f.fault_id for f in t.idle_link_ups()] == [2]


def test_a_link_up_that_changes_nothing_is_warned_of(tmp_path: Path) -> None:
    from fabricpilot.runner import config_warnings, prepare
    from fabricpilot.scenario import scenario_from_dict

    sc = scenario_from_dict({
        "name": "up", "topology": {"kind": "leaf_spine", "hosts": 4, "gpus_per_host": 1,
                                   "nics_per_leaf": 2},
        "jobs": [{"name": "a", "gpus": 2, "collectives": [{"op": "allreduce",
                                                          "size_bytes": "1MiB"}]}],
        "faults": {"events": [{"kind": "link_up", "link": "leaf0-spine1", "at_ns": "1ms"}]},
    }, "up.yaml")
    assert config_warnings(sc, prepare(sc)) == [
        "faults.events: link leaf0<->spine1 up at 1 ms: nothing holds the link down then, "
        "so it changes nothing"]


def test_a_link_down_on_a_link_already_down_is_warned_of(ct: CompiledTopology) -> None:
    """The same open-ended ``link_down`` given twice holds the link twice: one ``link_up``
    leaves it down (the twin counts holds), so the second one is named for a warning; a
    ``link_down`` inside a switch's down time is named too, one after the first ended not."""
    t = resolve(ct, {"kind": "link_down", "link": "leaf0-spine1", "at_ns": "1ms"},
                {"kind": "link_down", "link": "leaf0-spine1", "at_ns": "2ms"},
                {"kind": "link_up", "link": "leaf0-spine1", "at_ns": "5ms"},
                {"kind": "switch_down", "switch": "spine0", "at_ns": "1ms", "until_ns": "3ms"},
                {"kind": "link_down", "link": "leaf1-spine0", "at_ns": "2ms", "until_ns": "4ms"},
                {"kind": "link_down", "link": "leaf1-spine0", "at_ns": "4ms"})
    cable = {link(ct, "leaf0", "spine1"), link(ct, "spine1", "leaf0")}
    assert cable <= t.links_at(6_000_000)[0]  # (one hold left after the link_up)
    assert [(f.fault_id, g.fault_id) for f, g in t.stacked_link_downs()] == [(1, 0), (4, 3)]


def test_a_stacked_link_down_is_a_config_warning() -> None:
    from fabricpilot.runner import config_warnings, prepare
    from fabricpilot.scenario import scenario_from_dict

    down = {"kind": "link_down", "link": "leaf0-spine1", "at_ns": "1ms"}
    sc = scenario_from_dict({
        "name": "twice", "topology": {"kind": "leaf_spine", "hosts": 4, "gpus_per_host": 1,
                                      "nics_per_leaf": 2},
        "jobs": [{"name": "a", "gpus": 2, "collectives": [{"op": "allreduce",
                                                          "size_bytes": "1MiB"}]}],
        "faults": {"events": [down, {**down, "at_ns": "2ms"}]},
    }, "twice.yaml")
    assert config_warnings(sc, prepare(sc)) == [
        "faults.events: link leaf0<->spine1 down at 2 ms: the link is already down then "
        "(link leaf0<->spine1 down at 1 ms): it comes up once both have ended (a link_up "
        "ends one)"]
