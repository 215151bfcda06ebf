"""The fluid model's configuration as a user writes it: the scenario schema (defaults equal the
data plane's, one-line errors that name the field), what `prepare` hands the rate model, the
QoS mismatch warning of the CLI, the summary keys (zeros under the flow model) and the fluid
model's extra tables."""

from __future__ import annotations

import copy
import csv
import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fabricpilot.dataplane import DcqcnParams, EcnParams, FluidParams, PfcParams, QosParams
from fabricpilot.dataplane.fluid import FluidReport, PfcEvent
from fabricpilot.errors import ScenarioError
from fabricpilot.report.tables import pfc_event_lines
from fabricpilot.results import summary_json, write_tables
from fabricpilot.results.io import PORT_COLUMNS, TIMESERIES_COLUMNS
from fabricpilot.results.run import MAX_PFC_EVENTS
from fabricpilot.runner import config_warnings, prepare, qos_warnings, run_policy
from fabricpilot.scenario import FabricSpec, load_scenario, scenario_from_dict
from fabricpilot.scenario.models import DcqcnSpec, EcnSpec, FluidSpec, PfcSpec, QosSpec

ROOT = Path(__file__).resolve().parents[1]

TINY: dict[str, Any] = {
    "name": "tiny",
    "seed": 1,
    "policies": ["ecmp"],
    "topology": {"kind": "leaf_spine", "hosts": 4, "gpus_per_host": 1, "nics_per_leaf": 2,
                 "rail_optimized": False},
    "fabric": {"model": "fluid"},
    "jobs": [{"name": "a2a", "gpus": 4,
              "collectives": [{"op": "alltoall", "size_bytes": "1MiB"}]}],
}

SUMMARY_KEYS = {"model", "ecn_marks", "drops_bytes", "retransmitted_bytes", "pfc_pause_ns_total",
                "pause_frames", "pfc_storms", "deadlocks", "pfc_events", "qos_mismatches"}


def tiny(**fabric: Any) -> dict[str, Any]:
    data = copy.deepcopy(TINY)
    data["fabric"].update(fabric)
    return data


def write(tmp_path: Path, data: dict[str, Any], name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def load_error(tmp_path: Path, data: dict[str, Any]) -> ScenarioError:
    """Load and prepare ``data`` from a file, expecting one one-line ScenarioError."""
    path = write(tmp_path, data, "bad.yaml")
    with pytest.raises(ScenarioError) as info:
        prepare(load_scenario(path), str(path))
    err = info.value
    assert "\n" not in str(err) and str(err).startswith(f"{path}: ")
    return err


# --- schema ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "params"), [
    (EcnSpec, EcnParams), (DcqcnSpec, DcqcnParams), (PfcSpec, PfcParams),
    (FluidSpec, FluidParams), (QosSpec, QosParams),
], ids=lambda x: x.__name__)
def test_defaults_equal_the_data_plane_defaults(spec: Any, params: Any) -> None:
    names = {f.name for f in dataclasses.fields(params)}
    assert set(spec.model_fields) == names  # every field mirrored, nothing extra
    assert spec().to_params() == params()
    for name in names:
        assert getattr(spec().to_params(), name) == getattr(params(), name), name
    for name, info in spec.model_fields.items():
        assert info.description, f"{spec.__name__}.{name} has no description"


