"""Replay buffers and the demo/online mix of RLPD (seed 004)."""

import pytest
import torch

from trainer.data.replay import MixedSampler, ReplayBuffer, add_transitions, transition_batch
from trainer.envs.vector_env import EnvStep


def transitions(first: int, count: int, intervened: list[bool] | None = None) -> dict:
    ids = torch.arange(first, first + count)
    return {
        "obs": ids.float().unsqueeze(1).repeat(1, 3),
        "action": torch.zeros(count, 2),
        "reward": ids.float(),
        "terminal": torch.zeros(count, dtype=torch.bool),
        "intervened": torch.tensor(intervened or [False] * count),
        "id": ids,
    }


def test_a_full_buffer_keeps_the_newest_rows_in_order():
    buffer = ReplayBuffer(5)
    buffer.add(transitions(0, 3))
    buffer.add(transitions(3, 4))
    assert len(buffer) == 5 and buffer.added == 7
    assert buffer.ordered()["id"].tolist() == [2, 3, 4, 5, 6]
    buffer.add(transitions(7, 12))  # more than the capacity at once
    assert buffer.ordered()["id"].tolist() == [14, 15, 16, 17, 18]
    assert buffer.added == 19


def test_fields_are_one_tensor_each_of_the_buffers_capacity():
    buffer = ReplayBuffer(100)
    buffer.add(transitions(0, 4))
    assert buffer.fields["obs"].shape == (100, 3) and buffer.fields["id"].dtype == torch.int64


def test_samples_come_only_from_stored_rows():
    buffer = ReplayBuffer(50)
    buffer.add(transitions(10, 20))
    drawn = buffer.sample(1000, torch.Generator().manual_seed(0))["id"]
    assert drawn.min() >= 10 and drawn.max() <= 29
    assert set(drawn.tolist()) == set(range(10, 30))  # uniform: every row comes up


def test_bad_batches_are_named():
    buffer = ReplayBuffer(10)
    with pytest.raises(ValueError, match="different numbers of rows"):
        buffer.add({"obs": torch.zeros(3, 1), "reward": torch.zeros(2)})
    buffer.add(transitions(0, 2))
    with pytest.raises(ValueError, match="differ from the buffer"):
        buffer.add({"obs": torch.zeros(2, 3)})
    with pytest.raises(ValueError, match="empty buffer"):
        ReplayBuffer(3).sample(1)
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(0)


@pytest.mark.parametrize(("batch_size", "fraction", "demo_rows"), [(256, 0.5, 128), (10, 0.3, 3)])
def test_each_batch_has_exactly_the_demo_share(batch_size, fraction, demo_rows):
    online, demo = ReplayBuffer(10_000), ReplayBuffer(100)
    online.add(transitions(0, 5_000))  # online data far outnumber the demos
    demo.add(transitions(100_000, 20))
    sampler = MixedSampler(online, demo, batch_size, demo_fraction=fraction)
    generator = torch.Generator().manual_seed(1)
    for _ in range(5):
        batch = sampler.sample(generator)
        assert batch["id"].shape == (batch_size,)
        assert int(batch["from_demo"].sum()) == demo_rows
        assert bool((batch["id"][batch["from_demo"]] >= 100_000).all())
        assert bool((batch["id"][~batch["from_demo"]] < 5_000).all())


def test_a_sampler_told_its_fields_gathers_those_alone_and_the_same_rows():
    online, demo = ReplayBuffer(100), ReplayBuffer(10)
    online.add(transitions(0, 50))
    demo.add(transitions(100_000, 5))
    every = MixedSampler(online, demo, 8).sample(torch.Generator().manual_seed(2))
    ids = MixedSampler(online, demo, 8, fields=("id",)).sample(torch.Generator().manual_seed(2))
    assert set(every) == {*transitions(0, 1), "from_demo"} and set(ids) == {"id"}
    assert torch.equal(ids["id"], every["id"])
    with pytest.raises(ValueError, match=r"the buffers hold no field 'next_obs'"):
        MixedSampler(online, demo, 8, fields=("id", "next_obs")).sample()


