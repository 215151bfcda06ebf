"""fabricpilot.integrations.torch: the environment it reads, the announcing state (without
torch, against a mock controller), and end to end: a real ``fabricpilot serve`` subprocess
and a real 2-process ``torch.distributed`` (gloo, CPU) DDP run with the hook.

The end-to-end test needs torch (``pip install torch==2.13.0``). Without it the test fails,
unless ``FABRICPILOT_SKIP_TORCH=1``, which skips it.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from conftest import free_port
from fabricpilot.client import Client, FabricpilotAPIError
from fabricpilot.integrations.torch import (
    DEFAULT_SLA_US,
    DEFAULT_TASK_ID,
    CommIntent,
    declare,
    gpus_from_env,
    ring_pairs,
    sla_from_env,
    task_id_from_env,
)

WORLD_SIZE = 2
GPU_OFFSET = 8
TASK_ID = "ddp-test"
SLA_US = 400
STEPS = 3


# ---------------------------------------------------------------- environment
def test_environment_values() -> None:
    assert task_id_from_env({"AI_TASK_ID": "llm-1", "TORCHELASTIC_RUN_ID": "r"}) == "llm-1"
    assert task_id_from_env({"TORCHELASTIC_RUN_ID": "none/#1"}) == "none--1"
    assert task_id_from_env({"AI_TASK_ID": "___"}) == DEFAULT_TASK_ID
    assert task_id_from_env({}) == DEFAULT_TASK_ID
    assert sla_from_env({"AI_SLA_LATENCY": " 250.5 "}) == 250.5
    assert sla_from_env({"AI_SLA_LATENCY": "400us"}) == 400.0  # (with a unit, as elsewhere)
    assert sla_from_env({"AI_SLA_LATENCY": "2ms"}) == 2000.0
    assert sla_from_env({}) is None
    assert sla_from_env({"AI_SLA_LATENCY": "1e9"}) == 1e9  # (the service's largest)
    # (1e300 was let through, for the service to refuse it with a 422 at the declaration)
    for bad in ("fast", "0", "-3", "inf", "nan", "1e400", "0us", "1GB", "1e300", "1001s"):
        with pytest.raises(ValueError, match="AI_SLA_LATENCY"):
            sla_from_env({"AI_SLA_LATENCY": bad})
    assert gpus_from_env(3, {}) == [0, 1, 2]
    assert gpus_from_env(2, {"FABRICPILOT_GPU_OFFSET": "64"}) == [64, 65]
    assert gpus_from_env(3, {"FABRICPILOT_GPUS": "9,4-5", "FABRICPILOT_GPU_OFFSET": "64"}) \
        == [9, 4, 5]
    with pytest.raises(ValueError, match="lists 8 GPUs for 2 ranks"):
        gpus_from_env(2, {"FABRICPILOT_GPUS": "0-7"})
    with pytest.raises(ValueError, match="FABRICPILOT_GPUS: bad range '3-1'"):
        gpus_from_env(2, {"FABRICPILOT_GPUS": "3-1"})
    with pytest.raises(ValueError, match="GPU 4 is listed twice"):  # (one GPU per rank)
        gpus_from_env(3, {"FABRICPILOT_GPUS": "4,5,4"})
    with pytest.raises(ValueError, match="FABRICPILOT_GPUS: more than"):  # (not expanded)
        gpus_from_env(2, {"FABRICPILOT_GPUS": "0-99999999999"})
    assert ring_pairs([1]) == [] and ring_pairs([4, 2]) == [(4, 2), (2, 4)]


# ---------------------------------------------------------------- state, mock controller
def _mock(handler: object) -> Client:
    return Client("http://fp.test", token="t" * 20, get_retries=0,
                  transport=httpx.MockTransport(handler))  # type: ignore[arg-type]


def _state(client: Client, *, announcer: bool = True) -> CommIntent:
    """A state as :func:`declare` makes it, with the process group's GPUs already known
    (what ``group_gpus`` would read from torch.distributed)."""
    state = CommIntent("job", [8, 9, 10], 400.0, 0, 3, client)
    state._group_gpus = [8, 9, 10]
    state._announcer = announcer
    return state


def test_declare_puts_the_job_with_its_ring() -> None:
    sent: list[tuple[str, str, dict[str, object]]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        sent.append((request.method, request.url.path, body))
        if request.method == "DELETE":
            return httpx.Response(204)
        return httpx.Response(200, json={**body, "tenant": "default"})

    env = {"AI_TASK_ID": "ddp-x", "AI_SLA_LATENCY": "400", "FABRICPILOT_GPUS": "3,7",
           "WORLD_SIZE": "2", "RANK": "0"}
    state = declare(_mock(handler), env=env, size_bytes=1 << 20)
    assert (state.task_id, state.gpus, state.sla_us, state.enabled) == ("ddp-x", [3, 7],
                                                                       400.0, True)
    assert sent == [("PUT", "/api/v1/jobs/ddp-x",
                     {"task_id": "ddp-x", "gpus": [3, 7], "opt_in": True,
                      "calls": [{"pattern": "allreduce", "size_bytes": 1 << 20,
                                 "sla_us": 400.0}]})]  # (the controller knows the hosts)
    assert state.job is not None and state.job["tenant"] == "default"

    other = declare(_mock(handler), env={**env, "RANK": "1"})  # only rank 0 declares
    assert len(sent) == 1 and other.job is None and other.sla_us == 400.0
    default_sla = declare(_mock(handler), env={"WORLD_SIZE": "1"})
    assert default_sla.sla_us == DEFAULT_SLA_US and default_sla.gpus == [0]
    # training over: the rank that declared the job withdraws it (its GPUs and paths are
    # free again), once; the others send nothing
    other.close()
    state.close()
    state.close()
    assert sent[-1][:2] == ("DELETE", "/api/v1/jobs/ddp-x") and len(sent) == 3
    default_sla.close(withdraw=False)
    assert len(sent) == 3


def test_nccl_algo_tree_declares_and_announces_trees() -> None:
    """With ``NCCL_ALGO=Tree`` (NCCL runs every AllReduce over trees) the job's AllReduce is
    declared and its buckets announced with ``algorithm: tree``, so that the controller
    plans the trees' pairs; a list (``Tree,Ring``) leaves the choice to NCCL and the
    controller plans rings, as without the setting."""
    sent: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "DELETE":  # (the job withdrawn when the state closes)
            return httpx.Response(204)
        body = json.loads(request.content)
        sent.append(body)
        return httpx.Response(200, json={**body, "tenant": "default", "pairs": []})

    env = {"WORLD_SIZE": "2", "RANK": "0", "FABRICPILOT_GPUS": "0,8", "NCCL_ALGO": "Tree"}
    state = declare(_mock(handler), env=env, size_bytes=1 << 20)
    assert state.algorithm == "tree"
    assert sent[0]["calls"] == [{"pattern": "allreduce", "size_bytes": 1 << 20,
                                 "sla_us": DEFAULT_SLA_US, "algorithm": "tree"}]
    state._group_gpus, state._announcer = [0, 8], True
    assert state.note_bucket(0, 4096) and state.flush(10)
    assert sent[1]["algorithm"] == "tree" and sent[1]["ranks"] == [0, 8]
    state.close()
    listed = declare(_mock(handler), env={**env, "NCCL_ALGO": "Tree,Ring"})
    assert listed.algorithm == "" and "algorithm" not in sent[2]["calls"][0]  # type: ignore[index]
    listed.close()


def test_declare_tolerates_an_unreachable_controller(caplog: pytest.LogCaptureFixture) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with caplog.at_level(logging.WARNING, "fabricpilot.integrations.torch"):
        state = declare(_mock(handler), env={"WORLD_SIZE": "2"})
    assert state.enabled is False and state.job is None
    assert "cannot declare job 'ddp-job'" in caplog.text and "training continues" in caplog.text
    assert state.note_bucket(0, 1024) is False  # nothing is announced afterwards


def test_a_malformed_controller_url_never_stops_training(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """``FABRICPILOT_URL=http://127.0.0.1:abc``: declare logs one line and training goes on
    without announcements (httpx's InvalidURL used to end every rank)."""
    monkeypatch.setenv("FABRICPILOT_URL", "http://127.0.0.1:abc")
    with caplog.at_level(logging.WARNING, "fabricpilot.integrations.torch"):
        state = declare(env={"WORLD_SIZE": "2", "RANK": "0"})
    assert state.enabled is False and state.client is None and state.job is None
    assert caplog.text.count("is not valid") == 1 and "training continues" in caplog.text
    assert state.note_bucket(0, 1024) is False
    state.close()


def test_task_ids_of_two_launches_do_not_collide(caplog: pytest.LogCaptureFixture) -> None:
    """torchrun without a run id sets TORCHELASTIC_RUN_ID=none: that is no task id; the
    rendezvous (MASTER_ADDR, MASTER_PORT) names the job instead, which two jobs running at
    once cannot share. A task id with nothing the service accepts falls back, said so."""
    rdzv = {"MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29501"}
    assert task_id_from_env({"TORCHELASTIC_RUN_ID": "none", **rdzv}) == "ddp-10.1.2.3-29501"
    assert task_id_from_env({"TORCHELASTIC_RUN_ID": "abc123", **rdzv}) == "abc123"
    assert task_id_from_env({"AI_TASK_ID": "mine", **rdzv}) == "mine"
    with caplog.at_level(logging.WARNING, "fabricpilot.integrations.torch"):
        assert task_id_from_env({"AI_TASK_ID": "日本/語"}) == DEFAULT_TASK_ID
    assert "has no character a task id may hold" in caplog.text
    # an id of the user's that had to change is said so: 'exp/1' and 'exp:1' are one job
    caplog.clear()
    with caplog.at_level(logging.WARNING, "fabricpilot.integrations.torch"):
        assert task_id_from_env({"AI_TASK_ID": "exp/1"}) == "exp-1"
        assert task_id_from_env({"TORCHELASTIC_RUN_ID": "run/2"}) == "run-2"  # (not theirs)
    assert [r.getMessage() for r in caplog.records] == [
        "fabricpilot: AI_TASK_ID='exp/1' is declared as task 'exp-1' (a task id holds "
        "letters, digits, '.', '_' and '-', at most 128): a job whose id reads the same "
        "would replace this one's intent"]


def test_an_unmet_sla_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"pairs": [], "sla_met": False,
                                         "sla_problem": "no path within 0.5 us"})

    with caplog.at_level(logging.WARNING, "fabricpilot.integrations.torch"), \
            _state(_mock(handler)) as state:
        state.note_bucket(0, 100)
        state.note_bucket(1, 100)
        assert state.flush(10)
    # (once, for whichever bucket's answer came first: they are announced at once)
    assert caplog.text.count("no path meets bucket ") == 1
    assert "'s SLA of 400 us: no path within 0.5 us" in caplog.text


