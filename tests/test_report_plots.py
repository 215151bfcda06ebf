"""The plots' data against figures derived independently, and the report's files."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from fabricpilot.report.plots import (
    busbw_by_job,
    ecdf,
    fabric_utilization,
    iteration_times,
    queued_bytes,
    write_report,
)
from fabricpilot.runner import prepare, run_policy
from fabricpilot.scenario import scenario_from_dict
from fabricpilot.workload.plan import Op, busbw_factor


@pytest.fixture(scope="module")
def runs():  # type: ignore[no-untyped-def]
    """A 16-GPU leaf-spine shared by an AlltoAll and a ring AllReduce (2 iterations), with
    mice, under ECMP and ideal."""
    sc = scenario_from_dict({
        "name": "plots", "seed": 4,
        "topology": {"kind": "leaf_spine", "hosts": 16, "gpus_per_host": 1,
                     "nics_per_leaf": 4, "rail_optimized": False},
        "jobs": [{"name": "a2a", "gpus": 8, "iterations": 2, "compute_ns": "20us",
                  "collectives": [{"op": "alltoall", "size_bytes": "4MiB"}]},
                 {"name": "ring", "gpus": 8, "iterations": 2, "compute_ns": "20us",
                  "collectives": [{"op": "allreduce", "size_bytes": "8MiB"}]}],
        "mice": {"rate_per_s": 200000, "size_bytes": "16KiB", "duration_ns": "200us"},
    }, "plots.yaml")
    prep = prepare(sc, "plots.yaml")
    return [run_policy(prep, p) for p in ("ecmp", "ideal")]


def test_busbw_is_bus_bytes_over_collective_time(runs) -> None:  # type: ignore[no-untyped-def]
    """nccl-tests' busbw: algbw x factor (AlltoAll (n-1)/n, AllReduce 2(n-1)/n), a job's
    collectives together: their bus bytes over their time."""
    data = busbw_by_job(runs)
    assert set(data) == {"a2a", "ring"}
    for r in runs:
        for job, op in (("a2a", Op.ALLTOALL), ("ring", Op.ALLREDUCE)):
            cs = r.job_collectives(job)
            assert len(cs) == 2
            bus_bytes = sum(c.size_bytes * busbw_factor(op, 8) for c in cs)
            assert data[job][r.policy] == pytest.approx(
                bus_bytes / sum(c.end_ns - c.start_ns for c in cs), rel=1e-12)


def test_fabric_utilization_adds_up_to_the_fabric_bytes(runs) -> None:  # type: ignore[no-untyped-def]
    for r in runs:
        u = fabric_utilization(r)
        fabric = np.asarray(r.link_kind) == "fabric"
        assert len(u) == fabric.sum() and np.all(np.diff(u) >= 0)
        # utilisation x capacity x time is the bytes each carried
        carried = np.sort(r.link_bytes[fabric] * 8.0
                          / (r.link_capacity_gbps[fabric] * r.sim_time_ns))
        np.testing.assert_allclose(u, carried, rtol=1e-12)
        assert 0 < u[-1] <= 1.0


def test_iteration_times_and_the_slowdown_cdf(runs) -> None:  # type: ignore[no-untyped-def]
    r = runs[0]
    times = iteration_times(r)
    for job in ("a2a", "ring"):
        its = r.job_iterations(job)
        assert times[job] == [(i.end_ns - i.start_ns) / 1e6 for i in its] and len(its) == 2
    x, y = ecdf(r.slowdowns("mice"))
    assert len(x) == len(r.slowdowns("mice")) > 10
    assert y[-1] == 1.0 and np.all(np.diff(x) >= 0) and x[0] >= 1.0 - 1e-9


def test_queued_bytes_sums_the_links_of_each_sample() -> None:
    ts = _Sized({"time_ns": np.array([1000, 1000, 1000, 2000]),
                 "link": np.array([0, 1, 2, 1]),
                 "queue_bytes": np.array([10.0, 20.0, 7.0, 5.0])})
    # link 2 leaves a GPU: its NIC's send queue, not a switch buffer
    fake = SimpleNamespace(model_report=SimpleNamespace(timeseries=ts),
                           link_names=["leaf0->spine0", "spine0->leaf1", "gpu3->leaf0"])
    t, q = queued_bytes(fake)  # type: ignore[arg-type]
    assert t.tolist() == [0.001, 0.002] and q.tolist() == [30.0, 5.0]
    t, q = queued_bytes(SimpleNamespace(model_report=None))  # type: ignore[arg-type]
    assert len(t) == len(q) == 0


class _Sized:
    """A time series stand-in: its columns and its length (rows)."""

    def __init__(self, cols: dict[str, np.ndarray]) -> None:
        self._cols = cols

    def columns(self) -> dict[str, np.ndarray]:
        return self._cols

    def __len__(self) -> int:
        return len(self._cols["time_ns"])


def test_the_report_is_written_and_reproducible(runs, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The page names every policy, the reference's fractions (hand-computed) and only
    images that exist; the same results give byte-identical files."""
    first = write_report(runs, runs[1], tmp_path / "a")
    second = write_report(runs, runs[1], tmp_path / "b")
    names = sorted(p.relative_to(tmp_path / "a").as_posix() for p in first)
    assert names == ["plots/busbw.png", "plots/iterations.png", "plots/link_utilization.png",
                     "plots/slowdown_cdf.png", "report.html"]  # (no queues: flow model)
    for a, b in zip(first, second, strict=True):
        assert a.read_bytes() == b.read_bytes()
    page = (tmp_path / "a" / "report.html").read_text()
    ecmp, ideal = runs
    frac = ecmp.mean_busbw_GBps("a2a") / ideal.mean_busbw_GBps("a2a")
    assert f"<td>ecmp</td><td>{ecmp.mean_iteration_ns('a2a') / 1e6:.3f}</td>" in page
    assert f"<td>{frac:.1%}</td>" in page
    assert page.count("<img ") == 4 and "<h2>faults" not in page


