"""The π0 family through a user's path: a tiny π0 saved with `save_pretrained` loads back
through the model folder's loader as transformers' PI0 classes; Flow-SDE at noise level 0
is the library's own `sample_actions` (what proves a user's checkpoint acts as before);
a sampled chain's log-probs are recomputed exactly, with gradients, over the env's
action dims only."""

import numpy as np
import pytest
import torch

from trainer.envs.builtin_reach import BuiltinReachEnv
from trainer.models.vla import ModelFolderError
from trainer.models.vla.families import PI0, TOKENS, family_of
from trainer.models.vla.flow_sde import FlowSDE, chain_log_probs, sample_chain
from trainer.models.vla.folder import load_folder
from trainer.models.vla.pi0 import build_tiny_pi0
from trainer.models.vla.pi0_inputs import Normaliser, observation_inputs

SENTENCES = ["reach the red target", "push the blue block to the left edge"]
ENV_DIMS = 7  # of the model's 32 action dims


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_pi0(tmp_path_factory.mktemp("pi0") / "tiny", SENTENCES)


@pytest.fixture(scope="module")
def loaded(folder):
    model, processor = load_folder(folder)
    return model.eval(), processor


def inputs(processor, rows: int = 3) -> dict[str, torch.Tensor]:
    """Two cameras per row (agent view and wrist), instructions of different lengths, a
    state of 8 dims padded to the model's 32."""
    rng = np.random.default_rng(0)
    images = [[rng.integers(0, 255, (32, 32, 3), dtype=np.uint8) for _ in range(2)]
              for _ in range(rows)]  # fmt: skip
    text = [SENTENCES[row % 2] for row in range(rows)]
    batch = processor(images=images, text=text, state=torch.randn(rows, 8).numpy())
    return dict(batch)


def test_a_saved_pi0_folder_loads_back_as_transformers_pi0(folder, loaded, tmp_path):
    model, processor = loaded
    assert family_of(folder) == PI0 and family_of(tmp_path) == TOKENS
    assert type(model).__name__ == "PI0ForConditionalGeneration"
    assert type(processor).__name__ == "PI0Processor"
    assert model.config.chunk_size == 50 and model.config.max_action_dim == 32
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((folder / "config.json").read_text())
    with pytest.raises(ModelFolderError, match="the weights"):
        load_folder(broken)


@pytest.mark.parametrize("steps", [4, 10])
def test_at_noise_level_zero_the_chain_is_the_librarys_own_sampling(loaded, steps):
    model, processor = loaded
    batch = inputs(processor)
    noise = torch.randn(3, 50, 32, generator=torch.Generator().manual_seed(1))
    ours = sample_chain(model, batch, noise, FlowSDE(steps, noise_level=0.0), ENV_DIMS)
    library = model.sample_actions(
        state=batch["state"], input_ids=batch["input_ids"], pixel_values=batch["pixel_values"],
        noise=noise, attention_mask=batch["attention_mask"],
        pixel_attention_mask=batch["pixel_attention_mask"], num_steps=steps,
    )  # fmt: skip
    assert ours.states.shape == (steps + 1, 3, 50, 32)
    torch.testing.assert_close(ours.actions, library, atol=1e-5, rtol=0)
    assert torch.all(ours.log_probs == 0)  # a deterministic chain has no density to tell


def test_a_sampled_chains_log_probs_are_recomputed_exactly_with_gradients(loaded):
    model, processor = loaded
    batch = inputs(processor)
    flow = FlowSDE(steps=4, noise_level=0.5)
    noise = torch.randn(3, 50, 32, generator=torch.Generator().manual_seed(2))
    chain = sample_chain(model, batch, noise, flow, ENV_DIMS, torch.Generator().manual_seed(3))
    assert chain.log_probs.shape == (3, 4) and torch.isfinite(chain.log_probs).all()
    again = sample_chain(model, batch, noise, flow, ENV_DIMS, torch.Generator().manual_seed(3))
    torch.testing.assert_close(again.states, chain.states, atol=0, rtol=0)  # seeded: the same

    model.zero_grad()
    recomputed = chain_log_probs(model, batch, chain.states, chain.stochastic, flow, ENV_DIMS)
    assert recomputed.shape == (3, 4, 50, ENV_DIMS)
    torch.testing.assert_close(recomputed.detach(), chain.step_log_probs, atol=1e-5, rtol=1e-6)
    recomputed.sum().backward()
    assert model.action_out_proj.weight.grad.abs().sum() > 0
    assert model.model.vlm.get_input_embeddings().weight.grad is not None  # the prefix too

    # Only the env's dims count: what the padded dims hold changes nothing.
    padded = chain.states.clone()
    padded[1:, ..., ENV_DIMS:] += 3.0
    with torch.no_grad():
        same = chain_log_probs(model, batch, padded, chain.stochastic, flow, ENV_DIMS)
    torch.testing.assert_close(same[:, 0].sum((1, 2)), chain.log_probs[:, 0], atol=1e-4, rtol=1e-6)


