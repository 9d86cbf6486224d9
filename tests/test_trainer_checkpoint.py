"""Checkpoints: async DCP saves, manifests, retention, verification with fallback, bit-identical loads.

One real 2-rank gloo group (spawned processes, DDP) for the save/load round trip; the rest runs in a
world-size-1 gloo group inside the test process.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import re
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from bedside.trainer.checkpoint import CheckpointError, CheckpointManager, SaveHandle, rng_state, set_rng_state
from bedside.trainer.manifest import MANIFEST, PARTIAL_SUFFIX, file_digest, find_latest_good

pytestmark = pytest.mark.slow(reason="checkpoints saved and loaded by two gloo ranks, DDP and FSDP")


def build(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        inputs = torch.randn(4, 8, generator=generator)
        model(inputs).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def snapshot(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Canonical (FQN-keyed) model and optimizer state, deep-copied (FSDP shards gathered: a collective)."""
    model_state, optim_state = get_state_dict(model, optimizer)
    return _clone({"model": model_state, "optim": optim_state})


def _clone(value: Any) -> Any:
    if isinstance(value, DTensor):
        return value.full_tensor().detach().clone()
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {key: _clone(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(item) for item in value)
    return value


def assert_identical(actual: Any, expected: Any, where: str = "state") -> None:
    """Same structure, tensors equal bit for bit (dtype included), other values equal."""
    if isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype and torch.equal(actual, expected), where
    elif isinstance(expected, dict):
        assert actual.keys() == expected.keys(), where
        for key in expected:
            assert_identical(actual[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), where
        for index, (a, e) in enumerate(zip(actual, expected)):
            assert_identical(a, e, f"{where}[{index}]")
    else:
        assert actual == expected, where


# -- two real ranks --------------------------------------------------------------------


def parallelize(model: torch.nn.Module, parallelism: str) -> torch.nn.Module:
    if parallelism == "ddp":
        return DistributedDataParallel(model)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    return fully_shard(model)


def _two_rank_worker(rank: int, workdir: str, parallelism: str) -> None:
    torch.set_num_threads(1)
    work = Path(workdir)
    dist.init_process_group("gloo", init_method=f"file://{work / 'rendezvous'}", rank=rank, world_size=2)
    try:
        model = parallelize(build(seed=0)[0], parallelism)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        manager = CheckpointManager(work / "checkpoints", keep_last=2)
        results = []
        for step in (3, 6):
            train(model, optimizer, 3, seed=step + rank)  # different data per rank, DDP keeps replicas equal
            extra = {
                "step": step,
                "timeline": 0,
                "rank": rank,
                "sampler": {"cursor": step, "skip_ranges": [[1, 2]]},
                "rng": rng_state(),
            }
            handle = manager.save(step, 0, model, optimizer, extra)
            expected, expected_extra = snapshot(model, optimizer), extra
            assert isinstance(handle.done(), bool)
            results.append(handle.wait())
        train(model, optimizer, 2, seed=99)  # move on, so that loading has something to undo
        choice = manager.latest_good()
        fresh = parallelize(build(seed=1)[0], parallelism)
        fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
        loaded_extra = manager.load(choice.checkpoint, fresh, fresh_optimizer)
        manager.close()
        torch.save(
            {
                "expected": expected,
                "loaded": snapshot(fresh, fresh_optimizer),
                "extra": expected_extra,
                "loaded_extra": loaded_extra,
                "results": [r.__dict__ for r in results],
                "choice": choice.checkpoint.path,
                "skipped": choice.skipped,
            },
            work / f"rank-{rank}.pt",
        )
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module", params=["ddp", "fsdp"])
def two_ranks(request, tmp_path_factory) -> tuple[Path, list[dict]]:
    """Two gloo ranks train, save twice, train on, then load the latest into a fresh model (DDP, FSDP2)."""
    work = tmp_path_factory.mktemp(f"two_ranks_{request.param}")
    # forked from a server that imports once what each spawned rank would import again
    multiprocessing.set_forkserver_preload([__name__, "torch._dynamo"])  # DDP imports it on wrapping
    mp.start_processes(
        _two_rank_worker, args=(str(work), request.param), nprocs=2, join=True, start_method="forkserver"
    )
    return work, [torch.load(work / f"rank-{rank}.pt", weights_only=False) for rank in range(2)]


def test_two_ranks_load_the_latest_save_bit_identically(two_ranks) -> None:
    work, outcomes = two_ranks
    for rank, outcome in enumerate(outcomes):
        assert outcome["choice"] == work / "checkpoints" / "step-00000006-t0" and outcome["skipped"] == ()
        assert_identical(outcome["loaded"], outcome["expected"], f"rank {rank}")
        assert outcome["loaded_extra"] == outcome["extra"] and outcome["loaded_extra"]["rank"] == rank
    assert_identical(outcomes[1]["loaded"], outcomes[0]["loaded"], "replicas")


def test_two_ranks_report_their_saves_and_rank0_publishes_the_manifest(two_ranks) -> None:
    work, outcomes = two_ranks
    results = outcomes[0]["results"]
    assert [(r["step"], r["status"], r["error"]) for r in results] == [(3, "saved", None), (6, "saved", None)]
    assert all(r["duration_s"] > 0 and r["bytes"] > 0 for r in results)
    manifest = json.loads((work / "checkpoints" / "step-00000006-t0" / MANIFEST).read_text())
    assert (manifest["step"], manifest["timeline"], manifest["world_size"]) == (6, 0, 2)
    assert manifest["extra"]["rank"] == 0 and manifest["extra"]["sampler"]["skip_ranges"] == [[1, 2]]
    assert {".metadata", "extra-rank-00000.json", "extra-rank-00001.json"} <= manifest["files"].keys()
    assert any(name.startswith("__1_") for name in manifest["files"])  # rank 1 wrote its own file
    assert manifest["bytes"] == results[1]["bytes"]
    assert all(0 < r["bytes"] < manifest["bytes"] for r in outcomes[1]["results"])  # rank 1: its own payload
    assert sorted(p.name for p in (work / "checkpoints").iterdir()) == ["step-00000003-t0", "step-00000006-t0"]


# -- one rank, in this process ---------------------------------------------------------


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    yield tmp_path / "checkpoints"
    dist.destroy_process_group()


@pytest.fixture
def manager(one_rank):
    managers = []

    def make(**options) -> CheckpointManager:
        managers.append(CheckpointManager(one_rank, **options))
        return managers[-1]

    yield make
    for each in managers:
        each.close()


def save_steps(manager: CheckpointManager, steps, timeline: int = 0) -> list:
    model, optimizer = build(seed=0)
    results = []
    for step in steps:
        train(model, optimizer, 1, seed=step)
        results.append(manager.save(step, timeline, model, optimizer, {"step": step, "timeline": timeline}).wait())
    return results


def test_manifest_lists_every_file_with_its_size_and_sha256(manager) -> None:
    [result] = save_steps(manager(), [5])
    manifest = json.loads((result.path / MANIFEST).read_text())
    on_disk = {p.name for p in result.path.iterdir()} - {MANIFEST}
    assert manifest["files"].keys() == on_disk and {".metadata", "extra-rank-00000.json"} <= on_disk
    for name, entry in manifest["files"].items():
        assert file_digest(result.path / name) == (entry["size"], entry["sha256"])
    assert manifest["extra"] == {"step": 5, "timeline": 0} and manifest["world_size"] == 1
    assert result.bytes == sum(e["size"] for e in manifest["files"].values()) and result.status == "saved"


def test_retention_keeps_the_last_k_and_the_milestones(manager) -> None:
    results = save_steps(manager(keep_last=2, milestone_every=4), range(1, 10))
    assert sorted(p.name for p in results[0].path.parent.iterdir()) == [
        "step-00000004-t0",
        "step-00000008-t0",
        "step-00000009-t0",
    ]
    deleted = {p.name for r in results for p in r.deleted}
    assert deleted == {f"step-{s:08d}-t0" for s in (1, 2, 3, 5, 6, 7)}


def test_retention_never_deletes_a_verified_checkpoint_to_keep_a_corrupt_one(manager) -> None:
    """A later process saves below two newer checkpoints that are corrupt: they take no place of the two kept."""
    [good] = save_steps(manager(keep_last=5), [10])
    for damaged in save_steps(manager(keep_last=5), [40, 50]):
        _damage(damaged.path, "flip")
    [saved] = save_steps(manager(keep_last=2), [20])
    assert saved.deleted == () and good.path.exists() and saved.path.exists()
    assert sorted(path.name for path, _ in saved.corrupt) == ["step-00000040-t0", "step-00000050-t0"]
    assert all("does not match the manifest" in why for _, why in saved.corrupt)


def test_retention_lets_a_corrupt_checkpoint_go_once_the_verified_ones_are_newer(manager) -> None:
    [damaged] = save_steps(manager(keep_last=5), [10])
    _damage(damaged.path, "flip")
    results = save_steps(manager(keep_last=2), [20, 30])
    assert results[0].deleted == () and results[1].deleted == (damaged.path,)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("flip", r"__0_0\.distcp: sha256 .* does not match"),
        ("truncate", r"__0_0\.distcp: size \d+ bytes, manifest says \d+"),
        ("remove", r"__0_0\.distcp: missing"),
        ("manifest_garbage", r"manifest\.json: unreadable"),
        ("manifest_removed", r"manifest\.json: missing"),
    ],
)
def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_one(manager, damage: str, reason: str) -> None:
    checkpoints = manager()
    older, newest = save_steps(checkpoints, [2, 4])
    _damage(newest.path, damage)
    choice = checkpoints.latest_good()
    assert choice.checkpoint.path == older.path and choice.checkpoint.step == 2 and choice.fell_back
    [(path, why)] = choice.skipped
    assert path == newest.path and str(newest.path) in why
    assert re.search(reason, why), why


