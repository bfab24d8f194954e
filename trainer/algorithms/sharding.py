"""`actor.strategy: fsdp`: the policy and critic sharded over the actor ranks with FSDP2
(`torch.distributed.fsdp.fully_shard`). Each rank keeps 1/N of every parameter, of its
gradient and of its optimizer state; a layer's full weights exist only while its
forward or backward runs, so a model that does not fit one device trains on several.

Only the update runs through the sharded modules: every rank makes the same calls there,
in the same order (the same number of minibatches, one early stop for all). Rollouts
differ between ranks (the plan cache decides for some envs at a time, the group filter
may draw again), so they run on a full copy of each module, refreshed from the shards
after every update.

Checkpoints are sharded (`save_shards`): each rank writes its own part of the models and
the optimizer with torch.distributed.checkpoint, and any number of ranks, sharded or
not — one process evaluating, say — loads them back (`load_shards`), each reading the
parts it needs.
"""

from __future__ import annotations

import copy
import pickle
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor, distribute_tensor

from trainer.algorithms.shard_reading import SafeLoadPlanner, SafeShardReader
from trainer.checkpoint_errors import UnreadableCheckpoint

# Methods the update calls instead of forward(): FSDP gathers a module's shards around
# forward() only, unless told of the others.
FORWARD_METHODS = ("chunk_log_prob", "token_log_probs")


def device_mesh(device: torch.device, world_size: int) -> DeviceMesh:
    """The ranks of the default process group, as one flat mesh on `device`'s type."""
    return init_device_mesh(device.type, (world_size,))


def shard(module: nn.Module, mesh: DeviceMesh) -> None:
    """Shard `module` in place: each submodule that holds parameters of its own (a
    layer) is one FSDP unit, gathered only around its own computation; the root holds
    the rest (e.g. the policy's log std)."""
    units = [
        sub
        for sub in module.modules()
        if sub is not module and any(True for _ in sub.parameters(recurse=False))
    ]
    for unit in units:
        fully_shard(unit, mesh=mesh)
    fully_shard(module, mesh=mesh)
    for name in FORWARD_METHODS:
        if hasattr(module, name):
            register_fsdp_forward_method(module, name)
    # The update scales each rank's loss by its share of all ranks' rows: gradients
    # are summed, not averaged over ranks (with plain sums, which gloo also has).
    for sub in [*units, module]:
        sub.set_gradient_divide_factor(1.0)
        sub.set_force_sum_reduction_for_comms(True)


def acting_copy(module: nn.Module) -> nn.Module:
    """A full copy of a module about to be sharded, for the rollout."""
    acting = copy.deepcopy(module)
    acting.requires_grad_(False)
    return acting


@torch.no_grad()
def refresh(acting: nn.Module, sharded: nn.Module) -> None:
    """Copy the sharded module's weights into its full copy (a collective: every rank
    calls it, after the same update)."""
    full = dict(acting.named_parameters())
    for name, param in sharded.named_parameters():
        full[name].copy_(_full(param))


def save_shards(models: nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Write this rank's part of `models` (one module holding the policy and critic) and
    of the optimizer's state into `folder` (a collective: every rank calls it)."""
    model_state, optimizer_state = get_state_dict(models, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=folder)


def load_shards(models: nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Load what `save_shards` wrote, whatever the number of ranks then and now, into
    models sharded or not (a collective where there is a process group)."""
    model_state, optimizer_state = get_state_dict(models, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    # Read without unpickling anything but the format's records and plain data: a run
    # folder's shards may be read by others than the job that wrote them.
    reader = SafeShardReader(folder)
    try:
        reader.read_metadata()  # first here, where a refusal is not wrapped by dcp's
        dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner())
    except (OSError, EOFError, pickle.UnpicklingError) as error:
        raise UnreadableCheckpoint(f"the shards in {folder} cannot be loaded: {error}") from None
    except CheckpointException as error:  # a BaseException: said here as a ValueError
        failure = next(iter(error.failures.values()))[0]
        first = str(failure).splitlines()[0] if str(failure) else type(failure).__name__
        raise UnreadableCheckpoint(f"the shards in {folder} cannot be loaded: {first}") from None
    set_state_dict(
        models, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
    )


def load_full_state(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a full state dict (one process's format: a ddp run's checkpoint) into a
    sharded module: each rank takes its own shard of every tensor, no communication."""
    current = module.state_dict()
    module.load_state_dict(
        {name: _like(value, current[name]) if name in current else value
         for name, value in state.items()}
    )  # fmt: skip


def shard_optimizer_state(state: dict[str, Any], params: list[torch.Tensor]) -> dict[str, Any]:
    """A full optimizer state dict (one process's format, per-parameter entries keyed by
    index) with each parameter-shaped tensor cut to this rank's shard of `params`."""
    per_param = {
        index: {key: _like(value, params[index]) for key, value in entries.items()}
        for index, entries in state["state"].items()
    }
    return {**state, "state": per_param}


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _like(value: Any, target: torch.Tensor) -> Any:
    """`value`, a full tensor, as `target`'s shard when `target` is sharded and `value`
    has its shape (an optimizer's step counter, say, stays as it is)."""
    if not isinstance(target, DTensor) or not isinstance(value, torch.Tensor):
        return value
    if tuple(value.shape) != tuple(target.shape):
        return value
    local = value.to(device=target.to_local().device, dtype=target.dtype)
    return distribute_tensor(local, target.device_mesh, target.placements, src_data_rank=None)
