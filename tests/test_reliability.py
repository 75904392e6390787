"""Fault injection: damaged checkpoints, kills, NaN, full disks, corrupt data, mismatched runs.

Every fault below leaves the run either resuming from its last *complete*
checkpoint or stopping with one line that names the file and the problem, with
nothing existing damaged. Most cases run in this process on the toy model of
tests/test_training_loop.py (the generic Trainer) or on a tiny BERT through
run_pretraining.py imported in-process; a subprocess is used only where a real
process death is the fault. Cases already covered elsewhere are listed in
COVERED_ELSEWHERE (the fault table in docs/reliability.md cites both).
"""

import contextlib
import glob
import hashlib
import importlib
import json
import logging
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO, tiny_pretraining_folder
from test_training_loop import TOY_SOURCE

from bert_tf.configs import BertConfig
from bert_tf.data import pipelines, pretraining_job, schema
from bert_tf.errors import TrainingError
from bert_tf.resources import SAMPLE_CORPUS
from bert_tf.runners.pretraining import run_pretraining
from bert_tf.runners.pretraining_config import PretrainingConfig
from bert_tf.training import strategy as strategy_lib
from bert_tf.training.settings import TrainSettings

pytestmark = pytest.mark.slow

TOY = {}
exec(TOY_SOURCE, TOY)  # noqa: S102 - the toy regression task: dataset_fn, make_trainer, ...
SEQ, PREDS = 32, 5
TINY = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
            max_position_embeddings=64, type_vocab_size=2)

# Bad inputs and faults whose behaviour is already tested next to the code that handles them.
COVERED_ELSEWHERE = {
    "bert_config.json: missing field, wrong type, hidden % heads, bad JSON":
        ["test_configs.py::test_validation_errors", "test_configs.py::test_file_errors"],
    "checkpoint of another size / vocab size (TF1 init_checkpoint)":
        ["test_checkpoints.py::test_mismatched_config_errors"],
    "GLUE/CSV: wrong column count, unknown label, non-UTF-8, empty file":
        ["test_glue.py::test_bad_rows_give_one_line_errors"],
    "vocab of another size than the checkpoint's (fine-tuning, export, extract_features)":
        ["test_run_classifier.py::test_vocab_that_does_not_fit_the_checkpoint_is_one_line",
         "test_export.py::test_checkpoint_export_refuses_a_vocab_that_does_not_fit_the_checkpoint",
         "test_extract_features.py::test_script_takes_a_checkpoint_folder_and_refuses_another_vocab"],
    "SQuAD: answer_start not matching the text":
        ["test_squad.py::test_answer_start_that_does_not_match_the_text_is_an_error"],
    "SQuAD: missing keys, empty context, bad JSON or bytes":
        ["test_squad.py::test_malformed_squad_files_name_the_place", "test_squad.py::test_invalid_json_and_bytes"],
    "SQuAD: max_seq_length too small for the query":
        ["test_squad.py::test_too_long_question_for_the_window_is_refused"],
    "max_seq_length > max_position_embeddings":
        ["test_gate.py::test_pretraining_flags_no_run_can_use_are_one_line",
         "test_run_classifier.py::test_bad_input_is_one_line_and_leaves_output_alone"],
    "TFRecords with other max_seq_length / max_predictions_per_seq (first file)":
        ["test_run_pretraining.py::test_record_length_mismatch_is_one_line",
         "test_run_pretraining.py::test_bad_flags_fail_in_one_line"],
    "SIGKILL at a random step, SIGTERM: resume equals the uninterrupted run":
        ["test_run_pretraining.py::test_sigkill_then_rerun_resumes_and_sigterm_saves",
         "test_training_loop.py::test_resume_continues_the_same_trajectory",
         "test_training_loop.py::test_sigterm_saves_a_checkpoint"],
    "a second run on a live run's output_dir; kill -9 of the holder, then a rerun":
        ["test_run_holder.py::test_second_run_on_a_live_output_dir_stops_and_kill_9_is_taken_over",
         "test_run_holder.py::test_stale_heartbeat_is_taken_over_and_the_old_holder_lets_go"],
    "NaN loss (toy Trainer, poisoned batch)": ["test_training_loop.py::test_non_finite_loss_stops_naming_the_step"],
}


def test_cases_covered_elsewhere_exist():
    for refs in COVERED_ELSEWHERE.values():
        for ref in refs:
            path, name = ref.split("::")
            assert f"def {name}(" in (REPO / "tests" / path).read_text(), ref