def test_each_bucket_is_announced_once() -> None:
    sent: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert request.url.path == "/api/v1/jobs/job/calls"
        sent.append(body)
        return httpx.Response(200, json={"size_bytes": body["size_bytes"], "pairs": []})

    with _state(_mock(handler)) as state:
        for _ in range(3):  # three iterations, two buckets
            assert [state.note_bucket(i, s) for i, s in ((0, 4096), (1, 512))] in (
                [True, True], [False, False])
        state.note_bucket(0, 2048)  # re-bucketed: a new size for index 0
        assert state.flush(10)
        # (sent at once but for one bucket in turn: index 0's new size comes after its first)
        assert sorted(sent, key=lambda b: b["bucket"]) == [  # (a stable sort)
            {"pattern": "allreduce", "size_bytes": 4096, "ranks": [8, 9, 10], "period_ns": 0,
             "sla_us": 400.0, "bucket": 0},
            {"pattern": "allreduce", "size_bytes": 2048, "ranks": [8, 9, 10], "period_ns": 0,
             "sla_us": 400.0, "bucket": 0},
            {"pattern": "allreduce", "size_bytes": 512, "ranks": [8, 9, 10], "period_ns": 0,
             "sla_us": 400.0, "bucket": 1}]
        assert sorted(state.announced) == [(0, 2048), (0, 4096), (1, 512)]
        assert state.decisions[(1, 512)] == {"size_bytes": 512, "pairs": []}

    with _state(_mock(handler), announcer=False) as follower:  # not rank 0 of the group
        assert follower.note_bucket(0, 4096) is False
    assert len(sent) == 3