def test_the_report_lists_the_faults(tmp_path: Path) -> None:
    """With faults, the page has the fault table: detected after the configured delay
    (100 us), the fault described under it; without faults, none."""
    sc = scenario_from_dict({
        "name": "faulty", "seed": 3,
        "topology": {"kind": "leaf_spine", "hosts": 8, "gpus_per_host": 1,
                     "nics_per_leaf": 2, "rail_optimized": False},
        "jobs": [{"name": "a2a", "gpus": 8, "collectives": [
            {"op": "alltoall", "size_bytes": "64MiB"}]}],
        "faults": {"detection_delay_ns": "100us", "convergence_delay_ns": "1ms",
                   "events": [{"kind": "link_down", "link": "leaf0-spine0", "at_ns": "200us"}]},
    }, "faulty.yaml")
    r = run_policy(prepare(sc, "faulty.yaml"), "ecmp")
    write_report([r], None, tmp_path)
    page = (tmp_path / "report.html").read_text()
    assert "<h2>faults" in page and "<td>ecmp</td><td>#0</td><td>0.100</td>" in page
    assert "#0: link leaf0&lt;-&gt;spine0 down at 200 us" in page
    assert "of nothing" not in page and "no ideal run" in page
    # the all-to-all crossed the link (every leaf pair spreads over both spines); it was
    # stalled, not cut off
    assert r.faults[0]["jobs_hit"] == ["a2a"] and "<td>a2a</td></tr>" in page
    # in a 110-column pipe (the CLI's width) no figure or header of the table is cut short,
    # even with six policies and times of hundreds of ms
    from rich.console import Console

    from fabricpilot.report.tables import fault_table

    f = r.faults[0]
    slow = replace(r, faults=[{**f, "reroute_us": 200_100.0, "recovery_us": 208_341.6}])
    con = Console(width=110, record=True, file=io.StringIO())
    con.print(fault_table([replace(slow, policy=p) for p in (
        "ecmp", "adaptive", "task-aware", "ideal", "spray", "spray-ooo")]))
    text = con.export_text()
    assert "…" not in text and "200.100" in text and "208.342" in text, text
    # nor a job's name, however long: where it does not fit, it folds onto the next line
    named = replace(slow, faults=[{**slow.faults[0], "jobs_hit": ["dp-ring", "x" * 30],
                                   "partitioned": ["dp-ring"]}])
    con = Console(width=110, record=True, file=io.StringIO())
    con.print(fault_table([replace(named, policy=p) for p in (
        "ecmp", "adaptive", "task-aware", "ideal", "spray", "spray-ooo")]))
    text = con.export_text()
    assert "…" not in text and text.count("x") == 6 * 30 and text.count("dp-ring") == 6, text
    assert max(map(len, text.splitlines())) <= 110
    # an 80-column terminal has no room for every figure side by side: one line per policy
    # and fault instead, each figure whole and named
    con = Console(width=80, record=True, file=io.StringIO())
    policies = ("ecmp", "adaptive-split", "task-aware")
    con.print(fault_table([replace(slow, policy=p) for p in policies], width=80))
    text = con.export_text()
    assert "…" not in text and "┃" not in text and max(map(len, text.splitlines())) <= 80
    flat = " ".join(text.split())
    for p in policies:
        assert (f"{p} #0: detected 0.100, rerouted 200.100, recovery 208.342, lost "
                in flat), flat
    assert "#0: link leaf0<->spine0 down at 200 us" in flat


