"""Resume as users type it: every path form of output_dir, reruns from other directories, two-phase
pretraining on the same output_dir, restore failures that say what failed, partial saves of a killed run.

The scripts run in subprocesses from the output's parent directory with relative paths (as the README
shows them), then again from another working directory; the path logic is also unit-tested for each
form, with TensorFlow's ram:// file system standing in for gs:// (a scheme, no local path).
"""

import hashlib
import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO, TESTDATA, TINY_VOCAB, run_script_main, tiny_pretraining_folder
from test_training_loop import TOY_SOURCE

from bert_tf import model_dir
from bert_tf.configs import BertConfig
from bert_tf.errors import TrainingError

pytestmark = pytest.mark.slow

TOY = {}
exec(TOY_SOURCE, TOY)  # noqa: S102 - the toy regression task: dataset_fn, make_trainer, ...
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")


# ------------------------------------------------------------------ the path logic, per form
def _save_steps(directory, steps):
    checkpoint = tf.train.Checkpoint(v=tf.Variable(1.0))
    manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=5)
    for step in steps:
        manager.save(checkpoint_number=step)


@pytest.mark.parametrize("form", ["name", "./name", "name/", "../x/name", "absolute", "symlink", "ram://"])
def test_checkpoint_paths_open_for_every_form(tmp_path, monkeypatch, form):
    """The prefixes model_dir returns open from the current directory whatever form the user typed
    (relative ones were joined twice before: r1/r1/ckpt-20)."""
    (tmp_path / "x").mkdir()
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "x")
    if form == "ram://":
        typed = f"ram://bucket/{tmp_path.name}/name"
    elif form == "absolute":
        typed = str(tmp_path / "x" / "name")
    elif form == "symlink":
        os.symlink(tmp_path / "x" / "real", tmp_path / "x" / "name")
        (tmp_path / "x" / "real").mkdir()
        typed = "name"
    elif form == "../x/name":
        monkeypatch.chdir(tmp_path / "work")
        typed = form
    else:
        typed = form
    _save_steps(typed, [10, 20])
    candidates = model_dir.checkpoint_candidates(typed)
    assert [model_dir.checkpoint_step(p) for p in candidates] == [20, 10]
    for path in candidates:
        assert tf.io.gfile.exists(path + ".index"), path
        v = tf.Variable(0.0)
        tf.train.Checkpoint(v=v).read(path).assert_existing_objects_matched()
        assert float(v.numpy()) == 1.0
    assert model_dir.latest_checkpoint(typed) == candidates[0]
    assert model_dir.has_checkpoint(typed)


def test_state_file_of_a_moved_folder_still_finds_its_checkpoints(tmp_path, monkeypatch):
    """A state file with absolute paths of where the folder was written (copied or moved since):
    the steps are taken from it, the files from where the folder is now."""
    _save_steps(str(tmp_path / "before"), [5])
    os.rename(tmp_path / "before", tmp_path / "after")
    monkeypatch.chdir(tmp_path)
    assert model_dir.latest_checkpoint("after") == os.path.join("after", "ckpt-5")


# ------------------------------------------------------------------ what a failed restore says
def _dense_model(width, extra=False):
    layers = [keras.Input((4,)), keras.layers.Dense(width, name="d1"), keras.layers.Dense(2, name="d2")]
    if extra:
        layers.append(keras.layers.Dense(3, name="d3"))
    return keras.Sequential(layers)


def test_restore_errors_name_their_kind(tmp_path):
    prefix = tf.train.Checkpoint(model=_dense_model(8)).write(str(tmp_path / "ckpt-1"))

    def kind_of(model, path):
        with pytest.raises((AssertionError, ValueError, tf.errors.OpError)) as info:
            tf.train.Checkpoint(model=model).restore(path).assert_existing_objects_matched()
        return model_dir.describe_restore_error(info.value)

    kind, detail = kind_of(_dense_model(16), prefix)
    assert kind == model_dir.RESTORE_MISMATCH
    assert "d1/kernel" in detail and "(4, 8) in the checkpoint" in detail and "(4, 16) in the model" in detail
    kind, detail = kind_of(_dense_model(8, extra=True), prefix)
    assert kind == model_dir.RESTORE_MISMATCH and "/d3/" in detail and "has no value in the checkpoint" in detail
    assert kind_of(_dense_model(8), str(tmp_path / "ckpt-9"))[0] == model_dir.RESTORE_MISSING
    data = next(p for p in os.listdir(tmp_path) if ".data-" in p)
    with open(tmp_path / data, "r+b") as f:
        f.write(b"\0" * 16)
    kind, detail = kind_of(_dense_model(8), prefix)
    assert kind == model_dir.RESTORE_CORRUPT and "Checksum" in detail and "\n" not in detail


