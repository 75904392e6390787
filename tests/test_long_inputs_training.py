"""Window trainings, each a tiny run of run_classifier's library: the aggregate's starting bias, each-then-aggregate,
each-then-calibrate, clean negatives in slots, window selection rounds, and max without the absent label."""

import json

import numpy as np
import pytest
from long_inputs import (
    MARKER,
    ROOM,
    SEQ,
    TINY_CONFIG_OVERRIDES,  # noqa: F401  (conftest's tiny_model reads it)
    _doc,
    _long_task_split,
    _run,
    _settings,
    _write_split,
)

from bert_tf.tasks import glue
from bert_tf.tasks.windows import any_start_bias


@pytest.mark.parametrize("aggregation", ["any", "max"])
def test_a_fresh_head_trained_on_the_any_aggregate_starts_at_the_datas_share(tiny_model, tmp_path, aggregation):
    """Training on the aggregate under any, the head's bias starts at any_start_bias of the training inputs
    (here 3 of 4 "no", 3 windows each); under max it starts at zero. A learning rate of ~0 keeps the start."""
    import tensorflow as tf

    rng = np.random.default_rng(3)
    rows = [(_doc(rng, 3 * ROOM), "no") for _ in range(24)] + \
        [(_doc(rng, 3 * ROOM, int(rng.integers(ROOM, 3 * ROOM))), "yes") for _ in range(8)]
    rows = [rows[i] for i in rng.permutation(len(rows))]
    share = 24 / 32
    _write_split(tmp_path / "train.tsv", rows)
    _write_split(tmp_path / "dev.tsv", rows[:8])
    out = tmp_path / "out"
    _run(tiny_model, tmp_path, out, learning_rate=1e-12, do_train=True, num_train_epochs=1, long_inputs="windows",
         doc_stride=ROOM, window_aggregation=aggregation, window_training="aggregate")
    reader = tf.train.load_checkpoint(str(out))
    [name] = [n for n, _ in tf.train.list_variables(str(out)) if "output_bias" in n and "OPTIMIZER" not in n]
    want = any_start_bias(share, 3, 2) if aggregation == "any" else np.zeros(2, np.float32)
    np.testing.assert_allclose(reader.get_tensor(name), want, atol=1e-6)
    if aggregation == "any":
        assert want[0] == pytest.approx(np.log(share ** (1 / 3) / (1 - share ** (1 / 3))), rel=1e-5)


def _two_stage_run(tiny_model, tmp_path, caplog, aggregation, training, **extra):
    """Trains 2 epochs of --window_training=`training` on 32 documents of 3 windows (16 windows a batch: 12 steps
    in the first stage) and evaluates on 8: (out, its first stage's folder, the run's keyword arguments, its
    results, its stage log lines)."""
    import logging

    from bert_tf.runners.classifier import CLEAN_NEGATIVES_DIR, EACH_WINDOW_DIR

    rng = np.random.default_rng(5)
    _write_split(tmp_path / "train.tsv", _long_task_split(rng, 32))
    _write_split(tmp_path / "dev.tsv", _long_task_split(rng, 8))
    out = tmp_path / "out"
    kw = dict(do_train=True, do_eval=True, num_train_epochs=2, long_inputs="windows", doc_stride=ROOM,
              window_aggregation=aggregation, window_training=training, **extra)
    with caplog.at_level(logging.INFO, logger="bert_tf"):
        results = _run(tiny_model, tmp_path, out, **kw)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"{training}, stage")]
    return out, out / (CLEAN_NEGATIVES_DIR if training == "clean_negatives" else EACH_WINDOW_DIR), kw, results, lines


