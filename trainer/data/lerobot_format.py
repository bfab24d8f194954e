"""The files of a LeRobot dataset, codebase version v3.0 (the `lerobot` package 0.4), as
numpy columns: what `LeRobotDataset(repo_id, root=folder)` opens offline, and what it
records. `trainer.data.lerobot_dataset` maps these frames to and from demo transitions.

A dataset folder holds

- `meta/info.json`: `codebase_version`, `fps`, the totals, the path templates and the
  `features`, each with `dtype`, `shape` and `names` (`image` features are `[H, W, C]`
  pictures stored in the parquet, `video` features frames of mp4 files);
- `data/chunk-000/file-000.parquet`: one row per frame, one column per feature that is
  not a video, plus `timestamp`, `frame_index`, `episode_index`, `index`, `task_index`;
- `meta/tasks.parquet`: the task strings (the pandas index) and their `task_index`;
- `meta/episodes/chunk-000/file-000.parquet`: per episode its tasks, its length, where
  its rows and videos are, and its statistics;
- `meta/stats.json`: per feature min, max, mean, std, count and quantiles (images per
  channel in [0, 1], shaped `[C, 1, 1]`), which LeRobot's policies normalise with;
- `videos/<feature>/chunk-000/file-000.mp4` for video features.

This module writes one data file and no videos; it reads every data file and decodes
videos with PyAV.
"""

from __future__ import annotations

import io
import json
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from trainer.data.demo_errors import DemoFileError

CODEBASE_VERSION = "v3.0"
INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
# Every dataset has them; LeRobot adds them to the features it is given.
BOOKKEEPING_FEATURES = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}
CAMERA_DTYPES = ("image", "video")
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
# LeRobot's defaults, recorded in info.json for its writers that append to a dataset.
CHUNKS_SIZE, DATA_FILES_SIZE_IN_MB, VIDEO_FILES_SIZE_IN_MB = 1000, 100, 200
# How far a video frame may sit from the frame's timestamp (LeRobot's tolerance_s).
VIDEO_TOLERANCE_S = 1e-4


@dataclass
class Frames:
    """A dataset's frames in `index` order: `columns` holds each feature asked for as
    `[N, *shape]` (pictures `[N, H, W, C]` uint8) and the bookkeeping columns as `[N]`;
    `tasks` the task string of each frame."""

    info: dict[str, Any]
    columns: dict[str, np.ndarray]
    tasks: list[str]


def image_feature(height: int, width: int, channels: int) -> dict[str, Any]:
    return {"dtype": "image", "shape": [height, width, channels],
            "names": ["height", "width", "channels"]}  # fmt: skip


def vector_feature(size: int, dtype: str = "float32") -> dict[str, Any]:
    return {"dtype": dtype, "shape": [size], "names": None}


def picture_shape(feature: dict[str, Any]) -> tuple[int, int, int]:
    """`[H, W, C]` of a camera feature: LeRobot's recorders write `[H, W, C]` with names
    height, width, channels, its HIL-SERL recorder `[C, H, W]` named channels first."""
    shape = tuple(int(size) for size in feature["shape"])
    names = feature.get("names") or []
    if len(shape) == 3 and names and names[0] in ("channel", "channels"):
        return shape[1], shape[2], shape[0]
    return shape  # type: ignore[return-value]


# ----- writing --------------------------------------------------------------------------