def test_buffers_with_different_fields_cannot_be_mixed():
    online, demo = ReplayBuffer(10), ReplayBuffer(10)
    online.add(transitions(0, 4))
    demo.add({name: t for name, t in transitions(10, 4).items() if name != "id"})
    with pytest.raises(ValueError, match=r"demo buffer's fields .* differ from the online"):
        MixedSampler(online, demo, 4).sample()


def test_updates_wait_for_training_starts_and_draw_online_alone_until_demos_arrive():
    online, demo = ReplayBuffer(100), ReplayBuffer(10)
    sampler = MixedSampler(online, demo, 8, training_starts=20)
    online.add(transitions(0, 19))
    assert not sampler.ready()
    online.add(transitions(19, 1))
    # No demo yet: updates start, every row of a batch from the online buffer.
    assert sampler.ready() and sampler.online_only and sampler.demo_share == 0.0
    batch = sampler.sample(torch.Generator().manual_seed(0))
    assert batch["id"].shape == (8,) and not batch["from_demo"].any()
    assert bool((batch["id"] < 20).all())
    demo.add(transitions(50, 1))  # the first demo (an intervention): back to half and half
    assert not sampler.online_only and sampler.demo_share == 0.5
    batch = sampler.sample(torch.Generator().manual_seed(0))
    assert batch["id"][batch["from_demo"]].tolist() == [50] * 4
    assert MixedSampler(online, ReplayBuffer(3), 8, demo_fraction=0.0).ready()


def test_intervened_transitions_go_into_both_buffers():
    online, demo = ReplayBuffer(100), ReplayBuffer(100)
    add_transitions(online, demo, transitions(0, 5, [False, True, False, True, True]))
    assert online.ordered()["id"].tolist() == [0, 1, 2, 3, 4]
    assert demo.ordered()["id"].tolist() == [1, 3, 4]
    add_transitions(online, demo, transitions(5, 2))
    assert len(demo) == 3 and len(online) == 7


def test_a_snapshot_round_trip_restores_rows_order_and_counters(tmp_path):
    buffer = ReplayBuffer(6)
    buffer.add(transitions(0, 4))
    buffer.add(transitions(4, 5))  # wrapped around
    torch.save(buffer.state_dict(), tmp_path / "buffer.pt")
    restored = ReplayBuffer(6)
    restored.add(transitions(50, 2))  # what it held before is replaced
    restored.load_state_dict(torch.load(tmp_path / "buffer.pt"))
    assert restored.ordered()["id"].tolist() == [3, 4, 5, 6, 7, 8]
    assert restored.added == 9 and len(restored) == 6
    restored.add(transitions(9, 1))  # writing goes on where it left off
    assert restored.ordered()["id"].tolist() == [4, 5, 6, 7, 8, 9]
    generator_a, generator_b = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    buffer.add(transitions(9, 1))
    assert torch.equal(buffer.sample(20, generator_a)["id"], restored.sample(20, generator_b)["id"])
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(7).load_state_dict(buffer.state_dict())


def test_a_snapshot_holds_only_the_stored_rows(tmp_path):
    buffer = ReplayBuffer(100_000)
    buffer.add(transitions(0, 5))
    torch.save(buffer.state_dict(), tmp_path / "small.pt")
    assert (tmp_path / "small.pt").stat().st_size < 20_000  # not the 100,000-row ring


def test_camera_frames_are_stored_as_uint8_within_half_a_level():
    def step(obs: torch.Tensor) -> EnvStep:
        no = torch.zeros(2, dtype=torch.bool)
        return EnvStep(obs, torch.zeros(2), no, no, no, torch.ones(2, dtype=torch.long))

    frames = torch.rand(2, 3, 8, 8)
    rows = transition_batch(frames, torch.zeros(2, 7), step(torch.rand(2, 3, 8, 8)))
    assert rows["obs"].dtype == rows["next_obs"].dtype == torch.uint8
    assert (rows["obs"].float() / 255 - frames).abs().max() <= 0.5 / 255 + 1e-6
    state = transition_batch(torch.rand(2, 5), torch.zeros(2, 7), step(torch.rand(2, 5)))
    assert state["obs"].dtype == state["next_obs"].dtype == torch.float32
