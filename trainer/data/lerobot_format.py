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

This module writes one data file and no videos; it reads every data file, and of the
videos the frames the episodes use, with PyAV. A dataset may come from anyone, so it is
read from its own folder only: every file it opens, and every path its info.json
formats, resolves (links followed) inside the folder; its videos are opened as MP4 files
and nothing else (no playlists, no URLs); the video pixels one read decodes are held to
MAX_VIDEO_PIXELS.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import shutil
import string
import tempfile
from collections.abc import Iterable, Iterator
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
# The most video pixels one read decodes: the frames the episodes use and those decoded on
# the way from a keyframe to them. 2**30 pixels are 3 GiB of RGB frames; read_frames'
# max_video_pixels sets another limit for one read.
MAX_VIDEO_PIXELS = 2**30
# Frames the episodes use that lie further apart in a video are reached by seeking to the
# keyframe before them; closer ones by decoding on.
SEEK_GAP_S = 1.0
# The fields info.json's path templates may format, with the format specs each may take
# (LeRobot's templates use `{chunk_index:03d}`): indices come out as digits only.
_INDEX_SPEC = re.compile(r"0?\d{0,2}d?")
DATA_PATH_FIELDS = {"chunk_index": _INDEX_SPEC, "file_index": _INDEX_SPEC}
VIDEO_PATH_FIELDS = {"video_key": re.compile(""), **DATA_PATH_FIELDS}


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
    path = _inside(folder, INFO_PATH, INFO_PATH)
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
    _check_path_templates(Path(folder), info)
    return info


def _check_path_templates(folder: Path, info: dict[str, Any]) -> None:
    """`data_path` and `video_path` format indices (and video feature names) only, into
    paths inside the dataset folder."""
    data_path = _path_template(folder, info, "data_path", DATA_PATH_FIELDS)
    if data_path is not None:
        relative = data_path.format(chunk_index=0, file_index=0)
        _inside(folder, relative, f"{INFO_PATH}: data_path {data_path!r} gives {relative!r}, which")
    video_path = _path_template(folder, info, "video_path", VIDEO_PATH_FIELDS)
    for name, feature in info["features"].items():
        if feature["dtype"] != "video":
            continue
        if "/" in name or "\\" in name or name in ("", ".", ".."):
            raise DemoFileError(
                f"{folder}: {INFO_PATH}: video feature {name!r} has a '/' or is '.' or '..' "
                "(video_path formats the names of video features into paths)"
            )
        if video_path is None:
            raise DemoFileError(f"{folder}: {INFO_PATH}: video feature {name!r} and no video_path")
        _video_file(folder, video_path, name, 0, 0)


def _path_template(
    folder: Path, info: dict[str, Any], key: str, fields: dict[str, re.Pattern]
) -> str | None:
    """The path template `info[key]`, checked to format only `fields`, with their specs."""
    template = info.get(key)
    if template is None:
        return None
    if not isinstance(template, str):
        raise DemoFileError(f"{folder}: {INFO_PATH}: {key} {template!r} is not a path template")
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as error:
        raise DemoFileError(
            f"{folder}: {INFO_PATH}: {key} {template!r} is not a path template ({error})"
        ) from None
    for _, field, spec, conversion in parts:
        if field is None:
            continue
        if field not in fields or conversion or not fields[field].fullmatch(spec):
            written = "{" + field + (f"!{conversion}" if conversion else "")
            written += (f":{spec}" if spec else "") + "}"
            allowed = ", ".join("{" + name + "}" for name in fields)
            raise DemoFileError(
                f"{folder}: {INFO_PATH}: {key} {template!r}: {written} is not one of the "
                f"fields it may format ({allowed}, indices with a width like :03d)"
            )
    return template


def _inside(folder: Path, relative: str, what: str) -> Path:
    """The path `relative` to the dataset folder, resolved (links followed) and checked to
    lie inside it; `what` names where the path comes from."""
    if "\0" in relative:
        raise DemoFileError(f"{folder}: {what} holds a NUL character, not a path")
    root = os.path.realpath(folder)
    resolved = os.path.realpath(os.path.join(root, relative))
    if os.path.commonpath([root, resolved]) != root:
        raise DemoFileError(
            f"{folder}: {what} resolves to {resolved}, outside the dataset folder (a dataset "
            "is read from its own folder only)"
        )
    return Path(resolved)


def _video_file(
    folder: Path, template: str, name: str, chunk_index: int, file_index: int
) -> tuple[str, Path]:
    """The video of feature `name` in chunk `chunk_index`, file `file_index`: its path as
    `video_path` gives it and resolved inside the dataset folder."""
    relative = template.format(video_key=name, chunk_index=chunk_index, file_index=file_index)
    what = f"{INFO_PATH}: video_path {template!r} gives {relative!r} (feature {name}), which"
    return relative, _inside(folder, relative, what)