def write_frames(
    folder: Path,
    features: dict[str, dict[str, Any]],
    columns: dict[str, np.ndarray],
    episode_lengths: list[int],
    frame_tasks: list[str],
    fps: int,
    robot_type: str | None = None,
) -> Path:
    """Write a dataset of `features` (image features and 1-d vectors) whose frames are
    `columns` (episodes one after another, `episode_lengths` long), each frame with its
    task string. An existing dataset or empty folder at `folder` is replaced; anything
    else there is refused."""
    folder = Path(folder)
    if folder.exists() and not _replaceable(folder):
        raise FileExistsError(f"{folder} exists and is not a LeRobot dataset or an empty folder")
    rows = sum(episode_lengths)
    if sorted(columns) != sorted(features) or len(frame_tasks) != rows:
        raise ValueError("every feature needs a column and every frame a task")
    columns = {**columns, **_bookkeeping(episode_lengths, frame_tasks, fps)}
    features = {**features, **BOOKKEEPING_FEATURES}
    tasks = list(dict.fromkeys(frame_tasks))  # in order of first appearance
    folder.parent.mkdir(parents=True, exist_ok=True)
    # Written aside and moved in whole, so a reader never meets half a dataset.
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        _write_data(staging, features, columns)
        _write_tasks(staging, tasks)
        stats = _write_episodes(staging, features, columns, episode_lengths, tasks)
        _write_json(staging / STATS_PATH, stats)
        info = {
            "codebase_version": CODEBASE_VERSION,
            "robot_type": robot_type,
            "total_episodes": len(episode_lengths),
            "total_frames": rows,
            "total_tasks": len(tasks),
            "chunks_size": CHUNKS_SIZE,
            "data_files_size_in_mb": DATA_FILES_SIZE_IN_MB,
            "video_files_size_in_mb": VIDEO_FILES_SIZE_IN_MB,
            "fps": int(fps),
            "splits": {"train": f"0:{len(episode_lengths)}"},
            "data_path": DATA_PATH,
            "video_path": None,
            "features": features,
        }
        _write_json(staging / INFO_PATH, info)
        if folder.exists():
            shutil.rmtree(folder)
        staging.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def _replaceable(folder: Path) -> bool:
    return folder.is_dir() and (not any(folder.iterdir()) or (folder / INFO_PATH).is_file())


def _bookkeeping(
    episode_lengths: list[int], frame_tasks: list[str], fps: int
) -> dict[str, np.ndarray]:
    frame_index = np.concatenate([np.arange(length) for length in episode_lengths])
    task_index = {task: index for index, task in enumerate(dict.fromkeys(frame_tasks))}
    return {
        "timestamp": (frame_index / fps).astype(np.float32),
        "frame_index": frame_index.astype(np.int64),
        "episode_index": np.repeat(np.arange(len(episode_lengths)), episode_lengths),
        "index": np.arange(len(frame_tasks), dtype=np.int64),
        "task_index": np.array([task_index[task] for task in frame_tasks], dtype=np.int64),
    }


def _write_data(folder: Path, features: dict[str, dict], columns: dict[str, np.ndarray]) -> None:
    arrays, hf_features = {}, {}
    for name, feature in features.items():
        arrays[name], hf_features[name] = _arrow_column(name, feature, columns[name])
    table = pa.table(arrays)
    # What the `datasets` library writes: LeRobot's loader and the Hub's viewer read it.
    hf_metadata = json.dumps({"info": {"features": hf_features}})
    table = table.replace_schema_metadata({"huggingface": hf_metadata})
    path = folder / DATA_PATH.format(chunk_index=0, file_index=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, compression="snappy")


def _arrow_column(name: str, feature: dict, values: np.ndarray) -> tuple[pa.Array, dict]:
    """The column of a feature and its `datasets` feature description."""
    dtype, shape = feature["dtype"], tuple(feature["shape"])
    if dtype == "image":
        pictures = [_png(picture) for picture in values]
        paths = [f"frame-{index:06d}.png" for index in range(len(values))]
        array = pa.StructArray.from_arrays(
            [pa.array(pictures, pa.binary()), pa.array(paths, pa.string())], ["bytes", "path"]
        )
        return array, {"_type": "Image"}
    if shape == (1,):
        return pa.array(values.reshape(-1).astype(dtype)), {"dtype": dtype, "_type": "Value"}
    if len(shape) == 1:
        flat = pa.array(values.reshape(-1).astype(dtype))
        described = {"feature": {"dtype": dtype, "_type": "Value"}, "length": shape[0]}
        return pa.FixedSizeListArray.from_arrays(flat, shape[0]), {**described, "_type": "List"}
    raise ValueError(f"{name}: only pictures and 1-d features are written, not {shape}")


