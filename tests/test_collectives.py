"""Collective generators: sizes, counts and routes checked against hand-computed numbers."""

from __future__ import annotations

import doctest
import math
from collections.abc import Callable, Sequence

import numpy as np
import pytest

from fabricpilot.workload import collectives
from fabricpilot.workload.collectives import (
    alltoall,
    broadcast,
    build_collective,
    hierarchical_allreduce,
    hierarchical_alltoall,
    host_matrix,
    ring_allgather,
    ring_allreduce,
    ring_reducescatter,
)
from fabricpilot.workload.plan import CollectivePlan, Op, Stage, busbw_factor


def sent_per_gpu(stages: tuple[Stage, ...], gpus: list[int]) -> dict[int, int]:
    """Bytes each GPU sends over all stages (a plain loop: independent of the generators)."""
    out = dict.fromkeys(gpus, 0)
    for st in stages:
        for s, b in zip(st.src.tolist(), st.size_bytes.tolist(), strict=True):
            out[s] += b
    return out


def received_per_gpu(stages: tuple[Stage, ...], gpus: list[int]) -> dict[int, int]:
    out = dict.fromkeys(gpus, 0)
    for st in stages:
        for d, b in zip(st.dst.tolist(), st.size_bytes.tolist(), strict=True):
            out[d] += b
    return out


def test_doctests() -> None:
    result = doctest.testmod(collectives)
    assert result.attempted > 0
    assert result.failed == 0


# ------------------------------------------------------------------------ ring AllReduce


def test_ring_allreduce_stream_n4() -> None:
    (st,) = ring_allreduce([0, 1, 2, 3], 1000)
    assert st.src.tolist() == [0, 1, 2, 3]
    assert st.dst.tolist() == [1, 2, 3, 0]
    assert st.size_bytes.tolist() == [1500] * 4  # ceil(2*3*1000/4)
    assert st.group.tolist() == [0] * 4
    assert st.hops == 6  # 2(n-1)
    # textbook ring cost: every rank sends and receives 2(n-1)/n * S
    assert set(sent_per_gpu((st,), [0, 1, 2, 3]).values()) == {1500}
    assert set(received_per_gpu((st,), [0, 1, 2, 3]).values()) == {1500}


def test_ring_allreduce_steps_n4() -> None:
    stages = ring_allreduce([0, 1, 2, 3], 1000, mode="steps")
    assert len(stages) == 6
    for st in stages:
        assert st.n_transfers == 4
        assert st.size_bytes.tolist() == [250] * 4
        assert st.group.tolist() == [-1] * 4
        assert st.hops == 1
        assert st.dst.tolist() == [1, 2, 3, 0]
    assert set(sent_per_gpu(stages, [0, 1, 2, 3]).values()) == {1500}


def test_ring_allreduce_rounds_up() -> None:
    (st,) = ring_allreduce([0, 1, 2], 1000)
    assert st.size_bytes.tolist() == [1334] * 3  # ceil(4000/3)
    steps = ring_allreduce([0, 1, 2], 1000, mode="steps")
    assert len(steps) == 4
    assert {int(s.size_bytes[0]) for s in steps} == {334}  # ceil(1000/3)


def test_ring_follows_given_order() -> None:
    (st,) = ring_allreduce([7, 3, 5], 300)
    assert st.src.tolist() == [7, 3, 5]
    assert st.dst.tolist() == [3, 5, 7]


def test_single_rank_has_no_stages() -> None:
    assert ring_allreduce([4], 1000) == ()
    assert ring_allreduce([4], 1000, mode="steps") == ()
    assert ring_reducescatter([4], 1000) == ()
    assert alltoall([4], 1000) == ()
    assert broadcast([4], 1000) == ()
    plan = build_collective(Op.ALLREDUCE, [4], 1000)
    assert plan.stages == ()
    assert plan.total_bytes == 0


def test_two_ranks() -> None:
    (st,) = ring_allreduce([0, 1], 1000)
    assert st.src.tolist() == [0, 1]
    assert st.dst.tolist() == [1, 0]
    assert st.size_bytes.tolist() == [1000, 1000]  # 2*1/2*1000
    assert st.hops == 2


