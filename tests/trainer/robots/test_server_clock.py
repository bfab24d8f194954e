"""A command's age on one clock: the server's stamps turned into the trainer's time by
the offset every (stamp, arrival) pair bounds, whatever either machine's clock reads."""

from __future__ import annotations

import pytest

from trainer.robots.server_clock import DRIFT_BOUND, ServerClock

TRANSIT = 0.002  # a quick hop over the link


def age_at_arrival(clock: ServerClock, sent_at: float, arrival: float, name: str = "w") -> float:
    return arrival - clock.local_time(sent_at, arrival, name)


@pytest.mark.parametrize("server_ahead", [5.0, -0.1, 1e6, -3600.0])
def test_a_commands_age_does_not_depend_on_how_the_two_clocks_differ(server_ahead):
    clock = ServerClock()
    ours = 1000.0
    for n in range(5):  # quick commands: each one a pair
        sent = ours + n * 0.025
        assert age_at_arrival(clock, sent + server_ahead, sent + TRANSIT) == pytest.approx(
            0, abs=1e-9
        )
    # One held 0.3 s between the server's stamp and its arrival here is 0.3 s old (less
    # the drift allowance since the last pair, a second ago: 0.1 ms).
    sent = ours + 1.0
    late = age_at_arrival(clock, sent + server_ahead, sent + 0.3 + TRANSIT)
    assert late == pytest.approx(0.3, abs=2 * DRIFT_BOUND)
    assert clock.offset(sent) == pytest.approx(server_ahead - TRANSIT, abs=2 * DRIFT_BOUND)


def test_the_fastest_transit_sets_the_offset_and_no_command_is_younger_than_zero():
    clock = ServerClock(drift_bound=0)  # the arithmetic alone
    assert age_at_arrival(clock, 5000.0, 10.30) == 0  # the first pair: no better bound yet
    assert clock.offset(10.30) == pytest.approx(4989.7)
    assert age_at_arrival(clock, 5000.5, 10.799) == pytest.approx(0, abs=1e-9)  # 1 ms faster
    assert clock.offset(10.799) == pytest.approx(4989.701)
    assert age_at_arrival(clock, 5001.0, 11.5) == pytest.approx(0.201)  # 0.2 s slower


def test_stamps_of_another_clock_start_the_estimate_afresh():
    clock = ServerClock(drift_bound=0)
    age_at_arrival(clock, 5000.0, 10.0, "web-1")
    # The link reconnected to another web server process, whose clock reads far less.
    assert age_at_arrival(clock, 20.0, 11.0, "web-2") == 0
    assert clock.offset(11.0) == pytest.approx(9.0)
    assert age_at_arrival(clock, 20.5, 11.6, "web-2") == pytest.approx(0.1)


def test_an_old_pair_bounds_the_offset_less_tightly_as_the_clocks_may_drift():
    clock = ServerClock()
    age_at_arrival(clock, 100.0, 10.0)
    idle = 3600.0  # an hour without a command
    assert clock.offset(10.0 + idle) == pytest.approx(90.0 - DRIFT_BOUND * idle)
    # Our clock ran 50 ppm fast meanwhile: a fresh command is still not seen as old.
    ours = 10.0 + idle * (1 + 50e-6)
    assert age_at_arrival(clock, 100.0 + idle, ours + TRANSIT) == 0
