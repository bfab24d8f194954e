"""The link's spool on the trainer's side: every line carries the MAC of the attempt's
spool key, and reading it back passes over any line that is not a message instead of
failing on it."""

import json

from tests.processes import free_port
from trainer.link.client import TrainerLink
from trainer.link.environment import link_from_env
from trainer.link.protocol import Metrics, Progress
from trainer.link.spool import Spool, is_authentic, line_mac, split_line

KEY = "the-attempts-spool-key"
ANY_MAC = b"0" * 64


def test_each_line_is_the_payload_signed_with_the_attempts_key(tmp_path):
    spool = Spool(tmp_path, attempt=3, key=KEY)
    payload = Progress(seq=1, step=1, total=2).payload()
    assert spool.append(payload)
    spool.close()
    (line,) = (tmp_path / "attempt-3.jsonl").read_bytes().splitlines()
    mac, signed = split_line(line)
    assert signed.decode() == payload
    assert mac == line_mac(KEY.encode(), signed) and is_authentic(KEY.encode(), mac, signed)
    assert not is_authentic(b"another-attempts-key", mac, signed)
    assert not is_authentic(KEY.encode(), mac, signed + b" ")


def test_lines_that_are_not_messages_are_passed_over(tmp_path):
    spool = Spool(tmp_path, attempt=1, key=KEY)
    spool.append(Progress(seq=1, step=1, total=9).payload())
    bad = [
        b'{"seq":"1"}', b'{"seq": 1.5}', b'{"seq": true}', b"[1, 2]", b'"text"', b"{}",
        b"[" * 100_000 + b"]" * 100_000,  # deeper than the parser goes
        b'{"seq": 7, "x": "\xff\xfe"}',  # not UTF-8
        b"{not json",
    ]  # fmt: skip
    with (tmp_path / "attempt-1.jsonl").open("ab") as raw:
        for payload in bad:
            raw.write(ANY_MAC + b" " + payload + b"\n")
        raw.write(json.dumps({"seq": 5}).encode() + b"\n")  # no MAC at all
    spool.append(Metrics(seq=2, step=1, time=1.0, values={"loss": 0.5}).payload())
    with (tmp_path / "attempt-1.jsonl").open("ab") as raw:
        raw.write(ANY_MAC + b' {"seq": 3, "type": "prog')  # cut short by a crash
    assert [seq for seq, _ in spool.messages()] == [1, 2]
    assert [seq for seq, _ in spool.messages(after=1)] == [2]
    assert spool.last_seq() == 2
    spool.close()


def test_a_restarted_trainer_continues_a_spool_holding_bad_lines(tmp_path):
    first = Spool(tmp_path, attempt=1, key=KEY)
    first.append(Progress(seq=1, step=1, total=9).payload())
    first.close()
    with (tmp_path / "attempt-1.jsonl").open("ab") as raw:
        raw.write(ANY_MAC + b' {"seq":"1"}\n')
    link = TrainerLink(
        f"http://127.0.0.1:{free_port()}", 7, "tok", spool=Spool(tmp_path, attempt=1, key=KEY)
    )
    link.progress(2, 9)
    assert link.pending() == 2  # the first process's message and the new one, seq 2
    assert link.close(timeout=0) is False
    seqs = [seq for seq, _ in Spool(tmp_path, attempt=1, key=KEY).messages()]
    assert seqs == [1, 2]


def test_the_link_signs_its_spool_with_the_key_from_the_jobs_environment(tmp_path, caplog):
    environ = {"ARMATURE_URL": f"http://127.0.0.1:{free_port()}", "ARMATURE_RUN_ID": "7",
               "ARMATURE_RUN_TOKEN": "tok", "ARMATURE_RUN_ATTEMPT": "2"}  # fmt: skip
    unsigned = link_from_env(environ, run_folder=tmp_path / "without-key")
    unsigned.progress(1, 2)
    assert unsigned.close(timeout=0) is False
    assert not (tmp_path / "without-key").exists()  # no spool the control plane would refuse
    assert "ARMATURE_SPOOL_KEY not set, so no spool" in caplog.text

    link = link_from_env({**environ, "ARMATURE_SPOOL_KEY": KEY}, run_folder=tmp_path)
    link.progress(1, 2)
    assert link.close(timeout=0) is False
    (line,) = (tmp_path / "link-spool" / "attempt-2.jsonl").read_bytes().splitlines()
    assert is_authentic(KEY.encode(), *split_line(line))
