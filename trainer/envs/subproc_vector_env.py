"""Env workers in parallel processes: one ``VectorEnv`` split over worker processes.

Simulators such as LIBERO step at tens of steps per second per env and hold the GIL, so
copies must run in separate processes to use several cores. Each worker builds its own
shard with ``factory(num_envs=k)``; splitting and joining the batch is
``ShardedVectorEnv``'s, this module is the pipe. To the rollout loop it is just another
``VectorEnv``. Workers are started with
``spawn`` (never ``fork``: forking a process that has started torch's thread pools can
deadlock the child), so ``factory`` must be picklable, e.g. a ``functools.partial`` of
an env class.

A worker that dies, fails or stops answering (``reply_timeout_s``) is not papered
over: the call raises ``EnvWorkerError`` naming the worker, its pid and the reason.
``restart_workers`` then replaces dead workers with fresh ones, which is how the runner
recovers: it restarts them and redoes the iteration.
"""

from __future__ import annotations

import multiprocessing as mp
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import torch

from trainer.config.env_shards import shard_sizes
from trainer.envs.pictures import picture_copies
from trainer.envs.sharded_vector_env import ShardedVectorEnv, env_facts
from trainer.envs.vector_env import EnvWorkerError, VectorEnv

EnvFactory = Callable[..., VectorEnv]
_POLL_SECONDS = 0.5
_START_TIMEOUT_S = 300.0  # a worker importing torch and building its simulator
_COMMANDS = ("reset", "step", "init_states")


def _serve(connection: Connection, factory: EnvFactory, num_envs: int) -> None:
    torch.set_num_threads(1)  # one core per worker; the parent decides how many workers
    try:
        env = factory(num_envs=num_envs)
        connection.send(("ok", env_facts(env)))
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
            if command == "pictures":
                connection.send(("ok", picture_copies(env, *payload)))
                continue
            if command not in _COMMANDS:
                raise ValueError(f"unknown command {command!r}")
            connection.send(("ok", getattr(env, command)(*payload)))
        except Exception:  # noqa: BLE001 - reported to the parent, which raises
            connection.send(("error", traceback.format_exc()))


class SubprocVectorEnv(ShardedVectorEnv):
    def __init__(
        self,
        factory: EnvFactory,
        num_envs: int,
        num_workers: int,
        reply_timeout_s: float = 600.0,
    ) -> None:
        if not 1 <= num_workers <= num_envs:
            raise ValueError(f"num_workers must be in 1..num_envs ({num_envs})")
        self.num_envs = num_envs
        self.reply_timeout_s = reply_timeout_s
        self._factory = factory
        self.shard_sizes = shard_sizes(num_envs, num_workers)
        self._connections: list[Connection] = []
        self._processes: list[Any] = []
        for worker in range(num_workers):
            connection, process = self._start(worker)
            self._connections.append(connection)
            self._processes.append(process)
        self._closed = False
        facts = [self._receive(w, "starting", _START_TIMEOUT_S) for w in range(num_workers)]
        self._adopt(facts[0])

    def _start(self, worker: int) -> tuple[Connection, Any]:
        parent, child = mp.get_context("spawn").Pipe()
        process = mp.get_context("spawn").Process(
            target=_serve, args=(child, self._factory, self.shard_sizes[worker]), daemon=True
        )
        process.start()
        child.close()
        return parent, process

    def restart_workers(self) -> list[str]:
        """Replace every worker that is no longer alive; what was restarted, one line
        each. The restarted shards need a reset before they step again."""
        restarted = []
        for worker, process in enumerate(self._processes):
            if process.is_alive():
                continue
            self._connections[worker].close()
            self._connections[worker], self._processes[worker] = self._start(worker)
            self._receive(worker, "restarting", _START_TIMEOUT_S)
            restarted.append(
                f"env worker {worker} (pid {process.pid}, exit code {process.exitcode}) "
                f"restarted as pid {self._processes[worker].pid}"
            )
        return restarted

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

    def _receive(self, worker: int, doing: str, timeout_s: float | None = None) -> Any:
        connection, process = self._connections[worker], self._processes[worker]
        timeout_s = self.reply_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while not connection.poll(_POLL_SECONDS):
            if not process.is_alive():
                raise EnvWorkerError(
                    f"env worker {worker} (pid {process.pid}) exited with code "
                    f"{process.exitcode} while {doing}"
                )
            if time.monotonic() > deadline:
                process.kill()  # a hung simulator: stopped, so a restart replaces it
                process.join(timeout=5.0)
                raise EnvWorkerError(
                    f"env worker {worker} (pid {process.pid}) did not answer within "
                    f"{timeout_s:g} s while {doing}; it was stopped"
                )
        try:
            status, value = connection.recv()
        except (EOFError, ConnectionResetError):
            # A worker that died with a command still unread in its pipe resets it.
            process.join(timeout=_POLL_SECONDS)
            code = process.exitcode
            how = "closed its pipe" if code is None else f"exited with code {code}"
            raise EnvWorkerError(
                f"env worker {worker} (pid {process.pid}) {how} while {doing}"
            ) from None
        if status == "error":
            raise EnvWorkerError(f"env worker {worker} failed while {doing}:\n{value}")
        return value

    def _gather(self, doing: str, workers: list[int] | None = None) -> list[Any]:
        """Every worker's reply. When one fails, the others' replies are still read, so
        none is left in a pipe to be taken for the answer to a later command."""
        replies, errors = [], []
        for worker in range(len(self._connections)) if workers is None else workers:
            try:
                replies.append(self._receive(worker, doing))
            except EnvWorkerError as error:
                errors.append(error)
        if errors:
            raise errors[0]
        return replies

    def _call_some(self, method: str, args: dict[int, tuple], doing: str) -> list[Any]:
        """Send each worker its message, then gather the replies of those that got it."""
        sent, errors = [], []
        for worker, arguments in args.items():
            try:
                self._send(worker, (method, arguments), doing)
                sent.append(worker)
            except EnvWorkerError as error:
                errors.append(error)
        replies = self._gather(doing, sent)
        if errors:
            raise errors[0]
        return replies

    def _call_first(self, method: str, args: tuple, doing: str) -> Any:
        self._send(0, (method, args), doing)
        return self._receive(0, doing)

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