def test_fabric_defaults_and_quantity_strings() -> None:
    f = FabricSpec()
    assert f.model == "flow"
    assert (f.ecn.kmin_bytes, f.ecn.kmax_bytes, f.ecn.pmax) == (5120, 204800, 0.01)
    assert f.qos.dscp == {"rdma": 26, "tcp": 0, "control": 48}
    assert f.qos.dscp_to_priority == {26: 3, 0: 0, 48: 6}
    assert f.qos.lossless_priorities == [3] and f.qos.scheduler == "strict"
    assert f.qos.weights == {6: 1.0, 3: 8.0, 0: 1.0} and f.qos.switch_overrides == {}
    f = FabricSpec.model_validate({
        "model": "fluid", "ecn": {"kmin_bytes": "10KiB", "kmax_bytes": "1MiB", "pmax": 0.2},
        "dcqcn": {"timer_ns": "20us", "min_rate_gbps": "1Gbps", "enabled": False},
        "pfc": {"xoff_bytes": "64KiB", "xon_bytes": "32KiB", "deadlock_detect_ns": "1ms"},
        "fluid": {"step_ns": "1us", "buffer_bytes_per_port": "1MiB"},
        "qos": {"dscp_to_priority": {"26": 3, 0: 0, 48: 6}, "lossless_priorities": [3, 4],
                "scheduler": "weighted", "weights": {3: 4}},
    })
    assert (f.ecn.kmin_bytes, f.ecn.kmax_bytes) == (10240, 1 << 20)
    assert f.dcqcn.to_params().timer_ns == 20_000 and f.dcqcn.min_rate_gbps == 1.0
    assert f.pfc.to_params() == PfcParams(xoff_bytes=65536, xon_bytes=32768,
                                          deadlock_detect_ns=1_000_000)
    assert f.fluid.to_params().buffer_bytes_per_port == 1 << 20
    q = f.qos.to_params()
    assert q.lossless_priorities == frozenset({3, 4}) and q.dscp_to_priority[26] == 3
    assert q.weights == {3: 4.0} and q.scheduler == "weighted"


BAD_FABRIC = [
    ({"ecn": {"kmin_bytes": "300KiB"}}, "fabric.ecn.kmin_bytes", "must be <= kmax_bytes"),
    ({"ecn": {"pmax": 0}}, "fabric.ecn.pmax", "must be > 0"),
    ({"ecn": {"pmax": 1.5}}, "fabric.ecn.pmax", "must be <= 1"),
    ({"pfc": {"xon_bytes": "1MiB"}}, "fabric.pfc.xon_bytes", "must be <= xoff_bytes"),
    ({"pfc": {"storm_hops": 0}}, "fabric.pfc.storm_hops", "must be >= 1"),
    ({"dcqcn": {"timer_ns": "5Gbps"}}, "fabric.dcqcn.timer_ns", "wrong unit"),
    ({"fluid": {"step_ns": "30us"}}, "fabric.fluid.max_quiet_step_ns", "must be >= step_ns"),
    ({"fluid": {"max_busy_step_ns": "100ns"}}, "fabric.fluid.max_busy_step_ns",
     "must be between step_ns and max_quiet_step_ns"),
    ({"fluid": {"max_busy_step_ns": "1ms"}}, "fabric.fluid.max_busy_step_ns",
     "(500 <= 1000000 <= 20000 does not hold)"),
    ({"model": "packet"}, "fabric.model", "must be 'flow' or 'fluid'"),
    ({"qos": {"dscp_to_priority": {26: 9}}}, "fabric.qos.dscp_to_priority[26]",
     "must be a priority 0..7 (got 9)"),
    ({"qos": {"dscp_to_priority": {64: 1}}}, "fabric.qos.dscp_to_priority[64]", "0..63"),
    ({"qos": {"lossless_priorities": [3, 9]}}, "fabric.qos.lossless_priorities[1]",
     "must be a priority 0..7 (got 9)"),
    ({"qos": {"dscp": {"rdma": 26, "tcp": 0}}}, "fabric.qos.dscp", "missing class 'control'"),
    ({"qos": {"dscp": {"rdma": 26, "tcp": 0, "control": 48, "video": 5}}},
     "fabric.qos.dscp.video", "unknown traffic class"),
    ({"qos": {"weights": {3: 0}}}, "fabric.qos.weights[3]", "must be a weight > 0"),
    ({"qos": {"scheduler": "fifo"}}, "fabric.qos.scheduler", "'strict' or 'weighted'"),
    ({"qos": {"switch_overrides": {"leaf0": {26: 8}}}},
     "fabric.qos.switch_overrides.leaf0[26]", "must be a priority 0..7"),
    ({"qos": {"switch_overrides": {"leaf7": {26: 0}}}}, "fabric.qos.switch_overrides.leaf7",
     "unknown switch (switches are e.g. leaf0, spine0)"),
    ({"pfc": {"xoff": 1}}, "fabric.pfc.xoff", "unknown key"),
]