def test_missing_files_are_not_blamed_on_the_model(tmp_path):
    run = str(tmp_path / "run")
    TOY["make_trainer"](run, steps=6).train(TOY["dataset_fn"])
    for name in os.listdir(run):
        if ".data-" in name:
            os.remove(os.path.join(run, name))
    with pytest.raises(TrainingError) as info:
        TOY["make_trainer"](run, steps=12).train(TOY["dataset_fn"])
    message = str(info.value)
    assert "(ckpt-6: missing files: " in message and "another output_dir" not in message and "\n" not in message


def test_model_of_another_size_names_the_variable_and_suggests_another_dir(tmp_path):
    run = str(tmp_path / "run")
    TOY["make_trainer"](run, steps=6).train(TOY["dataset_fn"])
    source = TOY_SOURCE.replace("keras.layers.Dense(8,", "keras.layers.Dense(5,")
    other = {}
    exec(source, other)  # noqa: S102 - the toy with a narrower hidden layer
    with pytest.raises(TrainingError) as info:
        other["make_trainer"](run, steps=12).train(other["dataset_fn"])
    message = str(info.value)
    assert "can be restored into this model (ckpt-6: does not match the model: " in message
    assert "hidden/kernel has shape (4, 8) in the checkpoint, (4, 5) in the model" in message
    assert message.endswith("use another output_dir for a different model")


def test_partial_saves_are_removed_on_start_and_complete_ones_kept(tmp_path, caplog):
    run = tmp_path / "run"
    TOY["make_trainer"](str(run), steps=6).train(TOY["dataset_fn"])
    (run / "ckpt-9_temp").mkdir()
    (run / "ckpt-9_temp" / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"\0" * 1024)
    before = sorted(os.listdir(run))
    with caplog.at_level("INFO", logger="bert_tf.training"):
        trainer = TOY["make_trainer"](str(run), steps=12)
        trainer.train(TOY["dataset_fn"])
    assert not (run / "ckpt-9_temp").exists()
    assert "removed 1 partial checkpoint save(s) of a killed run: ckpt-9_temp" in caplog.text
    assert {"ckpt-6.index", "ckpt-12.index"} <= set(os.listdir(run)) and "ckpt-6.index" in before
    assert int(trainer.global_step.numpy()) == 12


# ------------------------------------------------------------------ the input position
def test_relative_model_dir_resumes_the_same_trajectory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    full = TOY["make_trainer"]("full", steps=12)
    full.train(TOY["dataset_fn"])
    first = TOY["make_trainer"]("run", steps=12)
    first.train_steps = 6  # stopped at its checkpoint, as if killed
    first.train(TOY["dataset_fn"])
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    second = TOY["make_trainer"]("../run/", steps=12)
    assert second.restore() == os.path.join("../run/", "ckpt-6")
    second.train(TOY["dataset_fn"])
    assert int(second.global_step.numpy()) == 12
    np.testing.assert_allclose(first.step_losses + second.step_losses, full.step_losses, rtol=1e-6)


def test_another_input_resumes_weights_and_step_but_starts_the_input_over(tmp_path, caplog):
    """Two-phase training in miniature: phase 2's batches have another shape. Before, the restored input
    position of phase 1 crashed phase 2 ("Incompatible shapes")."""
    run = str(tmp_path / "run")
    TOY["make_trainer"](run, steps=6, batch=16).train(TOY["dataset_fn"])
    phase2 = TOY["make_trainer"](run, steps=12, batch=8)
    phase2.restore()
    x, y = TOY["X"][:8], TOY["Y"][:8]  # the new input's first batch
    first_batch_loss = float(np.mean((phase2.model(x).numpy() - y) ** 2))
    with caplog.at_level("INFO", logger="bert_tf.training"):
        phase2.train(TOY["dataset_fn"])
    assert int(phase2.global_step.numpy()) == 12
    assert "the input differs from the one ckpt-6 was trained on (batch; shapes: x [16, 4] -> [8, 4], " \
           "y [16, 1] -> [8, 1]); weights, optimizer and step 6 resume, the input starts from its beginning" \
           in caplog.text
    assert phase2.step_losses[0] == pytest.approx(first_batch_loss, rel=1e-5)