def test_each_then_aggregate_trains_the_aggregate_from_the_each_window_model_in_one_resumable_run(
        tiny_model, tmp_path, caplog):
    """--window_training=each_then_aggregate: 2 epochs of each window alone (32 documents of 3 windows, 16 windows
    a batch: 12 steps) into out/each_window, then half an epoch (a quarter of 2) of their aggregate under any from
    that model, round(16 / 3) = 5 documents a batch (3 steps), into out. The second stage starts from the first's
    head, not from the fresh any start; only out is evaluated; a rerun trains nothing and scores the same."""
    import tensorflow as tf

    from bert_tf.runners.classifier import EACH_WINDOW_DIR

    out, first, kw, results, lines = _two_stage_run(tiny_model, tmp_path, caplog, "any", "each_then_aggregate")
    assert lines == [f"each_then_aggregate, stage 1 of 2: each window alone for 2 epoch(s) -> {first}",
                     f"each_then_aggregate, stage 2 of 2: their aggregate from {first} for 0.5 epoch(s), 5 inputs "
                     f"per batch (3.0 windows each) -> {out}"], lines
    assert tf.train.latest_checkpoint(str(first)).endswith("ckpt-12")
    assert tf.train.latest_checkpoint(str(out)).endswith("ckpt-3")
    assert json.loads((first / "bert_tf_info.json").read_text())["window_training"] == "each"
    assert json.loads((out / "bert_tf_info.json").read_text())["window_training"] == "each_then_aggregate"
    assert (out / "eval_results.txt").is_file() and not (first / "eval_results.txt").exists()

    def bias(folder):
        [name] = [n for n, _ in tf.train.list_variables(str(folder)) if "output_bias" in n and "OPTIMIZER" not in n]
        return tf.train.load_checkpoint(str(folder)).get_tensor(name)

    # 3 steps at <= 1e-3 move a weight by ~1e-2 at most (the original's AdamW has no bias correction: its first
    # steps are up to ~3x the rate); a fresh head would start at the any bias (~1.35, 0).
    assert np.abs(bias(out) - bias(first)).max() < 0.05, (bias(out), bias(first))
    assert np.abs(bias(out) - any_start_bias(0.5, 3, 2)).max() > 1.0
    again = _run(tiny_model, tmp_path, out, **kw)
    assert tf.train.latest_checkpoint(str(first)).endswith("ckpt-12")
    assert tf.train.latest_checkpoint(str(out)).endswith("ckpt-3")
    assert again["dev"]["eval_accuracy"] == results["dev"]["eval_accuracy"]
    assert again["dev"]["eval_loss"] == pytest.approx(results["dev"]["eval_loss"], rel=1e-5)
    # A folder that holds another training's run is refused before the first stage trains into it.
    with pytest.raises(ValueError, match="holds a run with window_training='each', not 'each_then_aggregate'"):
        _run(tiny_model, tmp_path, first, **kw)
    assert not (first / EACH_WINDOW_DIR).exists()


def test_each_then_calibrate_moves_only_the_output_layer_of_the_each_window_model(tiny_model, tmp_path, caplog):
    """--window_training=each_then_calibrate: out/each_window trains 2 epochs of each window alone (12 steps); out
    gets that model at the same step with only the output layer changed, by the shift and scale the log reports
    (weights x scale, bias + shift on "no", then x scale), and is the one evaluated; a rerun trains and
    calibrates nothing."""
    import logging
    import re

    import tensorflow as tf

    out, first, kw, results, lines = _two_stage_run(tiny_model, tmp_path, caplog, "max", "each_then_calibrate")
    assert len(lines) == 2 and lines[0].startswith("each_then_calibrate, stage 1 of 2: each window alone"), lines
    found = re.fullmatch(r"each_then_calibrate, stage 2 of 2: the 'no' logit of every window shifted by "
                         r"([-+][\d.]+) and every logit scaled by ([\d.e+-]+), fitted on the max of the windows of 32 "
                         r"training inputs -> (.*) \(step 12\)", lines[1])
    assert found and found.group(3) == str(out), lines[1]
    shift, scale = float(found.group(1)), float(found.group(2))
    assert tf.train.latest_checkpoint(str(first)).endswith("ckpt-12")
    assert tf.train.latest_checkpoint(str(out)).endswith("ckpt-12")
    assert json.loads((out / "bert_tf_info.json").read_text())["window_training"] == "each_then_calibrate"
    assert results["dev"]["global_step"] == 12 and (out / "eval_results.txt").is_file()
    trained, calibrated = tf.train.load_checkpoint(str(first)), tf.train.load_checkpoint(str(out))
    names = [n for n, _ in tf.train.list_variables(str(first)) if n.startswith("model/") and "OPTIMIZER" not in n]
    assert len(names) > 20
    head = [n for n in names if "output_bias" in n or "output_weights" in n]
    assert len(head) == 2, head
    for name in names:
        want = trained.get_tensor(name)
        if "output_bias" in name:  # the log rounds: the shift to 3 decimals, the scale to 3 digits
            np.testing.assert_allclose(calibrated.get_tensor(name), (want + np.array([shift, 0.0])) * scale,
                                       rtol=5e-3, atol=2e-3 * scale, err_msg=name)
        elif "output_weights" in name:
            np.testing.assert_allclose(calibrated.get_tensor(name), want * scale, rtol=5e-3, err_msg=name)
        else:
            np.testing.assert_array_equal(calibrated.get_tensor(name), want, err_msg=name)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="bert_tf"):
        again = _run(tiny_model, tmp_path, out, **kw)
    assert any(r.getMessage() == f"each_then_calibrate, stage 2 of 2: {out} holds the calibrated model"
               for r in caplog.records)
    np.testing.assert_array_equal(tf.train.load_checkpoint(str(out)).get_tensor(
        [n for n in names if "output_bias" in n][0]), calibrated.get_tensor([n for n in names if "output_bias" in n][0]))
    assert again["dev"] == results["dev"]