@pytest.mark.parametrize(("fabric", "field", "problem"), BAD_FABRIC,
                         ids=[b[1] + ":" + b[2][:12] for b in BAD_FABRIC])
def test_bad_fabric_settings(tmp_path: Path, fabric: dict[str, Any], field: str,
                             problem: str) -> None:
    err = load_error(tmp_path, tiny(**fabric))
    assert err.field == field
    assert problem in err.problem, err.problem


@pytest.mark.parametrize("where", ["job", "mice"])
def test_unknown_traffic_class(tmp_path: Path, where: str) -> None:
    data = tiny()
    if where == "job":
        data["jobs"][0]["traffic_class"] = "video"
        field = "jobs[0].traffic_class"
    else:
        data["mice"] = {"rate_per_s": 1000, "duration_ns": "1us", "traffic_class": "bulk"}
        field = "mice.traffic_class"
    err = load_error(tmp_path, data)
    assert err.field == field and "'rdma', 'tcp' or 'control'" in err.problem


# --- prepare --------------------------------------------------------------------------------


def test_prepare_passes_the_model_parameters_and_classes() -> None:
    data = tiny(pfc={"xoff_bytes": "64KiB", "xon_bytes": "32KiB"},
                qos={"switch_overrides": {"spine1": {26: 0}}})
    data["jobs"][0]["traffic_class"] = "tcp"
    data["mice"] = {"rate_per_s": 1000, "duration_ns": "1us", "traffic_class": "control"}
    prep = prepare(scenario_from_dict(data))
    assert prep.rate_model == "fluid"
    assert set(prep.model_params) == {"ecn", "dcqcn", "pfc", "fluid", "qos"}
    assert prep.model_params["pfc"] == PfcParams(xoff_bytes=65536, xon_bytes=32768)
    assert prep.model_params["ecn"] == EcnParams()
    qos = prep.model_params["qos"]
    assert isinstance(qos, QosParams) and qos.switch_overrides == {"spine1": {26: 0}}
    assert prep.jobs[0].traffic_class == "tcp" and prep.mice_class == "control"
    assert qos_warnings(prep) == prep.qos_mismatches == [
        "spine1: DSCP 26 (rdma) -> priority 0 (lossy), other switches use priority 3 "
        "(lossless)"]


def test_flow_model_warns_that_fluid_settings_are_ignored() -> None:
    sc = scenario_from_dict(tiny(model="flow", pfc={"enabled": False}))
    assert config_warnings(sc, prepare(sc)) == [
        "fabric: pfc is ignored by the flow model (set fabric.model: fluid to use it)"]
    sc = scenario_from_dict(tiny())
    assert config_warnings(sc, prepare(sc)) == []


def test_a_job_of_one_gpu_is_warned_of() -> None:
    """A one-GPU job's collectives move no data (nccl-tests' bus factor of one rank is 0):
    it runs, with a warning naming it, and its collectives take no time."""
    data = tiny(model="flow")
    data["jobs"][0]["gpus"] = 3
    data["jobs"].append({**copy.deepcopy(data["jobs"][0]), "name": "solo", "gpus": 1})
    sc = scenario_from_dict(data)
    prep = prepare(sc)
    assert config_warnings(sc, prep) == [
        "jobs[1]: solo: one GPU: its collectives move no data over the fabric "
        "(time 0, busbw 0)"]
    assert all(not s.transfers for c in prep.jobs[1].collectives for s in c.stages)