# ------------------------------------------------------------------ shared fixtures and helpers
@pytest.fixture(scope="module")
def toy_reference(tmp_path_factory):
    """An uninterrupted toy run: 12 steps, checkpoints every 3 (ckpt-3 ... ckpt-12)."""
    model_dir = str(tmp_path_factory.mktemp("toy_full"))
    trainer = TOY["make_trainer"](model_dir, save_checkpoints_steps=3)
    trainer.train(TOY["dataset_fn"])
    return model_dir, trainer


def _weights(trainer):
    return [v.numpy() for v in trainer.model.weights]


def _ckpt_steps(model_dir):
    return sorted(int(p.rsplit("-", 1)[1][: -len(".index")]) for p in glob.glob(os.path.join(model_dir, "ckpt-*.index")))


def _digest(model_dir, step):
    """sha256 over the files of ckpt-<step>: proof that a checkpoint was not rewritten."""
    h = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(model_dir, f"ckpt-{step}.*"))):
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Vocab, bert_config.json and pretraining TFRecords (seq 32, 5 predictions) from the KJV sample."""
    return tiny_pretraining_folder(tmp_path_factory.mktemp("reliability_data"), lines=None,
                                   records={"train.tfrecord": (SEQ, PREDS)}, **TINY)


@contextlib.contextmanager
def _imported_run_pretraining():
    """run_pretraining.py imported here; afterwards its flags (and bert_flags' shared ones) are removed."""
    sys.path.insert(0, str(REPO))
    try:
        module = importlib.import_module("run_pretraining")
    finally:
        sys.path.pop(0)
    try:
        yield module
    finally:
        for name in ("run_pretraining", "bert_flags"):
            for flag in module.FLAGS.get_flags_for_module(name):
                if flag.name in module.FLAGS:
                    delattr(module.FLAGS, flag.name)
        sys.modules.pop("run_pretraining", None)


@pytest.fixture(scope="module")
def script():
    with _imported_run_pretraining() as module:
        yield module


def pretrain(script, data, out, **flags):
    """Runs run_pretraining.py's main in this process; returns its exit code (0, 143 or the 'error: ...' line)."""
    args = dict(bert_config_file=data / "bert_config.json", input_file=data / "train.tfrecord", output_dir=out,
                max_seq_length=SEQ, max_predictions_per_seq=PREDS, do_train=True, train_batch_size=8,
                num_train_steps=4, num_warmup_steps=0, learning_rate=1e-3, iterations_per_loop=2,
                save_checkpoints_steps=2)
    args.update(flags)
    handlers, level = logging.root.handlers[:], logging.root.level
    script.FLAGS.unparse_flags()
    script.FLAGS(["run_pretraining.py"] + [f"--{k}={v}" for k, v in args.items() if v is not None])
    try:
        script.main([])
        return 0
    except SystemExit as e:
        return e.code
    finally:
        logging.root.handlers[:], logging.root.level = handlers, level


def assert_one_line_error(code, *fragments):
    assert isinstance(code, str) and code.startswith("error: ") and "\n" not in code, code
    for fragment in fragments:
        assert fragment in code, code


@pytest.fixture(scope="module")
def pretrained_dir(script, data, tmp_path_factory):
    """A finished 4-step pretraining run (ckpt-2, ckpt-4) that tests copy and then damage."""
    out = tmp_path_factory.mktemp("pretrained") / "run"
    assert pretrain(script, data, out) == 0
    assert _ckpt_steps(str(out)) == [2, 4]
    return out


def _copy(src, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(src, dst)
    return dst


# ------------------------------------------------------------------ 1. kills and half-written checkpoints
def _truncate_data(d, step):
    [path] = glob.glob(os.path.join(d, f"ckpt-{step}.data-*"))
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _zero_tail(d, step):
    [path] = glob.glob(os.path.join(d, f"ckpt-{step}.data-*"))
    size = os.path.getsize(path)
    with open(path, "r+b") as f:  # the file has its full size but the last writes never reached the disk
        f.seek(size // 2)
        f.write(b"\0" * (size - size // 2))


def _remove(d, step, suffix):
    for path in glob.glob(os.path.join(d, f"ckpt-{step}{suffix}")):
        os.remove(path)


def _temp_dir_only(d, step):
    # Killed inside the save: TensorFlow's temporary shard exists, the final files do not.
    _remove(d, step, ".*")
    os.makedirs(os.path.join(d, f"ckpt-{step}_temp"))
    with open(os.path.join(d, f"ckpt-{step}_temp", "part-00000-of-00001.data-00000-of-00001"), "wb") as f:
        f.write(b"\x01" * 100)


# damage -> the step the rerun must resume from (ckpt-12 is the newest of ckpt-3..12).
CHECKPOINT_DAMAGE = {
    "data file truncated": (lambda d: _truncate_data(d, 12), 9),
    "data file tail never written (zeros)": (lambda d: _zero_tail(d, 12), 9),
    "index missing (state file names a checkpoint that is not there)": (lambda d: _remove(d, 12, ".index"), 9),
    "data file missing": (lambda d: _remove(d, 12, ".data-*"), 9),
    "two newest damaged": (lambda d: (_truncate_data(d, 12), _remove(d, 9, ".index")), 6),
    "killed inside the save (temp shard only)": (lambda d: _temp_dir_only(d, 12), 9),
    "state file lost": (lambda d: os.remove(os.path.join(d, "checkpoint")), 12),
}


@pytest.mark.parametrize("damage", list(CHECKPOINT_DAMAGE))
def test_damaged_checkpoint_is_never_resumed_from(toy_reference, tmp_path, damage):
    ref_dir, ref = toy_reference
    model_dir = str(tmp_path / "run")
    shutil.copytree(ref_dir, model_dir)
    make_damage, resume_step = CHECKPOINT_DAMAGE[damage]
    make_damage(model_dir)
    # Before the fix a missing index made latest_checkpoint() None and the run silently started over.
    trainer = TOY["make_trainer"](model_dir, save_checkpoints_steps=3)
    restored = trainer.restore()
    assert restored == os.path.join(model_dir, f"ckpt-{resume_step}")
    assert int(trainer.global_step.numpy()) == resume_step
    trainer.train(TOY["dataset_fn"])
    # Retraining from the last complete checkpoint reproduces the uninterrupted run (same losses, same weights).
    np.testing.assert_allclose(trainer.step_losses, ref.step_losses[resume_step:], rtol=1e-6)
    for a, b in zip(_weights(trainer), _weights(ref), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    if resume_step < 12:  # the damaged checkpoint was written again, complete
        assert tf.train.latest_checkpoint(model_dir) == os.path.join(model_dir, "ckpt-12")
        trainer = TOY["make_trainer"](model_dir, save_checkpoints_steps=3)
        assert trainer.restore() == os.path.join(model_dir, "ckpt-12")


def test_no_usable_checkpoint_is_one_line_not_a_fresh_start(toy_reference, tmp_path):
    ref_dir, _ = toy_reference
    model_dir = str(tmp_path / "run")
    shutil.copytree(ref_dir, model_dir)
    for step in (3, 6, 9, 12):
        _truncate_data(model_dir, step)
    trainer = TOY["make_trainer"](model_dir, save_checkpoints_steps=3)
    with pytest.raises(TrainingError) as info:
        trainer.train(TOY["dataset_fn"])
    # Truncated data is damage, not another model: the message says so and does not send the user elsewhere.
    assert str(info.value).startswith(f"{model_dir}: none of its 4 checkpoint(s) can be restored "
                                      "(ckpt-12: unreadable or corrupt data: ")
    assert "another output_dir" not in str(info.value)
    assert "\n" not in str(info.value)


KILL_IN_SAVE = TOY_SOURCE + textwrap.dedent(
    """
    import os, signal, sys
    from tensorflow.python.checkpoint import checkpoint_management

    update = checkpoint_management.update_checkpoint_state_internal

    def update_or_die(save_dir, model_checkpoint_path, *args, **kwargs):
        # ckpt-9's files are written; SIGKILL arrives before the state file names them.
        if model_checkpoint_path.endswith("ckpt-9"):
            os.kill(os.getpid(), signal.SIGKILL)
        return update(save_dir, model_checkpoint_path, *args, **kwargs)

    checkpoint_management.update_checkpoint_state_internal = update_or_die
    make_trainer(sys.argv[1], save_checkpoints_steps=3).train(dataset_fn)
    """
)


def test_sigkill_inside_a_checkpoint_save_then_rerun(toy_reference, tmp_path):
    _, ref = toy_reference
    model_dir = str(tmp_path / "run")
    proc = subprocess.run([sys.executable, "-c", KILL_IN_SAVE, model_dir], capture_output=True, text=True,
                          cwd=REPO, timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert tf.train.latest_checkpoint(model_dir).endswith("ckpt-6")  # the state file never saw ckpt-9
    # The same command again: ckpt-9 is complete (its index and data check out), so the run goes on from it.
    trainer = TOY["make_trainer"](model_dir, save_checkpoints_steps=3)
    trainer.train(TOY["dataset_fn"])
    np.testing.assert_allclose(trainer.step_losses, ref.step_losses[9:], rtol=1e-6)
    for a, b in zip(_weights(trainer), _weights(ref), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------ 2. NaN / Inf loss
def test_nan_loss_names_the_step_and_keeps_the_last_good_checkpoint(script, data, pretrained_dir, tmp_path):
    out = _copy(pretrained_dir, tmp_path)
    before = _digest(str(out), 4), (out / "checkpoint").read_bytes()
    # A learning rate of 1e12 from step 5 on: the weights blow up and the loss becomes NaN within a few steps.
    code = pretrain(script, data, out, num_train_steps=20, learning_rate=1e12)
    assert_one_line_error(code, "stopped without saving", f"(last good checkpoint: {out}/ckpt-4)")
    step = int(re.search(r"loss is (?:nan|inf|-inf) at step (\d+);", code).group(1))
    assert 4 < step <= 20
    assert _ckpt_steps(str(out)) == [2, 4]
    assert (_digest(str(out), 4), (out / "checkpoint").read_bytes()) == before


# ------------------------------------------------------------------ 3. disk full
@contextlib.contextmanager
def file_size_limit(nbytes):
    """Writes past `nbytes` in any file fail with EFBIG, as on a full disk (no root or tmpfs needed)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write instead of killing the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def test_disk_full_during_a_checkpoint_write(toy_reference, tmp_path):
    ref_dir, ref = toy_reference
    model_dir = str(tmp_path / "run")
    shutil.copytree(ref_dir, model_dir)
    for step in (9, 12):
        _remove(model_dir, step, ".*")
    state = tf.train.get_checkpoint_state(model_dir)
    del state.all_model_checkpoint_paths[2:]
    state.model_checkpoint_path = state.all_model_checkpoint_paths[-1]
    with open(os.path.join(model_dir, "checkpoint"), "w") as f:
        f.write(str(state))
    good = _digest(model_dir, 6)
    size = os.path.getsize(glob.glob(os.path.join(model_dir, "ckpt-6.data-*"))[0])
    trainer = TOY["make_trainer"](model_dir, save_checkpoints_steps=3)
    with file_size_limit(size // 2), pytest.raises(TrainingError) as info:
        trainer.train(TOY["dataset_fn"])
    message = str(info.value)
    assert message.startswith(f"{model_dir}: cannot write checkpoint ckpt-9 (") and "\n" not in message
    assert message.endswith(f"earlier checkpoints are intact (latest: {model_dir}/ckpt-6)")
    # Nothing of ckpt-9 is left to look complete, ckpt-6 is untouched and still resumes the same trajectory.
    assert not glob.glob(os.path.join(model_dir, "ckpt-9*"))
    assert _digest(model_dir, 6) == good and _ckpt_steps(model_dir) == [3, 6]
    again = TOY["make_trainer"](model_dir, save_checkpoints_steps=3)
    again.train(TOY["dataset_fn"])
    np.testing.assert_allclose(again.step_losses, ref.step_losses[6:], rtol=1e-6)


@pytest.fixture
def full_disk(tmp_path):
    """A 256 KB tmpfs under tmp_path (needs root: skipped elsewhere); the test fills it."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_real_disk_full_during_training(toy_reference, full_disk):
    ref_dir, _ = toy_reference
    model_dir = str(full_disk / "run")
    shutil.copytree(ref_dir, model_dir, ignore=shutil.ignore_patterns("ckpt-9.*", "ckpt-12.*", "checkpoint"))
    with open(os.path.join(model_dir, "checkpoint"), "w") as f:
        f.write('model_checkpoint_path: "ckpt-6"\nall_model_checkpoint_paths: "ckpt-3"\n'
                'all_model_checkpoint_paths: "ckpt-6"\n')
    good = _digest(model_dir, 6)
    with open(full_disk / "filler", "wb", buffering=0) as f, pytest.raises(OSError, match="No space left"):
        while True:
            f.write(b"\0" * 4096)
    trainer = TOY["make_trainer"](model_dir, save_checkpoints_steps=3)
    # The summary writer fails first (logged, training goes on); the checkpoint write stops the run.
    with pytest.raises(TrainingError) as info:
        trainer.train(TOY["dataset_fn"])
    d = re.escape(model_dir)
    assert re.fullmatch(rf"{d}: cannot write checkpoint ckpt-9 \({d}/ckpt-9_temp/\S+; No space left on device\); "
                        rf"earlier checkpoints are intact \(latest: {d}/ckpt-6\)", str(info.value)), str(info.value)
    assert not glob.glob(os.path.join(model_dir, "ckpt-9*"))
    assert _digest(model_dir, 6) == good and _ckpt_steps(model_dir) == [3, 6]


def test_disk_full_while_writing_tfrecords(data, tmp_path):
    out = tmp_path / "train.tfrecord"
    out.write_bytes(b"an earlier, complete output")
    config = pretraining_job.PretrainingDataConfig(
        input_file=SAMPLE_CORPUS, output_file=str(out), vocab_file=str(data / "vocab.txt"), max_seq_length=SEQ,
        max_predictions_per_seq=PREDS, dupe_factor=1, num_workers=1)
    with file_size_limit(64 * 1024), pytest.raises(OSError, match="File too large"):
        pretraining_job.create_pretraining_data(config)
    # The earlier file is untouched and no partial file is left under any name.
    assert out.read_bytes() == b"an earlier, complete output"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.tfrecord"]


# ------------------------------------------------------------------ 4. corrupt / truncated TFRecords
def _small_file(data, path, n=40, damage=None):
    """`n` records of the real data; damage: 'crc' flips a byte inside record 10, 'cut' ends inside record n-1."""
    records = list(schema.read_records(str(data / "train.tfrecord")))[:n]
    framed = [schema.frame_record(r) for r in records]
    blob = bytearray(b"".join(framed))
    offset_10 = sum(len(f) for f in framed[:10])
    if damage == "crc":
        blob[offset_10 + 12 + 5] ^= 0xFF
    elif damage == "cut":
        blob = blob[: len(blob) - len(framed[-1]) // 2]
    elif damage == "first":
        blob[12 + 5] ^= 0xFF
    path.write_bytes(bytes(blob))
    return offset_10, sum(len(f) for f in framed[:-1])


@pytest.mark.parametrize("damage", ["crc", "cut", "first"])
def test_corrupt_tfrecord_is_one_line_naming_the_file(script, data, tmp_path, damage):
    bad = tmp_path / "shard-00001.tfrecord"
    offset_10, offset_last = _small_file(data, bad, damage=damage)
    out = tmp_path / "out"
    code = pretrain(script, data, out, input_file=f"{data / 'train.tfrecord'},{bad}")
    where = {"crc": f"at byte {offset_10} (bad data CRC, after 10 good records)",
             "cut": f"at byte {offset_last} (truncated record, after 39 good records)",
             "first": "at byte 0 (bad data CRC, after 0 good records)"}[damage]
    # ("first": found before training, where the lengths of each file's first record are checked.)
    assert_one_line_error(code, f"{bad}: corrupt TFRecord data {where}; pass --skip_corrupt_records to read past it")
    assert not glob.glob(str(out / "ckpt-*"))


def test_skip_corrupt_records_counts_and_trains(data, tmp_path, caplog):
    bad = tmp_path / "shard-00001.tfrecord"
    offset_10, _ = _small_file(data, bad, damage="crc")
    scan = pipelines.scan_record_file(str(bad))
    assert (scan.records, scan.corrupt_at, scan.problem, scan.skipped) == (10, offset_10, "bad data CRC", 29)
    # The count is what tf.data really reads with errors ignored: the 10 records before the damage.
    assert sum(1 for _ in tf.data.TFRecordDataset(str(bad)).ignore_errors()) == scan.records
    config = PretrainingConfig(
        bert_config=BertConfig.from_json_file(str(data / "bert_config.json")),
        input_files=[str(data / "train.tfrecord"), str(bad)], output_dir=str(tmp_path / "out"), max_seq_length=SEQ,
        max_predictions_per_seq=PREDS, do_train=True, train_batch_size=8, num_train_steps=4, num_warmup_steps=0,
        train=TrainSettings(iterations_per_loop=2, save_checkpoints_steps=4), skip_corrupt_records=True)
    with caplog.at_level(logging.WARNING, logger="bert_tf"):
        run_pretraining(config, strategy_lib.get_strategy("one_device"))
    [line] = [r.getMessage() for r in caplog.records if "skip_corrupt_records" in r.getMessage()]
    assert "corrupt data in 1 of 2 file(s)" in line and "29 intact record(s) after it" in line
    assert f"{bad}: corrupt TFRecord data at byte {offset_10}" in line
    assert _ckpt_steps(str(tmp_path / "out")) == [4]


# ------------------------------------------------------------------ 5. data made with other lengths
def test_a_later_shard_with_other_lengths_is_one_line(script, data, tmp_path):
    other = tmp_path / "other-000.tfrecord"
    pretraining_job.create_pretraining_data(pretraining_job.PretrainingDataConfig(
        input_file=SAMPLE_CORPUS, output_file=str(other), vocab_file=str(data / "vocab.txt"), max_seq_length=48,
        max_predictions_per_seq=8, dupe_factor=1, num_workers=1))
    code = pretrain(script, data, tmp_path / "out", input_file=f"{data / 'train.tfrecord'},{other}")
    assert_one_line_error(code, f"{other}: records were written with max_seq_length=48 (flag says 32), "
                          "max_predictions_per_seq=8 (flag says 5)")
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ 6. config / vocab / checkpoint mismatches
@pytest.mark.parametrize("values, fragment", [
    (dict(TINY), "missing required field vocab_size"),
    (dict(TINY, vocab_size="300"), "vocab_size must be an integer, got '300'"),
    (dict(TINY, vocab_size=300, num_attention_heads=3), "hidden_size 16 is not a multiple of num_attention_heads 3"),
])
def test_bad_bert_config_via_the_script(script, data, tmp_path, values, fragment):
    path = tmp_path / "bert_config.json"
    path.write_text(json.dumps(values))
    code = pretrain(script, data, tmp_path / "out", bert_config_file=path)
    assert_one_line_error(code, str(path), fragment)
    assert not (tmp_path / "out").exists()


def test_vocab_larger_than_the_model_via_the_script(script, data, tmp_path):
    config = BertConfig.from_json_file(str(data / "bert_config.json"))
    small = tmp_path / "bert_config.json"
    config.replace(vocab_size=config.vocab_size - 50).to_json_file(str(small))
    code = pretrain(script, data, tmp_path / "out", bert_config_file=small, vocab_file=data / "vocab.txt")
    assert_one_line_error(code, str(data / "vocab.txt"), f"but the model's vocab_size is {config.vocab_size - 50}")
    assert not (tmp_path / "out").exists()


def test_init_checkpoint_of_another_size_via_the_script(script, data, pretrained_dir, tmp_path):
    config = BertConfig.from_json_file(str(data / "bert_config.json"))
    bigger = tmp_path / "bert_config.json"
    config.replace(hidden_size=32, intermediate_size=64).to_json_file(str(bigger))
    code = pretrain(script, data, tmp_path / "out", bert_config_file=bigger,
                    init_checkpoint=pretrained_dir / "ckpt-4")
    assert_one_line_error(code, f"{pretrained_dir / 'ckpt-4'}: checkpoint does not match the model built from "
                          "bert_config")
    assert code.count(str(pretrained_dir)) == 1
    assert not glob.glob(str(tmp_path / "out" / "ckpt-*"))


# ------------------------------------------------------------------ 9. output_dir of another run
def test_output_dir_of_another_config_is_refused_unless_overwritten(script, data, pretrained_dir, tmp_path):
    out = _copy(pretrained_dir, tmp_path)
    config = BertConfig.from_json_file(str(data / "bert_config.json"))
    other = tmp_path / "bert_config.json"
    config.replace(hidden_size=32, intermediate_size=64).to_json_file(str(other))
    before = _digest(str(out), 4)
    code = pretrain(script, data, out, bert_config_file=other)
    assert_one_line_error(code, f"{out}/bert_config.json: output_dir holds a run with a different bert_config",
                          "--overwrite_output_dir")
    assert _digest(str(out), 4) == before and BertConfig.from_json_file(str(out / "bert_config.json")) == config
    # Told to overwrite: the old run is cleared and a fresh one trained (from step 0, with the new config).
    (out / "notes.txt").write_text("not part of the run")
    assert pretrain(script, data, out, bert_config_file=other, overwrite_output_dir=True, num_train_steps=2) == 0
    assert _ckpt_steps(str(out)) == [2]
    assert BertConfig.from_json_file(str(out / "bert_config.json")).hidden_size == 32
    assert (out / "notes.txt").read_text() == "not part of the run"


def test_overwrite_never_deletes_the_init_checkpoint(script, data, pretrained_dir, tmp_path):
    out = _copy(pretrained_dir, tmp_path)
    code = pretrain(script, data, out, init_checkpoint=out / "ckpt-2", overwrite_output_dir=True)
    assert_one_line_error(code, f"--overwrite_output_dir would delete {out / 'ckpt-2'}")
    assert _ckpt_steps(str(out)) == [2, 4]


def test_finetuning_output_dir_of_another_model_is_refused(tmp_path):
    from bert_tf.configs import TaskRecord
    from bert_tf.errors import CheckpointError
    from bert_tf.model_dir import write_finetuned

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n")
    small = BertConfig(vocab_size=4, **TINY)
    out = tmp_path / "out"
    record = TaskRecord("classification", label_list=("a", "b"))
    write_finetuned(str(out), small, str(vocab), record, do_lower_case=True, max_seq_length=32)
    (out / "checkpoint").write_text('model_checkpoint_path: "ckpt-5"\n')  # a run's checkpoints are there
    bigger = small.replace(hidden_size=32, num_hidden_layers=2)
    with pytest.raises(CheckpointError, match=r"holds the checkpoints of a run with a different bert_config "
                       r"\(hidden_size, num_hidden_layers\); use a new --output_dir or pass --overwrite_output_dir"):
        write_finetuned(str(out), bigger, str(vocab), record, do_lower_case=True, max_seq_length=32)
    assert BertConfig.from_json_file(str(out / "bert_config.json")) == small


# ------------------------------------------------------------------ 10. a worker of a 2-worker run dies
def _free_ports(n):
    import socket

    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def test_dead_worker_is_reported_and_a_restart_of_both_resumes(data, tmp_path):
    out = tmp_path / "out"
    workers = [f"localhost:{p}" for p in _free_ports(2)]

    def start(index, steps):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", TF_CONFIG=json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}))
        flags = dict(bert_config_file=data / "bert_config.json", input_file=data / "train.tfrecord", output_dir=out,
                     max_seq_length=SEQ, max_predictions_per_seq=PREDS, do_train=True, train_batch_size=8,
                     num_train_steps=steps, num_warmup_steps=0, learning_rate=1e-3, iterations_per_loop=2,
                     save_checkpoints_steps=4, distribution_strategy="multi_worker")
        cmd = [sys.executable, str(REPO / "run_pretraining.py")] + [f"--{k}={v}" for k, v in flags.items()]
        return subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=REPO, env=env)

    chief, other = start(0, 100_000), start(1, 100_000)
    try:
        deadline = time.time() + 300
        while not tf.train.latest_checkpoint(str(out)):
            assert chief.poll() is None and other.poll() is None, (chief.stderr.read() or "")[-2000:]
            assert time.time() < deadline, "no checkpoint within 300 s"
            time.sleep(0.2)
        other.send_signal(signal.SIGKILL)
        killed_at = time.time()
        # The survivor does not hang: the next collective fails at once (the peer's connection resets).
        _, stderr = chief.communicate(timeout=120)
    finally:
        for proc in (chief, other):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert chief.returncode == 1 and time.time() - killed_at < 120
    last = stderr.strip().splitlines()[-1]
    latest = tf.train.latest_checkpoint(str(out))
    assert re.fullmatch(r"error: a worker of the multi-worker cluster is gone at step \d+ \(\w+Error: .*\); "
                        rf"restart every worker with the same command to resume from {re.escape(latest)}", last), last
    # The same command on both workers resumes from that checkpoint (no input position under MWMS: the data restarts).
    step = int(latest.rsplit("-", 1)[1])
    chief, other = start(0, step + 4), start(1, step + 4)
    results = [proc.communicate(timeout=300) for proc in (chief, other)]
    assert chief.returncode == 0 and other.returncode == 0, results[0][1][-2000:] + results[1][1][-2000:]
    assert f"resumed from {latest} at step {step}" in results[0][1]
    assert tf.train.latest_checkpoint(str(out)) == f"{out}/ckpt-{step + 4}"