# ------------------------------------------------------------------------ RS / AG


@pytest.mark.parametrize("fn", [ring_reducescatter, ring_allgather])
def test_ring_half_collectives(fn: Callable[..., tuple[Stage, ...]]) -> None:
    (st,) = fn([0, 1, 2, 3], 1000)
    assert st.size_bytes.tolist() == [750] * 4  # ceil(3*1000/4)
    assert st.group.tolist() == [0] * 4
    assert st.hops == 3
    steps = fn([0, 1, 2, 3], 1000, mode="steps")
    assert len(steps) == 3
    for s in steps:
        assert s.size_bytes.tolist() == [250] * 4
        assert s.group.tolist() == [-1] * 4
        assert s.hops == 1


# ------------------------------------------------------------------------ AlltoAll


def test_alltoall_n4() -> None:
    (st,) = alltoall([0, 1, 2, 3], 400)
    assert st.n_transfers == 12
    assert st.size_bytes.tolist() == [100] * 12
    assert st.group.tolist() == [-1] * 12
    assert st.hops == 1
    pairs = set(zip(st.src.tolist(), st.dst.tolist(), strict=True))
    assert pairs == {(i, j) for i in range(4) for j in range(4) if i != j}
    assert set(sent_per_gpu((st,), [0, 1, 2, 3]).values()) == {300}  # (n-1)/n * S
    assert set(received_per_gpu((st,), [0, 1, 2, 3]).values()) == {300}


def test_alltoall_every_pair_once_larger() -> None:
    ranks = list(range(100, 164))
    (st,) = alltoall(ranks, 64 * 1000)
    assert st.n_transfers == 64 * 63
    keys = st.src * 1000 + st.dst
    assert len(np.unique(keys)) == 64 * 63
    assert not np.any(st.src == st.dst)
    assert set(st.size_bytes.tolist()) == {1000}


# ------------------------------------------------------------------------ Broadcast


def test_broadcast_chain_from_root() -> None:
    (st,) = broadcast([10, 11, 12, 13], 4096, root=1)
    assert st.src.tolist() == [11, 12, 13]
    assert st.dst.tolist() == [12, 13, 10]
    assert st.size_bytes.tolist() == [4096] * 3
    assert st.group.tolist() == [0] * 3
    assert st.hops == 3


def test_broadcast_bad_root() -> None:
    with pytest.raises(ValueError, match="root"):
        broadcast([0, 1, 2], 10, root=3)


# ------------------------------------------------------------------------ hierarchical AlltoAll


def _host(x: np.ndarray, g: int) -> np.ndarray:
    return x // g


def test_pxn_alltoall_2x4() -> None:
    g = 4
    ranks = list(range(8))  # hosts 0 and 1, four GPUs each
    s = 800  # n = 8, chunk = 100
    a, b = hierarchical_alltoall(ranks, s, g, pipelined=False)
    # stage A: per host, 4*3 ordered pairs, each carrying h * chunk = 2 * 100
    assert a.n_transfers == 2 * 12
    assert set(a.size_bytes.tolist()) == {200}
    assert np.all(_host(a.src, g) == _host(a.dst, g))
    # stage B: per rail, 2*1 ordered host pairs, each carrying g * chunk = 4 * 100
    assert b.n_transfers == 4 * 2
    assert set(b.size_bytes.tolist()) == {400}
    assert np.all(_host(b.src, g) != _host(b.dst, g))  # only crosses hosts
    assert np.all(b.src % g == b.dst % g)  # stays on the rail
    for st in (a, b):
        assert set(st.group.tolist()) == {-1}
        assert st.hops == 1

    # payload that ends at each GPU: everything arriving by rail (stage B) is final; of what
    # arrives over NVLink (stage A), 1 chunk of the h per transfer is for the receiver itself
    # and h-1 are forwarded in stage B. Total final payload = (n-1) chunks = (n-1)/n * S.
    recv_b = received_per_gpu((b,), ranks)
    recv_a = received_per_gpu((a,), ranks)
    for gpu in ranks:
        final = recv_b[gpu] + recv_a[gpu] // 2
        assert final == 700  # 7/8 * 800
    # inter-host bytes per GPU equal flat AlltoAll's: (h-1) * g chunks
    assert set(sent_per_gpu((b,), ranks).values()) == {400}