def test_validate_warns_of_a_qos_mismatch(tmp_path: Path) -> None:
    path = write(tmp_path, tiny(qos={"switch_overrides": {"leaf1": {26: 0}}}))
    res = subprocess.run([sys.executable, "-m", "fabricpilot", "validate", str(path)],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert res.stderr.strip().splitlines() == [
        f"warning: {path}: fabric.qos: leaf1: DSCP 26 (rdma) -> priority 0 (lossy), other "
        f"switches use priority 3 (lossless)"]
    assert "ok" in res.stdout


# --- results --------------------------------------------------------------------------------


def test_flow_summary_has_the_fluid_keys_as_zeros() -> None:
    prep = prepare(scenario_from_dict(tiny(model="flow")))
    result = run_policy(prep, "ecmp")
    assert result.model == "flow" and result.model_report is None
    s = result.summary()
    assert s.keys() >= SUMMARY_KEYS and "pfc_events_truncated" not in s
    assert s["model"] == "flow" and s["pfc_events"] == [] and s["qos_mismatches"] == []
    for key in SUMMARY_KEYS - {"model", "pfc_events", "qos_mismatches"}:
        assert s[key] == 0 and isinstance(s[key], int), key


def test_tiny_fluid_run_writes_timeseries_and_ports(tmp_path: Path) -> None:
    data = tiny(pfc={"xoff_bytes": "16KiB", "xon_bytes": "8KiB"})
    data["topology"]["oversubscription"] = 2  # one uplink per leaf of two GPUs: it queues
    result = run_policy(prepare(scenario_from_dict(data)), "ecmp")
    assert result.model == "fluid" and isinstance(result.model_report, FluidReport)
    s = result.summary(include_wall_time=False)
    assert s.keys() >= SUMMARY_KEYS and s["model"] == "fluid"
    assert s["bytes_delivered"] == s["bytes_sent"] > 0
    for key in ("ecn_marks", "drops_bytes", "retransmitted_bytes", "pfc_pause_ns_total",
                "pause_frames", "pfc_storms", "deadlocks"):
        assert isinstance(s[key], int) and s[key] >= 0, key
    assert json.loads(summary_json([result], include_wall_time=False)) == s

    names = {p.name for p in write_tables(result, tmp_path)}
    assert {"timeseries.csv", "ports.csv", "flows.csv"} <= names
    with (tmp_path / "timeseries.csv").open() as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == TIMESERIES_COLUMNS == ["time_ns", "link", "queue_bytes", "utilization",
                                             "ecn_marks", "paused"]
    assert len(rows) > 1 and all(len(r) == len(rows[0]) for r in rows)
    assert {r[1] for r in rows[1:]} <= set(result.link_names)
    assert all(r[5] in ("0", "1") for r in rows[1:])
    with (tmp_path / "ports.csv").open() as fh:
        header, *ports = list(csv.reader(fh))
    assert header == PORT_COLUMNS == ["link", "priority", "pause_ns", "pause_frames",
                                      "ecn_marks", "drops_bytes"]
    assert ports and s["pause_frames"] > 0 and s["pfc_pause_ns_total"] > 0
    for link, prio, *values in ports:  # only (link, priority) pairs with something to report
        assert link in result.link_names and prio == "3"  # the lossless RDMA priority
        assert any(float(v) > 0 for v in values)
    with (tmp_path / "flows.csv").open() as fh:
        flows = list(csv.DictReader(fh))
    assert flows and all(int(f["retx_bytes"]) >= 0 for f in flows)


def test_pfc_events_are_capped_and_counted() -> None:
    prep = prepare(scenario_from_dict(tiny(model="flow")))
    result = run_policy(prep, "ecmp")
    events = [PfcEvent("storm", 1000 * i, [f"leaf0->spine{i % 2} prio 3"], hops=3)
              for i in range(MAX_PFC_EVENTS + 5)]
    events.append(PfcEvent("deadlock", 5, ["a prio 3", "b prio 3"], cleared_by_watchdog=True))
    result.model_report = FluidReport(events=events)
    s = result.summary()
    assert s["pfc_storms"] == MAX_PFC_EVENTS + 5 and s["deadlocks"] == 1
    assert len(s["pfc_events"]) == MAX_PFC_EVENTS and s["pfc_events_truncated"] == 6
    assert s["pfc_events"][1] == {"kind": "storm", "time_ns": 1000,
                                  "ports": ["leaf0->spine1 prio 3"], "hops": 3,
                                  "cleared_by_watchdog": False}
    lines = pfc_event_lines([result])
    assert lines[1] == "ecmp: pause storm at 0.001 ms: leaf0->spine1 prio 3 (3 hops)"
    assert len(lines) == 11 and lines[-1] == f"ecmp: ... and {MAX_PFC_EVENTS - 4} more"


def test_a_run_longer_than_the_row_budget_coarsens_its_timeseries(tmp_path: Path) -> None:
    data = tiny(fluid={"sample_interval_ns": "1us", "max_timeseries_rows": 50})
    data["topology"]["oversubscription"] = 2
    path = write(tmp_path, data)
    proc = subprocess.run(
        [sys.executable, "-m", "fabricpilot", "run", str(path), "--policy", "ecmp",
         "--out", str(tmp_path / "out"), "--json", str(tmp_path / "s.json")],
        capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    s = json.loads((tmp_path / "s.json").read_text())
    # a power-of-two multiple of the configured period, and said so on the terminal
    interval = s["timeseries_interval_ns"]
    assert interval > 1000 and (interval // 1000) & (interval // 1000 - 1) == 0
    assert "max_timeseries_rows=50" in proc.stdout
    with (tmp_path / "out" / "ecmp" / "timeseries.csv").open() as fh:
        rows = list(csv.reader(fh))[1:]
    assert 0 < len(rows) <= 50
    # it still covers the whole run: every ECN mark of the run is in some row
    assert s["ecn_marks"] > 0
    assert sum(float(r[4]) for r in rows) == pytest.approx(s["ecn_marks"], abs=1.0)


def test_a_dcqcn_floor_at_the_nic_rate_is_refused(tmp_path: Path) -> None:
    """A floor of 400 Gb/s on 400 Gb/s NICs: every cut would be undone at once (the run
    matched ``dcqcn.enabled: false`` while it said DCQCN was on); just below it, it loads."""
    err = load_error(tmp_path, tiny(dcqcn={"min_rate_gbps": 400}))
    assert err.field == "fabric.dcqcn.min_rate_gbps"
    assert err.problem.startswith("400 Gbps is not below the NIC rate (400 Gbps)")
    path = write(tmp_path, tiny(dcqcn={"min_rate_gbps": 399}))
    prepare(load_scenario(path), str(path))
    path = write(tmp_path, tiny(dcqcn={"min_rate_gbps": 400, "enabled": False}))
    prepare(load_scenario(path), str(path))


def test_a_run_that_delivers_nothing_stops_with_one_line(tmp_path: Path) -> None:
    """8 GPUs at 4 : 1 on one spine in a ring that crosses the leaves each hop, with 128
    KiB of buffer per switch: PFC pauses a port's senders at its xoff (some tens of KiB), so
    a few ports fill the switch first and its arrivals overflow it every step; every
    sender loses bytes in each and goes back N together, and the 1 MiB AllReduce never
    delivers a byte more. The run stops after 100 ms of simulated time without progress,
    with one line saying why (it ran on for ever)."""
    from fabricpilot.dataplane.engine import NO_PROGRESS_NS
    from fabricpilot.errors import SimulationError

    data = copy.deepcopy(TINY)
    data["topology"] = {"kind": "leaf_spine", "hosts": 8, "gpus_per_host": 1,
                        "nics_per_leaf": 4, "oversubscription": 4, "rail_optimized": False}
    data["fabric"]["fluid"] = {"buffer_bytes_per_switch": "128KiB"}
    data["jobs"] = [{"name": "ar", "gpus": 8, "placement": "explicit",
                     "gpu_ids": [0, 4, 1, 5, 2, 6, 3, 7], "collectives": [
                         {"op": "allreduce", "size_bytes": "1MiB", "algorithm": "ring"}]}]
    path = write(tmp_path, data)
    with pytest.raises(SimulationError) as info:
        run_policy(prepare(load_scenario(path), str(path)), "ecmp")
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(
        f"no byte was delivered for {NO_PROGRESS_NS / 1e6:g} ms of simulated time")
    assert "fabric.fluid.buffer_bytes_per_switch" in msg