def _png(picture: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(picture).save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


def _write_tasks(folder: Path, tasks: list[str]) -> None:
    """LeRobot reads this file with pandas, the task strings as the frame's index: the
    pandas metadata below is what `DataFrame.to_parquet` writes for it."""
    table = pa.table(
        {"task_index": pa.array(range(len(tasks)), pa.int64()), "__index_level_0__": tasks}
    )
    pandas_metadata = {
        "index_columns": ["__index_level_0__"],
        "column_indexes": [{"name": None, "field_name": None, "pandas_type": "unicode",
                            "numpy_type": "object", "metadata": {"encoding": "UTF-8"}}],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64",
             "numpy_type": "int64", "metadata": None},
            {"name": None, "field_name": "__index_level_0__", "pandas_type": "unicode",
             "numpy_type": "object", "metadata": None},
        ],
        "attributes": {},
        "creator": {"library": "pyarrow", "version": pa.__version__},
    }  # fmt: skip
    table = table.replace_schema_metadata({"pandas": json.dumps(pandas_metadata)})
    (folder / TASKS_PATH).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / TASKS_PATH)


def _write_episodes(
    folder: Path,
    features: dict[str, dict],
    columns: dict[str, np.ndarray],
    episode_lengths: list[int],
    tasks: list[str],
) -> dict[str, dict[str, list]]:
    """The episodes' file; the whole dataset's statistics."""
    ends = np.cumsum(episode_lengths)
    records: list[dict[str, Any]] = []
    for episode, (start, end) in enumerate(zip(ends - episode_lengths, ends, strict=True)):
        task_indices = np.unique(columns["task_index"][start:end])
        record = {
            "episode_index": episode,
            "tasks": [tasks[index] for index in task_indices],
            "length": int(end - start),
            "data/chunk_index": 0,
            "data/file_index": 0,
            "dataset_from_index": int(start),
            "dataset_to_index": int(end),
        }
        for name, feature in features.items():
            stats = feature_stats(columns[name][start:end], feature["dtype"] == "image")
            record.update({f"stats/{name}/{key}": value for key, value in stats.items()})
        record["meta/episodes/chunk_index"], record["meta/episodes/file_index"] = 0, 0
        records.append(record)
    path = folder / EPISODES_PATH.format(chunk_index=0, file_index=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records), path, compression="snappy")
    return {
        name: feature_stats(columns[name], feature["dtype"] == "image")
        for name, feature in features.items()
    }


def feature_stats(values: np.ndarray, is_picture: bool) -> dict[str, list]:
    """LeRobot's statistics of one feature over `values [N, ...]`, as JSON lists: per
    dimension for vectors, per channel in [0, 1] shaped `[C, 1, 1]` for pictures (their
    mean, std and quantiles from a thousand frames at most, as LeRobot samples too)."""
    count = [int(values.shape[0])]
    if is_picture:  # [N, H, W, C] uint8 -> one row per pixel
        channels = values.shape[-1]
        every = values.reshape(-1, channels)
        sample = values[:: max(1, len(values) // 1000)].reshape(-1, channels) / 255.0
        low, high = every.min(axis=0) / 255.0, every.max(axis=0) / 255.0
    else:
        every = values.reshape(values.shape[0], -1)
        sample = every.astype(np.float64)
        low, high = every.min(axis=0), every.max(axis=0)
    stats = {
        "min": low,
        "max": high,
        "mean": sample.mean(axis=0),
        "std": sample.std(axis=0),
        **{f"q{round(q * 100):02d}": np.quantile(sample, q, axis=0) for q in QUANTILES},
    }
    if is_picture:
        stats = {key: value.reshape(-1, 1, 1) for key, value in stats.items()}
    return {**{key: value.tolist() for key, value in stats.items()}, "count": count}


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=4, ensure_ascii=False))


# ----- reading --------------------------------------------------------------------------


def read_info(folder: Path) -> dict[str, Any]:
    """`meta/info.json`, checked to be of codebase version v3.0 with features."""
    path = Path(folder) / INFO_PATH
    if not path.is_file():
        raise DemoFileError(f"{folder}: no {INFO_PATH}, not a LeRobot dataset")
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise DemoFileError(f"{folder}: {INFO_PATH} is not readable JSON ({error})") from error
    version = info.get("codebase_version") if isinstance(info, dict) else None
    if version != CODEBASE_VERSION:
        raise DemoFileError(
            f"{folder}: codebase_version {version!r}, only {CODEBASE_VERSION!r} is read "
            "(lerobot's datasets/v30/convert_dataset_v21_to_v30.py converts v2.1)"
        )
    if not isinstance(info.get("features"), dict) or not isinstance(info.get("fps"), int | float):
        raise DemoFileError(f"{folder}: {INFO_PATH} has no features or no fps")
    for name, feature in info["features"].items():
        if not isinstance(feature, dict) or not {"dtype", "shape"} <= set(feature):
            raise DemoFileError(f"{folder}: feature {name} in {INFO_PATH} has no dtype or shape")
    return info


