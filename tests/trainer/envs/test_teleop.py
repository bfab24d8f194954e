"""The operator's control of env copies: one holder, the deadman, the command window,
e-stop, and the audit of every takeover; driven through the intervention wrapper on the
built-in env, so the safety rules are checked on the actions the env executed."""

import threading

import pytest
import torch

from trainer.envs.builtin_reach import BuiltinReachEnv
from trainer.envs.intervention import InterventionEnv
from trainer.envs.teleop import TeleopRefused, TeleopSettings, TeleopSource


class Clock:
    """Time the test moves by hand: the rules are about elapsed time, not speed."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def scene(on_link_loss: str = "release"):
    clock = Clock()
    settings = TeleopSettings(deadman_s=0.2, command_window_s=0.1, on_link_loss=on_link_loss)
    source = TeleopSource(2, 7, settings, clock)
    env = InterventionEnv(BuiltinReachEnv(2, seed=0), source)
    env.reset(0, env.init_states(0)[:2])
    return env, source, clock


def step(env):
    return env.step(torch.full((2, 7), 0.5))  # what the policy would do


def test_the_operators_command_replaces_the_policys_while_held():
    env, source, clock = scene()
    source.take_over(1, "olga")
    source.command(1, "olga", [1, 0, 0, 0, 0, 0, -1], sent_at=clock.now)
    result = step(env)
    assert result.intervened.tolist() == [False, True]
    assert not result.held.any()
    assert result.applied_actions[0].tolist() == [0.5] * 7
    assert result.applied_actions[1].tolist() == [1, 0, 0, 0, 0, 0, -1]
    assert source.mode(1) == ("human", "olga")


def test_one_operator_holds_a_copy_others_are_told_who():
    _, source, _ = scene()
    source.take_over(0, "olga")
    with pytest.raises(TeleopRefused, match="copy 0 is held by olga"):
        source.take_over(0, "ivan")
    with pytest.raises(TeleopRefused, match="ivan does not hold copy 0"):
        source.command(0, "ivan", [0] * 7, sent_at=0)
    source.release(0, "olga")
    source.take_over(0, "ivan")
    assert source.mode(0) == ("human", "ivan")


def test_lost_heartbeats_release_the_copy_with_a_zero_action_first():
    env, source, clock = scene()
    source.take_over(0, "olga")
    source.command(0, "olga", [1] * 7, sent_at=clock.now)
    clock.now += 0.05
    assert step(env).applied_actions[0].tolist() == [1] * 7
    clock.now += 0.25  # no heartbeat for 0.3 s
    lost = step(env)
    # The zero action after the loss is a safety hold, not the operator's step.
    assert lost.held[0] and not lost.intervened[0]
    assert lost.applied_actions[0].tolist() == [0] * 7
    assert source.mode(0) == ("policy", None)
    after = step(env)
    assert not (after.intervened[0] or after.held[0])
    assert after.applied_actions[0].tolist() == [0.5] * 7
    (takeover,) = source.takeovers
    assert (takeover.operator, takeover.copy, takeover.reason) == ("olga", 0, "heartbeat lost")
    assert takeover.steps == 1 and takeover.ended == clock.now


def test_the_deadman_lets_go_while_the_env_is_not_stepping():
    """A worker waiting on its learner does not step; the console's reading of the
    copies (`status`, a few times a second) ends the silent operator's takeover on time,
    and the env's next step is still the zero action."""
    env, source, clock = scene()
    source.take_over(0, "olga")
    clock.now += 0.1
    assert source.status()[0].mode == "human"
    clock.now += 0.15  # no heartbeat for 0.25 s, and no step either
    assert (source.status()[0].mode, source.status()[0].holder) == ("policy", None)
    (takeover,) = source.takeovers
    assert (takeover.reason, takeover.ended, takeover.steps) == ("heartbeat lost", clock.now, 0)
    clock.now += 5.0
    lost = step(env)
    assert lost.held[0] and lost.applied_actions[0].tolist() == [0] * 7
    assert not (step(env).held[0] or len(source.takeovers) > 1)


def test_with_stop_on_link_loss_the_copy_is_held_still_until_cleared():
    env, source, clock = scene("stop")
    source.take_over(0, "olga")
    clock.now += 1.0
    for _ in range(3):
        held = step(env)
        assert held.held[0] and not held.intervened[0]
        assert held.applied_actions[0].tolist() == [0] * 7
    assert source.mode(0) == ("stopped", None)
    source.clear_stop(0, "olga")
    after = step(env)
    assert not (after.intervened[0] or after.held[0])