def test_pxn_alltoall_3x4_payload() -> None:
    g = 4
    ranks = list(range(12))
    a, b = hierarchical_alltoall(ranks, 1200, g, pipelined=False)  # n = 12, chunk 100, h 3
    assert (a.n_transfers, int(a.size_bytes[0])) == (3 * 12, 300)
    assert (b.n_transfers, int(b.size_bytes[0])) == (4 * 6, 400)
    recv_a = received_per_gpu((a,), ranks)
    recv_b = received_per_gpu((b,), ranks)
    for gpu in ranks:
        assert recv_b[gpu] + recv_a[gpu] // 3 == 1100  # 11/12 * 1200


def test_pxn_skips_empty_stages() -> None:
    (only_a,) = hierarchical_alltoall([0, 1, 2, 3], 400, 4)  # one host
    assert only_a.label == "pxn-intra"
    assert set(only_a.size_bytes.tolist()) == {100}  # h = 1
    (only_b,) = hierarchical_alltoall([0, 4, 8], 300, 4)  # one GPU per host
    assert only_b.label == "pxn-rail"
    assert only_b.n_transfers == 6
    assert set(only_b.size_bytes.tolist()) == {100}  # g = 1


# ------------------------------------------------------------------------ hierarchical AllReduce


def test_hier_allreduce_2x4_stream() -> None:
    g = 4
    ranks = list(range(8))
    a, b, c = hierarchical_allreduce(ranks, 800, g)
    # A: intra-host ring ReduceScatter, ceil(3*800/4) = 600 per hop, hops 3
    assert a.src.tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    assert a.dst.tolist() == [1, 2, 3, 0, 5, 6, 7, 4]
    assert set(a.size_bytes.tolist()) == {600}
    assert a.group.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert a.hops == 3
    # B: per rail, ring AllReduce of 800/4 = 200 bytes per rank over 2 hosts: 2*1*200/2 = 200
    assert b.n_transfers == 8
    assert set(b.size_bytes.tolist()) == {200}
    assert b.hops == 2
    assert np.all(_host(b.src, g) != _host(b.dst, g))
    assert np.all(b.src % g == b.dst % g)
    assert sorted(set(b.group.tolist())) == [0, 1, 2, 3]  # one coupled group per rail
    # C mirrors A
    assert c.src.tolist() == a.src.tolist()
    assert c.dst.tolist() == a.dst.tolist()
    assert c.size_bytes.tolist() == a.size_bytes.tolist()
    assert c.hops == 3


def test_hier_allreduce_4x2_matches_textbook_cost() -> None:
    g = 2
    ranks = list(range(8))
    a, b, c = hierarchical_allreduce(ranks, 1000, g)
    assert set(a.size_bytes.tolist()) == {500}  # ceil(1*1000/2)
    assert a.hops == 1
    assert set(b.size_bytes.tolist()) == {750}  # S/g = 500 per rank, 2*3*500/4
    assert b.hops == 6
    # total per GPU = 2(n-1)/n * S = 1750, same as a flat ring
    assert set(sent_per_gpu((a, b, c), ranks).values()) == {1750}

    steps = hierarchical_allreduce(ranks, 1000, g, mode="steps")
    assert len(steps) == 1 + 6 + 1
    mids = steps[1:-1]
    for st in mids:
        assert set(st.size_bytes.tolist()) == {125}  # ceil(1000/8)
        assert set(st.group.tolist()) == {-1}
        assert st.hops == 1
        assert st.n_transfers == 8
    assert set(sent_per_gpu(steps, ranks).values()) == {1750}


def test_hier_allreduce_degenerate_shapes() -> None:
    # one host: A and C only (an intra-host ring AllReduce)
    stages = hierarchical_allreduce([0, 1, 2, 3], 1000, 4)
    assert [s.label for s in stages] == ["intra-reducescatter", "intra-allgather"]
    # one GPU per host: B only, a ring AllReduce across hosts
    (b,) = hierarchical_allreduce([0, 8, 16, 24], 1000, 8)
    assert set(b.size_bytes.tolist()) == {1500}
    assert b.hops == 6