def read_frames(
    folder: Path, names: Iterable[str], max_video_pixels: int = MAX_VIDEO_PIXELS
) -> Frames:
    """The frames of the dataset at `folder` with the features `names` (each one of its
    features) and the bookkeeping columns; of its videos, at most `max_video_pixels`
    pixels are decoded."""
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
        columns.update(_read_videos(folder, info, videos, columns, max_video_pixels))
    tasks = _read_tasks(folder)
    try:
        frame_tasks = [tasks[int(index)] for index in columns["task_index"]]
    except KeyError as error:
        raise DemoFileError(f"{folder}: task_index {error} is not in {TASKS_PATH}") from None
    return Frames(info=info, columns=columns, tasks=frame_tasks)


def _read_data_file(
    folder: Path, path: Path, names: list[str], features: dict[str, dict]
) -> dict[str, np.ndarray]:
    where = path.relative_to(folder).as_posix()
    try:
        table = pq.read_table(_inside(folder, where, where), columns=names)
    except (OSError, pa.ArrowException) as error:
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
    path = _inside(folder, TASKS_PATH, TASKS_PATH)
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
        where = path.relative_to(folder).as_posix()
        path = _inside(folder, where, where)
        names = [name for name in pq.read_schema(path).names if not name.startswith("stats/")]
        for record in pq.read_table(path, columns=names).to_pylist():
            episodes[int(record["episode_index"])] = record
    return episodes


def _read_videos(
    folder: Path,
    info: dict,
    names: list[str],
    columns: dict[str, np.ndarray],
    max_video_pixels: int,
) -> dict[str, np.ndarray]:
    """Each frame of the video features `names`: the frame of its episode's mp4 file at
    the episode's start there plus the frame's timestamp. Only those frames, and the ones
    on the way from a keyframe to them, are decoded."""
    try:
        import av  # only datasets with video features need it
    except ImportError as error:
        raise DemoFileError(
            f"{folder}: reading video feature {names[0]} needs PyAV ({error}); record the "
            "dataset with use_videos=False to store pictures in the parquet instead"
        ) from None
    rows = len(columns["index"])
    shapes = {name: picture_shape(info["features"][name]) for name in names}
    asked = sum(rows * shape[0] * shape[1] for shape in shapes.values())
    if asked > max_video_pixels:
        raise DemoFileError(
            f"{folder}: the frames asked for hold {asked} video pixels, over the limit of "
            f"{max_video_pixels} ({_PIXELS_LIMIT}); read a dataset of fewer frames or "
            "smaller pictures, or raise the limit"
        )
    episodes = _read_episodes(folder)
    episode_ids, episode_of_row = np.unique(columns["episode_index"], return_inverse=True)
    pixels = _VideoPixels(folder, max_video_pixels)
    result = {}
    for name in names:
        places = [_episode_video(folder, info, name, int(episode), episodes.get(int(episode)))
                  for episode in episode_ids]  # fmt: skip
        starts = np.array([start for _, _, start in places], dtype=np.float64)
        wanted = starts[episode_of_row] + columns["timestamp"].astype(np.float64)
        result[name] = np.empty((rows, *shapes[name]), dtype=np.uint8)
        for relative, path in dict.fromkeys((relative, path) for relative, path, _ in places):
            in_file = [index for index, place in enumerate(places) if place[1] == path]
            file_rows = np.flatnonzero(np.isin(episode_of_row, in_file))
            file = (relative, path)
            video = _VideoFrames(folder, name, shapes[name], file, file_rows, wanted[file_rows])
            video.decode_into(result[name], pixels, av)
            video.check_found(columns["episode_index"])
    return result


_PIXELS_LIMIT = "MAX_VIDEO_PIXELS in trainer/data/lerobot_format.py, read_frames' max_video_pixels"


class _VideoPixels:
    """The video pixels one read has decoded, held to its limit."""

    def __init__(self, folder: Path, limit: int) -> None:
        self.folder, self.limit, self.decoded = folder, limit, 0

    def count(self, frame: Any, relative: str) -> None:
        self.decoded += frame.width * frame.height
        if self.decoded > self.limit:
            raise DemoFileError(
                f"{self.folder}: decoding {relative} passes the limit of {self.limit} video "
                f"pixels ({_PIXELS_LIMIT}); the frames from the keyframe before each "
                "episode's first are decoded too, so a video with few keyframes costs more"
            )


def _episode_video(
    folder: Path, info: dict, name: str, episode: int, record: dict[str, Any] | None
) -> tuple[str, Path, float]:
    """The video of feature `name` that holds `episode` (its path as video_path gives it,
    resolved inside the folder) and the episode's start in it in seconds."""
    keys = [f"videos/{name}/{key}" for key in ("chunk_index", "file_index", "from_timestamp")]
    if record is None or any(key not in record for key in keys):
        raise DemoFileError(f"{folder}: episode {episode} has no video of {name}")
    try:
        chunk_index, file_index = int(record[keys[0]]), int(record[keys[1]])
        start = float(record[keys[2]])
    except (TypeError, ValueError):
        values = ", ".join(f"{key} {record[key]!r}" for key in keys)
        raise DemoFileError(f"{folder}: episode {episode}: {values} are not numbers") from None
    relative, path = _video_file(folder, info["video_path"], name, chunk_index, file_index)
    return relative, path, start