def read_frames(folder: Path, names: Iterable[str]) -> Frames:
    """The frames of the dataset at `folder` with the features `names` (each one of its
    features) and the bookkeeping columns."""
    folder = Path(folder)
    info = read_info(folder)
    features = info["features"]
    names = list(names)
    missing = [name for name in [*names, *BOOKKEEPING_FEATURES] if name not in features]
    if missing:
        raise DemoFileError(f"{folder}: no feature {', '.join(missing)} in {INFO_PATH}")
    paths = sorted((folder / "data").glob("*/*.parquet"))
    if not paths:
        raise DemoFileError(f"{folder}: no data files under data/")
    wanted = [*names, *BOOKKEEPING_FEATURES]
    stored = [name for name in wanted if features[name]["dtype"] != "video"]
    parts = [_read_data_file(folder, path, stored, features) for path in paths]
    columns = {name: np.concatenate([part[name] for part in parts]) for name in stored}
    for name in BOOKKEEPING_FEATURES:
        columns[name] = columns[name].reshape(-1)
    order = np.argsort(columns["index"], kind="stable")
    columns = {name: column[order] for name, column in columns.items()}
    videos = [name for name in names if features[name]["dtype"] == "video"]
    if videos:
        columns.update(_read_videos(folder, info, videos, columns))
    tasks = _read_tasks(folder)
    try:
        frame_tasks = [tasks[int(index)] for index in columns["task_index"]]
    except KeyError as error:
        raise DemoFileError(f"{folder}: task_index {error} is not in {TASKS_PATH}") from None
    return Frames(info=info, columns=columns, tasks=frame_tasks)


def _read_data_file(
    folder: Path, path: Path, names: list[str], features: dict[str, dict]
) -> dict[str, np.ndarray]:
    try:
        table = pq.read_table(path, columns=names)
    except (OSError, pa.ArrowException) as error:
        where = path.relative_to(folder)
        raise DemoFileError(f"{folder}: {where} is not a readable parquet file ({error})") from None
    columns = {}
    for name in names:
        feature = features[name]
        column = table.column(name)
        if feature["dtype"] == "image":
            columns[name] = _decode_pictures(folder, name, column, picture_shape(feature))
        else:
            columns[name] = _numbers(folder, name, column, tuple(feature["shape"]))
    return columns


def _numbers(folder: Path, name: str, column: pa.ChunkedArray, shape: tuple) -> np.ndarray:
    """`[N, *shape]` from a column of scalars or of (fixed-size) lists."""
    array = column.combine_chunks()
    rows = len(array)
    while pa.types.is_list(array.type) or pa.types.is_fixed_size_list(array.type):
        array = array.flatten()
    values = array.to_numpy(zero_copy_only=False)
    if values.size != rows * int(np.prod(shape)):
        per_row = values.size / max(rows, 1)
        raise DemoFileError(
            f"{folder}: feature {name} has {per_row:g} values per frame, {INFO_PATH} says "
            f"shape {list(shape)}"
        )
    return values.reshape(rows, *shape)


def _decode_pictures(
    folder: Path, name: str, column: pa.ChunkedArray, shape: tuple[int, int, int]
) -> np.ndarray:
    pictures = np.empty((len(column), *shape), dtype=np.uint8)
    for row, cell in enumerate(column.to_pylist()):
        if not cell or not cell.get("bytes"):
            raise DemoFileError(f"{folder}: feature {name} frame {row} has no embedded picture")
        with Image.open(io.BytesIO(cell["bytes"])) as image:
            picture = np.asarray(image.convert("RGB") if shape[2] == 3 else image)
        picture = picture.reshape(*picture.shape[:2], -1)
        if picture.shape != shape:
            raise DemoFileError(
                f"{folder}: feature {name} frame {row} is {list(picture.shape)}, "
                f"{INFO_PATH} says {list(shape)}"
            )
        pictures[row] = picture
    return pictures


