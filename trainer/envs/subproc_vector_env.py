"""Env workers in parallel processes: one ``VectorEnv`` split over worker processes.

Simulators such as LIBERO step at tens of steps per second per env and hold the GIL, so
copies must run in separate processes to use several cores. Each worker builds its own
shard with ``factory(num_envs=k)`` and the parent scatters actions and gathers results;
to the rollout loop it is just another ``VectorEnv``. Workers are started with
``spawn`` (never ``fork``: forking a process that has started torch's thread pools can
deadlock the child), so ``factory`` must be picklable, e.g. a ``functools.partial`` of
an env class.

A worker that dies or fails is not papered over: the next call raises
``EnvWorkerError`` naming the worker, its pid and the reason.
"""

from __future__ import annotations

import multiprocessing as mp
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import torch

from trainer.envs.vector_env import EnvStep, VectorEnv

EnvFactory = Callable[..., VectorEnv]
_POLL_SECONDS = 0.5


class EnvWorkerError(RuntimeError):
    pass


def _serve(connection: Connection, factory: EnvFactory, num_envs: int) -> None:
    torch.set_num_threads(1)  # one core per worker; the parent decides how many workers
    try:
        env = factory(num_envs=num_envs)
        connection.send(
            (
                "ok",
                {
                    "num_tasks": env.num_tasks,
                    "obs_shape": env.obs_shape,
                    "action_dim": env.action_dim,
                    "max_episode_steps": env.max_episode_steps,
                    "task_names": [env.task_name(task) for task in range(env.num_tasks)],
                },
            )
        )
    except Exception:  # noqa: BLE001 - reported to the parent, which raises
        connection.send(("error", traceback.format_exc()))
        return
    while True:
        command, payload = connection.recv()
        try:
            if command == "close":
                env.close()
                connection.send(("ok", None))
                return
            if command == "reset":
                result: Any = env.reset(*payload)
            elif command == "step":
                result = env.step(payload)
            elif command == "init_states":
                result = env.init_states(payload)
            else:
                raise ValueError(f"unknown command {command!r}")
            connection.send(("ok", result))
        except Exception:  # noqa: BLE001 - reported to the parent, which raises
            connection.send(("error", traceback.format_exc()))


class SubprocVectorEnv(VectorEnv):
    def __init__(self, factory: EnvFactory, num_envs: int, num_workers: int) -> None:
        if not 1 <= num_workers <= num_envs:
            raise ValueError(f"num_workers must be in 1..num_envs ({num_envs})")
        self.num_envs = num_envs
        base, extra = divmod(num_envs, num_workers)
        self.shard_sizes = [base + (1 if worker < extra else 0) for worker in range(num_workers)]
        context = mp.get_context("spawn")
        self._connections: list[Connection] = []
        self._processes: list[Any] = []
        for size in self.shard_sizes:
            parent, child = context.Pipe()
            process = context.Process(target=_serve, args=(child, factory, size), daemon=True)
            process.start()
            child.close()
            self._connections.append(parent)
            self._processes.append(process)
        self._closed = False
        meta = self._gather("start")[0]
        self.num_tasks = meta["num_tasks"]
        self.obs_shape = tuple(meta["obs_shape"])
        self.action_dim = meta["action_dim"]
        self.max_episode_steps = meta["max_episode_steps"]
        self._task_names = meta["task_names"]
        self._init_states: dict[int, torch.Tensor] = {}

    def _send(self, worker: int, message: tuple[str, Any], doing: str) -> None:
        try:
            self._connections[worker].send(message)
        except (BrokenPipeError, ConnectionResetError, EOFError):
            process = self._processes[worker]
            process.join(timeout=_POLL_SECONDS)
            raise EnvWorkerError(
                f"env worker {worker} (pid {process.pid}) exited with code "
                f"{process.exitcode} while {doing}"
            ) from None

    def _receive(self, worker: int, doing: str) -> Any:
        connection, process = self._connections[worker], self._processes[worker]
        while not connection.poll(_POLL_SECONDS):
            if not process.is_alive():
                raise EnvWorkerError(
                    f"env worker {worker} (pid {process.pid}) exited with code "
                    f"{process.exitcode} while {doing}"
                )
        try:
            status, value = connection.recv()
        except EOFError:
            raise EnvWorkerError(
                f"env worker {worker} (pid {process.pid}) closed its pipe while {doing}"
            ) from None
        if status == "error":
            raise EnvWorkerError(f"env worker {worker} failed while {doing}:\n{value}")
        return value

    def _gather(self, doing: str) -> list[Any]:
        return [self._receive(worker, doing) for worker in range(len(self._connections))]

    def _split(self, values: torch.Tensor) -> list[torch.Tensor]:
        return list(torch.split(values, self.shard_sizes))

    def init_states(self, task_id: int) -> torch.Tensor:
        if task_id not in self._init_states:
            self._send(0, ("init_states", task_id), "reading init states")
            self._init_states[task_id] = self._receive(0, "reading init states")
        return self._init_states[task_id].clone()

    def task_name(self, task_id: int) -> str:
        return self._task_names[task_id]

    def reset(self, task_id: int, init_states: torch.Tensor) -> torch.Tensor:
        if init_states.shape[0] != self.num_envs:
            raise ValueError(f"init_states must have {self.num_envs} rows")
        for worker, shard in enumerate(self._split(init_states)):
            self._send(worker, ("reset", (task_id, shard)), "resetting")
        return torch.cat(self._gather("resetting"))

    def step(self, actions: torch.Tensor) -> EnvStep:
        if actions.shape[0] != self.num_envs:
            raise ValueError(f"actions must have {self.num_envs} rows")
        for worker, shard in enumerate(self._split(actions)):
            self._send(worker, ("step", shard), "stepping")
        parts: list[EnvStep] = self._gather("stepping")
        finals = [part.final_observation for part in parts]
        return EnvStep(
            obs=torch.cat([part.obs for part in parts]),
            reward=torch.cat([part.reward for part in parts]),
            terminated=torch.cat([part.terminated for part in parts]),
            truncated=torch.cat([part.truncated for part in parts]),
            success=torch.cat([part.success for part in parts]),
            executed_actions=torch.cat([part.executed_actions for part in parts]),
            final_observation=None if any(f is None for f in finals) else torch.cat(finals),
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for connection, process in zip(self._connections, self._processes, strict=True):
            if process.is_alive():
                try:
                    connection.send(("close", None))
                    if connection.poll(5.0):
                        connection.recv()
                except (BrokenPipeError, EOFError, OSError):
                    pass
            process.join(timeout=5.0)
            if process.is_alive():
                process.terminate()  # only our own worker, by its handle
                process.join(timeout=5.0)
            connection.close()

    def __del__(self) -> None:
        # Best effort only: at interpreter exit the multiprocessing machinery may already
        # be gone, and the daemon workers die with us anyway.
        try:
            if hasattr(self, "_closed"):
                self.close()
        except Exception:  # noqa: BLE001, S110
            pass
