"""The file-system broker never shows a reader a half-written message or result."""

import json
import threading
from pathlib import Path

import pytest
from kombu import Connection

from controlplane.core.filebroker import AtomicFilesystemBackend

pytestmark = pytest.mark.embedded


def read_whole_files(folder: Path, pattern: str, stop: threading.Event, bad: list) -> None:
    while not stop.is_set():
        for path in folder.glob(pattern):
            if path.name.endswith(".part"):  # readers look up exact names only
                continue
            try:
                text = path.read_bytes()
            except FileNotFoundError:  # consumed in the meantime
                continue
            try:
                json.loads(text)
            except ValueError:
                bad.append((path.name, text))


def test_messages_appear_only_when_complete(tmp_path):
    options = {
        "data_folder_in": str(tmp_path),
        "data_folder_out": str(tmp_path),
        "control_folder": str(tmp_path / "control"),
    }
    stop, bad = threading.Event(), []
    reader = threading.Thread(target=read_whole_files, args=(tmp_path, "*.msg", stop, bad))
    reader.start()
    try:
        with Connection(
            "filesystem://", transport="controlplane.core.filebroker:Transport",
            transport_options=options,
        ) as conn:  # fmt: skip
            queue = conn.SimpleQueue("stress")
            payload = {"blob": "x" * 200_000}
            for _ in range(100):
                queue.put(payload)
            received = [queue.get(timeout=5) for _ in range(100)]
            for message in received:
                message.ack()
            queue.close()
    finally:
        stop.set()
        reader.join()
    assert bad == []
    assert all(m.payload == payload for m in received)
    assert list(tmp_path.glob(".*.part")) == []


def test_results_appear_only_when_complete(tmp_path, settings):
    from controlplane.celery import app

    backend = AtomicFilesystemBackend(app=app, url=f"file://{tmp_path}")
    stop, bad = threading.Event(), []
    reader = threading.Thread(
        target=read_whole_files, args=(tmp_path, "celery-task-meta-*", stop, bad)
    )
    reader.start()
    try:
        for index in range(200):
            backend.store_result(f"task-{index}", {"blob": "y" * 100_000}, "SUCCESS")
    finally:
        stop.set()
        reader.join()
    assert bad == []
    assert backend.get_task_meta("task-7")["result"] == {"blob": "y" * 100_000}