def test_hosts_ordered_by_first_appearance() -> None:
    m = host_matrix([6, 7, 4, 5, 1, 0, 3, 2], 4)
    assert m.tolist() == [[4, 5, 6, 7], [0, 1, 2, 3]]
    a, _b, _c = hierarchical_allreduce([6, 7, 4, 5, 1, 0, 3, 2], 800, 4)
    assert a.src.tolist() == [4, 5, 6, 7, 0, 1, 2, 3]


@pytest.mark.parametrize("fn", [hierarchical_allreduce, hierarchical_alltoall])
def test_unequal_hosts_raise(fn: Callable[..., tuple[Stage, ...]]) -> None:
    with pytest.raises(ValueError, match="same number of GPUs on every host"):
        fn([0, 1, 2, 4], 1000, 4)


# ------------------------------------------------------------------------ build_collective


@pytest.mark.parametrize(
    ("op", "ranks", "gph", "expected"),
    [
        (Op.ALLREDUCE, range(16), 8, "hierarchical"),
        (Op.ALLREDUCE, range(8), 8, "ring"),  # one host
        (Op.ALLREDUCE, [0, 8, 16, 24], 8, "ring"),  # one GPU per host
        (Op.ALLREDUCE, range(16), 1, "ring"),  # gpus_per_host == 1
        (Op.ALLREDUCE, [0, 1, 2, 8], 8, "ring"),  # unequal hosts: hierarchical impossible
        (Op.ALLTOALL, range(16), 8, "pxn"),
        (Op.ALLTOALL, range(8), 8, "flat"),
        (Op.ALLTOALL, [0, 8], 8, "flat"),
        (Op.REDUCESCATTER, range(16), 8, "rails"),
        (Op.ALLGATHER, range(16), 8, "rails"),
        (Op.BROADCAST, range(16), 8, "rails"),
        (Op.ALLGATHER, range(8), 8, "ring"),  # one host
        (Op.BROADCAST, [0, 1, 2, 8], 8, "ring"),  # unequal hosts
    ],
)
def test_auto_algorithm(op: Op, ranks: Sequence[int], gph: int, expected: str) -> None:
    plan = build_collective(op, ranks, 1 << 20, gpus_per_host=gph)
    assert plan.algorithm == expected


def test_plan_fields() -> None:
    plan = build_collective("allreduce", [3, 1, 2, 0], 1000)
    assert isinstance(plan, CollectivePlan)
    assert plan.op is Op.ALLREDUCE
    assert plan.ranks == (3, 1, 2, 0)
    assert plan.size_bytes == 1000
    assert plan.algorithm == "ring"
    assert plan.total_bytes == 4 * 1500
    steps = build_collective("allreduce", [3, 1, 2, 0], 1000, mode="steps")
    assert steps.algorithm == "ring-steps"
    assert steps.total_bytes == plan.total_bytes  # stream and steps agree when n | S
    hier = build_collective("allreduce", range(16), 1600, gpus_per_host=8, mode="steps")
    assert hier.algorithm == "hierarchical-steps"


def test_explicit_algorithms() -> None:
    flat = build_collective("allreduce", range(16), 1600, gpus_per_host=8, algorithm="ring")
    assert flat.algorithm == "ring"
    assert len(flat.stages) == 1
    a2a = build_collective("alltoall", range(16), 1600, gpus_per_host=8, algorithm="flat")
    assert a2a.algorithm == "flat"
    with pytest.raises(ValueError, match="same number of GPUs"):
        build_collective("allreduce", [0, 1, 2, 8], 100, gpus_per_host=8,
                         algorithm="hierarchical")
    with pytest.raises(ValueError, match="not available for allreduce"):
        build_collective("allreduce", range(4), 100, algorithm="flat")
    with pytest.raises(ValueError, match="not available for reducescatter"):
        build_collective("reducescatter", range(4), 100, algorithm="hierarchical")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"algorithm": "trie"}, "auto, ring, rails, hierarchical, tree, flat"),
        ({"mode": "chunks"}, "stream, steps"),
        ({"gpus_per_host": 0}, "gpus_per_host"),
    ],
)
def test_bad_options(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build_collective("allreduce", range(4), 100, **kwargs)


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="distinct"):
        build_collective("allreduce", [0, 1, 1, 2], 100)
    with pytest.raises(ValueError, match=">= 0"):
        build_collective("allreduce", [0, 1], -1)
    with pytest.raises(ValueError, match="unknown collective op"):
        build_collective("reduce_all", [0, 1], 100)
    with pytest.raises(ValueError, match="stream, steps"):
        ring_allreduce([0, 1], 100, mode="bogus")


