"""A stand-in for SERL's robot server (serl_robot_infra/robot_servers/franka_server.py)
for tests without an arm: the same endpoints and JSON, a kinematic arm that goes to
each pose it is sent, and a log of every request. It can fall silent (accept requests
and never answer, as a hung real-time PC does) and be stopped and started again on the
same port."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

HOME = [0.5, 0.0, 0.2, 1.0, 0.0, 0.0, 0.0]  # above the table, gripper pointing down
ENDPOINTS = {"getstate", "pose", "clearerr", "jointreset", "open_gripper", "close_gripper",
             "move_gripper", "update_param"}  # fmt: skip


class FakeSerlServer:
    def __init__(self, port: int = 0) -> None:
        self.pose = list(HOME)
        self.gripper_pos = 1.0  # open
        self.requests: list[tuple[str, dict | None]] = []
        self.errors_cleared = 0
        self.silent = False  # True: requests are taken and never answered
        self.unanswered: list[str] = []
        self._wake = threading.Event()  # ends the silent handlers' wait
        self.lock = threading.Lock()
        self._port = port
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}/"

    def start(self) -> FakeSerlServer:
        self._server = ThreadingHTTPServer(("127.0.0.1", self._port), self._handler())
        self._server.daemon_threads = True
        self._port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def fall_silent(self) -> None:
        self.silent = True
        self._wake.clear()

    def speak_again(self) -> None:
        self.silent = False
        self._wake.set()

    def stop(self) -> None:
        """Gone, as a killed server: connections to its port are refused."""
        self._wake.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def posed(self) -> list[list[float]]:
        """Every pose the server was sent, in order."""
        return [payload["arr"] for endpoint, payload in self.requests if endpoint == "pose"]

    def endpoints(self) -> list[str]:
        return [endpoint for endpoint, _ in self.requests]

    def state(self) -> dict:
        return {
            "pose": self.pose, "vel": [0.0] * 6, "force": [0.0] * 3, "torque": [0.0] * 3,
            "q": [0.0] * 7, "dq": [0.0] * 7, "jacobian": np.zeros((6, 7)).tolist(),
            "gripper_pos": self.gripper_pos,
        }  # fmt: skip

    def answer(self, endpoint: str, payload: dict | None) -> tuple[int, object]:
        with self.lock:
            self.requests.append((endpoint, payload))
            if endpoint == "getstate":
                return 200, self.state()
            if endpoint == "pose":
                arr = payload["arr"] if isinstance(payload, dict) else None
                if not isinstance(arr, list) or len(arr) != 7:
                    return 400, "pose needs arr: 7 numbers"
                self.pose = [float(v) for v in arr]
            elif endpoint == "close_gripper":
                self.gripper_pos = 0.0
            elif endpoint == "open_gripper":
                self.gripper_pos = 1.0
            elif endpoint == "move_gripper":
                self.gripper_pos = float(payload["gripper_pos"]) / 255.0
            elif endpoint == "clearerr":
                self.errors_cleared += 1
            elif endpoint == "jointreset":
                self.pose = list(HOME)
            return 200, "ok"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                endpoint = self.path.strip("/")
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if server.silent:
                    server.unanswered.append(endpoint)
                    server._wake.wait(60)
                    return
                if endpoint not in ENDPOINTS:
                    self.send_error(404)
                    return
                payload = json.loads(body) if body else None
                status, reply = server.answer(endpoint, payload)
                data = (json.dumps(reply) if isinstance(reply, dict) else str(reply)).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json" if isinstance(reply, dict)
                                 else "text/plain")  # fmt: skip
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                """Quiet: the request log is `requests`."""

        return Handler


@contextlib.contextmanager
def fake_servers(count: int) -> Iterator[list[FakeSerlServer]]:
    """`count` started fake servers, stopped afterwards."""
    fakes = [FakeSerlServer().start() for _ in range(count)]
    try:
        yield fakes
    finally:
        for fake in fakes:
            fake.stop()