def test_clean_negatives_trains_in_slots_then_calibrates_in_one_resumable_run(tiny_model, tmp_path, caplog):
    """--window_training=clean_negatives: 2 epochs of documents in slots (32 documents of 3 windows, round(16 / 3)
    = 5 a batch: 12 steps) into out/clean_negatives, then that model calibrated into out at the same step; both
    record the training and the absent label; a rerun (not naming it: read back) trains and calibrates nothing
    and scores the same. The labels are read from train.tsv, as for a user task without --labels."""
    import logging

    import tensorflow as tf

    out, first, kw, results, lines = _two_stage_run(tiny_model, tmp_path, caplog, "max", "clean_negatives", labels=(),
                                                    absent_label="no")
    assert first.name == "clean_negatives" and not (out / "each_window").exists()
    assert lines[0] == (f"clean_negatives, stage 1 of 2: every window of a 'no' input as 'no', another input's max "
                        f"for 2 epoch(s), 5 inputs per batch (3.0 windows each) -> {first}"), lines
    assert len(lines) == 2 and lines[1].startswith("clean_negatives, stage 2 of 2: the 'no' logit of every window "
                                                   "shifted by ") and lines[1].endswith(f"-> {out} (step 12)"), lines
    assert tf.train.latest_checkpoint(str(first)).endswith("ckpt-12")
    assert tf.train.latest_checkpoint(str(out)).endswith("ckpt-12")
    for folder in (first, out):
        info = json.loads((folder / "bert_tf_info.json").read_text())
        assert (info["window_training"], info["absent_label"], info["label_list"]) == \
            ("clean_negatives", "no", ["no", "yes"]), info
    assert results["dev"]["global_step"] == 12 and not (first / "eval_results.txt").exists()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="bert_tf"):  # the rerun reads the absent label back from out
        again = _run(tiny_model, tmp_path, out, **{k: v for k, v in kw.items() if k != "absent_label"})
    assert f"clean_negatives, stage 2 of 2: {out} holds the calibrated model" in [r.getMessage() for r in caplog.records]
    assert tf.train.latest_checkpoint(str(first)).endswith("ckpt-12")
    assert again["dev"] == results["dev"]


def test_window_selection_trains_rounds_on_the_chosen_windows_then_calibrates(tiny_model, tmp_path, caplog):
    """run_select_stages (top-k window selection; not a --window_training choice): out/each_window trains 2 epochs of each window alone (12 steps), then
    each of SELECT_ROUNDS rounds into out/select_<r> scores the 96 training windows with the previous model and
    trains one epoch (2 steps of 16) on one window per document, a "yes" one's most "yes" window labelled yes, a
    "no" one's most "yes" window labelled no; out gets the last round's model calibrated; a rerun trains nothing.
    Measured: every round picks the marker's window in each of the 15 "yes" documents that hold it whole in one."""
    import logging

    import tensorflow as tf

    from bert_tf.runners.classifier import EACH_WINDOW_DIR, ClassifierRunConfig, run_select_stages
    from bert_tf.tasks.windows import SELECT_ROUNDS, SELECT_TOP

    assert (SELECT_ROUNDS, SELECT_TOP) == (3, 1)
    rng = np.random.default_rng(5)
    train = _long_task_split(rng, 32)
    _write_split(tmp_path / "train.tsv", train)
    _write_split(tmp_path / "dev.tsv", _long_task_split(rng, 8))
    out = tmp_path / "out"
    cfg = ClassifierRunConfig(task=glue.user_task("text", "label", labels=["no", "yes"], index="id"),
                              data_dir=str(tmp_path), output_dir=str(out), run=_settings(tiny_model),
                              max_seq_length=SEQ, train_batch_size=16, eval_batch_size=8, do_train=True, do_eval=True,
                              num_train_epochs=2, long_inputs="windows", doc_stride=ROOM, window_aggregation="max")
    with caplog.at_level(logging.INFO, logger="bert_tf"):
        results = run_select_stages(cfg)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("each_then_select, stage")]
    assert lines[0] == f"each_then_select, stage 1 of 5: each window alone for 2 epoch(s) -> {out / EACH_WINDOW_DIR}"
    previous = out / EACH_WINDOW_DIR
    for r in (1, 2, 3):
        assert lines[r] == (f"each_then_select, stage {r + 1} of 5: one epoch on 32 windows (the top 1 of each input "
                            f"by the model of {previous}, 16 of them labelled 'no') -> {out / f'select_{r}'}")
        previous = out / f"select_{r}"
    assert lines[4].startswith("each_then_select, stage 5 of 5: the 'no' logit of every window shifted by ")
    assert lines[4].endswith(f"fitted on the max of the windows of 32 training inputs -> {out} (step 2)")
    words = [text.split() for text, _ in train]
    at = [next((i for i in range(len(w)) if w[i:i + len(MARKER)] == MARKER), None) for w in words]
    # the window (3 per document, ROOM pieces each, one piece a word) that holds the marker whole, if one does
    whole = [None if a is None or a // ROOM != (a + len(MARKER) - 1) // ROOM else a // ROOM for a in at]
    found = [i for i, w in enumerate(whole) if w is not None]
    assert len(found) == 15
    for r in (1, 2, 3):
        rows, labels = np.array(json.loads((out / f"select_{r}" / "selected_windows.json").read_text())).T
        assert rows.tolist() == [3 * i + w for i, w in enumerate(rows % 3)]  # one window of each document
        assert labels.tolist() == [int(label == "yes") for _, label in train]
        assert [rows[i] % 3 for i in found] == [whole[i] for i in found]
        assert tf.train.latest_checkpoint(str(out / f"select_{r}")).endswith("ckpt-2")
        assert json.loads((out / f"select_{r}" / "bert_tf_info.json").read_text())["window_training"] == \
            "each_then_select"
    assert tf.train.latest_checkpoint(str(out)).endswith("ckpt-2")
    assert json.loads((out / "bert_tf_info.json").read_text())["window_training"] == "each_then_select"
    assert results["dev"]["global_step"] == 2 and (out / "eval_results.txt").is_file()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="bert_tf"):
        again = run_select_stages(cfg)
    assert f"each_then_select, stage 5 of 5: {out} holds the calibrated model" in [r.getMessage() for r in caplog.records]
    assert again["dev"] == results["dev"]


