"""Names of the channel-layer groups, in one place."""

SYSTEM_STATUS = "system.status"
RUNS_LIST = "runs.list"


def run_group(run_id: int) -> str:
    return f"run.{run_id}"


def trainer_group(run_id: int) -> str:
    """The open trainer links of a run (closed when the run ends)."""
    return f"trainer.{run_id}"


def console_group(run_id: int) -> str:
    """The operator consoles watching a run's robots."""
    return f"console.{run_id}"


def sweep_group(sweep_id: int) -> str:
    """The pages watching a sweep."""
    return f"sweep.{sweep_id}"