def test_a_command_older_than_its_window_is_never_applied():
    env, source, clock = scene()
    source.take_over(0, "olga")
    source.command(0, "olga", [1] * 7, sent_at=clock.now - 0.5)  # arrived late
    assert step(env).applied_actions[0].tolist() == [0] * 7
    source.command(0, "olga", [0.3] * 7, sent_at=clock.now)
    source.command(0, "olga", [0.9] * 7, sent_at=clock.now - 0.05)  # older than the last
    applied = step(env).applied_actions[0]
    torch.testing.assert_close(applied, torch.full((7,), 0.3))
    clock.now += 0.15  # heartbeats go on, but the command has aged out of its window
    source.heartbeat(0, "olga")
    assert step(env).applied_actions[0].tolist() == [0] * 7


def test_e_stop_holds_until_cleared_whoever_held_the_copy():
    env, source, clock = scene()
    source.take_over(1, "olga")
    source.estop(1, "ivan")
    with pytest.raises(TeleopRefused, match="copy 1 is e-stopped by ivan; clear it first"):
        source.take_over(1, "olga")
    for _ in range(3):
        clock.now += 1.0
        held = step(env)
        assert held.held[1] and not held.intervened[1]
        assert held.applied_actions[1].tolist() == [0] * 7
    assert source.takeovers[-1].reason == "e-stop by ivan"
    source.clear_stop(1, "ivan")
    after = step(env)
    assert not (after.intervened[1] or after.held[1])
    with pytest.raises(TeleopRefused, match="copy 1 is not stopped"):
        source.clear_stop(1, "ivan")


def test_only_who_pressed_an_e_stop_or_an_admin_clears_it_and_both_are_recorded():
    env, source, clock = scene()
    source.estop(0, "ivan")
    source.estop(0, "olga")  # pressed again: still ivan's to clear
    with pytest.raises(TeleopRefused, match="copy 0 was e-stopped by ivan: only they or an "
                                            "admin may clear it"):  # fmt: skip
        source.clear_stop(0, "olga")
    assert source.mode(0) == ("e-stopped", "ivan")
    assert step(env).held[0]
    source.clear_stop(0, "ada", override=True)
    assert source.mode(0) == ("policy", None)
    assert [(s.action, s.operator, s.stopped_by, s.override) for s in source.stops] == [
        ("pressed", "ivan", None, False), ("cleared", "ada", "ivan", True),
    ]  # fmt: skip


def test_bad_requests_are_named():
    _, source, clock = scene()
    with pytest.raises(TeleopRefused, match="there is no copy 5: copies are 0..1"):
        source.take_over(5, "olga")
    source.take_over(0, "olga")
    with pytest.raises(TeleopRefused, match="an action is 7 finite numbers, not \\[3\\]"):
        source.command(0, "olga", [1, 2, 3], sent_at=clock.now)
    with pytest.raises(TeleopRefused, match="7 finite numbers"):
        source.command(0, "olga", [float("nan")] * 7, sent_at=clock.now)


def test_a_command_returns_the_one_action_the_env_will_apply():
    env, source, clock = scene()
    source.take_over(0, "olga")
    # 1e39 is a finite number (beyond float32's range): clamped like 1e30, not refused.
    action = source.command(0, "olga", [1e30, -1e30, 1e39, 0.25, -7, 0, 1], sent_at=clock.now)
    assert action == [1.0, -1.0, 1.0, 0.25, -1.0, 0.0, 1.0]
    assert step(env).applied_actions[0].tolist() == action
    # A late packet is a heartbeat, not an action: nothing for a robot's driver.
    assert source.command(0, "olga", [0.5] * 7, sent_at=clock.now - 0.01) is None


def test_operator_messages_from_another_thread_while_the_env_steps():
    env, source, clock = scene()
    source.take_over(0, "olga")
    stop = threading.Event()

    def operator():
        while not stop.is_set():
            source.command(0, "olga", [0.2] * 7, sent_at=clock.now)

    thread = threading.Thread(target=operator)
    thread.start()
    try:
        for _ in range(200):
            result = step(env)
            applied = result.applied_actions[0]
            # The operator's command, a human's step; or a zero action held before the
            # first command arrived, a safety hold.
            if result.intervened[0]:
                assert torch.equal(applied, torch.full((7,), 0.2)) and not result.held[0]
            else:
                assert torch.equal(applied, torch.zeros(7)) and result.held[0]
    finally:
        stop.set()
        thread.join()
    source.release(0, "olga")
    assert source.takeovers[-1].steps == 200 and source.takeovers[-1].reason == "released"


