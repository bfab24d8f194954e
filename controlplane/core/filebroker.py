"""Kombu's file-system transport and Celery's file-system result backend, made safe for
several processes.

Both write a file in place, so a reader polling the folder can pick it up half written
(an empty message crashes the worker with a JSONDecodeError). Here a file is written
under a temporary name and renamed into place, which is atomic on one file system: a
reader sees whole files or nothing.
"""

import os
import uuid
from time import monotonic

from celery.backends.filesystem import FilesystemBackend
from kombu.transport import filesystem
from kombu.utils.encoding import ensure_bytes, str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs) -> None:
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        # A leading dot keeps the partial file out of every queue's name pattern.
        partial = os.path.join(self.data_folder_out, f".{name}.part")
        with open(partial, "wb") as handle:
            handle.write(str_to_bytes(dumps(payload)))
        os.replace(partial, os.path.join(self.data_folder_out, name))


class Transport(filesystem.Transport):
    Channel = Channel


class AtomicFilesystemBackend(FilesystemBackend):
    def set(self, key, value) -> None:
        final = self._filename(key)  # bytes: Celery's keys and paths are bytes here
        partial = final + f".{uuid.uuid4().hex}.part".encode()
        with self.open(partial, "wb") as handle:
            handle.write(ensure_bytes(value))
        os.replace(partial, final)