def test_buckets_are_announced_at_once_each_bucket_in_turn() -> None:
    """Each announcement waits for the controller's next plan: one after another, 300
    buckets took 300 plans. Four buckets are in flight together (the handler holds each
    until all four have come); a bucket's second size waits for its first to be answered."""
    arrived = threading.Barrier(4, timeout=5)
    order: list[tuple[str, int, int]] = []
    lock = threading.Lock()

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        with lock:
            order.append(("in", body["bucket"], body["size_bytes"]))
        if body["size_bytes"] == 100:
            arrived.wait()  # (a BrokenBarrierError if they came one at a time)
        with lock:
            order.append(("out", body["bucket"], body["size_bytes"]))
        return httpx.Response(200, json={"pairs": []})

    with _state(_mock(handler)) as state:
        for i in range(4):
            state.note_bucket(i, 100)
        state.note_bucket(0, 200)
        assert state.flush(10)
    assert len(state.announced) == 5
    assert order.index(("out", 0, 100)) < order.index(("in", 0, 200))


def test_announce_failures_never_raise(caplog: pytest.LogCaptureFixture) -> None:
    statuses = iter([422, 422, 200])

    def refusing(request: httpx.Request) -> httpx.Response:
        status = next(statuses)
        return httpx.Response(status, json={"detail": "ranks: GPU 9 is not one of job's GPUs"}
                              if status != 200 else {"pairs": []})

    def unreachable(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with caplog.at_level(logging.WARNING, "fabricpilot.integrations.torch"):
        with _state(_mock(refusing)) as state:
            for i in range(3):
                state.note_bucket(i, 100)
            assert state.flush(10)
            assert state.enabled is True and len(state.announced) == 1
        assert caplog.text.count("refused bucket") == 1  # warned once

        caplog.clear()
        with _state(_mock(unreachable)) as state:
            state.job = {"task_id": "job"}  # (declared before the controller went away)
            state.note_bucket(0, 100)
            assert state.flush(10)
            assert state.enabled is False  # stops trying after the first failure
            assert state.note_bucket(1, 100) is False
        assert caplog.text.count("cannot reach the fabricpilot controller") == 1
        # (nor is its withdrawal at the end a second warning: one line in all)
        assert [r.levelno for r in caplog.records] == [logging.WARNING]


def test_close_reports_announcements_it_could_not_send(
        caplog: pytest.LogCaptureFixture) -> None:
    """A controller that never answers: ``close(t)`` returns after about ``t`` (not 2t) and
    says how many announcements were dropped."""
    release = threading.Event()

    def hung(request: httpx.Request) -> httpx.Response:
        release.wait(10)
        return httpx.Response(200, json={"pairs": []})

    state = _state(_mock(hung))
    state.note_bucket(0, 100)
    state.note_bucket(1, 100)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, "fabricpilot.integrations.torch"):
        state.close(0.5)
    waited_s = time.monotonic() - started
    release.set()
    assert "2 announcement(s) not sent within 0.5 s" in caplog.text
    assert waited_s < 0.9  # one budget for flushing and joining together (was 2 x 0.5 s)