def _damage(directory: Path, damage: str) -> None:
    data = directory / "__0_0.distcp"
    if damage == "flip":
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0x01
        data.write_bytes(bytes(raw))
    elif damage == "truncate":
        data.write_bytes(data.read_bytes()[:-1])
    elif damage == "remove":
        data.unlink()
    elif damage == "manifest_garbage":
        (directory / MANIFEST).write_text("{not json")
    else:
        (directory / MANIFEST).unlink()


def test_an_unfinished_save_is_ignored_and_cleaned_up_by_the_next_manager(manager, one_rank) -> None:
    [good] = save_steps(manager(), [3])
    crashed = one_rank / f"step-00000007-t0{PARTIAL_SUFFIX}"  # a crash mid-save: data written, no manifest
    crashed.mkdir()
    (crashed / "__0_0.distcp").write_bytes(b"half a checkpoint")
    choice = find_latest_good(one_rank)
    assert choice.checkpoint.path == good.path and choice.skipped == ()
    manager()  # a restarted job
    assert not crashed.exists() and good.path.exists()


def test_at_or_before_step_and_newer_timelines_choose_the_right_one(manager) -> None:
    checkpoints = manager(keep_last=10)
    save_steps(checkpoints, [2, 4, 6])
    assert checkpoints.latest_good(at_or_before_step=5).checkpoint.step == 4
    assert checkpoints.latest_good(at_or_before_step=6).checkpoint.step == 6
    assert checkpoints.latest_good(at_or_before_step=1).checkpoint is None
    save_steps(checkpoints, [5], timeline=1)  # rewound to step 4, then trained on a new timeline
    latest = checkpoints.latest_good().checkpoint
    assert (latest.timeline, latest.step) == (1, 5) and latest.extra == {"step": 5, "timeline": 1}
    earlier = checkpoints.latest_good(at_or_before_step=4).checkpoint
    assert (earlier.timeline, earlier.step) == (0, 4)


