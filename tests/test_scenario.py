"""Scenario files: the default, the examples, unit strings, and one-line errors for bad files."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from fabricpilot.errors import ScenarioError
from fabricpilot.scenario import (
    Scenario,
    check_gpu_count,
    default_scenario,
    default_scenario_path,
    load_scenario,
    scenario_from_dict,
)
from fabricpilot.scenario.loader import load_strict_yaml

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.yaml"))

BASE: dict[str, Any] = {
    "name": "t",
    "topology": {"kind": "leaf_spine", "hosts": 16, "gpus_per_host": 8, "nics_per_leaf": 16},
    "jobs": [
        {"name": "a", "gpus": 8, "collectives": [{"op": "allreduce", "size_bytes": 1024}]},
        {"name": "b", "gpus": 8, "collectives": [{"op": "alltoall", "size_bytes": 1024}]},
    ],
}


def base() -> dict[str, Any]:
    """A fresh copy of a small valid scenario (128 GPUs, two 8-GPU jobs)."""
    return copy.deepcopy(BASE)


def write(tmp_path: Path, data: dict[str, Any] | str, name: str = "bad.yaml") -> Path:
    """Write ``data`` (a dict or raw YAML text) to ``tmp_path / name``."""
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def load_error(path: Path) -> ScenarioError:
    """Load ``path``, expecting a ScenarioError; check it is one line naming the file."""
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    err = info.value
    message = str(err)
    assert "\n" not in message
    assert path.name in message
    assert message == f"{err.source}: {err.field}: {err.problem}" or not err.field
    return err


# --- what loads ---------------------------------------------------------------------------


@pytest.mark.parametrize(("topology", "spines"), [
    # 2 x 800G NICs per leaf, 4 : 1 on 400G links: 2 x 800 / (4 x 400) = 1 spine
    ({"hosts": 4, "nics_per_leaf": 2, "oversubscription": 4, "nic_rate_gbps": 800,
      "fabric_rate_gbps": 400}, 1),
    # 16 ports at 1.6 : 1 (as written, 8/5): 10 spines
    ({"hosts": 32, "gpus_per_host": 1, "nics_per_leaf": 16, "oversubscription": 1.6,
      "rail_optimized": False}, 10),
])
def test_leaf_spines_counted_from_rates_and_ratios_as_written(topology: dict[str, Any],
                                                              spines: int) -> None:
    d = copy.deepcopy(BASE)
    d["topology"] = {"kind": "leaf_spine", **topology}
    d["jobs"] = [{"name": "a", "gpus": 2, "collectives": [{"op": "allreduce",
                                                           "size_bytes": 1 << 20}]}]
    assert Scenario.model_validate(d).topology.n_spines == spines


def test_default_scenario() -> None:
    scenario = default_scenario()
    assert scenario.name == "default"
    assert scenario.topology.n_gpus is not None and scenario.topology.n_gpus >= 128
    assert scenario.topology.gpus_per_host == 8
    # 16 hosts, 8 NIC ports per leaf: 2 leaves per rail x 8 rails; non-blocking: a leaf's
    # uplink capacity (spines x fabric rate) equals its downlink capacity (8 x NIC rate)
    topo = scenario.topology
    assert topo.n_leaves == 16 and topo.n_spines == 8
    assert topo.n_spines * topo.fabric_rate_gbps == topo.nics_per_leaf * topo.nic_rate_gbps
    assert topo.nic_rate_gbps == 400 and topo.rail_optimized
    assert len(scenario.jobs) >= 3
    ops = {c.op for job in scenario.jobs for c in job.collectives}
    assert {"allreduce", "alltoall"} <= ops
    assert scenario.mice is not None and scenario.mice.size_bytes == 16 * 1024
    assert scenario.seed == 7 and scenario.policies == ["ecmp", "adaptive", "task-aware", "ideal"]
    assert sum(job.gpus for job in scenario.jobs) <= scenario.topology.n_gpus
    assert default_scenario_path().is_file()


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_load(path: Path) -> None:
    scenario = load_scenario(path)
    assert scenario.jobs


def test_expected_examples_exist() -> None:
    names = {p.name for p in EXAMPLES}
    assert {
        "oversubscribed_2to1.yaml",
        "fat_tree_k8.yaml",
        "permutation_ecmp_collisions.yaml",
        "qp_scaling.yaml",
        "mice_elephants.yaml",
    } <= names


def test_quantity_strings_convert() -> None:
    data = base()
    data["topology"].update(nic_rate_gbps="0.1Tbps", link_delay_ns="1.5us")
    data["jobs"][0].update(start_ns="2ms", compute_ns=250)
    data["jobs"][0]["collectives"][0]["size_bytes"] = "256MiB"
    data["fabric"] = {"mtu_bytes": "4KiB"}
    scenario = scenario_from_dict(data, "t.yaml")
    job = scenario.jobs[0]
    assert job.collectives[0].size_bytes == 268435456
    assert job.start_ns == 2000000 and isinstance(job.start_ns, int)
    assert job.compute_ns == 250
    assert scenario.topology.nic_rate_gbps == pytest.approx(100.0)
    assert isinstance(scenario.topology.nic_rate_gbps, float)
    assert scenario.topology.link_delay_ns == 1500
    assert scenario.fabric.mtu_bytes == 4096


def test_models_are_frozen() -> None:
    scenario = scenario_from_dict(base(), "t.yaml")
    with pytest.raises(ValueError):
        scenario.seed = 3  # type: ignore[misc]


def test_fat_tree_and_topology_counts() -> None:
    data = base()
    data["topology"] = {"kind": "fat_tree", "k": 8, "gpus_per_host": 4}
    topology = scenario_from_dict(data, "t.yaml").topology
    assert topology.n_gpus == 128 and topology.n_hosts == 32


def test_file_topology_resolved_relative_to_scenario(tmp_path: Path) -> None:
    (tmp_path / "topo.json").write_text("{}")
    data = base()
    data["topology"] = {"kind": "file", "path": "topo.json"}
    scenario = load_scenario(write(tmp_path, data, "s.yaml"))
    assert scenario.topology.path == str((tmp_path / "topo.json").resolve())
    assert scenario.topology.n_gpus is None
    with pytest.raises(ScenarioError, match=r"s\.yaml: jobs: jobs need 16 GPUs but the cluster"):
        check_gpu_count(scenario, 8, "s.yaml")


def test_mice_gpus_list() -> None:
    data = base()
    data["mice"] = {"rate_per_s": 1000, "duration_ns": "1ms", "gpus": [0, 5, 9]}
    mice = scenario_from_dict(data, "t.yaml").mice
    assert mice is not None and mice.gpus == [0, 5, 9] and mice.duration_ns == 1_000_000


def test_scenario_constructible_directly() -> None:
    assert Scenario.model_validate(base()).topology.n_gpus == 128


# --- bad files: one line, the exact field, the problem -------------------------------------


def _typo(d: dict[str, Any]) -> None:
    d["topology"]["rate_gpbs"] = 400


def _wrong_unit(d: dict[str, Any]) -> None:
    d["topology"]["link_delay_ns"] = "5Gbps"


def _negative_size(d: dict[str, Any]) -> None:
    d["jobs"][1]["collectives"][0]["size_bytes"] = -5


def _gpu_id_out_of_range(d: dict[str, Any]) -> None:
    d["jobs"][1].update(placement="explicit", gpus=4, gpu_ids=[0, 1, 2, 128])


def _job_too_big(d: dict[str, Any]) -> None:
    d["jobs"][0]["gpus"] = 300


def _total_too_big(d: dict[str, Any]) -> None:
    d["jobs"][0]["gpus"] = 100
    d["jobs"][1]["gpus"] = 100


def _duplicate_names(d: dict[str, Any]) -> None:
    d["jobs"][1]["name"] = "a"


def _explicit_overlap(d: dict[str, Any]) -> None:
    d["jobs"][0].update(placement="explicit", gpus=3, gpu_ids=[0, 1, 2])
    d["jobs"][1].update(placement="explicit", gpus=3, gpu_ids=[5, 2, 7])


def _k_on_leaf_spine(d: dict[str, Any]) -> None:
    d["topology"]["k"] = 8


def _unknown_literal(d: dict[str, Any]) -> None:
    d["fabric"] = {"model": "packet"}


def _root_out_of_range(d: dict[str, Any]) -> None:
    d["jobs"][0]["collectives"].append({"op": "broadcast", "size_bytes": 1, "root": 8})


def _huge_mtu(d: dict[str, Any]) -> None:
    d.setdefault("fabric", {})["mtu_bytes"] = "1PiB"  # (blamed on a buffer never written)


def _root_of_an_allreduce(d: dict[str, Any]) -> None:
    d["jobs"][0]["collectives"].append({"op": "allreduce", "size_bytes": 1, "root": 3})


def _spines_not_whole(d: dict[str, Any]) -> None:
    d["topology"]["oversubscription"] = 3


def _rail_hosts(d: dict[str, Any]) -> None:
    d["topology"]["hosts"] = 12


def _missing_collectives(d: dict[str, Any]) -> None:
    del d["jobs"][0]["collectives"]


def _mice_out_of_range(d: dict[str, Any]) -> None:
    d["mice"] = {"rate_per_s": 10, "duration_ns": 1000, "gpus": [0, 200]}


def _explicit_without_ids(d: dict[str, Any]) -> None:
    d["jobs"][0]["placement"] = "explicit"


def _negative_heal_spread(d: dict[str, Any]) -> None:
    d["controller"] = {"heal_spread_over": -0.1}


def _negative_holddown(d: dict[str, Any]) -> None:
    d["controller"] = {"link_up_holddown_ns": "-1ms"}


def _gray_clear_rate(d: dict[str, Any]) -> None:
    d["controller"] = {"gray_clear_ns": "5Gbps"}


def _priority_too_high(d: dict[str, Any]) -> None:
    d["jobs"][0]["priority"] = 9


def _priority_not_a_number(d: dict[str, Any]) -> None:
    d["jobs"][0]["priority"] = "high"


def _seed_as_text(d: dict[str, Any]) -> None:
    d["seed"] = "3"  # (read as 3 before: counts are numbers, as elsewhere in the file)


def _gpus_as_text(d: dict[str, Any]) -> None:
    d["jobs"][0]["gpus"] = "4"


def _oversubscription_as_text(d: dict[str, Any]) -> None:
    d["topology"]["oversubscription"] = "2"  # (a plain number, read as 2.0 before)


def _fractional_bytes(d: dict[str, Any]) -> None:
    d["jobs"][0]["collectives"][0]["size_bytes"] = "0.1KiB"


def _size_in_bits(d: dict[str, Any]) -> None:
    d["jobs"][0]["collectives"][0]["size_bytes"] = "64Mb"


def _size_in_gibibits(d: dict[str, Any]) -> None:  # (Gib: 2^30 bits, an eighth of a GiB)
    d["jobs"][0]["collectives"][0]["size_bytes"] = "16Gib"


def _size_in_an_unknown_unit(d: dict[str, Any]) -> None:
    d["jobs"][0]["collectives"][0]["size_bytes"] = "16XB"


def _sla_a_boolean(d: dict[str, Any]) -> None:
    d["jobs"][0]["sla_us"] = True


def _fuse_a_boolean(d: dict[str, Any]) -> None:
    d["controller"] = {"pressure_fuse": True}


def _scenario_name_of_two_lines(d: dict[str, Any]) -> None:
    d["name"] = "a\nb"


def _sla_beyond_any_time(d: dict[str, Any]) -> None:  # (1e15 ns: the longest time taken)
    d["jobs"][0]["sla_us"] = "1e30s"


def _l3_cap_near_zero(d: dict[str, Any]) -> None:
    d["controller"] = {"l3_rate_cap": 1e-9}


def _blank_name(d: dict[str, Any]) -> None:
    d["jobs"][0]["name"] = "   "


def _name_with_colon(d: dict[str, Any]) -> None:
    d["jobs"][0]["name"] = "a:b"


def _name_of_the_mice(d: dict[str, Any]) -> None:
    d["jobs"][0]["name"] = "mice"  # (what flows.csv calls the mice)


def _fractional_ns(d: dict[str, Any]) -> None:
    d["jobs"][0]["compute_ns"] = "0.4ns"  # (once rounded to 0 without a word)


def _megaseconds(d: dict[str, Any]) -> None:
    d["jobs"][0]["compute_ns"] = "1Ms"  # (once read as 1 ms)


def _millibytes(d: dict[str, Any]) -> None:
    d["jobs"][0]["collectives"][0]["size_bytes"] = "1mB"  # (once read as 1 MB)


def _arabic_digits(d: dict[str, Any]) -> None:
    d["jobs"][0]["collectives"][0]["size_bytes"] = "\u0663MiB"  # (once read as 3 MiB)


def _on_as_a_boolean(d: dict[str, Any]) -> None:
    d["topology"]["rail_optimized"] = "on"  # (YAML 1.2: a string; once read as true)


def _rates_on_a_file(d: dict[str, Any]) -> None:
    # (a topology file gives its own: the key would be ignored)
    d["topology"] = {"kind": "file", "path": "topo.json", "nic_rate_gbps": 100}


def _spines_by_rate_not_whole(d: dict[str, Any]) -> None:
    d["topology"]["fabric_rate_gbps"] = 300  # (16 x 400 / 300 uplinks)


BAD_CASES = [
    (_typo, "topology.rate_gpbs", "unknown key (allowed: kind, hosts"),
    (_wrong_unit, "topology.link_delay_ns", "wrong unit 'Gbps' for a time"),
    (_negative_size, "jobs[1].collectives[0].size_bytes", "must be > 0"),
    (_gpu_id_out_of_range, "jobs[1].gpu_ids[3]", "GPU 128 is outside the cluster"),
    (_job_too_big, "jobs[0].gpus", "job needs 300 GPUs but the cluster has 128"),
    (_total_too_big, "jobs", "jobs need 200 GPUs but the cluster has 128"),
    (_duplicate_names, "jobs[1].name", "duplicate job name 'a'"),
    (_explicit_overlap, "jobs[1].gpu_ids[1]", "GPU 2 is already used by job 'a'"),
    (_k_on_leaf_spine, "topology.k", "only valid for kind fat_tree"),
    (_megaseconds, "jobs[0].compute_ns", "wrong unit 'Ms' for a time"),
    (_fractional_ns, "jobs[0].compute_ns",
     "expected a whole number of nanoseconds, got '0.4ns' (0.4 ns)"),
    (_millibytes, "jobs[0].collectives[0].size_bytes", "wrong unit 'mB' for a size: write MB"),
    (_arabic_digits, "jobs[0].collectives[0].size_bytes", "cannot read"),
    (_on_as_a_boolean, "topology.rail_optimized", "must be true or false (got 'on')"),
    (_rates_on_a_file, "topology.nic_rate_gbps",
     "not for kind file: the topology file gives its GPUs, rates and delays"),
    (_unknown_literal, "fabric.model", "must be 'flow' or 'fluid' (got 'packet')"),
    (_root_out_of_range, "jobs[0].collectives[1].root", "root rank 8"),
    (_huge_mtu, "fabric.mtu_bytes", "1125899906842624 B is more than "
     "fabric.fluid.buffer_bytes_per_port (4194304 B): no packet would fit"),
    (_root_of_an_allreduce, "jobs[0].collectives[1].root",
     "only a broadcast has a root (this is an allreduce)"),
    (_spines_not_whole, "topology.oversubscription", "whole number"),
    (_rail_hosts, "topology.hosts", "multiple of nics_per_leaf"),
    (_missing_collectives, "jobs[0].collectives", "required key is missing"),
    (_mice_out_of_range, "mice.gpus[1]", "GPU 200 is outside the cluster"),
    (_explicit_without_ids, "jobs[0].gpu_ids", "required when placement is explicit"),
    (_negative_heal_spread, "controller.heal_spread_over", "must be >= 0"),
    (_negative_holddown, "controller.link_up_holddown_ns", "must be >= 0"),
    (_gray_clear_rate, "controller.gray_clear_ns", "wrong unit 'Gbps' for a time"),
    (_priority_too_high, "jobs[0].priority", "must be <= 7 (got 9)"),
    (_priority_not_a_number, "jobs[0].priority", "must be an integer (got 'high')"),
    (_seed_as_text, "seed", "must be an integer (got '3')"),
    (_gpus_as_text, "jobs[0].gpus", "must be an integer (got '4')"),
    (_oversubscription_as_text, "topology.oversubscription", "must be a number (got '2')"),
    (_fractional_bytes, "jobs[0].collectives[0].size_bytes",
     "expected a whole number of bytes, got '0.1KiB' (102.4 bytes)"),
    (_size_in_bits, "jobs[0].collectives[0].size_bytes",
     "'64Mb' is in bits (b); a size is in bytes: write MB (powers of ten) or MiB (of two)"),
    (_size_in_gibibits, "jobs[0].collectives[0].size_bytes",
     "'16Gib' is in bits (b); a size is in bytes: write GB (powers of ten) or GiB (of two)"),
    (_size_in_an_unknown_unit, "jobs[0].collectives[0].size_bytes",
     "wrong unit 'XB' for a size; use one of B; K, M, G, T, P (powers of two, as nccl-tests "
     "reads them); KB, MB, GB, TB, PB (of ten); KiB, MiB, GiB, TiB, PiB (of two)"),
    (_sla_a_boolean, "jobs[0].sla_us", "expected a number, got a boolean (true)"),
    (_fuse_a_boolean, "controller.pressure_fuse", "expected a number, got a boolean (true)"),
    (_l3_cap_near_zero, "controller.l3_rate_cap", "must be >= 0.01 (got 1e-09)"),
    (_scenario_name_of_two_lines, "name", "must not contain '\\n' (got 'a\\nb')"),
    (_sla_beyond_any_time, "jobs[0].sla_us", "must be <= 1000000000000.0 (got 1e+36)"),
    (_blank_name, "jobs[0].name", "must not be blank"),
    (_name_with_colon, "jobs[0].name", "must not contain ':' (got 'a:b')"),
    (_name_of_the_mice, "jobs[0].name", "'mice' names the Poisson mice in the results"),
    (_spines_by_rate_not_whole, "topology.fabric_rate_gbps", "= 16 x 400 / (1 x 300) = "
                                                             "21.3333 must be a whole number"),
]


@pytest.mark.parametrize(
    ("mutate", "field", "problem"), BAD_CASES, ids=[c[0].__name__.strip("_") for c in BAD_CASES]
)
def test_bad_scenario(tmp_path: Path, mutate: Any, field: str, problem: str) -> None:
    data = base()
    mutate(data)
    err = load_error(write(tmp_path, data))
    assert err.field == field
    assert problem in err.problem
    assert str(err).startswith(f"{tmp_path / 'bad.yaml'}: {field}: ")


def test_typo_suggests_the_key(tmp_path: Path) -> None:
    data = base()
    data["ecmp"] = {"qps_per_conection": 2}
    err = load_error(write(tmp_path, data))
    assert err.field == "ecmp.qps_per_conection"
    assert "did you mean 'qps_per_connection'?" in err.problem


def test_yaml_syntax_error(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\ntopology:\n  kind: leaf_spine\n  hosts: [16\njobs: []\n")
    err = load_error(path)
    assert "invalid YAML at line" in err.problem


def test_a_json_scenario_s_syntax_errors_name_json(tmp_path: Path) -> None:
    # (JSON is read as YAML; the error names the file's own language)
    path = write(tmp_path, '{"name": "x", "seed": 1, "seed": 2}', "s.json")
    assert load_error(path).problem == "invalid JSON at line 1, column 26: duplicate key 'seed'"


def test_yaml_duplicate_key(tmp_path: Path) -> None:
    err = load_error(write(tmp_path, "name: x\nseed: 1\nseed: 2\n"))
    assert "duplicate key 'seed'" in err.problem and "line 3" in err.problem


def test_missing_file(tmp_path: Path) -> None:
    err = load_error(tmp_path / "nope.yaml")
    assert err.problem == "file not found"


@pytest.mark.parametrize("text", ["", "- 1\n- 2\n", "just a string\n"])
def test_top_level_not_a_mapping(tmp_path: Path, text: str) -> None:
    err = load_error(write(tmp_path, text))
    assert "top level must be a mapping" in err.problem


def test_missing_topology_file(tmp_path: Path) -> None:
    data = base()
    data["topology"] = {"kind": "file", "path": "missing.json"}
    err = load_error(write(tmp_path, data))
    assert err.field == "topology.path"
    assert err.problem.startswith("file not found: ")
    data["topology"] = {"kind": "file", "path": str(tmp_path)}  # (a directory)
    err = load_error(write(tmp_path, data))
    assert (err.field, err.problem) == ("topology.path", f"not a regular file: {tmp_path}")


def test_the_largest_size_can_be_written_in_its_own_unit() -> None:
    """The limit on sizes is 1 PiB, and it can be written so (PiB, P, PB)."""
    for text, size in (("1PiB", 1 << 50), ("0.5P", 1 << 49), ("1PB", 10**15)):
        data = base()
        data["jobs"][0]["collectives"][0]["size_bytes"] = text
        assert scenario_from_dict(data, "t.yaml").jobs[0].collectives[0].size_bytes == size


def test_a_rate_in_bytes_per_second_is_eight_times_its_bits() -> None:
    """NVLink is quoted in GB/s: ``900GB/s`` is 7200 Gb/s, not 900 (the unit was read
    without its case, gigabytes as gigabits); ``400Gb/s`` and ``50GB/s`` are one NIC."""
    data = base()
    data["topology"]["nvlink_rate_gbps"] = "900GB/s"
    data["topology"]["nic_rate_gbps"] = "50GB/s"
    topo = scenario_from_dict(data, "t.yaml").topology
    assert (topo.nvlink_rate_gbps, topo.nic_rate_gbps) == (7200.0, 400.0)
    data["topology"]["nic_rate_gbps"] = "400Gb/s"
    assert scenario_from_dict(data, "t.yaml").topology.nic_rate_gbps == 400.0


def test_adaptive_settings_convert_and_reach_the_policies(tmp_path: Path) -> None:
    from fabricpilot.balancing import PolicyContext, make_policy
    from fabricpilot.runner import prepare

    data = base()
    data["adaptive"] = {"rebalance_interval_ns": "20us", "drain_safe": False,
                        "flowlet_gap_ns": "250us", "mice_bytes": "100KiB",
                        "reserved_spines": 2, "hysteresis": 0.5}
    sc = load_scenario(write(tmp_path, data, "ok.yaml"))
    prep = prepare(sc)
    a = prep.adaptive
    assert (a.rebalance_interval_ns, a.drain_safe, a.flowlet_gap_ns, a.mice_bytes,
            a.reserved_spines, a.hysteresis) == (20_000, False, 250_000, 100 * 1024, 2, 0.5)
    ctx = PolicyContext(prep.topology, 1, 600, adaptive=a)
    assert make_policy("flowlet", ctx).gap_ns == 250_000  # type: ignore[attr-defined]
    split = make_policy("adaptive-split", ctx)
    assert split.mice_bytes == 100 * 1024 and split.drain_safe is False  # type: ignore[attr-defined]
    data["adaptive"] = {"rebalance_interval_ns": None}
    never = prepare(load_scenario(write(tmp_path, data, "never.yaml")))
    assert never.adaptive.rebalance_interval_ns == float("inf")


@pytest.mark.parametrize(("adaptive", "field", "problem"), [
    ({"flowlet_gap_ns": 0}, "adaptive.flowlet_gap_ns", "must be > 0 (got 0)"),
    ({"reserved_spines": 0}, "adaptive.reserved_spines", "must be >= 1 (got 0)"),
    ({"mice_bytes": "1ms"}, "adaptive.mice_bytes", "unit"),
    ({"drain_safe": "maybe"}, "adaptive.drain_safe", "must be true or false"),
])
def test_bad_adaptive_settings_are_one_line_errors(tmp_path: Path, adaptive: dict[str, Any],
                                                    field: str, problem: str) -> None:
    data = base()
    data["adaptive"] = adaptive
    err = load_error(write(tmp_path, data))
    assert err.field == field and problem in err.problem


@pytest.mark.parametrize(
    "path", sorted((Path(__file__).resolve().parents[1] / "examples" / "large").glob("*.yaml")),
    ids=lambda p: p.name)
def test_large_examples_validate(path: Path) -> None:
    # too long to run in the suite (see benchmarks/); they must still load and prepare
    from fabricpilot.runner import prepare

    prep = prepare(load_scenario(path), str(path))
    assert sum(j.n_gpus for j in prep.jobs) == 1024


def test_heal_spread_setting_reaches_the_controller(tmp_path: Path) -> None:
    data = base()
    data["controller"] = {"heal_spread_over": 0.25, "link_up_holddown_ns": "5ms"}
    sc = load_scenario(write(tmp_path, data))
    assert sc.controller.to_params().heal_spread_over == 0.25
    assert sc.controller.to_params().link_up_holddown_ns == 5_000_000
    assert sc.controller.to_params().gray_clear_ns == float("inf")  # (never, by default)
    data["controller"] = {"gray_clear_ns": "2ms"}
    assert load_scenario(write(tmp_path, data)).controller.to_params().gray_clear_ns == 2e6


@pytest.mark.parametrize(("text", "where", "problem"), [
    ("1: x", "", "key 1 is a number to YAML, not a name (quote it if it is meant as one)"),
    ("null: x", "", "key null is no value to YAML, not a name (quote it if it is meant as "
                    "one)"),
    ("fabric: {true: 3}", "fabric", "key true is a boolean to YAML, not a name (quote it if "
                                    "it is meant as one)"),
])
def test_a_key_yaml_reads_as_no_name_says_so(tmp_path: Path, text: str, where: str,
                                              problem: str) -> None:
    """YAML reads an unquoted 1, true or null as a number, a boolean or no value: the
    error says so (it said "[1]: Keys should be strings", a list index to the eye)."""
    path = write(tmp_path, base())
    path.write_text(path.read_text() + text + "\n")
    err = load_error(path)
    assert (err.field, err.problem) == (where, problem)


def test_a_long_refused_value_is_not_repeated_whole(tmp_path: Path) -> None:
    data = base()
    data["jobs"][0]["collectives"][0]["size_bytes"] = "9" * 5000
    err = load_error(write(tmp_path, data))
    assert err.field == "jobs[0].collectives[0].size_bytes"
    assert err.problem.endswith(f"'{'9' * 40}...' (5000 characters)") and len(err.problem) < 100


# --- plain scalars by the YAML 1.2 core schema ----------------------------------------------
# https://yaml.org/spec/1.2.2/#1032-tag-resolution (PyYAML's own SafeLoader follows YAML 1.1)


def test_yaml_core_integers() -> None:
    data = load_strict_yaml("a: 010\nb: 0o10\nc: 0x1F\nd: -17\ne: +0\n")
    # 010 is decimal (YAML 1.1: octal 8); 0o10 is octal (YAML 1.1: the string '0o10')
    assert data == {"a": 10, "b": 8, "c": 31, "d": -17, "e": 0}
    assert all(type(v) is int for v in data.values())


def test_yaml_core_floats() -> None:
    data = load_strict_yaml("a: 1e6\nb: -1.5E-3\nc: 2e-5\nd: .inf\ne: -.Inf\nf: 1.\n")
    # 1e6 and 2e-5 are numbers (YAML 1.1: strings, its floats need a point and a signed exponent)
    assert data == {"a": 1e6, "b": -0.0015, "c": 2e-5, "d": float("inf"), "e": float("-inf"),
                    "f": 1.0}
    assert all(type(v) is float for v in data.values())
    nan = load_strict_yaml("v: .NaN")["v"]
    assert type(nan) is float and nan != nan


@pytest.mark.parametrize("text", ["12:30", "on", "off", "yes", "no", "1_000", "0b11",
                                  "2024-01-01", "="])
def test_yaml_core_other_plain_scalars_are_strings(text: str) -> None:
    # (PyYAML's YAML 1.1: 750, booleans, 1000, 3, a date, an error)
    assert load_strict_yaml(f"v: {text}") == {"v": text}


def test_yaml_core_booleans_and_null() -> None:
    data = load_strict_yaml("a: true\nb: False\nc: TRUE\nd: ~\ne: null\nf:\ng: yes\nh: off\n")
    # only the true/false forms are booleans (YAML 1.1: yes, no, on, off, ... too)
    assert data == {"a": True, "b": False, "c": True, "d": None, "e": None, "f": None,
                    "g": "yes", "h": "off"}
    assert all(type(data[k]) is bool for k in "abc")


def test_yaml_core_words_as_keys_and_names() -> None:
    data = load_strict_yaml("on: 1\nno: 2\njobs: [{name: no}, {name: yes}]\n")
    assert data == {"on": 1, "no": 2, "jobs": [{"name": "no"}, {"name": "yes"}]}


def test_yaml_core_schema_is_the_strict_loaders_own() -> None:
    """The scenario loader reads YAML 1.2 while yaml.safe_load still reads YAML 1.1: the
    loader's resolvers are a copy, PyYAML's SafeLoader is left as it is."""
    text = "a: 010\nb: on\nc: 12:30"
    assert load_strict_yaml(text) == {"a": 10, "b": "on", "c": "12:30"}
    assert yaml.safe_load(text) == {"a": 8, "b": True, "c": 750}


def test_merge_keys_share_a_job_template(tmp_path: Path) -> None:
    """``<<: *template`` merges an anchored mapping; keys written next to it win."""
    path = tmp_path / "s.yaml"
    data = load_strict_yaml(
        "x-job: &job\n"
        "  gpus: 16\n"
        "  collectives: [{op: allreduce, size_bytes: 1048576}]\n"
        "jobs:\n"
        "  - {<<: *job, name: a}\n"
        "  - {<<: *job, name: b, gpus: 32}\n"
        "  - <<: [{gpus: 8}, *job]\n"  # (the first of several merged mappings wins)
        "    name: c\n"
    )
    jobs = data["jobs"]
    assert [(j["name"], j["gpus"]) for j in jobs] == [("a", 16), ("b", 32), ("c", 8)]
    assert all(j["collectives"] == [{"op": "allreduce", "size_bytes": 1048576}] for j in jobs)
    # a scenario's jobs written that way load as if spelled out
    text = ("name: t\n"
            "topology: {kind: leaf_spine, hosts: 16, gpus_per_host: 8, nics_per_leaf: 16}\n"
            "jobs:\n"
            "  - &job {name: a, gpus: 16, collectives: [{op: allreduce, size_bytes: 1024}]}\n"
            "  - {<<: *job, name: b, gpus: 32}\n")
    path.write_text(text)
    scenario = load_scenario(path)
    assert [(j.name, j.gpus) for j in scenario.jobs] == [("a", 16), ("b", 32)]
    assert scenario.jobs[1].collectives == scenario.jobs[0].collectives


def test_merge_keys_keep_duplicate_checks_and_errors_one_line(tmp_path: Path) -> None:
    err = load_error(write(tmp_path, "base: &b {seed: 1}\nname: x\nj: {<<: *b, a: 1, a: 2}\n"))
    assert "duplicate key 'a'" in err.problem and "line 3" in err.problem
    err = load_error(write(tmp_path, "name: x\nj: {<<: 5}\n"))
    assert "invalid YAML at line 2" in err.problem and "merging" in err.problem
    err = load_error(write(tmp_path, "name: x\nj: &j {<<: *j, a: 1}\n"))
    assert "a mapping merges itself" in err.problem
    # two merge keys in one mapping: a key given twice too (both were merged, silently)
    err = load_error(write(tmp_path, "a: &a {seed: 1}\nb: &b {seed: 2}\nj: {<<: *a, <<: *b}\n"))
    assert "duplicate key '<<' (merge several mappings as <<: [*a, *b])" in err.problem
    assert "line 3" in err.problem


def test_gpu_ids_with_leading_zeros_are_decimal(tmp_path: Path) -> None:
    """``gpu_ids: [010, 011, 012, 013]`` places the job on GPUs 10..13 (YAML 1.1: 8..11)."""
    from fabricpilot.runner import prepare

    path = tmp_path / "s.yaml"
    path.write_text(
        "name: t\n"
        "topology: {kind: leaf_spine, hosts: 16, gpus_per_host: 8, nics_per_leaf: 16}\n"
        "jobs:\n"
        "  - name: a\n"
        "    gpus: 4\n"
        "    placement: explicit\n"
        "    gpu_ids: [010, 011, 012, 013]\n"
        "    collectives: [{op: allreduce, size_bytes: 1024}]\n"
    )
    scenario = load_scenario(path)
    assert scenario.topology.n_gpus is not None and scenario.topology.n_gpus >= 14
    assert scenario.jobs[0].gpu_ids == [10, 11, 12, 13]
    assert prepare(scenario, str(path)).jobs[0].gpus == (10, 11, 12, 13)


def test_the_key_reference_is_the_models_own() -> None:
    """docs/scenario-keys.md lists every key the loader takes, as the models describe it
    (``python -m fabricpilot.scenario.reference`` writes it): a key added, renamed or
    re-described without it being regenerated fails here. Each key it lists is one a file
    may give, and every key of the reference scenario is in it."""
    from fabricpilot.scenario.reference import reference_markdown, scenario_keys

    root = Path(__file__).resolve().parents[1]
    assert (root / "docs" / "scenario-keys.md").read_text() == reference_markdown()
    listed = {k.path for k in scenario_keys()}
    assert all(k.description for k in scenario_keys())

    def leaves(d: Any, prefix: str = "") -> set[str]:
        out: set[str] = set()
        for k, v in d.items():
            if isinstance(v, dict):
                out |= leaves(v, f"{prefix}{k}.")
            elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
                for x in v:
                    out |= leaves(x, f"{prefix}{k}[].")
            else:
                out.add(f"{prefix}{k}")
        return out

    from fabricpilot.scenario import default_scenario_path

    written = leaves(yaml.safe_load(default_scenario_path().read_text()))
    assert written <= listed, written - listed


def test_a_misspelt_key_is_named_before_the_key_it_leaves_missing(tmp_path: Path) -> None:
    """``topolgy:`` both is an unknown key and leaves ``topology`` missing: the first is
    what to fix, and is what is said (the missing key was)."""
    err = load_error(write(tmp_path, "name: x\ntopolgy: {kind: leaf_spine, hosts: 4}\n"
                                     "jobs: []\n"))
    assert err.field == "topolgy" and "did you mean 'topology'?" in err.problem


@pytest.mark.parametrize(("job", "field", "cause"), [
    # 1 MiB at 400 Gb/s takes microseconds: the start is the run
    ({"start_ns": 999_999_999_999_999}, "jobs[0].start_ns", "its start"),
    # 10^6 iterations of 1 s compute: 1e15 ns of gaps before any byte moves
    ({"iterations": 1_000_000, "compute_ns": "1s"}, "jobs[0].compute_ns",
     "its compute gaps"),
    # 1 PiB through a 1 Gb/s NIC: 2 x (n - 1) / n x 2^50 x 8 / 1 ns = 1.35e16 ns for 4 GPUs
    ({"collectives": [{"op": "allreduce", "size_bytes": "1PiB"}]}, "jobs[0]",
     "its transfers; rates too low"),
])
def test_a_run_beyond_the_twin_s_horizon_blames_its_largest_part(
        tmp_path: Path, job: dict[str, Any], field: str, cause: str) -> None:
    from fabricpilot.runner import prepare

    rate = 1 if "collectives" in job else 400
    data = {"topology": {"kind": "leaf_spine", "hosts": 4, "gpus_per_host": 1,
                         "nics_per_leaf": 2, "rail_optimized": False,
                         "nic_rate_gbps": rate, "fabric_rate_gbps": rate},
            "jobs": [{"name": "a", "gpus": 4,
                      "collectives": [{"op": "allreduce", "size_bytes": "1MiB"}]} | job]}
    path = write(tmp_path, data, "s.yaml")
    with pytest.raises(ScenarioError) as info:
        prepare(load_scenario(path), str(path))
    err = info.value
    assert err.field == field and "\n" not in str(err)
    assert f"most of it {cause}" in err.problem and "beyond the twin's 1e15 ns" in err.problem
    if field == "jobs[0]":
        assert "1.35e+16 ns)" in err.problem


@pytest.mark.parametrize(("value", "us"), [("50us", 50.0), ("0.1ms", 100.0), ("50", 50.0),
                                           (75, 75.0), ("2500ns", 2.5)])
def test_a_job_s_sla_takes_a_time_unit_as_other_keys_do(value: object, us: float) -> None:
    data = base()
    data["jobs"][0]["sla_us"] = value
    assert scenario_from_dict(data, "t.yaml").jobs[0].sla_us == us


def test_a_job_s_sla_in_another_dimension_is_refused(tmp_path: Path) -> None:
    data = base()
    data["jobs"][0]["sla_us"] = "50Gbps"
    err = load_error(write(tmp_path, data))
    assert err.field == "jobs[0].sla_us" and "wrong unit 'Gbps' for a time" in err.problem


def test_counts_in_topology_errors_agree_with_their_nouns() -> None:
    data = base()
    data["topology"] = {"kind": "leaf_spine", "hosts": 1, "gpus_per_host": 8,
                        "nics_per_leaf": 16}
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(data, "t.yaml")
    assert info.value.problem.endswith("(1 host, 16 NICs per leaf)")


def test_an_integer_past_pythons_digit_limit_is_placed_in_the_file(tmp_path: Path) -> None:
    """Python reads at most 4300 digits of an integer; a longer one in a scenario is a
    YAML problem at its line and column, not Python's advice to raise the limit."""
    path = write(tmp_path, base())
    path.write_text(path.read_text() + "seed: " + "9" * 5000 + "\n")
    line = len(path.read_text().splitlines())
    err = load_error(path)
    assert str(err) == (f"{path}: invalid YAML at line {line}, column 7: an integer of 5000 "
                        "digits (at most 4300)")