# ---------------------------------------------------------------- end to end
WORKER = r'''
"""One rank of the DDP test run: train with the fabricpilot hook and without it, record
what DDP hands the hook, and write the outcome as JSON to argv[1]."""
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from fabricpilot.client import Client
from fabricpilot.integrations.torch import declare, fabricpilot_allreduce_hook

STEPS = int(os.environ["TEST_STEPS"])
BUCKET_CAP_MB = 0.01  # ~10 KB: the model's ~23 KB of gradients span several buckets


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 48), torch.nn.ReLU(),
                               torch.nn.Linear(48, 8))


def batches(rank):
    g = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g))
            for _ in range(STEPS)]


def train(data, state=None, record=None):
    model = DDP(make_model(), bucket_cap_mb=BUCKET_CAP_MB)
    if state is not None and record is None:
        model.register_comm_hook(state, fabricpilot_allreduce_hook)  # as documented
    elif state is not None:
        def recording_hook(st, bucket):
            # independent of the hook's own arithmetic: the bucket's parameters' bytes
            params_bytes = sum(p.numel() * p.element_size() for p in bucket.parameters())
            record.append([bucket.index(), params_bytes])
            return fabricpilot_allreduce_hook(st, bucket)
        model.register_comm_hook(state, recording_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    grads = []
    for x, y in data:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        grads.append([p.grad.detach().clone() for p in model.parameters()])
        opt.step()
    return grads, [p.detach().clone() for p in model.parameters()]


def local_grads(x, y):
    model = make_model()
    torch.nn.functional.mse_loss(model(x), y).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    data = batches(rank)
    state = declare()
    record = []
    hooked_grads, hooked_params = train(data, state, record)
    flushed = state.flush(30)
    plain_grads, plain_params = train(data)

    # step 0: the hook's gradients are the mean of the ranks' local gradients
    mine = local_grads(*data[0])
    gathered = [None] * world
    dist.all_gather_object(gathered, mine)
    mean = [sum(g[i] for g in gathered) / world for i in range(len(mine))]
    mean_diff = max(float((a - b).abs().max()) for a, b in zip(hooked_grads[0], mean))

    # an unreachable controller: declared and trained through, without announcements
    dead = Client(os.environ["TEST_DEAD_URL"], get_retries=0, timeout_s=5)
    dead_state = declare(dead, task_id="ddp-unreachable")
    dead_grads, _ = train(data, dead_state)

    # what the service holds of the job while it trains (rank 0; withdrawn at close)
    service = None
    if rank == 0:
        with Client() as fp:
            service = {"job": fp.get_job(state.task_id), "calls": fp.calls(state.task_id),
                       "paths": fp.paths(state.task_id),
                       "jobs": [j["task_id"] for j in fp.list_jobs()]}
    dist.barrier()

    out = {
        "service": service,
        "rank": rank, "world": world, "task_id": state.task_id, "gpus": state.gpus,
        "sla_us": state.sla_us, "enabled": state.enabled, "flushed": flushed,
        "declared": state.job, "announced": [list(k) for k in state.announced],
        "decisions": {f"{i}:{s}": d for (i, s), d in state.decisions.items()},
        "record": record,
        "grads_equal": all(torch.equal(a, b) for ga, gb in zip(hooked_grads, plain_grads)
                           for a, b in zip(ga, gb)),
        "params_equal": all(torch.equal(a, b) for a, b in zip(hooked_params, plain_params)),
        "mean_diff": mean_diff,
        "dead_enabled": dead_state.enabled,
        "dead_grads_equal": all(torch.equal(a, b) for ga, gb in zip(dead_grads, plain_grads)
                                for a, b in zip(ga, gb)),
    }
    state.close()
    dead_state.close()
    dist.barrier()
    dist.destroy_process_group()
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)


main()
'''



