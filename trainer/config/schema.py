"""The experiment config schema, in the seeds' vocabulary (RLinf / RIPT).

One schema serves the CLI, the control plane's validation and the Ray job. Unknown keys
are errors (a typo must never silently fall back to a default). The ``cluster`` section
is kept as a mapping here and validated by ``trainer.cluster``. Every field carries a
description: docs/training.md's table of keys is generated from them
(``python -m trainer.config.reference --write``; a test keeps the two equal).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    model_validator,
)

from trainer.config.addresses import check_camera_url, check_host, check_robot_url
from trainer.config.env_defaults import LIBERO_DEFAULT_SUITE, default_max_episode_steps


class Section(BaseModel):
    # NaN and infinity are never a meaningful setting (YAML reads `.nan`, `.inf`, `1e400`).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class InterventionConfig(Section):
    source: Literal["none", "scripted", "console"] = Field(
        "none",
        description="Who may take over env copies, one env step at a time whatever the "
        "chunk, in every layout (in PPO/GRPO/RLOO the chunks a human drove are left out "
        "of the policy-gradient loss): "
        "none; scripted (a test operator that steers the built-in env's effector to the "
        "goal); console (operators in the control plane's console, each copy a simulated "
        "robot: docs/console.md).",
    )
    share: float = Field(
        0.2, ge=0, le=1, description="Share of episodes the scripted operator takes over."
    )
    max_steps: PositiveInt | None = Field(
        None, description="Steps of an episode the operator holds at most; null: all."
    )
    deadman_s: float = Field(
        0.15, gt=0, le=5,
        description="Console: an operator controls a robot only while heartbeats arrive "
        "within this many seconds.",
    )  # fmt: skip
    command_window_s: float = Field(
        0.1, gt=0, le=5,
        description="Console: a command older than this (seconds) is never applied.",
    )  # fmt: skip
    on_link_loss: Literal["release", "stop"] = Field(
        "release",
        description="Console: when the operator's heartbeats stop, give the robot back to "
        "the policy (release) or hold it still until cleared (stop).",
    )
    control_hz: float = Field(
        20.0,
        gt=0,
        le=1000,
        description="Console: env steps per second while an operator holds a robot.",
    )
    camera_fps: float = Field(
        15.0, gt=0, le=60, description="Console: camera frames per second sent while watched."
    )
    camera_quality: int = Field(
        80, ge=10, le=95, description="Console: JPEG quality of the camera frames (10-95)."
    )
    real_time: bool = Field(
        False,
        description="Console: step at control_hz at all times, as a real arm does, not "
        "only while a robot is held (simulated robots then move at a pace people can "
        "watch and take over from).",
    )


class SafetyBoxConfig(Section):
    xyz_low: list[float] = Field(min_length=3, max_length=3, description="Lowest x, y, z (m).")
    xyz_high: list[float] = Field(min_length=3, max_length=3, description="Highest x, y, z (m).")
    rpy_low: list[float] = Field(
        [0.0, -3.1416, -3.1416],
        min_length=3,
        max_length=3,
        description="Lowest |roll|, pitch, yaw (rad; roll bounds |roll|, as HIL-SERL's box).",
    )
    rpy_high: list[float] = Field(
        [3.1416, 3.1416, 3.1416],
        min_length=3,
        max_length=3,
        description="Highest |roll|, pitch, yaw (rad).",
    )


class CameraConfig(Section):
    name: str = Field(min_length=1, max_length=150, description="The camera's name.")
    url: Annotated[str, AfterValidator(check_camera_url)] = Field(
        description="Its MJPEG stream or snapshot URL."
    )


class RobotConfig(Section):
    name: str | None = Field(None, description="The arm's name in the console; null: arm-<n>.")
    robot_ip: Annotated[str, AfterValidator(check_host)] | None = Field(
        None, description="The SERL robot server's host (the inventory's robot_ip)."
    )
    port: int = Field(5000, ge=1, le=65535, description="The SERL robot server's port.")
    url: Annotated[str, AfterValidator(check_robot_url)] | None = Field(
        None, description="The server's URL; null: http://robot_ip:port/."
    )
    safety_box: SafetyBoxConfig = Field(description="Where the end effector may be sent.")
    action_scale: list[float] = Field(
        [0.01, 0.06, 1.0],
        min_length=3,
        max_length=3,
        description="Metres, radians and gripper units per action unit (HIL-SERL's).",
    )
    control_hz: float = Field(10.0, gt=0, description="Actions sent per second.")
    timeout_s: float = Field(
        0.5, gt=0, description="Deadline of every request; a silent server is a lost link."
    )
    reset_pose: list[float] | None = Field(
        None,
        min_length=7,
        max_length=7,
        description="Pose every episode starts from (xyz + quaternion xyzw); null: where it is.",
    )
    joint_reset: bool = Field(False, description="Home the joints (/jointreset) on every reset.")
    cameras: list[CameraConfig] = Field(
        [], description="The arm's cameras, shown in the console (the first by default)."
    )


class SuccessClassifierConfig(Section):
    path: str = Field(
        description="A success classifier's file (python -m trainer train-classifier)."
    )
    camera: str | None = Field(
        None, description="The camera of each arm it reads; null: each arm's first."
    )
    threshold: float | None = Field(
        None, gt=0, lt=1, description="Probability from which a frame is a success; null: "
        "the one saved with the classifier.",
    )  # fmt: skip


class RealRobotEnvConfig(Section):
    task: str = Field("the operator's task", description="What the arms are doing (its name).")
    robots: list[RobotConfig] = Field(
        [], description="One entry per arm: one env copy each (env.name: real_robot)."
    )
    reconnect_s: float = Field(
        60.0,
        gt=0,
        description="After a lost link, how long a recovery keeps trying to reach the arm "
        "before the run fails (each of runner.env_worker_retries recoveries).",
    )
    success_classifier: SuccessClassifierConfig | None = Field(
        None,
        description="A learned success detector on the arms' cameras (HIL-SERL's reward "
        "classifier): a frame it judges a success ends the episode with reward 1, as an "
        "operator's mark does; null: only the marks.",
    )


class EnvConfig(Section):
    name: str = Field("builtin_reach", description="Env family from trainer.envs' registry.")
    suite: str | None = Field(
        None,
        description="LIBERO suite: libero_spatial, libero_object, libero_goal, libero_10 or "
        "libero_90 (null: libero_spatial); other envs have none.",
    )
    task_ids: list[int] | None = Field(
        None, description="Tasks to train on; null means every task of the env."
    )
    num_parallel_envs: PositiveInt = Field(
        16,
        description="Init states run at once: a round runs num_parallel_envs x group_size "
        "episodes in parallel.",
    )
    max_episode_steps: PositiveInt = Field(
        40,
        description="Time limit in env actions; hitting it is a time-out (truncation), "
        "not a terminal state. Unset: 40, or the suite's usual limit for LIBERO "
        "(220/280/300/520/400, after the settle steps).",
    )
    num_workers: int = Field(
        0,
        ge=0,
        description="Env worker processes the copies are split over; 0 steps them in the "
        "trainer's process (best for the built-in env, which is vectorised in torch).",
    )
    real_robot: RealRobotEnvConfig = Field(
        RealRobotEnvConfig(), description="env.name real_robot: the arms behind SERL servers."
    )
    camera: bool = Field(
        False,
        description="Image observations instead of state (LIBERO's camera; the built-in "
        "env's top-down view). A vla model gets images, proprio and the instruction "
        "whatever this says.",
    )
    image_size: PositiveInt | None = Field(
        None,
        description="Camera images' side in pixels (LIBERO's camera; the built-in env's "
        "view); null: the env's default (128 LIBERO, 64 built-in).",
    )
    physics_substeps: PositiveInt = Field(
        1,
        description="Built-in env: substeps each action is integrated in (contact checked "
        "after each); a few hundred make a step cost what a simulator's does.",
    )
    init_states_per_task: PositiveInt = Field(
        50,
        description="Size of each task's fixed init-state set (built-in env; LIBERO always "
        "has 50).",
    )
    seed: int = Field(0, description="Seed of the env's init-state sets.")
    instructions: dict[NonNegativeInt, Annotated[str, Field(min_length=1, max_length=500)]] = Field(
        {},
        max_length=64,
        description="Built-in env: the sentence a VLA is told for a task, by task id, in "
        "place of the built-in one (a multi-task mix whose instructions differ in "
        "length, as LIBERO's do); {}: the built-in sentences.",
    )
    interventions: InterventionConfig = InterventionConfig()

    @model_validator(mode="after")
    def _instructions_only_built_in(self) -> EnvConfig:
        if self.instructions and self.name != "builtin_reach":
            raise ValueError(
                f"instructions: only the built-in env's tasks can be renamed ({self.name}'s "
                "instructions are its own)"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _env_family_defaults(cls, data: Any) -> Any:
        # The time limit depends on the env family and suite, so an unset limit is
        # filled in here and the resolved config shows the number actually used.
        # (Wrong types are left for the field validators to report.)
        if not isinstance(data, dict):
            return data
        name = data.get("name", "builtin_reach")
        if name == "libero" and data.get("suite") is None:
            data = {**data, "suite": LIBERO_DEFAULT_SUITE}
        suite = data.get("suite")
        if data.get("max_episode_steps") is None and isinstance(name, str):
            if suite is None or isinstance(suite, str):
                data = {**data, "max_episode_steps": default_max_episode_steps(name, suite)}
        return data


class LoraConfig(Section):
    rank: PositiveInt = Field(16, description="LoRA rank of each adapted layer.")
    alpha: float = Field(32.0, gt=0, description="LoRA scale numerator (scale = alpha / rank).")
    dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Dropout on the LoRA branch. A vla policy runs without dropout, so that "
        "its rollout and its update are the same network: it has no effect there.",
    )
    target_modules: list[str] = Field(
        ["q_proj", "k_proj", "v_proj", "o_proj"],
        min_length=1,
        description="Names of the backbone's linear layers that get adapters (peft's "
        "target_modules).",
    )


class FlowConfig(Section):
    steps: PositiveInt = Field(
        4,
        description="π0: denoising steps per decision, in rollouts, updates and evaluation "
        "(πRL uses 4-5 for RL; shipped π0s infer with 10).",
    )
    noise_level: float = Field(
        0.5,
        ge=0,
        description="π0: Flow-SDE's noise level a (σ_t = a·√(t / (1 - t))): how far each "
        "denoising step explores around the ODE's; 0 is the library's own deterministic "
        "sampling, with no log-probs to train on.",
    )
    method: Literal["sde"] = Field(
        "sde",
        description="π0: how the denoising loop becomes a stochastic policy: sde (Flow-SDE, "
        "each step a Gaussian transition with exact log-probs).",
    )
    stochastic_steps: Literal["all", "one"] = Field(
        "all",
        description="π0: which denoising steps inject noise in rollouts. all: every step, "
        "a chunk's log-prob the whole chain's. one: each decision draws one step, the "
        "others follow the ODE, the log-prob is that step's (πRL's hybrid ODE-SDE "
        "sampling): the executed chunk carries one step's noise, and the update evaluates "
        "one velocity per row instead of `steps`.",
    )
    step_tokens: bool = Field(
        False,
        description="π0, with algorithm.ratio: token: a token is one dim of one executed "
        "action at one denoising step, so the trust region clips each step's Gaussian "
        "apart (a per-step ratio); false: a token's log-prob is its dim's density summed "
        "over the steps.",
    )


# A VLA's action range: [low, high] for every dim, or fitted to bc's demos.
ActionBounds = Annotated[list[float], Field(min_length=2, max_length=2)] | Literal["demos"]


class ModelConfig(Section):
    kind: Literal["mlp", "cnn", "vla"] = Field(
        "mlp",
        description="mlp (state), cnn (images [C, H, W]) or vla (a vision-language model "
        "from `path`, given the env's camera images, proprio and the task's instruction).",
    )
    path: str | None = Field(
        None,
        description="VLA: the base model folder (a transformers `save_pretrained` output "
        "with its processor); read offline, never downloaded.",
    )
    init_from: str | None = Field(
        None,
        description="A checkpoint (file, run folder or its checkpoints) whose policy "
        "weights this run starts from, e.g. an SFT run's; its optimizer is not taken.",
    )
    build_tiny: bool = Field(
        False,
        description="VLA: when `path` holds no model yet, first write a tiny random one "
        "there, fitted to the env's instructions (what `python -m trainer tiny-vla` "
        "writes; for tests and CPU demos).",
    )
    tiny_family: Literal["tokens", "pi0"] = Field(
        "tokens",
        description="VLA: the family `build_tiny` writes: tokens (a PaliGemma given an "
        "action-token head) or pi0 (transformers' PI0, flow matching).",
    )
    flow: FlowConfig = Field(
        FlowConfig(), description="π0: how its flow-matching head samples for RL."
    )
    num_bins: int = Field(
        255,
        ge=3,
        le=4095,
        description="VLA: discrete bins per action dim (action tokens); odd, so that 0 is a "
        "bin's centre (OpenVLA's 255).",
    )
    temperature: float = Field(
        1.0,
        gt=0,
        description="VLA: the rollout's sampling temperature (logits / temperature); the "
        "log-probs are the tempered policy's. Below 1 explores near the most likely "
        "plan; behaviour cloning and deterministic plans are unaffected.",
    )
    action_bounds: ActionBounds = Field(
        [-1.0, 1.0],
        description="VLA: the [low, high] range the bins split, per action dim, or demos: "
        "each dim's 1st to 99th percentile of bc's demos (widened to be symmetric about 0 "
        "when it holds 0). A checkpoint the run starts from brings its own.",
    )
    lora: LoraConfig | None = Field(
        None, description="VLA: train LoRA adapters (peft) instead of the whole backbone."
    )
    freeze_vision: bool = Field(False, description="VLA: keep the vision tower's weights fixed.")
    gradient_checkpointing: bool = Field(
        False, description="VLA: recompute the backbone's activations in backward (less memory)."
    )
    num_action_chunks: PositiveInt = Field(5, description="Actions sent per env step.")
    action_dim: PositiveInt = Field(
        7, description="Action dims the model predicts; only the env's dims are sent."
    )
    hidden_sizes: list[PositiveInt] = Field(
        [64, 64], min_length=1, description="Widths of the encoder's hidden layers."
    )
    activation: Literal["tanh", "elu", "silu", "relu"] = Field(
        "silu",
        description="Hidden-layer activation of the MLP policy and critic: silu, tanh, elu or "
        "relu. SiLU learns the built-in env as well as tanh and costs a seventh of torch's "
        "CPU tanh.",
    )
    init_log_std: float = Field(0.0, description="Initial log std of the Gaussian plan.")

    @model_validator(mode="after")
    def _vla_has_a_folder(self) -> ModelConfig:
        if self.kind == "vla" and not self.path:
            raise ValueError("a vla model needs `path`: its base model folder")
        # Only a VLA decodes bins: an MLP's frozen configs (num_bins 256 before) still load.
        if self.kind == "vla" and self.num_bins % 2 == 0:
            raise ValueError(
                f"num_bins must be odd, so that a zero action is a bin's centre; got "
                f"{self.num_bins} (OpenVLA's is 255)"
            )
        if self.action_bounds != "demos":
            low, high = self.action_bounds
            if low >= high:
                raise ValueError(f"action_bounds needs low < high, got [{low}, {high}]")
        return self


class ActorConfig(Section):
    model: ModelConfig = ModelConfig()
    learning_rate: float = Field(
        1e-3, gt=0, description="Adam step size (actor, and critic unless critic.learning_rate)."
    )
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient norm clip per step.")
    lr_warmup_updates: NonNegativeInt = Field(
        0,
        description="Gradient steps over which the step size rises linearly to "
        "learning_rate (0: none). Adam's first steps are full-size whatever the gradient's "
        "noise; a warmup keeps them from throwing a pretrained (SFT) policy far off.",
    )
    device: str = Field(
        "auto",
        pattern=r"^(auto|cpu|cuda(:\d+)?)$",
        description="Where each process that computes (an actor rank, its rollout worker, "
        "RLPD's learner) runs its models, data and updates: auto (the GPU of the process's "
        "local rank among those its placement lets it see, else the CPU), cpu, cuda, or "
        "cuda:N (the N-th GPU it sees). Envs always step on the CPU. A device the process "
        "does not see is a config error.",
    )
    precision: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="Forward passes in fp32, or in bf16 under autocast (weights and "
        "optimizer state stay fp32). On GPUs, fp32 matmuls use TF32.",
    )
    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="How several actor ranks share the model: ddp (each holds all of it; "
        "gradients are summed in buckets while backward runs) or fsdp (FSDP2: each holds "
        "1/N of every parameter, gradient and optimizer state, for a model that does not "
        "fit one device; rollouts use a full copy refreshed after each update). One rank "
        "trains alike either way. On-policy algorithms only: RLPD's learner is one process.",
    )


class CriticConfig(Section):
    hidden_sizes: list[PositiveInt] = Field(
        [64, 64],
        min_length=1,
        description="Widths of the critic's hidden layers (PPO; for a vla, of its value head).",
    )
    learning_rate: float | None = Field(
        None,
        gt=0,
        description="Adam step size of the critic's own parameters (PPO); unset: "
        "actor.learning_rate. RLinf's π0 PPO steps its value head 20 times the policy's.",
    )
    train_backbone: bool = Field(
        True,
        description="A π0's value head (PPO): true, the value loss trains the backbone it "
        "shares with the policy; false, the head reads the backbone's features under a "
        "stop-gradient and only the policy loss moves the backbone (RLinf's π0 PPO, "
        "`detach_critic_input`).",
    )


class RolloutConfig(Section):
    action_horizons_pattern: list[PositiveInt] = Field(
        [5],
        min_length=1,
        description="Planning horizons H: one per group of rollouts (per rollout when "
        "algorithm.group_size is 1), the groups taking them in turn over the run; each must be "
        "a multiple of actor.model.num_action_chunks.",
    )
    pipeline_stages: PositiveInt = Field(
        1,
        description="Groups of a rank's env workers stepped in turn, so the policy decides "
        "one group's actions while the others simulate (needs at least that many placed "
        "env workers per actor rank); 1: every worker steps at once, then the policy runs.",
    )
    cuda_graph: bool = Field(
        True,
        description="ppo/grpo/rloo on a GPU: capture each phase of the plan cache's decision "
        "schedule (the policy's forward, sampling, the plan cache's copies) once as a CUDA "
        "graph and replay it, one launch instead of dozens of small kernels a decision; false "
        "runs decisions kernel by kernel.",
    )


class RewardFilterConfig(Section):
    enabled: bool = Field(
        False, description="Drop groups whose scores are all equal (needs group_size >= 2)."
    )
    max_attempts: PositiveInt = Field(
        3, description="Collection passes before giving up and training with a loss mask."
    )


class RLPDConfig(Section):
    """RLPD (seed 004): soft actor-critic on an online buffer and a demo buffer."""

    batch_size: PositiveInt = Field(256, description="Transitions per update batch.")
    demo_fraction: float = Field(
        0.5,
        ge=0,
        le=1,
        description="Share of each batch drawn from the demo buffer (an exact count); while "
        "the demo buffer is empty, whole batches come from the online buffer.",
    )
    training_starts: int = Field(
        200,
        ge=0,
        description="Online transitions collected (by uniform random actions) before the "
        "first update.",
    )
    online_capacity: PositiveInt = Field(100_000, description="Online buffer size.")
    demo_capacity: PositiveInt = Field(
        20_000, description="Demo buffer size (demos, then interventions)."
    )
    demos: str | None = Field(
        None, description="A demo file (.npz) or LeRobot v3.0 dataset folder loaded at the start."
    )
    updates_per_step: PositiveInt = Field(
        1,
        description="Update rounds (each cta_ratio updates) per env.num_parallel_envs stored "
        "transitions (one step of every copy): the update-to-data ratio is "
        "updates_per_step x cta_ratio / num_parallel_envs critic updates per transition.",
    )
    cta_ratio: PositiveInt = Field(
        2, description="Updates per round: cta_ratio - 1 critic-only, then one joint."
    )
    discount: float = Field(0.97, ge=0, le=1, description="Discount per env action.")
    tau: float = Field(0.005, gt=0, le=1, description="Polyak step of the target critics.")
    critic_ensemble: PositiveInt = Field(10, description="Critics in the ensemble.")
    critic_subsample: PositiveInt = Field(
        2, description="Random critics whose minimum makes the target."
    )
    layer_norm: bool = Field(True, description="LayerNorm in the critics.")
    hidden_sizes: list[PositiveInt] = Field(
        [256, 256], min_length=1, description="Hidden widths of the actor and critics."
    )
    actor_lr: float = Field(3e-4, gt=0, description="Adam step size of the actor.")
    critic_lr: float = Field(3e-4, gt=0, description="Adam step size of the critics.")
    temperature_lr: float = Field(3e-4, gt=0, description="Adam step size of the temperature.")
    init_temperature: float = Field(0.01, gt=0, description="Initial entropy temperature.")
    backup_entropy: bool = Field(
        False,
        description="Subtract the entropy term in the critics' target (soft Q); off, as in "
        "HIL-SERL, so a sparse success reward is not swamped by it.",
    )
    target_entropy: float | None = Field(None, description="null: -action_dim / 2.")
    cuda_graph: bool = Field(
        True,
        description="On a GPU, capture an update round once as a CUDA graph and replay it "
        "(one launch instead of hundreds of small kernels); false runs it kernel by kernel.",
    )
    shared_encoder: bool = Field(
        True,
        description="Camera images: the actor reads the critics' CNN under a stop-gradient "
        "(its own projection on top), as RLPD and DrQ do; only the critics' loss trains "
        "the CNN. false: the actor trains a CNN of its own.",
    )
    image_augmentation: Literal["random_shift", "none"] = Field(
        "random_shift",
        description="Camera images: random_shift (DrQ's: every update's observations and "
        "next observations padded 4 pixels, edges replicated, and cropped back at a random "
        "offset per row) or none.",
    )
    publish_every: PositiveInt = Field(
        10,
        description="Updates between publications of the actor's weights to placed env "
        "workers (each also gets the latest at the start of an iteration).",
    )
    exchange_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Seconds an exchange between the learner and a placed env worker may "
        "take (transitions, weights) before the side that stalled is reported.",
    )
    buffer_snapshot_every: int = Field(
        0,
        ge=0,
        description="Iterations between snapshots of both buffers (resume restores them); "
        "0: with every checkpoint (and always at the end and at a stop).",
    )

    @model_validator(mode="after")
    def _subsample_fits(self) -> RLPDConfig:
        if self.critic_subsample > self.critic_ensemble:
            raise ValueError(
                f"critic_subsample ({self.critic_subsample}) exceeds critic_ensemble "
                f"({self.critic_ensemble})"
            )
        return self


class BCConfig(Section):
    demos: str | None = Field(
        None, description="bc: the demo file (.npz) or LeRobot dataset folder the policy imitates."
    )
    scripted_episodes: int = Field(
        0,
        ge=0,
        description="bc on the built-in env: when `demos` does not exist yet, first record "
        "this many successful episodes per task of the scripted operator into it.",
    )
    batch_size: PositiveInt = Field(32, description="bc: demo rows per update.")
    updates_per_iteration: PositiveInt = Field(
        20, description="bc: gradient steps per iteration (its rollouts only measure)."
    )


class AlgorithmConfig(Section):
    name: Literal["ppo", "grpo", "rloo", "rlpd", "bc"] = Field(
        "ppo",
        description="ppo, grpo, rloo (on-policy), rlpd (off-policy, with demos) or bc "
        "(behaviour cloning / SFT on demos).",
    )
    group_size: PositiveInt = Field(1, description="Rollouts per group; at least 2 for GRPO/RLOO.")
    init_states: Literal["per_group", "per_rollout"] = Field(
        "per_group",
        description="per_group: a group's rollouts share one init state (what a group-"
        "relative baseline compares); per_rollout: every rollout of a round starts from "
        "its own state, as seed 001 takes them. The same when group_size is 1.",
    )
    data_batch_size: PositiveInt = Field(
        64, description="Trajectories per iteration, exactly; a multiple of group_size."
    )
    gamma: float = Field(0.95, ge=0, le=1, description="Discount per env step (chunk).")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE lambda (PPO).")
    clip_ratio: float = Field(
        0.2,
        gt=0,
        description="The ratio's clip epsilon on the sides clip_ratio_low and "
        "clip_ratio_high leave unset (ratios from 1 - clip_ratio to 1 + clip_ratio).",
    )
    clip_ratio_low: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="How far below 1 the ratio may fall before it is clipped; null: "
        "clip_ratio. A vla's default is 0.2 where the config sets no clip.",
    )
    clip_ratio_high: float | None = Field(
        None,
        gt=0,
        description="How far above 1 the ratio may rise before it is clipped; null: "
        "clip_ratio. Above clip_ratio_low (clip-higher, DAPO's) a rare token may rise "
        "further than a likely one may fall, which keeps a token policy exploring; a vla's "
        "default is 0.28 where the config sets no clip.",
    )
    ratio: Literal["chunk", "geometric_mean", "token"] = Field(
        "chunk",
        description="The clipped ratio of an executed chunk, a token being one action dim "
        "of one step: chunk (its probability ratio, the product of its tokens'), "
        "geometric_mean (that ratio's geometric mean, length-normalised as GSPO does, "
        "clipped in log space by the chunk's range over the token count) or token (each "
        "token's ratio clipped on its own, the loss the mean of the tokens' surrogates, as "
        "RLinf and SimpleVLA-RL do). A vla's default is token: the product of its 35-70 "
        "token ratios leaves any clip range at the first step.",
    )
    kl_coef: float = Field(
        0.0,
        ge=0,
        description="ppo/grpo/rloo: weight of a KL anchor, the per-token KL (k3 "
        "estimator) from the policy to a frozen copy of the one the run started from "
        "(an SFT start, init_from), which checkpoints keep. 0: none, and no copy is kept "
        "(RLinf's and SimpleVLA-RL's default).",
    )
    loss_aggregation: Literal["rows", "episodes"] = Field(
        "rows",
        description="grpo/rloo: how the policy loss averages its decisions. rows: each "
        "decision weighs the same, so a failed episode that ran to the time limit "
        "outweighs a success that ended early; episodes: each episode weighs the same, "
        "shared by its decisions (GRPO's per-sequence mean), which keeps the failures' "
        "push-down from spreading a token policy's probability over every bin.",
    )
    value_clip: float | None = Field(None, gt=0, description="Clip the value update; null: off.")
    value_loss_coef: float = Field(0.5, ge=0, description="Weight of the value loss (PPO).")
    entropy_coef: float = Field(0.0, ge=0, description="Weight of the entropy bonus.")
    target_kl: float | None = Field(
        None,
        gt=0,
        description="KL early stop: the update stops before the first minibatch whose "
        "approximate KL (losses/approx_kl) exceeds it, measured per token with ratio "
        "token and per chunk otherwise; null: off.",
    )
    update_epochs: PositiveInt = Field(4, description="Passes over the batch per iteration.")
    num_minibatches: PositiveInt = Field(4, description="Minibatches per pass.")
    cuda_graph: bool = Field(
        True,
        description="ppo/grpo/rloo on a GPU: capture a minibatch step (forward, losses, "
        "backward, clip, Adam) once as a CUDA graph and replay it, one launch instead of "
        "hundreds of small kernels; used with one rank, no target_kl and the built-in "
        "policies. false runs every step kernel by kernel.",
    )
    normalize_advantages: bool | None = Field(
        None, description="null: on for ppo, off for grpo/rloo (already group-relative)."
    )
    bootstrap_timeouts: bool = Field(True, description="r += gamma*V(s_terminal) at time-outs.")
    use_plan_reward: bool = Field(False, description="Add the plan reward to successes.")
    plan_reward_coef: float = Field(0.0, ge=0, description="Plan reward: coef x H / base_h.")
    base_h: float = Field(5.0, gt=0, description="Plan reward: the horizon worth coef.")
    reward_filter: RewardFilterConfig = RewardFilterConfig()
    rlpd: RLPDConfig = RLPDConfig()
    bc: BCConfig = BCConfig()


class VideosConfig(Section):
    every: int = Field(
        0, ge=0, description="Iterations between those whose episodes are recorded as "
        "videos (the first iteration and every N-th); 0: no videos.",
    )  # fmt: skip
    per_task: PositiveInt = Field(
        2, le=64, description="Episodes recorded per task in a recorded iteration, "
        "failures and successes in turn while both are there.",
    )  # fmt: skip
    fps: PositiveInt = Field(10, le=60, description="Frames a second of the videos.")
    size: PositiveInt = Field(
        128, ge=16, le=1024, description="Side in pixels of a rendered picture (the "
        "built-in env's); cameras (LIBERO's) keep their own size.",
    )  # fmt: skip
    max_mb: PositiveInt = Field(
        200, description="The run's disk budget for videos: past it, each task's middle "
        "episodes are thinned (its first and newest kept).",
    )  # fmt: skip


class RunnerConfig(Section):
    iterations: PositiveInt = Field(100, description="Training iterations (one task each).")
    seed: int = Field(0, description="Seeds weights, sampling and shuffling.")
    output_dir: str | None = Field(
        None, description="Metrics, checkpoints, config; null: var/runs/<name>."
    )
    checkpoint_every: PositiveInt = Field(25, description="Iterations between checkpoints.")
    env_worker_retries: int = Field(
        2,
        ge=0,
        description="Times an iteration is redone after an env worker died or hung (its "
        "workers restarted) before the run fails with the reason.",
    )
    progress: bool = Field(True, description="Show a progress bar on stderr.")
    torch_threads: PositiveInt | None = Field(None, description="null: torch's default.")
    videos: VideosConfig = VideosConfig()


class ExperimentConfig(Section):
    name: str = Field("experiment", description="A label for humans.")
    env: EnvConfig = EnvConfig()
    actor: ActorConfig = ActorConfig()
    critic: CriticConfig = CriticConfig()
    rollout: RolloutConfig = RolloutConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    runner: RunnerConfig = RunnerConfig()
    cluster: dict[str, Any] | None = Field(
        None, description="Cluster and component placement; validated by trainer.cluster."
    )

    @model_validator(mode="before")
    @classmethod
    def _policy_kind_defaults(cls, data: Any) -> Any:
        # What is clipped depends on the policy: a vla's chunk is 35-70 action tokens,
        # so by default each token's ratio is clipped, with clip-higher. Unset keys are
        # filled in here, so the resolved config shows what a run used; a config that
        # sets clip_ratio keeps it on both sides (as configs written before these keys).
        if not isinstance(data, dict) or _policy_kind(data) != "vla":
            return data
        algorithm = data.get("algorithm", {})
        if not isinstance(algorithm, dict):
            return data  # a built section is taken as it is
        defaults: dict[str, Any] = {"ratio": "token"}
        if "clip_ratio" not in algorithm:
            defaults.update(clip_ratio_low=VLA_CLIP_RATIO_LOW, clip_ratio_high=VLA_CLIP_RATIO_HIGH)
        return {**data, "algorithm": {**defaults, **algorithm}}


# A vla's clip-higher defaults: SimpleVLA-RL's and DAPO's.
VLA_CLIP_RATIO_LOW = 0.2
VLA_CLIP_RATIO_HIGH = 0.28


def _policy_kind(data: dict[str, Any]) -> Any:
    """`actor.model.kind` of a config not validated yet (None where it is not there)."""
    actor = data.get("actor")
    model = actor.get("model") if isinstance(actor, dict) else getattr(actor, "model", None)
    return model.get("kind") if isinstance(model, dict) else getattr(model, "kind", None)