def test_the_built_in_env_renders_a_top_down_view_for_the_console():
    env = BuiltinReachEnv(2, seed=0)
    env.reset(0, env.init_states(0)[:2])
    frame = env.render(1, size=64)
    assert frame.shape == (64, 64, 3) and frame.dtype == torch.uint8

    def pixel(position):  # the scene's (x, y) to the frame's row and column
        x, y = position[0].item(), position[1].item()
        return frame[round((1 - y) / 2 * 63), round((x + 1) / 2 * 63)].tolist()

    for marker, colour in enumerate([[220, 50, 50], [50, 190, 70], [60, 90, 230]]):
        assert pixel(env._markers[1, marker]) == colour
    # The effector with its gripper open is a ring: the background shows at its centre.
    assert pixel(env._effector[1]) == [40, 40, 40]
    env.step(torch.tensor([[0, 0, 0, 0, 0, 0, 1.0]] * 2))  # close the gripper
    frame = env.render(1, size=64)
    assert pixel(env._effector[1]) == [240, 240, 240]
    with pytest.raises(ValueError, match="copy 2 is not in 0..1"):
        env.render(2)


def test_marks_end_the_episode_a_success_terminal_a_failure_truncated():
    env, source, _ = scene()
    source.mark(0, "olga", success=True)
    source.mark(1, "ivan", success=False)
    result = step(env)
    assert result.terminated.tolist() == [True, False]
    assert result.truncated.tolist() == [False, True]
    assert result.success.tolist() == [True, False]
    assert result.reward[0] == 1.0
    assert [status.last_success for status in source.status()] == [True, False]
    assert [status.episode for status in source.status()] == [1, 1]
    assert not step(env).done.any()  # a mark ends one episode only


def test_a_lost_link_lets_go_at_once_with_a_zero_action_or_holds_still():
    for on_link_loss, mode_after in (("release", "policy"), ("stop", "stopped")):
        env, source, clock = scene(on_link_loss)
        source.take_over(0, "olga")
        source.take_over(1, "ivan")
        source.command(0, "olga", [1, 0, 0, 0, 0, 0, 1], sent_at=clock.now)
        assert source.link_lost("olga") == [0]
        result = step(env)
        # Olga's copy gets its zero action, Ivan's (no command yet) is held still.
        assert result.held.tolist() == [True, True] and not result.intervened.any()
        assert result.applied_actions[0].tolist() == [0.0] * 7
        assert source.mode(0)[0] == mode_after and source.mode(1) == ("human", "ivan")
        assert source.takeovers[-1].reason == "operator link lost"
        assert step(env).held[0].item() is (on_link_loss == "stop")


def test_steps_keep_to_the_control_rate_while_a_human_holds_a_copy():
    import time

    source = TeleopSource(2, 7, TeleopSettings(control_hz=50.0), clock=time.monotonic)
    env = InterventionEnv(BuiltinReachEnv(2, seed=0), source)
    env.reset(0, env.init_states(0)[:2])
    source.take_over(0, "olga")
    started = time.monotonic()
    for _ in range(10):
        source.heartbeat(0, "olga")
        step(env)
    held = time.monotonic() - started
    assert held >= 9 / 50.0  # 10 steps at 50 Hz take at least 9 periods


@pytest.mark.parametrize("real_time", [False, True])
def test_in_real_time_steps_keep_to_the_control_rate_with_no_one_holding(real_time, monkeypatch):
    import time

    waits = []
    sleep = time.sleep
    monkeypatch.setattr(time, "sleep", lambda s: (waits.append(s), sleep(s)))
    settings = TeleopSettings(control_hz=50.0, real_time=real_time)
    source = TeleopSource(2, 7, settings, clock=time.monotonic)
    env = InterventionEnv(BuiltinReachEnv(2, seed=0), source)
    env.reset(0, env.init_states(0)[:2])
    started = time.monotonic()
    for _ in range(10):
        step(env)
    assert bool(waits) is real_time  # unpaced, no step ever waits
    if real_time:
        assert time.monotonic() - started >= 9 / 50.0  # at least 9 periods


def test_the_first_step_that_applies_a_command_reports_it():
    env, source, clock = scene()
    applied = []
    source.on_applied = lambda command_id, at: applied.append((command_id, at))
    source.take_over(0, "olga")
    source.command(0, "olga", [1, 0, 0, 0, 0, 0, 1], sent_at=clock.now, command_id="c1")
    step(env)
    step(env)
    assert applied == [("c1", clock.now)]


def test_the_console_sees_the_episode_as_policy_human_and_held_segments():
    env, source, clock = scene()
    step(env)
    step(env)
    source.take_over(0, "olga")
    for _ in range(3):
        source.command(0, "olga", [1] * 7, sent_at=clock.now)
        step(env)
    clock.now += 0.3  # the operator goes silent: one zero action, then the policy
    step(env)
    step(env)
    first, second = source.status()
    assert first.timeline == [("policy", 2), ("human", 3), ("held", 1), ("policy", 1)]
    assert second.timeline == [("policy", 7)]
    assert first.episode_step == sum(steps for _, steps in first.timeline) - 1
    source.mark(0, "olga", success=True)
    step(env)  # the episode ends: the next one starts a timeline of its own
    assert source.status()[0].timeline == []
    step(env)
    assert source.status()[0].timeline == [("policy", 1)]
