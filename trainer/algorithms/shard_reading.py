"""Reading a folder of shards (torch.distributed.checkpoint) without running code from it.

torch's own reader unpickles the folder's `.metadata` and loads the non-tensor parts of
the state with `torch.load(weights_only=False)`: a planted folder would run whatever its
pickles name. A run folder is written by a job, and others read it (an evaluation, a
run that starts from its policy), so here the metadata may name only the checkpoint
format's own records, and the rest loads as tensors and plain data.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

# What a `.metadata` file of the format names (torch's dtypes aside).
_METADATA_GLOBALS = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in (
        "Metadata",
        "TensorStorageMetadata",
        "TensorProperties",
        "ChunkStorageMetadata",
        "BytesStorageMetadata",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    )
} | {  # fmt: skip
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
}


class UnsafeShards(pickle.UnpicklingError):
    """A folder of shards whose metadata names something other than the format's
    records."""


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeShards(f"the shards' metadata names {module}.{name}: refused")


class SafeShardReader(FileSystemReader):
    """torch's file-system reader, its metadata read through the allowlist above."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self._get_metadata_path(kwargs.get("rank")))
        with path.open("rb") as file:
            metadata = _MetadataUnpickler(file).load()
        if not isinstance(metadata, Metadata):
            raise UnsafeShards(f"{path} is not a shards' metadata file")
        metadata.storage_meta = getattr(metadata, "storage_meta", None) or StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """torch's load planner, the state's non-tensor parts loaded as plain data."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded
