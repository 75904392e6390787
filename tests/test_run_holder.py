"""One run per output_dir (bert_tf/run_holder.py): the holder file claimed, refused, taken over and released,
in this process (local disk, and TensorFlow's ram:// file system standing in for gs://), then through the
scripts: a second run_pretraining.py and a run_classifier.py on a live run's folder stop in one line and
change nothing; after kill -9 of the holder the next run takes over and resumes."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from conftest import REPO, TESTDATA, run_script_main, tiny_pretraining_folder

from bert_tf import run_holder
from bert_tf.errors import OutputDirHeld
from bert_tf.run_holder import HOLDER_FILE, RunHolder, holding, process_start

HOST = socket.gethostname()


def _elsewhere(pid, host="other-host"):
    """The identity of a run on another host (its process cannot be looked up from here)."""
    return dict(host=host, pid=pid, process_start="1")


def _dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _listing(folder):
    """{relative path: (size, mtime_ns)} of every file under folder."""
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            st = os.stat(path)
            out[os.path.relpath(path, folder)] = (st.st_size, st.st_mtime_ns)
    return out


def _record(folder):
    with open(os.path.join(folder, HOLDER_FILE), encoding="utf-8") as f:
        return json.load(f)


# ------------------------------------------------------------------ in this process
def test_no_tensorflow_at_import():
    code = "import sys, bert_tf.run_holder; assert 'tensorflow' not in sys.modules, 'tensorflow imported'"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_claim_refuse_naming_the_holder_release(tmp_path):
    out = str(tmp_path / "a" / "out")  # folders the claim makes
    first = RunHolder(out, me=_elsewhere(4242), heartbeat_every=0.05).claim()
    record = _record(out)
    assert (record["host"], record["pid"], record["token"]) == ("other-host", 4242, first.token)
    assert record["started"] == record["heartbeat"] and abs(record["started"] - time.time()) < 5
    time.sleep(0.3)
    assert _record(out)["heartbeat"] > record["heartbeat"]  # the daemon thread refreshes it
    assert _record(out)["started"] == record["started"]
    open(os.path.join(out, "ckpt-1.index"), "w").close()
    first._stop.set()  # no more heartbeats, so the listing cannot change while the second run looks
    first._thread.join()
    before = _listing(tmp_path)

    with pytest.raises(OutputDirHeld) as info:
        RunHolder(out, heartbeat_every=60).claim()
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{out}: another run holds this output_dir: pid 4242 on host other-host since ")
    assert time.strftime("%Y-%m-%d", time.gmtime(record["started"])) in message
    assert "(last heartbeat 0 s ago)" in message and f"delete {out}/{HOLDER_FILE}" in message
    assert _listing(tmp_path) == before  # the refused run wrote nothing
    assert run_holder.held_message(out) == message

    first.release()
    assert sorted(os.listdir(out)) == ["ckpt-1.index"]  # its folder kept: the run wrote there
    assert run_holder.held_message(out) is None
    second = RunHolder(out, heartbeat_every=60).claim()
    assert _record(out)["pid"] == os.getpid() and _record(out)["process_start"] == process_start(os.getpid())
    second.release()
    assert not os.path.exists(os.path.join(out, HOLDER_FILE))


def test_a_refused_or_empty_claim_leaves_no_folder(tmp_path):
    out = tmp_path / "new" / "out"
    RunHolder(str(out), heartbeat_every=60).claim().release()
    assert not (tmp_path / "new").exists()  # made by the claim, empty at the release: removed


def test_dead_pid_on_this_host_is_taken_over(tmp_path, caplog):
    out = str(tmp_path)
    dead = _dead_pid()
    RunHolder(out, me=dict(host=HOST, pid=dead, process_start="1"), heartbeat_every=60).claim()._stop.set()
    with caplog.at_level("WARNING", logger="bert_tf.run_holder"):
        holder = RunHolder(out, heartbeat_every=60).claim()
    assert _record(out)["token"] == holder.token
    assert f"took over {out} from pid {dead} on host {HOST} since " in caplog.text
    assert "its process is gone" in caplog.text
    holder.release()


def test_a_live_process_holds_and_a_reused_pid_does_not(tmp_path):
    parent = os.getppid()  # alive, on this host, not this process
    live = RunHolder(str(tmp_path / "live"), me=dict(host=HOST, pid=parent, process_start=process_start(parent)),
                     heartbeat_every=60).claim()
    with pytest.raises(OutputDirHeld, match=f"pid {parent} on host {HOST}"):
        RunHolder(str(tmp_path / "live"), heartbeat_every=60).claim()
    live.release()
    # The same pid, but the process it named started at another time: the pid was reused, the holder is gone.
    RunHolder(str(tmp_path / "reused"), me=dict(host=HOST, pid=parent, process_start="7"), heartbeat_every=60).claim()
    assert run_holder.held_message(str(tmp_path / "reused")) is None
    RunHolder(str(tmp_path / "reused"), heartbeat_every=60).claim().release()


def test_stale_heartbeat_is_taken_over_and_the_old_holder_lets_go(tmp_path, caplog):
    out = str(tmp_path)
    old = RunHolder(out, me=_elsewhere(11), heartbeat_every=60).claim()  # silent from now on
    with pytest.raises(OutputDirHeld, match="pid 11 on host other-host"):
        RunHolder(out, stale_after=0.5, heartbeat_every=60).claim()
    time.sleep(0.6)
    with caplog.at_level("WARNING", logger="bert_tf.run_holder"):
        new = RunHolder(out, stale_after=0.5, heartbeat_every=60).claim()
    assert "took over" in caplog.text and "no heartbeat for more than 0.5 s" in caplog.text
    with caplog.at_level("ERROR", logger="bert_tf.run_holder"):
        assert old.heartbeat() is False  # it finds the new token, says so and stops
    assert f"this run no longer holds output_dir: pid {os.getpid()} on host {HOST}" in caplog.text
    old.release()
    assert _record(out)["token"] == new.token  # the old holder's release leaves the new one's file
    new.release()


def test_a_holder_that_keeps_beating_is_never_stale(tmp_path):
    live = RunHolder(str(tmp_path), me=_elsewhere(12), heartbeat_every=0.05).claim()
    time.sleep(0.8)
    with pytest.raises(OutputDirHeld, match="pid 12"):
        RunHolder(str(tmp_path), stale_after=0.5, heartbeat_every=60).claim()
    live.release()


def test_unreadable_holder_file_is_taken_over(tmp_path):
    (tmp_path / HOLDER_FILE).write_text("{not json")
    RunHolder(str(tmp_path), heartbeat_every=60).claim().release()
    assert not (tmp_path / HOLDER_FILE).exists()


@pytest.mark.parametrize("where", ["local", "ram://"])
@pytest.mark.parametrize("start", ["empty", "gone holder"])
def test_simultaneous_claims_have_one_winner(tmp_path, where, start):
    """Six runs (on other hosts) claim at once: one wins, the others name it. On ram:// (gs://'s stand-in: no
    links) and when taking over a gone holder, by the write, settle and read-back protocol."""
    out = str(tmp_path) if where == "local" else f"ram://holder/{tmp_path.name}/{start.replace(' ', '_')}"
    if start == "gone holder":
        RunHolder(out, me=_elsewhere(99), heartbeat_every=60).claim()._stop.set()
        record = RunHolder(out).current()
        record["started"] -= 3600
        record["heartbeat"] -= 3600
        RunHolder(out).file.write(json.dumps(record))
    holders = [RunHolder(out, me=_elsewhere(100 + i, f"host-{i}"), heartbeat_every=60, settle=0.3) for i in range(6)]
    outcomes = {}
    barrier = threading.Barrier(len(holders))

    def claim(h):
        barrier.wait()
        try:
            h.claim()
            outcomes[h.me["pid"]] = "won"
        except OutputDirHeld as e:
            outcomes[h.me["pid"]] = str(e)

    threads = [threading.Thread(target=claim, args=(h,)) for h in holders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [pid for pid, outcome in outcomes.items() if outcome == "won"]
    assert len(winners) == 1, outcomes
    assert RunHolder(out).current()["pid"] == winners[0]
    for pid, outcome in outcomes.items():
        if pid != winners[0]:
            assert f"pid {winners[0]} on host host-{winners[0] - 100} since" in outcome, outcome
    next(h for h in holders if h.me["pid"] == winners[0]).release()
    assert RunHolder(out).current() is None


def test_nested_holds_share_one_and_other_workers_hold_nothing(tmp_path):
    out = str(tmp_path)
    with holding(out) as outer:
        with holding(out + "/") as inner:  # the same folder, spelled another way
            assert inner is outer
        assert _record(out)["token"] == outer.token  # the inner block did not release it
        assert run_holder.held_message(out) is None  # this process's own hold
    assert not os.path.exists(os.path.join(out, HOLDER_FILE))
    with holding(out, chief=False) as none:
        assert none is None and not os.listdir(out)


def test_overwrite_output_dir_refuses_a_folder_a_live_run_holds(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "ckpt-5.index").write_text("x")
    parent = os.getppid()
    live = RunHolder(str(out), me=dict(host=HOST, pid=parent, process_start=process_start(parent)),
                     heartbeat_every=60).claim()
    code = run_script_main("run_pretraining", f"--output_dir={out}", "--overwrite_output_dir",
                           f"--bert_config_file={tmp_path / 'bert_config.json'}",
                           f"--input_file={tmp_path / 'train.tfrecord'}")
    live.release()
    assert isinstance(code, str) and code.startswith(f"error: --overwrite_output_dir: {out}: another run holds this "
                                                     f"output_dir: pid {parent} on host {HOST}"), code
    assert (out / "ckpt-5.index").exists()


# ------------------------------------------------------------------ through the scripts
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")


@pytest.mark.slow
def test_second_run_on_a_live_output_dir_stops_and_kill_9_is_taken_over(tmp_path):
    """run_pretraining.py holds out; a second run_pretraining.py and a run_classifier.py on out (the holder
    paused with SIGSTOP, so its files stand still) stop in one line naming it and change no file; after
    kill -9 of the holder the same command takes over (its process is gone) and resumes from its checkpoint."""
    data = tiny_pretraining_folder(tmp_path, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=32, max_position_embeddings=64)

    def pretrain(steps):
        return [sys.executable, str(REPO / "run_pretraining.py"), "--bert_config_file=bert_config.json",
                "--vocab_file=vocab.txt", "--input_file=train.tfrecord", "--output_dir=out", "--do_train",
                "--max_seq_length=32", "--max_predictions_per_seq=5", "--train_batch_size=8",
                f"--num_train_steps={steps}", "--num_warmup_steps=2", "--learning_rate=1e-3",
                "--iterations_per_loop=5", "--save_checkpoints_steps=10"]

    out = tmp_path / "out"
    holder = subprocess.Popen(pretrain(100000), cwd=data, env=ENV, stderr=subprocess.PIPE, text=True)
    try:
        start = time.time()
        while not (out / "checkpoint").exists():
            assert holder.poll() is None, holder.stderr.read()[-3000:]
            assert time.time() - start < 300
            time.sleep(0.2)
        holder.send_signal(signal.SIGSTOP)
        record = _record(out)
        assert (record["host"], record["pid"]) == (HOST, holder.pid)
        before = _listing(out)
        second = subprocess.run(pretrain(20), cwd=data, env=ENV, capture_output=True, text=True, timeout=300)
        classifier = subprocess.run(
            [sys.executable, str(REPO / "run_classifier.py"), "--task_name=user",
             f"--data_dir={TESTDATA / 'classifier'}", "--index_column=id", "--vocab_file=vocab.txt",
             "--bert_config_file=bert_config.json", "--output_dir=out", "--max_seq_length=32",
             "--train_batch_size=8", "--do_train", "--num_train_epochs=1"],
            cwd=data, env=ENV, capture_output=True, text=True, timeout=300)
        assert _listing(out) == before  # every file of the live run as it was: names, sizes, mtimes
        for proc in (second, classifier):
            assert proc.returncode == 1, proc.stderr[-3000:]
            errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
            assert errors == [proc.stderr.strip().splitlines()[-1]], proc.stderr[-3000:]
            assert errors[0].startswith(f"error: out: another run holds this output_dir: pid {holder.pid} on host "
                                        f"{HOST} since "), errors
            assert "last heartbeat" in errors[0]
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert _record(out)["pid"] == holder.pid  # a kill -9 leaves its holder file
    step = int(open(out / "checkpoint").read().split('"')[1].rsplit("-", 1)[1])
    third = subprocess.run(pretrain(step + 5), cwd=data, env=ENV, capture_output=True, text=True, timeout=300)
    assert third.returncode == 0, third.stderr[-3000:]
    assert f"took over out from pid {holder.pid} on host {HOST} since " in third.stderr
    assert "its process is gone" in third.stderr
    assert f"resumed from out/ckpt-{step} at step {step}" in third.stderr
    assert f"ckpt-{step + 5}" in (out / "checkpoint").read_text()
    assert not (out / HOLDER_FILE).exists()  # released at its clean end
