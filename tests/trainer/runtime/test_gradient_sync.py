"""Actor ranks train through torch.distributed (gloo, real processes): after each update
every rank holds the same parameters, equal to one process training on all the rows,
their gradients summed in buckets that start while backward still runs;
a rank without a task joins with nothing and shrinks nobody's step; counts are summed
across ranks, keys only some ranks have included; the early stop is one decision."""

import copy
import socket
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from trainer.algorithms import PPO, OnPolicySettings
from trainer.algorithms.collective import TorchCollective
from trainer.data.rollout_storage import empty_training_samples
from trainer.models import GaussianChunkPolicy, build_encoder

OBS, CHUNK, ACTIONS, HORIZON = 6, 2, 3, 4


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_algorithm(**settings) -> PPO:
    torch.manual_seed(0)
    policy = GaussianChunkPolicy(build_encoder("mlp", (OBS,), (8,)), ACTIONS, ACTIONS, HORIZON)
    base = dict(update_epochs=1, num_minibatches=1, normalize_advantages=False)
    return PPO(policy, None, OnPolicySettings(**{**base, **settings}), chunk=CHUNK)


def rows(algorithm: PPO, count: int, seed: int, human: bool = False) -> dict[str, torch.Tensor]:
    """`count` rows; with `human`, every third one a human's (no policy weight) with a
    large advantage that must not shift the policy's normalised ones."""
    if count == 0:
        return empty_training_samples((OBS,), CHUNK, ACTIONS)
    gen = torch.Generator().manual_seed(seed)
    obs = torch.randn(count, OBS, generator=gen)
    samples = {
        "obs": obs,
        "plan_obs": obs,
        "actions": torch.randn(count, CHUNK, ACTIONS, generator=gen),
        "chunk_offset": torch.zeros(count, dtype=torch.long),
        "plan_horizon": torch.full((count,), HORIZON, dtype=torch.long),
        "value": torch.zeros(count),
        "returns": torch.zeros(count),
        "advantage": torch.randn(count, generator=gen) + 1.0,
        "weight": torch.ones(count),
        "policy_weight": torch.ones(count),
    }
    if human:
        samples["policy_weight"][::3] = 0.0
        samples["advantage"][::3] = 5.0
    with torch.no_grad():
        samples["log_prob"], _ = algorithm.policy.chunk_log_prob(
            obs, samples["plan_horizon"], samples["chunk_offset"], samples["actions"]
        )
    return samples