def _require_torch() -> None:
    if importlib.util.find_spec("torch") is not None:
        return
    if os.environ.get("FABRICPILOT_SKIP_TORCH") == "1":
        pytest.skip("torch is not installed and FABRICPILOT_SKIP_TORCH=1")
    pytest.fail("torch is not installed: the DDP hook test needs it "
                "(pip install torch==2.13.0, or pip install 'fabricpilot[torch]'); "
                "set FABRICPILOT_SKIP_TORCH=1 to skip this test", pytrace=False)


@dataclass
class Served:
    url: str
    token: str


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    """``python -m fabricpilot serve --no-twin`` on a free loopback port."""
    state_dir = tmp_path / "state"
    port = free_port()
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fabricpilot", "serve", "--no-twin", "--state-dir",
             str(state_dir), "--host", "127.0.0.1", "--port", str(port),
             "--log-level", "WARNING"],
            stdout=log_file, stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "200"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 45
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"fabricpilot serve exited with {proc.returncode}:\n"
                                   + log_path.read_text())
            if time.monotonic() > deadline:
                raise RuntimeError("fabricpilot serve did not answer /health in 45 s:\n"
                                   + log_path.read_text())
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        token = (state_dir / "operator.token").read_text().strip()
        yield Served(url, token)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _run_workers(tmp_path: Path, served: Served) -> list[dict[str, object]]:
    script = tmp_path / "ddp_worker.py"
    script.write_text(WORKER)
    master_port = free_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FABRICPILOT_", "AI_", "TORCHELASTIC_"))}
    env.update(OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port),
               GLOO_SOCKET_IFNAME="lo", WORLD_SIZE=str(WORLD_SIZE), AI_SLA_LATENCY=str(SLA_US),
               AI_TASK_ID=TASK_ID, FABRICPILOT_URL=served.url, FABRICPILOT_TOKEN=served.token,
               FABRICPILOT_GPU_OFFSET=str(GPU_OFFSET), TEST_STEPS=str(STEPS),
               TEST_DEAD_URL=f"http://127.0.0.1:{free_port()}")
    procs = []
    for rank in range(WORLD_SIZE):
        log = (tmp_path / f"rank{rank}.log").open("w")
        procs.append((subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / f"rank{rank}.json")],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=log, stderr=subprocess.STDOUT), log))
    deadline = time.monotonic() + 120
    try:
        for proc, _ in procs:
            proc.wait(max(deadline - time.monotonic(), 1))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            log.close()
    logs = "\n".join(f"--- rank {r}:\n" + (tmp_path / f"rank{r}.log").read_text()
                     for r in range(WORLD_SIZE))
    assert all(p.returncode == 0 for p, _ in procs), f"a DDP worker failed:\n{logs}"
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD_SIZE)]


