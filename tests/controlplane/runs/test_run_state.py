"""One function owns every state change; illegal moves raise."""

import pytest

from controlplane.runs.models import Run, RunState
from controlplane.runs.state import IllegalTransition, transition
from tests.runs import queued_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def run():
    return queued_run("e")


def test_the_happy_path_records_timestamps_and_events(run):
    transition(run.pk, RunState.SUBMITTING)
    transition(run.pk, RunState.RUNNING)
    done = transition(run.pk, RunState.SUCCEEDED, "all good")
    assert done.submitted_at and done.started_at and done.finished_at
    assert done.exit_reason == "all good"
    moves = [(e.data["from"], e.data["to"]) for e in done.events.filter(kind="state")]
    assert moves == [("queued", "submitting"), ("submitting", "running"), ("running", "succeeded")]


@pytest.mark.parametrize(
    "path",
    [
        [RunState.RUNNING],
        [RunState.SUCCEEDED],
        [RunState.CANCELLED, RunState.RUNNING],
        [RunState.SUBMITTING, RunState.FAILED, RunState.SUCCEEDED],
        [RunState.SUBMITTING, RunState.RUNNING, RunState.QUEUED],
    ],
)
def test_illegal_moves_raise_and_change_nothing(run, path):
    *legal, illegal = path
    for state in legal:
        transition(run.pk, state)
    before = Run.objects.get(pk=run.pk).state
    with pytest.raises(IllegalTransition, match=f"cannot go from {before} to {illegal}"):
        transition(run.pk, illegal)
    assert Run.objects.get(pk=run.pk).state == before


def test_moving_to_the_current_state_is_a_no_op(run):
    transition(run.pk, RunState.SUBMITTING)
    transition(run.pk, RunState.SUBMITTING)
    assert run.events.filter(kind="state").count() == 1