def concat(parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {key: torch.cat([part[key] for part in parts]) for key in parts[0]}


# Every scenario in one pair of processes: starting one costs seconds (torch imports).
SCENARIOS = {
    "epochs": ([12, 20], {"num_minibatches": 2, "update_epochs": 2}),
    "one step": ([12, 20], {}),
    "idle": ([0, 16], {}),
    "kl stop": ([0, 16], {"update_epochs": 3, "target_kl": 0.0}),
    "normalised": ([12, 20], {"normalize_advantages": True}),
    "small buckets": ([12, 20], {}),  # one bucket per parameter
    "fsdp": ([12, 20], {"update_epochs": 2}),  # sharded: the same steps as ddp
}
HUMAN_ROWS = {"normalised"}  # scenarios whose rows include a human's


def _rank(rank, world, port, out, shards):
    collective = TorchCollective(rank, world, "127.0.0.1", port, timeout_s=60)
    try:
        for name, (counts_per_rank, settings) in SCENARIOS.items():
            algorithm = make_algorithm(**settings)
            algorithm.collective = collective
            if name == "small buckets":
                algorithm.gradient_bucket_bytes = 1
                started = watch_bucket_starts(algorithm, collective)
            # Ranks seeded differently start with different weights: rank 0's win.
            torch.manual_seed(100 + rank)
            for p in algorithm.policy.parameters():
                p.data.add_(torch.randn_like(p) * rank)
            collective.broadcast_module(algorithm.policy)
            mine = rows(algorithm, counts_per_rank[rank], seed=rank, human=name in HUMAN_ROWS)
            if name == "fsdp":
                algorithm.shard()
            stats = algorithm.update_rows(mine)
            counts = Counter({f"task{rank}_episodes": 2.0, "episodes": 2.0})
            out[(name, rank)] = {
                "buckets": started if name == "small buckets" else None,
                "params": [p.detach().clone() for p in algorithm.acting_policy.parameters()],
                "stats": stats,
                "counts": dict(collective.sum_counts(counts)),
            }
            if name == "fsdp":  # after the update's parameters are kept
                out[("fsdp checkpoint", rank)] = fsdp_checkpoint_round_trip(algorithm, mine, shards)
    finally:
        collective.close()


def watch_bucket_starts(algorithm: PPO, collective: TorchCollective) -> list[tuple[int, int]]:
    """(gradients still to come, bucket size) at each bucket's start: a bucket started
    while others' gradients were still to come overlapped with backward."""
    started: list[tuple[int, int]] = []
    start = collective.sum_tensor_async

    def sum_tensor_async(tensor):
        buckets = algorithm._buckets
        waiting = sum(len(b.params) - b.filled for b in buckets.buckets)
        started.append((waiting, tensor.numel()))
        return start(tensor)

    collective.sum_tensor_async = sum_tensor_async
    return started


def fsdp_checkpoint_round_trip(algorithm: PPO, mine: dict[str, torch.Tensor], shards: Path) -> dict:
    """The sharded run's checkpoint (each rank writes its shards), loaded back by a
    second sharded copy, by an unsharded (ddp) copy, and from that one's full tensors by
    a third sharded copy: all four then take the same step."""
    state = algorithm.state_dict(shards / "iter_000001.shards")
    resolved = state | {"shards": str(shards / state["shards"])}  # as load_checkpoint does

    def copy_of(sharded: bool) -> PPO:
        made = make_algorithm(update_epochs=2)
        made.collective = algorithm.collective
        if sharded:
            made.shard()
        return made

    again, ddp, from_full = copy_of(True), copy_of(False), copy_of(True)
    again.load_state_dict(resolved)
    ddp.load_state_dict(resolved)
    # Copied, as a checkpoint file does (the optimizer's step counters are live tensors).
    from_full.load_state_dict(copy.deepcopy(ddp.state_dict()))
    steps = {}
    for name, model in {
        "first": algorithm,
        "again": again,
        "ddp": ddp,
        "from full": from_full,
    }.items():
        torch.manual_seed(7)  # the same minibatch order
        model.update_rows(dict(mine))
        steps[name] = [p.detach().clone() for p in model.acting_policy.parameters()]
    return {
        "state": state,
        "steps": steps,
        "sharded": [tuple(p.to_local().shape) for p in algorithm.policy.parameters()],
    }


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict:
    shards = tmp_path_factory.mktemp("shards")  # where the sharded scenario saves
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rank, args=(2, free_port(), out, shards), nprocs=2, join=True)
        results = dict(out)
    names = [*SCENARIOS, "fsdp checkpoint"]
    return {name: [results[(name, 0)], results[(name, 1)]] for name in names} | {"shards": shards}


def single_process(counts_per_rank: list[int], human: bool = False, **settings) -> list:
    algorithm = make_algorithm(**settings)
    parts = [
        rows(algorithm, count, seed=rank, human=human) for rank, count in enumerate(counts_per_rank)
    ]
    algorithm.update_rows(concat([p for p in parts if p["weight"].numel()]))
    return [p.detach().clone() for p in algorithm.policy.parameters()]