def test_the_report_carries_interference_and_the_controller_line(runs, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from dataclasses import replace

    ecmp = replace(runs[0], interference={"a2a": 1.25, "ring": 1.0},
                   controller={"qps_steered": 90, "qps_pinned": 6, "qps_unpinned": 0,
                               "switch_rules_max": 4, "switch_rule_capacity": 4096,
                               "control_periods": 12, "replans": 1, "fuse_trips": 0})
    write_report([ecmp, runs[1]], runs[1], tmp_path)
    page = (tmp_path / "report.html").read_text()
    assert "<th>interference</th>" in page and "<td>1.250x</td>" in page
    assert "<td>-</td></tr>" in page  # (ideal's run measured none)
    assert "ecmp controller: 90 QPs steered by source port, 6 pinned by rules" in page


def test_a_reference_not_shown_is_given_by_its_figures(runs, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """With ``ideal`` run as the reference only, the page gives its busbw per job, as the
    CLI does, so that the fractions can be checked from the page."""
    ecmp, ideal = runs
    write_report([ecmp], ideal, tmp_path)
    page = (tmp_path / "report.html").read_text()
    figures = ", ".join(f"{j.name} {ideal.mean_busbw_GBps(j.name):.1f}" for j in ideal.jobs)
    assert f"ideal (run as the reference only), busbw GB/s: {figures}." in page
    write_report([ecmp, ideal], ideal, tmp_path / "both")
    assert "run as the reference only" not in (tmp_path / "both" / "report.html").read_text()


def test_a_reproducible_report_leaves_the_heal_wall_times_out(runs, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Heal times are the controller's wall-clock time: two runs of one seed differ in
    them, so a reproducible report leaves them out (as the JSON writes them as 0) and
    otherwise says they are wall time."""
    from dataclasses import replace

    ctl = {"qps_steered": 90, "qps_pinned": 0, "qps_unpinned": 0, "switch_rules_max": 0,
           "switch_rule_capacity": 4096, "control_periods": 12, "replans": 0,
           "fuse_trips": 0, "heals": 2, "heal_sent_max_ms": 1.0}
    pages = []
    for i, wall_ms in enumerate((14.14, 1.31)):
        r = replace(runs[0], controller={**ctl, "heal_max_ms": wall_ms})
        write_report([r], None, tmp_path / f"r{i}", include_wall_time=False)
        pages.append((tmp_path / f"r{i}" / "report.html").read_text())
    assert pages[0] == pages[1]
    assert "fuse trips; 2 heals</p>" in pages[0] and "wall" not in pages[0]
    r = replace(runs[0], controller={**ctl, "heal_max_ms": 14.14})
    write_report([r], None, tmp_path / "w")
    page = (tmp_path / "w" / "report.html").read_text()
    assert "2 heals (the slowest 14.14 ms of wall time" in page


def test_the_report_has_the_fluid_tables_and_what_the_cli_says_under_them(
        tmp_path: Path) -> None:
    """The page shows what the terminal shows below its tables: the fluid model's columns
    (pause storms counted, as many as listed), the storms, and a job whose SLA no path
    meets."""
    from fabricpilot.report.tables import pfc_event_lines, run_notes

    root = Path(__file__).resolve().parents[1]
    from fabricpilot.scenario import load_scenario

    path = root / "examples" / "pause_storm.yaml"
    r = run_policy(prepare(load_scenario(path), str(path)), "ecmp")
    storms = r.summary()["pfc_storms"]
    assert storms > 0 and r.model_report is not None
    assert len([e for e in r.model_report.events if e.kind == "storm"]) == storms
    write_report([r], None, tmp_path)
    page = (tmp_path / "report.html").read_text()
    assert "<th>storms</th>" in page and f"<td>{storms}</td>" in page
    lines = pfc_event_lines([r])
    assert lines[-1] == f"ecmp: ... and {storms - 10} more"
    assert all(f"<li>{line.replace('>', '&gt;')}</li>" in page for line in lines)
    # an SLA no path meets: the line under the CLI's table, on the page too
    unmet = replace(r, sla_unmet=["retrieval: L1 (< 50 us) needs one switch"])
    assert run_notes([unmet]) == ["ecmp: 1 job with an SLA no path meets, e.g. retrieval: "
                                  "L1 (< 50 us) needs one switch"]
    write_report([unmet], None, tmp_path)
    assert "1 job with an SLA no path meets" in (tmp_path / "report.html").read_text()


def test_a_job_stopped_after_some_iterations_is_marked_so(tmp_path: Path) -> None:
    """examples/link_failure.yaml with 7 RDMA retries: under ECMP both jobs stop 32 ms
    after the loss (7 x 4 ms timeouts, as docs/model.md says), the ring before it finished an
    iteration, the AlltoAll after one. The table shows the AlltoAll's figures "then
    stopped", the JSON why each stopped and no fraction of ideal for the ring (the table's
    "-"), and the busbw plot is written with both marked."""
    import json

    import yaml

    from fabricpilot.report.tables import comparison_rows
    from fabricpilot.results import summary_json
    from fabricpilot.scenario import scenario_from_dict

    root = Path(__file__).resolve().parents[1]
    data = yaml.safe_load((root / "examples" / "link_failure.yaml").read_text())
    data["faults"]["rdma_retry_count"] = 7
    prep = prepare(scenario_from_dict(data, "lf.yaml"), "lf.yaml")
    ecmp, ideal = run_policy(prep, "ecmp"), run_policy(prep, "ideal")
    assert set(ecmp.aborted) == {"dp-ring", "ep-alltoall"}
    _, rows = comparison_rows([ecmp], ideal)
    cells = {c[0]: c for c, _ in rows}
    assert cells["dp-ring"][3:] == ["stopped", "-", "-"]
    assert cells["ep-alltoall"][3].endswith(" then stopped")
    jobs = {j["name"]: j for j in json.loads(summary_json([ecmp], reference=ideal))["jobs"]}
    assert jobs["dp-ring"]["of_ideal"] is None and jobs["dp-ring"]["iterations"] == 0
    assert "RDMA retries exhausted" in jobs["dp-ring"]["stopped"]
    assert jobs["ep-alltoall"]["iterations"] >= 1 and jobs["ep-alltoall"]["of_ideal"] > 0
    assert "stopped" not in {j["name"]: j for j in json.loads(summary_json([ideal]))[
        "jobs"]}["dp-ring"]
    assert (write_report([ecmp], ideal, tmp_path)[0]).name == "busbw.png"


def test_peak_fabric_utilization_is_blank_with_no_fabric_link(tmp_path: Path,
                                                              runs) -> None:  # type: ignore[no-untyped-def]
    """One leaf reaches every NIC, so the fabric has no spine and no switch-to-switch link:
    its peak fabric utilisation is no figure ("-", null), not 0 %. With spines it is the
    busiest fabric link's peak."""
    from fabricpilot.report.tables import fabric_cells
    sc = scenario_from_dict({
        "name": "one-leaf", "seed": 1,
        "topology": {"kind": "leaf_spine", "hosts": 4, "gpus_per_host": 1,
                     "nics_per_leaf": 4, "rail_optimized": False},
        "jobs": [{"name": "ring", "gpus": 4, "collectives": [{"op": "allreduce",
                                                               "size_bytes": "1MiB"}]}],
    }, "one-leaf.yaml")
    r = run_policy(prepare(sc, "one-leaf.yaml"), "ecmp")
    assert "fabric" not in r.link_kind and r.bytes_delivered == r.bytes_sent > 0
    links = r.summary()["links"]
    assert links == {"fabric_peak_utilization": None, "fabric_mean_utilization": None}
    assert fabric_cells(r)[4] == "-"
    write_report([r], None, tmp_path)  # (the report is made all the same)
    for two in runs:
        fabric = np.asarray(two.link_kind) == "fabric"
        peak = float(two.link_peak_util[fabric].max())
        assert 0 < peak <= 1 + 1e-9
        assert fabric_cells(two)[4] == f"{peak:.0%}"


def test_every_policy_has_a_colour_of_its_own_in_every_report() -> None:
    """A policy's colour follows its name, not its place among ``-p`` (ECMP was blue in
    one report and flowlet in another): every registered policy has a colour, no two the
    same."""
    from fabricpilot.balancing import POLICIES
    from fabricpilot.report.plots import policy_color

    colours = {name: policy_color(name) for name in POLICIES}
    assert len(set(colours.values())) == len(colours)
    assert policy_color("not-a-policy") not in colours.values()
