"""The placement preview past its limit: the review's ~170-byte request (100 nodes of
1024 accelerators, `actor: all`, 102,400 processes) against a preview of 80 processes
(10 nodes of 8), timed in the same run through Django's test client (the whole request),
with each answer's size. Before the limit the big one answered 33.8 MB in 1.6 s and
grew the server by 387 MB; now it answers the count per component and the limit.

It migrates an SQLite database in a temporary folder and needs no server.

    python bench/preview_limits.py [--repeats 9]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hostile_input import set_up  # noqa: E402


def body(nodes: int, accelerators: int) -> str:
    cluster = (
        f"cluster:\n  num_nodes: {nodes}\n  node_groups:\n    - label: gpu\n"
        f"      node_ranks: 0-{nodes - 1}\n"
        f"      accelerators: {{type: H100, count: {accelerators}}}\n"
    )
    return json.dumps({"cluster_yaml": cluster, "placement": {"actor": "all"}})


def timed(client, text: str, status: int, repeats: int) -> tuple[float, int]:
    times, size = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        response = client.post("/api/v1/placement/preview", text, content_type="application/json")
        times.append(time.perf_counter() - start)
        assert response.status_code == status, response.content[:300]
        size = len(response.content)
    return statistics.median(times), size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    big, small = body(100, 1024), body(10, 8)
    with tempfile.TemporaryDirectory(prefix="armature-bench-") as folder:
        client = set_up(Path(folder))
        timed(client, small, 200, 1)  # warm the request path before timing
        big_s, big_bytes = timed(client, big, 400, args.repeats)
        small_s, small_bytes = timed(client, small, 200, args.repeats)
    print(f"median of {args.repeats} requests")
    print(f"102,400 processes ({len(big)} B request): {big_s * 1e3:.2f} ms, {big_bytes:,} B answer")
    print(f"     80 processes ({len(small)} B request): {small_s * 1e3:.2f} ms, "
          f"{small_bytes:,} B answer")  # fmt: skip
    print(
        f"RESULT bench=preview_limits ours={big_s * 1e3:.3f} baseline={small_s * 1e3:.3f} "
        f"ratio={big_s / small_s:.3f} unit=ms better=lower"
    )


if __name__ == "__main__":
    main()
