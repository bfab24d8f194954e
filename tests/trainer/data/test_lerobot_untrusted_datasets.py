"""A LeRobot dataset from outside is read from its own folder only: the paths its
meta/info.json formats stay inside it, its videos are opened as MP4 files and nothing
else (no playlists, no URLs), and only the video frames its episodes use are decoded,
under a limit of decoded pixels.

The datasets here are the project's writer's, with a camera turned into a video feature
the way LeRobot's recorder stores one: an AV1 mp4 file per chunk, episodes one after
another in it, each episode's place given by `videos/<feature>/from_timestamp`.
"""

import http.server
import json
import os
import shutil
import threading
import tracemalloc
import urllib.error
import urllib.request
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainer.data import lerobot_format
from trainer.data.demo_errors import DemoFileError
from trainer.data.lerobot_format import VIDEO_PATH, read_frames, vector_feature, write_frames

CAMERA = "observation.images.front"
FPS = 10
SIZE = 64  # SVT-AV1's smallest pictures
EPISODES_FILE = "meta/episodes/chunk-000/file-000.parquet"


def video_pictures(count: int, seed: int = 0) -> np.ndarray:
    """Flat colours with a bright square that moves: pictures a lossy codec keeps close
    and never confuses with another frame's."""
    rng = np.random.default_rng(seed)
    pictures = np.empty((count, SIZE, SIZE, 3), dtype=np.uint8)
    for index in range(count):
        pictures[index] = rng.integers(30, 220, size=3)
        corner = (index * 5) % (SIZE // 2)
        pictures[index, corner : corner + SIZE // 4, corner : corner + SIZE // 4] = 250
    return pictures


def write_video(path: Path, pictures: np.ndarray, keyframe_every: int = 2) -> Path:
    """An AV1 mp4 file as LeRobot's encoder writes one (libsvtav1, yuv420p, a keyframe
    every 2 frames by default)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # SVT-AV1, run as root, puts the thread that opens an encoder at real-time priority
    # (SCHED_FIFO 99) and leaves it there: the test worker, and every process it starts
    # after (Ray heads, web servers, Chromium, trainers), would then starve the rest of
    # the machine. The thread gets its own scheduling back once the file is written.
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        with av.open(str(path), "w", format="mp4") as container:
            stream = container.add_stream("libsvtav1", rate=FPS)
            stream.width, stream.height, stream.pix_fmt = SIZE, SIZE, "yuv420p"
            stream.options = {"g": str(keyframe_every), "crf": "30", "preset": "12"}
            for picture in pictures:
                frame = av.VideoFrame.from_ndarray(picture, format="rgb24")
                container.mux(stream.encode(frame))
            container.mux(stream.encode())
    finally:
        os.sched_setscheduler(0, policy, param)
    return path


def video_dataset(
    folder: Path, video: np.ndarray, episodes: list[tuple[int, int]], keyframe_every: int = 2
) -> Path:
    """A dataset whose episodes `(first frame in the video, length)` are stretches of
    one mp4 file of the pictures `video`."""
    lengths = [length for _, length in episodes]
    rows = sum(lengths)
    write_frames(folder, {"action": vector_feature(2)}, {"action": np.zeros((rows, 2), "f4")},
                 lengths, ["look"] * rows, FPS)  # fmt: skip
    write_video(folder / VIDEO_PATH.format(video_key=CAMERA, chunk_index=0, file_index=0), video,
                keyframe_every)  # fmt: skip

    def change(info: dict) -> None:
        info["video_path"] = VIDEO_PATH
        info["features"][CAMERA] = {"dtype": "video", "shape": [SIZE, SIZE, 3],
                                    "names": ["height", "width", "channels"]}  # fmt: skip

    change_info(folder, change)
    table = pq.read_table(folder / EPISODES_FILE)
    starts = [first / FPS for first, _ in episodes]
    ends = [(first + length) / FPS for first, length in episodes]
    for column, values in (("chunk_index", [0] * len(episodes)),
                           ("file_index", [0] * len(episodes)),
                           ("from_timestamp", starts), ("to_timestamp", ends)):  # fmt: skip
        table = table.append_column(f"videos/{CAMERA}/{column}", pa.array(values))
    pq.write_table(table, folder / EPISODES_FILE)
    return folder


def change_info(folder: Path, change) -> None:
    path = folder / "meta/info.json"
    info = json.loads(path.read_text())
    change(info)
    path.write_text(json.dumps(info))


def assert_close_frames(read: np.ndarray, expected: np.ndarray) -> None:
    """A lossy codec: each frame close to its own source frame, and nearest it."""
    error = np.abs(read.astype(int)[:, None] - expected.astype(int)[None]).mean(axis=(2, 3, 4))
    assert error.diagonal().max() < 12, error.diagonal()
    assert (error.argmin(axis=1) == np.arange(len(read))).all()


@pytest.fixture
def outside(tmp_path) -> Path:
    """A folder beside the dataset with an mp4 file and a parquet file that the dataset
    must not read."""
    folder = tmp_path / "outside"
    write_video(folder / "secret.mp4", video_pictures(8, seed=7))
    write_frames(folder / "other", {"action": vector_feature(2)},
                 {"action": np.ones((3, 2), "f4")}, [3], ["other"] * 3, FPS)  # fmt: skip
    return folder


def test_the_frames_of_each_episode_are_read_from_the_video(tmp_path):
    video = video_pictures(60)
    folder = video_dataset(tmp_path / "ds", video, [(0, 4), (4, 3), (40, 5)])
    frames = read_frames(folder, [CAMERA])
    assert frames.columns[CAMERA].shape == (12, SIZE, SIZE, 3)
    expected = np.concatenate([video[0:7], video[40:45]])
    assert_close_frames(frames.columns[CAMERA], expected)


# ----- the dataset's own folder --------------------------------------------------------


def absolute_video_path(folder: Path, outside: Path) -> str:
    change_info(folder, lambda info: info.update(video_path=str(outside / "secret.mp4")))
    return CAMERA


def climbing_video_path(folder: Path, outside: Path) -> str:
    change_info(folder, lambda info: info.update(video_path="../outside/secret.mp4"))
    return CAMERA


def climbing_feature_name(folder: Path, outside: Path) -> str:
    """A video feature whose name climbs out of videos/ to an mp4 file laid out as the
    template wants."""
    name = "../../outside/cam"
    write_video(outside / "cam/chunk-000/file-000.mp4", video_pictures(8, seed=7))

    def rename(info: dict) -> None:
        info["features"][name] = info["features"].pop(CAMERA)

    change_info(folder, rename)
    table = pq.read_table(folder / EPISODES_FILE)
    table = table.rename_columns([column.replace(CAMERA, name) for column in table.column_names])
    pq.write_table(table, folder / EPISODES_FILE)
    return name


def linked_video_folder(folder: Path, outside: Path) -> str:
    """videos/<feature>/chunk-000 a link to a folder outside with the file in it."""
    (outside / "chunk").mkdir()
    shutil.copy(outside / "secret.mp4", outside / "chunk/file-000.mp4")
    chunk = folder / f"videos/{CAMERA}/chunk-000"
    shutil.rmtree(chunk)
    chunk.symlink_to(outside / "chunk", target_is_directory=True)
    return CAMERA


@pytest.mark.parametrize(
    ("escape", "message"),
    [
        (absolute_video_path, r"meta/info.json: video_path '/.*/outside/secret.mp4'.* outside "
                              r"the dataset folder"),
        (climbing_video_path, r"meta/info.json: video_path '../outside/secret.mp4'.* outside "
                              r"the dataset folder"),
        (climbing_feature_name, r"meta/info.json: video feature '../../outside/cam' has"),
        (linked_video_folder, r"meta/info.json: video_path 'videos/\{video_key\}/chunk-"
                              r"\{chunk_index:03d\}/file-\{file_index:03d\}.mp4' gives "
                              r"'videos/observation.images.front/chunk-000/file-000.mp4'.*"
                              r"resolves to .*/outside/chunk/file-000.mp4, outside the dataset"),
    ],
)  # fmt: skip
def test_a_video_outside_the_dataset_folder_is_refused(tmp_path, outside, escape, message):
    folder = video_dataset(tmp_path / "ds", video_pictures(8), [(0, 4), (4, 4)])
    feature = escape(folder, outside)
    with pytest.raises(DemoFileError, match=message) as raised:
        read_frames(folder, [feature])
    assert str(raised.value).startswith(f"{folder}: ")


def test_a_video_path_that_formats_more_than_the_indices_is_refused(tmp_path):
    folder = video_dataset(tmp_path / "ds", video_pictures(8), [(0, 8)])
    template = "videos/{video_key}/{chunk_index:/>12}/file.mp4"  # a fill of slashes
    change_info(folder, lambda info: info.update(video_path=template))
    with pytest.raises(DemoFileError, match=r"meta/info.json: video_path 'videos/\{video_key\}/"
                       r"\{chunk_index:/>12\}/file.mp4': \{chunk_index:/>12\} is not"):  # fmt: skip
        read_frames(folder, [CAMERA])


def plain_dataset(folder: Path) -> Path:
    return write_frames(folder, {"action": vector_feature(2)}, {"action": np.zeros((3, 2), "f4")},
                        [3], ["look"] * 3, FPS)  # fmt: skip


def test_a_data_path_outside_the_dataset_folder_is_refused(tmp_path):
    folder = plain_dataset(tmp_path / "ds")
    change_info(folder, lambda info: info.update(data_path="../../etc/{chunk_index}.parquet"))
    message = r"meta/info.json: data_path '../../etc/\{chunk_index\}.parquet'.* outside the dat"
    with pytest.raises(DemoFileError, match=message):
        read_frames(folder, ["action"])


def test_a_data_file_linked_from_outside_is_refused(tmp_path, outside):
    folder = plain_dataset(tmp_path / "ds")
    (folder / "data/chunk-001").symlink_to(outside / "other/data/chunk-000")
    message = r"data/chunk-001/file-000.parquet resolves to .*/outside/other/data/chunk-000/"
    with pytest.raises(DemoFileError, match=message + "file-000.parquet, outside the dataset"):
        read_frames(folder, ["action"])


# ----- MP4 files only -----------------------------------------------------------------------


@pytest.fixture
def http_server():
    """A server on loopback that records every request it gets."""
    requests: list[str] = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the standard library's name)
            requests.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *arguments):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", requests
    server.shutdown()
    server.server_close()
    thread.join()


def playlist(*segments: str) -> str:
    lines = ["#EXTM3U", "#EXT-X-VERSION:3", "#EXT-X-TARGETDURATION:1", "#EXT-X-MEDIA-SEQUENCE:0"]
    for segment in segments:
        lines += ["#EXTINF:1.0,", segment]
    return "\n".join([*lines, "#EXT-X-ENDLIST", ""])


@pytest.mark.parametrize("suffix", [".mp4", ".m3u8"])
def test_a_video_that_is_a_playlist_of_urls_fetches_nothing(tmp_path, http_server, suffix):
    url, requests = http_server
    folder = video_dataset(tmp_path / "ds", video_pictures(8), [(0, 8)])
    template = VIDEO_PATH.removesuffix(".mp4") + suffix
    change_info(folder, lambda info: info.update(video_path=template))
    video = folder / template.format(video_key=CAMERA, chunk_index=0, file_index=0)
    video.write_text(playlist(f"{url}/segment-0.ts", f"{url}/segment-1.mp4"))
    with pytest.raises(DemoFileError, match=f"video feature {CAMERA}: videos/{CAMERA}/chunk-000/"
                       rf"file-000\{suffix} cannot be decoded here as an MP4 video"):  # fmt: skip
        read_frames(folder, [CAMERA])
    assert requests == []
    with pytest.raises(urllib.error.HTTPError):  # the server does record what is fetched
        urllib.request.build_opener(urllib.request.ProxyHandler({})).open(f"{url}/probe")
    assert requests == ["/probe"]


def test_a_playlist_does_not_pull_in_a_video_from_outside(tmp_path, outside):
    # FFmpeg holds a local playlist's entries to local files, but any local file will do.
    folder = video_dataset(tmp_path / "ds", video_pictures(8), [(0, 8)])
    template = VIDEO_PATH.removesuffix(".mp4") + ".m3u8"
    change_info(folder, lambda info: info.update(video_path=template))
    video = folder / template.format(video_key=CAMERA, chunk_index=0, file_index=0)
    video.write_text(playlist(str(outside / "secret.mp4")))
    with pytest.raises(DemoFileError, match="file-000.m3u8 cannot be decoded here as an MP4"):
        read_frames(folder, [CAMERA])


# ----- only the frames used, under a limit --------------------------------------------------


def test_only_the_frames_the_episodes_use_are_decoded(tmp_path):
    video = video_pictures(400)
    folder = video_dataset(tmp_path / "ds", video, [(60, 5), (300, 5)], keyframe_every=10)
    every_frame = video.nbytes  # what decoding the whole file into memory holds
    tracemalloc.start()
    try:
        frames = read_frames(folder, [CAMERA])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < every_frame / 4, f"{peak} bytes at the peak, the whole video is {every_frame}"
    assert_close_frames(frames.columns[CAMERA], np.concatenate([video[60:65], video[300:305]]))
    # Each episode is reached from the keyframe before it: 10 frames or so are decoded each.
    read_frames(folder, [CAMERA], max_video_pixels=2 * 15 * SIZE * SIZE)


def test_video_frames_past_the_limit_of_decoded_pixels_are_refused(tmp_path):
    folder = video_dataset(tmp_path / "ds", video_pictures(20), [(0, 10), (10, 10)])
    asked = 20 * SIZE * SIZE
    read_frames(folder, [CAMERA], max_video_pixels=asked)
    with pytest.raises(DemoFileError, match=rf"the frames asked for hold {asked} video pixels, "
                       rf"over the limit of {asked - 1} \(MAX_VIDEO_PIXELS"):  # fmt: skip
        read_frames(folder, [CAMERA], max_video_pixels=asked - 1)
    assert lerobot_format.MAX_VIDEO_PIXELS >= 2**30


def test_frames_decoded_to_reach_the_ones_used_count_towards_the_limit(tmp_path):
    # One keyframe only: the frames before the episode's must be decoded to reach it.
    folder = video_dataset(tmp_path / "ds", video_pictures(200), [(190, 5)], keyframe_every=300)
    with pytest.raises(DemoFileError, match=rf"decoding videos/{CAMERA}/chunk-000/file-000.mp4 "
                       r"passes the limit of 409600 video pixels \(MAX_VIDEO_PIXELS"):  # fmt: skip
        read_frames(folder, [CAMERA], max_video_pixels=100 * SIZE * SIZE)
    assert read_frames(folder, [CAMERA], max_video_pixels=200 * SIZE * SIZE).columns[CAMERA].shape