MIRRORED_RESUME = TOY_SOURCE + textwrap.dedent(
    """
    import json, logging, sys
    logging.basicConfig(level=logging.INFO)
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    full = make_trainer(sys.argv[1] + "/full", strategy="mirrored")
    full.train(dataset_fn)
    first = make_trainer(sys.argv[1] + "/run", strategy="mirrored")
    first.train_steps = 6
    first.train(dataset_fn)
    second = make_trainer(sys.argv[1] + "/run", strategy="mirrored")
    second.train(dataset_fn)
    print("RESULT" + json.dumps({"full": full.step_losses, "resumed": first.step_losses + second.step_losses,
                                 "step": int(second.global_step.numpy())}))
    """
)


def test_mirrored_resume_skips_the_consumed_batches(tmp_path):
    """tf.distribute's iterators cannot be saved: the resumed run skips the batches step 6 consumed, so its
    losses are the uninterrupted run's (before, it restarted the input and replayed the first batches)."""
    proc = subprocess.run([sys.executable, "-c", MIRRORED_RESUME, str(tmp_path)], capture_output=True, text=True,
                          cwd=REPO, timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert out["step"] == 12
    assert "input position: skipping the 12 batch(es) per input pipeline consumed by step 6" in proc.stderr
    np.testing.assert_allclose(out["resumed"], out["full"], rtol=1e-5)
    assert not np.allclose(out["resumed"][6:], out["full"][:6], rtol=1e-3)  # not a replay of the start


# ------------------------------------------------------------------ the scripts, as the README runs them
SEQ1, PREDS1, SEQ2, PREDS2 = 32, 5, 64, 10


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A user's folder: vocab.txt, bert_config.json and records at two sequence lengths."""
    return tiny_pretraining_folder(
        tmp_path_factory.mktemp("user"), lines=None, vocab_size=400,
        records={f"train{seq}.tfrecord": (seq, preds) for seq, preds in ((SEQ1, PREDS1), (SEQ2, PREDS2))},
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, max_position_embeddings=64)


def _pretrain_flags(*flags, prefix=""):
    """The flags of _pretrain: the common ones, then `flags`."""
    return [f"--bert_config_file={prefix}bert_config.json", f"--vocab_file={prefix}vocab.txt", "--do_train",
            "--train_batch_size=8", "--learning_rate=1e-3", "--num_warmup_steps=2", "--iterations_per_loop=5",
            "--save_checkpoints_steps=10", *flags]


def _pretrain(cwd, *flags, prefix=""):
    """run_pretraining.py in cwd; `prefix` leads the paths of the config and vocab (e.g. "../")."""
    return subprocess.run([sys.executable, str(REPO / "run_pretraining.py"), *_pretrain_flags(*flags, prefix=prefix)],
                          capture_output=True, text=True, cwd=cwd, env=ENV, timeout=600)


def _digests(folder):
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest()
            for name in sorted(os.listdir(folder)) if (folder / name).is_file()}