def assert_same(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(180)
def test_two_ranks_end_identical_and_equal_to_one_process_on_all_rows(ranks):
    first, second = ranks["epochs"]
    assert all(torch.equal(a, b) for a, b in zip(first["params"], second["params"], strict=True))
    # Minibatches are drawn per rank, so compare one full-batch step with one process.
    first, second = ranks["one step"]
    assert_same(first["params"], single_process([12, 20]))
    assert first["counts"] == {"episodes": 4.0, "task0_episodes": 2.0, "task1_episodes": 2.0}


def test_a_rank_without_a_task_joins_with_nothing_and_shrinks_no_step(ranks):
    idle, busy = ranks["idle"]
    assert all(torch.equal(a, b) for a, b in zip(idle["params"], busy["params"], strict=True))
    assert_same(idle["params"], single_process([0, 16]))
    assert idle["stats"]["losses/updates"] == 1.0


def test_the_kl_early_stop_is_one_decision_over_every_rank(ranks):
    # target_kl 0: after the first epoch the KL over every rank's rows is > 0, so both
    # ranks stop there, the idle one (whose own rows say nothing) included.
    idle, busy = ranks["kl stop"]
    assert idle["stats"]["losses/updates"] == busy["stats"]["losses/updates"] == 1.0
    assert idle["stats"]["losses/early_stopped"] == busy["stats"]["losses/early_stopped"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(idle["params"], busy["params"], strict=True))


def test_advantages_are_normalised_over_every_ranks_policy_rows_alike(ranks):
    """Both ranks scale their advantages by the moments of all ranks' policy rows (a
    human's rows left out), so two ranks step as one process on all rows does."""
    first, second = ranks["normalised"]
    assert all(torch.equal(a, b) for a, b in zip(first["params"], second["params"], strict=True))
    assert_same(first["params"], single_process([12, 20], human=True, normalize_advantages=True))
    # ... and not as a process that let the human rows into the statistics would
    leaky = single_process([12, 20], human=False, normalize_advantages=True)
    assert any(not torch.allclose(a, b) for a, b in zip(first["params"], leaky, strict=True))


def test_buckets_start_while_backward_still_runs_and_sum_as_one_buffer_did(ranks):
    first, second = ranks["small buckets"]
    assert all(torch.equal(a, b) for a, b in zip(first["params"], second["params"], strict=True))
    assert_same(first["params"], single_process([12, 20]))
    parameters = len(first["params"])
    assert [size for _, size in first["buckets"]] == [
        p.numel() for p in reversed(first["params"])
    ]  # one per parameter, the last layers' first
    # Backward gives the gradients about in reverse: the first bucket went out while
    # most were still to come (log_std's, used last in the forward pass, comes early).
    waiting = [still for still, _ in first["buckets"]]
    assert waiting[0] >= parameters // 2 and waiting[-1] == 0, waiting


def test_fsdp_shards_the_model_and_steps_as_one_process_on_all_rows(ranks):
    first, second = ranks["fsdp"]
    assert all(torch.equal(a, b) for a, b in zip(first["params"], second["params"], strict=True))
    ddp = make_algorithm(update_epochs=2)
    full = [tuple(p.shape) for p in ddp.policy.parameters()]
    shards = ranks["fsdp checkpoint"][0]["sharded"]
    assert [s[0] for s in shards] == [-(-f[0] // 2) for f in full]  # half of dim 0 each
    # Minibatches are drawn per rank: compare two epochs of full batches.
    parts = [rows(ddp, count, seed=rank) for rank, count in enumerate([12, 20])]
    ddp.update_rows(concat(parts))
    assert_same(first["params"], [p.detach() for p in ddp.policy.parameters()])


def test_an_fsdp_checkpoint_is_sharded_and_loads_into_any_number_of_ranks(ranks):
    first, second = ranks["fsdp checkpoint"]
    # The shards and the count of steps taken, for the step size's warmup.
    assert first["state"] == {"shards": "iter_000001.shards", "optimizer_steps": 2}
    folder = ranks["shards"] / "iter_000001.shards"
    assert sorted(path.name for path in folder.glob("*.distcp")) == [
        "__0_0.distcp",
        "__1_0.distcp",
    ]  # each rank wrote its own part
    # One process, no process group, unsharded: it reads every rank's part.
    single = make_algorithm(update_epochs=2)
    single.load_state_dict({"shards": str(folder), "optimizer_steps": 2})
    assert single.optimizer_steps == 2
    assert_same([p.detach() for p in single.policy.parameters()], ranks["fsdp"][0]["params"])
    assert all(state["step"] == 2 for state in single.optimizer.state.values())
    # Two ranks loading it, sharded, unsharded, or sharded from the unsharded one's full
    # tensors, all step as the run that wrote it.
    for rank in (first, second):
        for name in ("again", "ddp", "from full"):
            assert_same(rank["steps"]["first"], rank["steps"][name])
    assert_same(first["steps"]["first"], second["steps"]["first"])