def test_ddp_hook_end_to_end(tmp_path: Path, served: Served) -> None:
    _require_torch()
    rank0, rank1 = _run_workers(tmp_path, served)
    gpus = [GPU_OFFSET + r for r in range(WORLD_SIZE)]

    # training is unchanged by the hook
    for out in (rank0, rank1):
        assert out["grads_equal"] is True and out["params_equal"] is True
        assert out["mean_diff"] < 1e-6  # type: ignore[operator]
        assert (out["task_id"], out["gpus"], out["sla_us"]) == (TASK_ID, gpus, SLA_US)
        assert out["enabled"] is True and out["flushed"] is True
        assert out["dead_enabled"] is False and out["dead_grads_equal"] is True
    assert rank0["declared"] is not None and rank1["declared"] is None

    # what DDP handed the hook: >= 2 buckets, the same on both ranks
    seen = {(int(i), int(s)) for i, s in rank0["record"]}  # type: ignore[attr-defined]
    assert seen == {(int(i), int(s)) for i, s in rank1["record"]}  # type: ignore[attr-defined]
    assert len({i for i, _ in seen}) >= 2
    # each (bucket, size) announced exactly once, by rank 0 only
    announced = sorted((int(i), int(s)) for i, s in rank0["announced"])  # type: ignore[attr-defined]
    assert announced == sorted(seen) and rank1["announced"] == []
    for key, decision in rank0["decisions"].items():  # type: ignore[attr-defined]
        assert [(p["src"], p["dst"]) for p in decision["pairs"]] == ring_pairs(gpus), key
        assert all(p["planned"] and p["paths"] for p in decision["pairs"])

    # what the service held while the job trained (read by rank 0 before closing)
    service = rank0["service"]
    assert rank1["service"] is None and isinstance(service, dict)
    job = service["job"]
    assert job["gpus"] == gpus
    assert all(c["pattern"] == "allreduce" and c["sla_us"] == SLA_US for c in job["calls"])
    calls = service["calls"]
    assert sorted((c["bucket"], c["size_bytes"]) for c in calls) == sorted(seen)
    for call in calls:
        assert call["pattern"] == "allreduce"
        assert call["ranks"] == gpus == job["gpus"]
        assert call["sla_us"] == SLA_US
    pairs = service["paths"]["pairs"]
    assert sorted((p["src"], p["dst"]) for p in pairs) == sorted(ring_pairs(gpus))
    assert service["jobs"] == [TASK_ID]  # (not the dead one)
    # training over: rank 0 withdrew the job, its GPUs and paths are free again
    with Client(served.url, token=served.token) as fp:
        assert fp.list_jobs() == []
        with pytest.raises(FabricpilotAPIError, match="404"):
            fp.get_job(TASK_ID)