def test_readme_pretraining_reruns_and_two_phases_with_relative_paths(workdir, monkeypatch):
    def run(cwd, prefix, output_dir, seq, preds, steps):
        return _pretrain(cwd, f"--input_file={prefix}train{seq}.tfrecord", f"--output_dir={output_dir}",
                         f"--max_seq_length={seq}", f"--max_predictions_per_seq={preds}", f"--num_train_steps={steps}",
                         prefix=prefix)

    first = run(workdir, "", "model", SEQ1, PREDS1, 10)
    assert first.returncode == 0, first.stderr[-3000:]
    # The same command again, and from other directories with other spellings of the same folder.
    (workdir / "sub").mkdir(exist_ok=True)
    for cwd, prefix, out, steps in ((workdir, "", "model", 20), (workdir / "sub", "../", "../model/", 30),
                                    (workdir, "./", "./model", 40)):
        again = run(cwd, prefix, out, SEQ1, PREDS1, steps)
        assert again.returncode == 0, again.stderr[-3000:]
        assert f"resumed from {os.path.join(out, f'ckpt-{steps - 10}')} at step {steps - 10}" in again.stderr
        assert "input position restored from" in again.stderr
        assert model_dir.latest_checkpoint(str(workdir / "model")).endswith(f"ckpt-{steps}")

    # Phase 2 (the paper's recipe): seq-64 records on the same output_dir, to a larger total step count.
    info_before = json.loads((workdir / "model" / "bert_tf_info.json").read_text())
    assert info_before["max_seq_length"] == SEQ1
    phase2 = run(workdir, "", "model", SEQ2, PREDS2, 50)
    assert phase2.returncode == 0, phase2.stderr[-3000:]
    assert "resumed from model/ckpt-40 at step 40" in phase2.stderr
    assert "the input starts from its beginning" in phase2.stderr
    assert "input_ids [8, 32] -> [8, 64]" in phase2.stderr
    assert model_dir.latest_checkpoint(str(workdir / "model")).endswith("ckpt-50")
    info = json.loads((workdir / "model" / "bert_tf_info.json").read_text())
    assert info["max_seq_length"] == SEQ2 and info["max_predictions_per_seq"] == PREDS2

    # A refused rerun (another model size) leaves every file as it was, and says so in one line.
    before = _digests(workdir / "model")
    other = BertConfig.from_json_file(str(workdir / "bert_config.json")).to_dict()
    other["hidden_size"] = 32
    (workdir / "other_config.json").write_text(json.dumps(other))
    # (run_pretraining.py's main in this process, in the user's folder: its exit code is the error line)
    monkeypatch.chdir(workdir)
    refused = run_script_main("run_pretraining", *_pretrain_flags(
        "--bert_config_file=other_config.json", "--vocab_file=vocab.txt", f"--input_file=train{SEQ2}.tfrecord",
        "--output_dir=model", f"--max_seq_length={SEQ2}", f"--max_predictions_per_seq={PREDS2}",
        "--num_train_steps=60"))
    assert refused == (
        "error: model/bert_config.json: output_dir holds a run with a different bert_config; use a new "
        "output_dir or pass --overwrite_output_dir")
    assert _digests(workdir / "model") == before


def test_crash_before_the_first_save_leaves_the_side_files(workdir):
    """Phase 2 on records that are corrupt past their first record: the run stops in training, and the
    folder's bert_tf_info.json still describes the checkpoints in it (before, a failed phase 2 rewrote
    it with the new seq length before it had trained a step)."""
    out = workdir / "crash"
    ok = _pretrain(workdir, f"--input_file=train{SEQ1}.tfrecord", "--output_dir=crash", f"--max_seq_length={SEQ1}",
                   f"--max_predictions_per_seq={PREDS1}", "--num_train_steps=10")
    assert ok.returncode == 0, ok.stderr[-3000:]
    data = (workdir / f"train{SEQ2}.tfrecord").read_bytes()
    (workdir / "damaged.tfrecord").write_bytes(data[:2000] + b"\xff" * 4000 + data[6000:])
    before = _digests(out)
    crashed = _pretrain(workdir, "--input_file=damaged.tfrecord", "--output_dir=crash", f"--max_seq_length={SEQ2}",
                        f"--max_predictions_per_seq={PREDS2}", "--num_train_steps=20", "--save_checkpoints_steps=5")
    assert crashed.returncode != 0
    after = _digests(out)
    # Every file that was there is as it was (the run's own TensorBoard events, written once the checkpoint
    # was restored, may be new).
    assert {name: after.get(name) for name in before} == before
    assert {name for name in after if name not in before} <= {n for n in after if n.startswith("events.out.")}


def test_classifier_rerun_on_a_relative_output_dir_resumes(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "vocab.txt").write_text("\n".join(TINY_VOCAB) + "\n")
    config = dict(vocab_size=len(TINY_VOCAB), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                  intermediate_size=32, type_vocab_size=2, max_position_embeddings=64)
    (tmp_path / "model" / "bert_config.json").write_text(json.dumps(config))

    def run(epochs):
        return subprocess.run(
            [sys.executable, str(REPO / "run_classifier.py"), "--task_name=user",
             f"--data_dir={TESTDATA / 'classifier'}", "--index_column=id", "--vocab_file=model/vocab.txt",
             "--bert_config_file=model/bert_config.json", "--output_dir=out", "--max_seq_length=32",
             "--train_batch_size=8", "--do_train", "--do_eval", f"--num_train_epochs={epochs}",
             "--learning_rate=1e-3"], capture_output=True, text=True, cwd=tmp_path, env=ENV, timeout=600)

    first = run(1)
    assert first.returncode == 0, first.stderr[-3000:]
    second = run(2)  # 48 examples / 8 per batch: 6 steps an epoch
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from out/ckpt-6 at step 6" in second.stderr
    results = dict(line.split(" = ") for line in (tmp_path / "out" / "eval_results.txt").read_text().splitlines())
    assert int(results["global_step"]) == 12