@pytest.mark.slow
def test_max_without_the_absent_label_stops_before_training_and_named_trains_it_as_found_nowhere(tiny_model,
                                                                                                   tmp_path):
    """Through run_classifier.py: the marker task labelled contains_nt / none (sorted: the "found" label first).
    --window_aggregation=max without --absent_label stops in one line before TensorFlow starts (nothing written);
    with --absent_label=none, clean negatives trains every window of a "none" document as "none", none gets label
    id 0, and bert_tf_info.json records it."""
    import os
    import subprocess
    import sys

    from conftest import REPO

    rng = np.random.default_rng(5)
    rename = {"yes": "contains_nt", "no": "none"}
    for split, n in (("train", 16), ("dev", 8)):
        _write_split(tmp_path / f"{split}.tsv", [(text, rename[label]) for text, label in _long_task_split(rng, n)])
    out = tmp_path / "out"
    args = [sys.executable, str(REPO / "run_classifier.py"), "--task_name=user", f"--data_dir={tmp_path}",
            "--text_a_column=text", "--index_column=id", f"--vocab_file={tiny_model / 'vocab.txt'}",
            f"--bert_config_file={tiny_model / 'bert_config.json'}", f"--output_dir={out}", f"--max_seq_length={SEQ}",
            "--long_inputs=windows", f"--doc_stride={ROOM}", "--window_aggregation=max", "--do_train", "--do_eval",
            "--num_train_epochs=1", "--train_batch_size=16", "--iterations_per_loop=50"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    refused = subprocess.run(args, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert refused.returncode != 0 and refused.stderr.strip().splitlines() == [
        "error: --window_training=clean_negatives (--window_aggregation=max's default) trusts one label to mean "
        "'found nowhere', and the labels read from the training file are contains_nt, none: name it with "
        "--absent_label=<label> (or give --labels in id order, that label first)"], refused.stderr[-2000:]
    assert not out.exists()
    trained = subprocess.run([*args, "--absent_label=none"], capture_output=True, text=True, env=env, cwd=REPO,
                             timeout=600)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "clean_negatives, stage 1 of 2: every window of a 'none' input as 'none', another input's max" \
        in trained.stderr, trained.stderr[-3000:]
    assert "clean_negatives, stage 2 of 2: the 'none' logit of every window shifted by" in trained.stderr
    assert "labels: none, contains_nt" in trained.stderr
    for folder in (out, out / "clean_negatives"):
        info = json.loads((folder / "bert_tf_info.json").read_text())
        assert (info["label_list"], info["absent_label"]) == (["none", "contains_nt"], "none"), info
    assert (out / "eval_results.txt").exists()