@pytest.mark.parametrize("op", list(Op))
def test_per_rank_bytes_match_busbw_factor(op: Op) -> None:
    """On a flat ring / flat AlltoAll, the busiest GPU sends busbw_factor * S (n | S)."""
    n, s = 8, 8000
    plan = build_collective(op, range(n), s, algorithm="flat" if op is Op.ALLTOALL else "auto")
    busiest = max(sent_per_gpu(plan.stages, list(range(n))).values())
    assert busiest == busbw_factor(op, n) * s


def test_arrays_int64_and_read_only() -> None:
    plan = build_collective("allreduce", range(16), 1 << 20, gpus_per_host=8)
    for st in plan.stages:
        for arr in (st.src, st.dst, st.size_bytes, st.group):
            assert arr.dtype == np.int64
            assert not arr.flags.writeable
    ranks = np.arange(4)
    ring_allreduce(ranks, 100)
    assert ranks.flags.writeable  # the caller's array is not touched


def test_large_ring_is_cheap() -> None:
    n = 8192
    plan = build_collective("allreduce", range(n), 1 << 30)
    (st,) = plan.stages
    assert st.n_transfers == n
    assert st.hops == 2 * (n - 1)
    assert int(st.size_bytes[0]) == -(-2 * (n - 1) * (1 << 30) // n)


# ------------------------------------------------------------------------ rail rings


def _rails(op: str, ranks: Sequence[int], size: int, **kw: int) -> Stage:
    plan = build_collective(op, ranks, size, gpus_per_host=4, algorithm="rails", **kw)
    assert plan.algorithm == "rails"
    (st,) = plan.stages
    return st


def test_rail_rings_keep_every_inter_host_hop_on_its_rail() -> None:
    # 3 hosts x 4 GPUs, given out of order: every ring visits all 12 GPUs, leaves each host
    # from its own rail's GPU to the same rail of the next host; every NIC sends one
    # inter-host hop in all, every GPU one NVLink hop per ring
    ranks = [9, 0, 5, 1, 8, 4, 2, 11, 3, 6, 10, 7]
    st = _rails("allgather", ranks, 12 * 4 * 100)
    src, dst, ring = st.src.tolist(), st.dst.tolist(), st.group.tolist()
    inter = [(s, d, r) for s, d, r in zip(src, dst, ring, strict=True) if s // 4 != d // 4]
    intra = [(s, d, r) for s, d, r in zip(src, dst, ring, strict=True) if s // 4 == d // 4]
    assert len(inter) == 4 * 3  # 3 hosts per ring, 4 rings
    assert all(s % 4 == d % 4 == r for s, d, r in inter)
    assert sorted(s for s, _, _ in inter) == sorted(ranks)  # one per NIC
    for r in range(4):
        # per host: 3 ring hops + the hand-over to the rail's GPU, a cycle over its 4 GPUs
        mine = [(s, d) for s, d, q in intra if q == r]
        assert len(mine) == 3 * 4
        assert sorted(s for s, _ in mine) == sorted(ranks)
        assert sorted(d for _, d in mine) == sorted(ranks)
    # (n-1)/(n g) S on every transfer: 11 / (12 x 4) x 4800 = 1100 bytes
    assert set(st.size_bytes.tolist()) == {1100}
    assert st.hops == 11


@pytest.mark.parametrize(("op", "factor", "hops"), [
    ("allreduce", 2 * 7, 14), ("reducescatter", 7, 7), ("allgather", 7, 7)])
def test_rails_carry_a_gth_of_the_ring_per_nic(op: str, factor: int, hops: int) -> None:
    # 2 hosts x 4 GPUs, S = 8000: a single ring's inter-host hop carries factor/8 x S; over
    # 4 rail rings each NIC carries a quarter of it
    ring = build_collective(op, range(8), 8000, gpus_per_host=4, algorithm="ring")
    (one,) = ring.stages
    st = _rails(op, range(8), 8000)
    nic = [b for s, d, b in zip(st.src.tolist(), st.dst.tolist(), st.size_bytes.tolist(),
                                strict=True) if s // 4 != d // 4]
    assert nic == [factor * 8000 // 8 // 4] * 8
    assert int(one.size_bytes[3]) == factor * 8000 // 8  # (3 -> 4 leaves host 0)
    assert st.hops == one.hops == hops


def test_rails_broadcast_chains_from_the_root() -> None:
    # 2 hosts x 4 GPUs, root GPU 6 (index 6): each of the 4 chains starts at GPU 6, reaches
    # the other 7 GPUs once and carries S / 4; GPU 6 receives nothing
    st = _rails("broadcast", range(8), 4000, root=6)
    received = received_per_gpu((st,), list(range(8)))
    logical = collectives.rail_rings(host_matrix(range(8), 4), root=6)[3]
    assert received[6] == 0
    # every other GPU receives its 4 chains' S / 4 each (plus hand-overs, which pass on)
    got = dict.fromkeys(range(8), 0)
    for d, b, lg in zip(st.dst.tolist(), st.size_bytes.tolist(), logical.tolist(), strict=True):
        got[d] += b if lg else 0
    assert got == {g: (0 if g == 6 else 4000) for g in range(8)}
    assert st.hops == 7
    for r in range(4):
        first = int(np.flatnonzero(st.group == r)[0])
        assert int(st.src[first]) == 6


def test_rails_steps_mode_splits_a_ring_step() -> None:
    plan = build_collective("allgather", range(8), 8000, gpus_per_host=4, algorithm="rails",
                            mode="steps")
    assert plan.algorithm == "rails-steps" and len(plan.stages) == 7
    # a step carries S / (n g) per transfer, independent
    assert {int(b) for st in plan.stages for b in st.size_bytes} == {8000 // 8 // 4}
    assert all((st.group == -1).all() for st in plan.stages)


def test_rails_allgather_runs_a_gth_of_the_ring_time_in_the_twin() -> None:
    """On 2 hosts x 8 GPUs of 400G NICs (NVLink 3600 Gb/s: 8 rings' hops at 450 Gb/s
    each), a single ring's inter-host hop on one NIC bounds it, rail rings spread that
    hop over the 8 NICs: the time per byte (the slope between two sizes, free of the
    latency term) is 8x smaller, and each rail ring's NIC hop of (n-1)/(n g) S is at most
    at line rate."""
    from fabricpilot.nccltests import default_cluster, run_sweep

    ct = default_cluster(16)
    sizes = [512 << 20, 1 << 30]
    slope = {}
    for algo in ("ring", "rails"):
        t_us = [r.time_us for r in run_sweep(ct, "allgather", sizes, "ideal", algorithm=algo)]
        slope[algo] = (t_us[1] - t_us[0]) / (sizes[1] - sizes[0])
    assert slope["ring"] / slope["rails"] == pytest.approx(8.0, rel=1e-3)
    nic_bytes_per_s = 15 / (16 * 8) * 8 / 400e9 * 1e6  # us per byte of S, at line rate
    assert nic_bytes_per_s <= slope["rails"] <= nic_bytes_per_s * 1.03  # (+ headers)


def test_pxn_pipelines_its_nvlink_and_rail_traffic() -> None:
    """PXN AlltoAll of S = 1 GiB per rank on 2 hosts x 8 GPUs (400G NICs, NVLink 450 Gb/s
    per GPU pair): each NIC carries g c = 8 x S/16 = S/2 by rail, 10.94 ms at line rate
    with the headers, while the NVLink forwarding (7 x h c = 7 x S/8 per GPU, over 7
    ports) takes 2.09 ms alongside it, as NCCL pipelines the two. PXN then takes what the
    flat AlltoAll takes (the same bytes on each NIC); as two stages it took their sum,
    13.03 ms, so ``auto``'s PXN was 19 % slower than flat on an idle fabric."""
    from fabricpilot.nccltests import default_cluster, run_sweep

    ct = default_cluster(16)
    size = 1 << 30
    nic_ns = (size // 2) * 4174 / 4096 / 50.0
    t = {algo: run_sweep(ct, "alltoall", [size], "ideal", algorithm=algo)[0]
         for algo in ("auto", "flat")}
    assert t["auto"].algorithm == "pxn"
    assert nic_ns <= t["auto"].time_us * 1e3 <= nic_ns * 1.001
    assert t["auto"].time_us == pytest.approx(t["flat"].time_us, rel=1e-3)


@pytest.mark.parametrize(("gpus", "faster"), [(16, "rails"), (1024, "tree")])
def test_auto_allreduce_is_the_fastest_of_rails_hierarchical_and_tree(gpus: int, faster: str
                                                                      ) -> None:
    """``auto`` weighs an AllReduce's rail rings, hierarchical algorithm and trees by an
    α-β estimate (``allreduce_estimates_ns``: steps x message latency + bytes / rate); on an
    idle fabric (``ideal``) the twin's times are those estimates plus the packet headers
    (4174 / 4096 on the bytes: within 2 %), and auto picks the one the twin runs fastest."""
    from fabricpilot.dataplane import FabricParams
    from fabricpilot.nccltests import default_cluster, run_sweep
    from fabricpilot.runner import link_costs

    ct = default_cluster(gpus)
    size = 256 << 20
    est = collectives.allreduce_estimates_ns(host_matrix(range(gpus), 8), size,
                                             link_costs(ct, FabricParams()))
    twin = {}
    for algo in ("rails", "hierarchical", "tree"):
        (row,) = run_sweep(ct, "allreduce", [size], "ideal", algorithm=algo)
        twin[algo] = row.time_us * 1e3
        assert 1.0 <= twin[algo] / est[algo] <= 4174 / 4096, algo
    (auto,) = run_sweep(ct, "allreduce", [size], "ideal")
    assert min(est, key=est.__getitem__) == min(twin, key=twin.__getitem__) == faster
    assert auto.time_us * 1e3 == pytest.approx(twin[faster])


def test_btree_is_nccls_illustrated_tree() -> None:
    """NCCL's binary tree of 14 ranks as its source draws it: 0 - 8; 8 - 4, 12; 4 - 2, 6;
    12 - 10, 13; 2 - 1, 3; 6 - 5, 7; 10 - 9, 11."""
    drawn = {8: 0, 4: 8, 12: 8, 2: 4, 6: 4, 10: 12, 13: 12, 1: 2, 3: 2, 5: 6, 7: 6, 9: 10,
             11: 10}
    parent = collectives.btree_parents(14)
    assert parent[0] == -1
    assert {r: int(parent[r]) for r in range(1, 14)} == drawn


@pytest.mark.parametrize("n", [2, 3, 4, 5, 14, 64, 100, 1024])
def test_double_binary_trees_span_the_ranks_and_share_the_work(n: int) -> None:
    """Both trees span the ``n`` positions (``n - 1`` edges, connected), rooted at 0 and at
    ``n - 1`` (even ``n``) or 1 (odd), no deeper than ``ceil(log2 n)``; a position is
    interior (has children) in at most one of them, except position 0 for odd ``n``."""
    import networkx as nx

    trees = collectives.dtree_parents(n)
    interior = []
    for parent, root in zip(trees, (0, n - 1 if n % 2 == 0 else 1), strict=True):
        assert np.flatnonzero(parent < 0).tolist() == [root]
        g = nx.Graph()
        g.add_nodes_from(range(n))
        g.add_edges_from((c, int(parent[c])) for c in range(n) if parent[c] >= 0)
        assert nx.is_tree(g)
        depth = max(nx.shortest_path_length(g, root).values())
        assert depth <= max(1, math.ceil(math.log2(n)))
        interior.append(set(parent[parent >= 0].tolist()))
    both = interior[0] & interior[1]
    assert both == (set() if n % 2 == 0 or n < 3 else {0})


@pytest.mark.parametrize(("hosts", "g"), [(2, 4), (3, 2), (8, 4), (13, 1), (64, 8)])
def test_tree_allreduce_moves_what_the_rail_rings_move(hosts: int, g: int) -> None:
    """The tree AllReduce's rail stage: every transfer stays on its rail, between two hosts,
    with its reverse (reduce up, broadcast down); ``S / 2g`` each, ``2(h-1)S`` in all, as
    the hierarchical rail ring's ``2(h-1)/(hg) S`` on each of ``hg`` hops; a GPU sends and
    receives 1 to 4 of them; the NVLink stages are the hierarchical algorithm's."""
    size = 2 * g * hosts * 100  # (no rounding: 2g and hg divide it)
    ranks = np.random.default_rng(hosts).permutation(hosts * g)
    tree = collectives.tree_allreduce(ranks, size, gpus_per_host=g)
    hier = collectives.hierarchical_allreduce(ranks, size, gpus_per_host=g)
    mid = next(st for st in tree if st.label == "rail-tree-allreduce")
    ring = next(st for st in hier if st.label == "rail-allreduce")
    assert [st.label for st in tree] == [st.label for st in hier][:1] * (g > 1) + [
        mid.label] + [st.label for st in hier][-1:] * (g > 1)
    assert mid.n_transfers == 4 * (hosts - 1) * g
    assert (mid.src % g == mid.dst % g).all() and (mid.src // g != mid.dst // g).all()
    assert sorted(zip(mid.src.tolist(), mid.dst.tolist(), strict=True)) == sorted(
        zip(mid.dst.tolist(), mid.src.tolist(), strict=True))
    assert set(mid.size_bytes.tolist()) == {size // (2 * g)}
    assert mid.total_bytes == ring.total_bytes == 2 * (hosts - 1) * size
    for ends in (mid.src, mid.dst):
        counts = np.bincount(ends, minlength=hosts * g)
        assert counts.min() >= 1 and counts.max() <= 4
    # a chunk's way up and down the deeper tree: a binary tree of h nodes is at least
    # floor(log2 h) deep, and these are at most ceil(log2 h) (log2 h for 2, 8, 64 hosts)
    lg = math.log2(hosts)
    assert 2 * math.floor(lg) <= mid.hops <= 2 * math.ceil(lg)
    # rail k's transfers are one coupled group
    assert (mid.group == mid.src % g).all()


@pytest.mark.parametrize(("gpus", "size", "faster"), [(16, 1 << 20, "tree"),
                                                     (16, 256 << 20, "ring"),
                                                     (64, 1 << 20, "tree")])
def test_auto_allreduce_on_single_gpu_hosts_weighs_the_ring_against_trees(
        gpus: int, size: int, faster: str) -> None:
    """One GPU per host: a ring pays 2(n-1) message latencies, the trees 2 log2 n, for
    about the same bytes per NIC (2S against 2(n-1)/n S). ``auto`` picks by the α-β
    estimate, and the twin (``ideal``) runs the one it picks faster: trees for 1 MiB on 16
    and 64 hosts, the ring for 256 MiB on 16 (where the trees' 2S/n more bytes per NIC
    outweigh 22 message latencies)."""
    from fabricpilot.nccltests import default_cluster, run_sweep

    ct = default_cluster(gpus, gpus_per_host=1)
    times = {}
    for algo in ("ring", "tree"):
        (row,) = run_sweep(ct, "allreduce", [size], "ideal", algorithm=algo)
        times[algo] = row.time_us
    (auto,) = run_sweep(ct, "allreduce", [size], "ideal")
    assert auto.algorithm == faster == min(times, key=times.__getitem__)
    assert auto.time_us == pytest.approx(times[faster])
