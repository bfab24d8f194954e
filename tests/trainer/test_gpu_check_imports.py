"""The GPU check (`bench/gpu.py`, `tests/gpu/`) runs from a copy of the repo on a bare
CUDA machine: what it imports must not reach for the control plane, Ray, the link's
WebSocket client or the optional model and dataset libraries."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NOT_ON_A_BARE_GPU_MACHINE = [
    "django", "channels", "celery", "redis", "psycopg", "ray", "websockets", "requests",
    "scipy", "orjson", "transformers", "peft", "pyarrow", "av", "tensorboard", "PIL",
]  # fmt: skip
IMPORT_BLOCKED = f"""
import importlib.abc, sys
blocked = {NOT_ON_A_BARE_GPU_MACHINE!r}
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ImportError(f"{{name}} is not on a bare GPU machine")
sys.meta_path.insert(0, Refuse())
sys.argv = ["bench/gpu.py"]
sys.path.insert(0, {str(REPO)!r})
import bench.gpu
import tests.gpu.test_gpu_training
import tests.trainer.runtime.test_gradient_sync  # its rows feed the graphed-PPO GPU tests
# The CPU tests the check runs beside it, on the GPU there.
import tests.trainer.test_devices, tests.trainer.models.test_plan_cache
import tests.trainer.algorithms.test_rlpd_learner
print("imported")
"""
# ... and `python -m trainer run` trains there and writes its metrics: two PPO
# iterations of the CPU suite's.
LEARN_BLOCKED = IMPORT_BLOCKED.replace(
    'print("imported")',
    f"""
import tempfile
from pathlib import Path
from trainer.commands.run import run
folder = Path(tempfile.mkdtemp())
status = run([str(Path({str(REPO)!r}) / "examples" / "builtin_ppo.yaml"), "runner.iterations=2",
              "runner.progress=false", "env.num_parallel_envs=4", "algorithm.data_batch_size=4",
              f"runner.output_dir={{folder}}"])
print(status, len((folder / "metrics.jsonl").read_text().splitlines()),
      (folder / "tensorboard").exists())
""",
)


def test_the_gpu_check_imports_nothing_a_bare_cuda_machine_lacks():
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_BLOCKED], capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip() == "imported", done.stderr[-2000:]


def test_a_run_on_a_bare_cuda_machine_trains_and_logs_without_tensorboard():
    done = subprocess.run(
        [sys.executable, "-c", LEARN_BLOCKED], capture_output=True, text=True, timeout=300
    )
    assert done.stdout.strip().endswith("0 2 False"), done.stderr[-2000:]
    assert "no tensorboard/ folder for this run" in done.stderr