def test_load_restores_model_optimizer_and_extra_in_one_rank(manager) -> None:
    checkpoints = manager()
    model, optimizer = build(seed=0)
    train(model, optimizer, 3, seed=0)
    extra = {"step": 3, "timeline": 0, "rng": rng_state()}
    checkpoints.save(3, 0, model, optimizer, extra)
    expected = snapshot(model, optimizer)
    train(model, optimizer, 2, seed=1)  # training continues while (and after) the save writes
    fresh, fresh_optimizer = build(seed=1)
    assert checkpoints.load(checkpoints.latest_good().checkpoint, fresh, fresh_optimizer) == extra
    assert_identical(snapshot(fresh, fresh_optimizer), expected)


def test_saves_must_move_forward_and_extra_must_be_json(manager) -> None:
    checkpoints = manager()
    save_steps(checkpoints, [4])
    model, optimizer = build(seed=0)
    with pytest.raises(CheckpointError, match="step-00000004-t0: not newer"):
        checkpoints.save(4, 0, model, optimizer, {})
    with pytest.raises(CheckpointError, match="step-00000005-t0: trainer state is not JSON-able"):
        checkpoints.save(5, 0, model, optimizer, {"rng": torch.get_rng_state()})


def test_result_of_a_save_in_flight_is_an_error_not_a_wait() -> None:
    with pytest.raises(CheckpointError, match="still in flight"):
        SaveHandle(Future(), staging_s=0.0).result()


def test_rng_state_round_trips_through_json() -> None:
    state = json.loads(json.dumps(rng_state()))
    drawn = (torch.rand(3), np.random.rand(3), random.random())
    set_rng_state(state)
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(drawn[0], again[0]) and np.array_equal(drawn[1], again[1]) and drawn[2] == again[2]


@pytest.mark.parametrize("options", [{"keep_last": 0}, {"milestone_every": 0}])
def test_bad_retention_settings_are_refused(tmp_path, options) -> None:
    with pytest.raises(ValueError):
        CheckpointManager(tmp_path, **options)