class _VideoFrames:
    """The frames rows of the dataset take from one mp4 file of the video feature `name`
    (`[H, W, C]` `shape`). The file is opened as MP4 only, with no protocol but local
    files, so that a playlist or any other container that fetches what it lists is
    refused; only the stretches of it that rows use are decoded."""

    def __init__(
        self,
        folder: Path,
        name: str,
        shape: tuple[int, int, int],
        file: tuple[str, Path],
        rows: np.ndarray,
        wanted: np.ndarray,
    ) -> None:
        """`file` is the path as video_path gives it and resolved; `rows` take the
        frames at the times `wanted` (seconds, one per row), each within
        VIDEO_TOLERANCE_S."""
        self.folder, self.name, self.shape = folder, name, shape
        self.relative, self.path = file
        self.times, inverse = np.unique(wanted, return_inverse=True)
        order = np.argsort(inverse, kind="stable")
        self.rows_at = np.split(rows[order], np.cumsum(np.bincount(inverse))[:-1])
        self.found = np.zeros(len(self.times), dtype=bool)
        self.nearest = np.full(len(self.times), np.inf)  # the nearest decoded frame's time

    def decode_into(self, frames: np.ndarray, pixels: _VideoPixels, av: Any) -> None:
        """Fill the rows' frames in `frames`."""
        local_only = {"protocol_whitelist": "file"}
        try:
            with av.open(str(self.path), format="mp4", container_options=local_only) as container:
                stream = container.streams.video[0]
                if stream.codec_context.width and stream.codec_context.height:
                    self._check_size(stream.codec_context.height, stream.codec_context.width)
                for start, end in _spans(self.times):
                    for frame in _frames_from(container, stream, start):
                        pixels.count(frame, self.relative)
                        if frame.time is not None and frame.time > end + VIDEO_TOLERANCE_S:
                            break
                        if frame.time is not None:
                            self._take(frame, frames)
        except (OSError, av.FFmpegError, IndexError) as error:
            raise DemoFileError(
                f"{self.folder}: video feature {self.name}: {self.relative} cannot be decoded "
                f"here as an MP4 video ({error}); its videos are opened as MP4 files only, "
                "as LeRobot writes them; record the dataset with use_videos=False to store "
                "pictures in the parquet instead"
            ) from None

    def _take(self, frame: Any, frames: np.ndarray) -> None:
        """Give `frame` to the rows whose time it is; note it as the nearest so far."""
        at = int(np.searchsorted(self.times, frame.time))
        for index in range(max(at - 1, 0), min(at + 1, len(self.times))):
            gap = abs(self.times[index] - frame.time)
            if gap < abs(self.times[index] - self.nearest[index]):
                self.nearest[index] = frame.time
            if gap <= VIDEO_TOLERANCE_S and not self.found[index]:
                self._check_size(frame.height, frame.width)
                frames[self.rows_at[index]] = frame.to_ndarray(format="rgb24")
                self.found[index] = True

    def check_found(self, episode_index: np.ndarray) -> None:
        if self.found.all():
            return
        index = int(np.flatnonzero(~self.found)[0])
        episode = int(episode_index[self.rows_at[index][0]])
        nearest = self.nearest[index]
        near = f"the nearest is at {nearest:.4f} s" if np.isfinite(nearest) else "none near it"
        raise DemoFileError(
            f"{self.folder}: {self.relative} has no frame at {self.times[index]:.4f} s "
            f"(episode {episode}), {near}"
        )

    def _check_size(self, height: int, width: int) -> None:
        if (height, width, 3) != self.shape:
            raise DemoFileError(
                f"{self.folder}: feature {self.name} frames are {[height, width, 3]}, "
                f"{INFO_PATH} says {list(self.shape)}"
            )


def _spans(times: np.ndarray) -> list[tuple[float, float]]:
    """The sorted `times` as stretches with no gap over SEEK_GAP_S: each is decoded from
    the keyframe before its start."""
    breaks = np.flatnonzero(np.diff(times) > SEEK_GAP_S) + 1
    return [(float(part[0]), float(part[-1])) for part in np.split(times, breaks)]


def _frames_from(container: Any, stream: Any, start: float) -> Iterator[Any]:
    """The stream's frames from the keyframe at or before `start` on; from its first
    frame where the seek lands past `start`."""
    # At or after the first wanted frame's time, so that a keyframe there is the one found.
    target = math.floor((start + VIDEO_TOLERANCE_S) / stream.time_base)
    container.seek(max(target, 0), stream=stream, backward=True)
    frames = container.decode(stream)
    first = next(frames, None)
    late = first is not None and first.time is not None and first.time > start + VIDEO_TOLERANCE_S
    if late and target > 0:
        container.seek(0, stream=stream, backward=True)
        frames = container.decode(stream)
        first = next(frames, None)
    if first is not None:
        yield first
        yield from frames