def _read_tasks(folder: Path) -> dict[int, str]:
    path = folder / TASKS_PATH
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as error:
        raise DemoFileError(f"{folder}: {TASKS_PATH} is not readable ({error})") from None
    # The task strings are pandas' index column (LeRobot's files) or a `task` column.
    strings = [field.name for field in table.schema if pa.types.is_string(field.type)]
    if "task_index" not in table.column_names or not strings:
        raise DemoFileError(f"{folder}: {TASKS_PATH} has no task strings and task_index")
    name = "task" if "task" in strings else strings[0]
    return dict(zip(table.column("task_index").to_pylist(), table.column(name).to_pylist(),
                    strict=True))  # fmt: skip


def _read_episodes(folder: Path) -> dict[int, dict[str, Any]]:
    paths = sorted((folder / "meta/episodes").glob("*/*.parquet"))
    if not paths:
        raise DemoFileError(f"{folder}: no episode files under meta/episodes/")
    episodes = {}
    for path in paths:
        names = [name for name in pq.read_schema(path).names if not name.startswith("stats/")]
        for record in pq.read_table(path, columns=names).to_pylist():
            episodes[int(record["episode_index"])] = record
    return episodes


def _read_videos(
    folder: Path, info: dict, names: list[str], columns: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Each frame of the video features `names`: the frame of its episode's mp4 file at
    the episode's start there plus the frame's timestamp."""
    try:
        import av  # only datasets with video features need it
    except ImportError as error:
        raise DemoFileError(
            f"{folder}: reading video feature {names[0]} needs PyAV ({error}); record the "
            "dataset with use_videos=False to store pictures in the parquet instead"
        ) from None
    episodes = _read_episodes(folder)
    decoded: dict[Path, tuple[np.ndarray, np.ndarray]] = {}
    result = {}
    for name in names:
        shape = picture_shape(info["features"][name])
        frames = np.empty((len(columns["index"]), *shape), dtype=np.uint8)
        for row, (episode, timestamp) in enumerate(
            zip(columns["episode_index"], columns["timestamp"], strict=True)
        ):
            record = episodes.get(int(episode))
            if record is None or f"videos/{name}/chunk_index" not in record:
                raise DemoFileError(f"{folder}: episode {episode} has no video of {name}")
            path = folder / info["video_path"].format(
                video_key=name,
                chunk_index=record[f"videos/{name}/chunk_index"],
                file_index=record[f"videos/{name}/file_index"],
            )
            if path not in decoded:
                decoded[path] = _decode_video(folder, name, path, av)
            times, pictures = decoded[path]
            wanted = record[f"videos/{name}/from_timestamp"] + float(timestamp)
            nearest = int(np.abs(times - wanted).argmin())
            if abs(times[nearest] - wanted) > VIDEO_TOLERANCE_S:
                raise DemoFileError(
                    f"{folder}: {path.relative_to(folder)} has no frame at {wanted:.4f} s "
                    f"(episode {episode}), the nearest is at {times[nearest]:.4f} s"
                )
            if pictures[nearest].shape != shape:
                raise DemoFileError(
                    f"{folder}: feature {name} frames are {list(pictures[nearest].shape)}, "
                    f"{INFO_PATH} says {list(shape)}"
                )
            frames[row] = pictures[nearest]
        result[name] = frames
    return result


def _decode_video(folder: Path, name: str, path: Path, av: Any) -> tuple[np.ndarray, np.ndarray]:
    """Every frame of an mp4 file (`[H, W, 3]` uint8) and its time in seconds."""
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            times, pictures = [], []
            for frame in container.decode(stream):
                times.append(float(frame.pts * stream.time_base))
                pictures.append(frame.to_ndarray(format="rgb24"))
    except (OSError, av.FFmpegError, IndexError) as error:
        raise DemoFileError(
            f"{folder}: video feature {name}: {path.relative_to(folder)} cannot be decoded "
            f"here ({error}); record the dataset with use_videos=False to store pictures "
            "in the parquet instead"
        ) from None
    return np.array(times), np.stack(pictures) if pictures else np.zeros((0, 1, 1, 3))