def test_with_one_stochastic_step_a_chain_has_one_steps_density_recomputed_exactly(loaded):
    """πRL's hybrid sampling: each row draws one step that injects noise, the others are
    the ODE's; the update recomputes that step's density alone, exactly."""
    model, processor = loaded
    batch = inputs(processor, rows=8)
    flow = FlowSDE(steps=4, noise_level=0.5, stochastic_steps="one")
    noise = torch.randn(8, 50, 32, generator=torch.Generator().manual_seed(4))
    chain = sample_chain(model, batch, noise, flow, ENV_DIMS, torch.Generator().manual_seed(5))
    assert torch.all(chain.stochastic.sum(1) == 1)
    assert len(set(chain.stochastic.argmax(1).tolist())) > 1  # drawn per row
    densities = chain.step_log_probs.sum((2, 3))
    assert torch.all((densities != 0) == chain.stochastic.bool())

    ode = sample_chain(model, batch, noise, FlowSDE(4, noise_level=0.0), ENV_DIMS)
    joint = sample_chain(model, batch, noise, FlowSDE(4, 0.5), ENV_DIMS,
                         torch.Generator().manual_seed(5))  # fmt: skip
    one_off = (chain.actions - ode.actions)[..., :ENV_DIMS].abs().mean()
    joint_off = (joint.actions - ode.actions)[..., :ENV_DIMS].abs().mean()
    assert one_off < joint_off  # one step's noise, not every step's

    model.zero_grad()
    recomputed = chain_log_probs(model, batch, chain.states, chain.stochastic, flow, ENV_DIMS)
    torch.testing.assert_close(recomputed.detach(), chain.step_log_probs, atol=1e-5, rtol=1e-6)
    recomputed.sum().backward()
    assert model.action_out_proj.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="stochastic_steps"):
        FlowSDE(stochastic_steps="some")


def test_the_noise_level_is_checked_and_the_first_steps_sigma_is_finite():
    with pytest.raises(ValueError, match="noise_level"):
        FlowSDE(noise_level=-0.1)
    with pytest.raises(ValueError, match="steps"):
        FlowSDE(steps=0)
    flow = FlowSDE(steps=4, noise_level=0.5)
    assert flow.times() == [1.0, 0.75, 0.5, 0.25]
    assert flow.sigma(1.0) == pytest.approx(0.5 * (0.75 / 0.25) ** 0.5)


def test_the_builtin_envs_rows_become_a_pi0s_inputs_and_its_chunk_the_envs_actions(tmp_path):
    env = BuiltinReachEnv(num_envs=4, vision_language=True, image_size=32)
    spec = env.vision_language
    folder = build_tiny_pi0(tmp_path / "tiny", spec.instructions)
    model, processor = load_folder(folder)
    rows = env.reset(1, env.init_states(1)[:4])
    normaliser = Normaliser.from_processor(processor, spec.proprio_dim, env.action_dim)
    assert normaliser.source == "identity"  # LIBERO's statistics do not fit this robot
    batch = observation_inputs(processor, spec, rows, normaliser, model.config.max_state_dim)
    assert batch["pixel_values"].shape == (4, 1, 3, 32, 32)  # one camera per copy
    assert batch["state"].shape == (4, 32)
    _, proprio, _ = spec.unpack(rows)
    torch.testing.assert_close(batch["state"][:, : spec.proprio_dim], proprio)
    assert torch.all(batch["state"][:, spec.proprio_dim :] == 0)  # padded
    chain = sample_chain(model.eval(), batch, torch.randn(4, 50, 32), FlowSDE(), env.action_dim)
    actions = normaliser.actions(chain.actions)
    assert actions.shape == (4, 50, env.action_dim) and torch.isfinite(actions).all()


def test_demo_statistics_normalise_and_travel_with_a_checkpoint():
    states = torch.tensor([[0.0, 2.0], [2.0, 6.0]])
    actions = torch.tensor([[1.0, -1.0, 0.0], [3.0, 1.0, 0.0]])
    normaliser = Normaliser.from_demos(states, actions)
    assert normaliser.source == "demos" and normaliser.state_mean == (1.0, 4.0)
    torch.testing.assert_close(normaliser.state(states), torch.tensor([[-1.0, -1.0], [1.0, 1.0]]),
                               atol=1e-6, rtol=0)  # fmt: skip
    normalised = (actions - torch.tensor([2.0, 0.0, 0.0])) / torch.tensor([1.0, 1.0, 1e-6])
    padded = torch.nn.functional.pad(normalised, (0, 29))
    torch.testing.assert_close(normaliser.actions(padded), actions, atol=1e-5, rtol=0)
    assert Normaliser.from_json(normaliser.to_json()) == normaliser
