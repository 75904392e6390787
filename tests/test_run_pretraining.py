"""run_pretraining.py on a tiny BERT and TFRecords made from the built-in KJV sample."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
from conftest import out_of_memory_command, run_command, run_script_main, tiny_pretraining_folder

from bert_tf.configs import BertConfig
from bert_tf.data import pipelines, pretraining_job
from bert_tf.errors import ConfigError, InputDataError
from bert_tf.resources import SAMPLE_CORPUS
from bert_tf.runners.pretraining import build_trainer, run_pretraining
from bert_tf.runners.pretraining_config import PretrainingConfig
from bert_tf.training import strategy as strategy_lib
from bert_tf.training.settings import TrainSettings

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEQ, PREDS = 32, 5
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=64, type_vocab_size=2)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_pretraining_folder(tmp_path_factory.mktemp("pretraining_data"), lines=None, vocab_size=500,
                                   records={"train.tfrecord": (SEQ, PREDS)}, dupe_factor=2, **TINY)


def _events(model_dir, kind="train"):
    """{tag: {step: value}} from the TensorBoard event files of model_dir/kind."""
    out = {}
    folder = os.path.join(model_dir, kind)
    for name in sorted(os.listdir(folder)):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(folder, name)):
            for v in event.summary.value:
                if v.metadata.plugin_data.plugin_name != "text":  # (the run's environment, flags, config)
                    out.setdefault(v.tag, {})[event.step] = float(tf.make_ndarray(v.tensor))
    return out


def test_loss_goes_down_and_mlm_accuracy_up(data, tmp_path):
    config = PretrainingConfig(
        bert_config=BertConfig.from_json_file(str(data / "bert_config.json")),
        input_files=[str(data / "train.tfrecord")], output_dir=str(tmp_path), max_seq_length=SEQ,
        max_predictions_per_seq=PREDS, do_train=True, do_eval=True, train_batch_size=32, eval_batch_size=32,
        num_train_steps=120, num_warmup_steps=10,
        train=TrainSettings(learning_rate=2e-3, iterations_per_loop=5, save_checkpoints_steps=60), max_eval_steps=5, vocab_file=str(data / "vocab.txt"), do_lower_case=True)
    results = run_pretraining(config, strategy_lib.get_strategy("one_device"))
    events = _events(str(tmp_path))
    loss, acc = events["loss"], events["masked_lm_accuracy"]
    # The first loop (steps 1-5, lr still warming up) is the untrained model's level.
    first, last = [np.mean([d[s] for s in steps]) for d in (loss,) for steps in ((5,), (110, 115, 120))]
    assert last < first - 1.0, loss
    first, last = [np.mean([acc[s] for s in steps]) for steps in ((5,), (110, 115, 120))]
    assert last > first + 0.04, acc
    assert {"learning_rate", "gradient_norm", "examples_per_second", "next_sentence_loss"} <= set(events)
    # eval_results.txt: the original's keys as sorted `key = value` lines.
    lines = (tmp_path / "eval_results.txt").read_text().splitlines()
    assert [line.split(" = ")[0] for line in lines] == ["global_step", "loss", "masked_lm_accuracy",
                                                        "masked_lm_loss", "next_sentence_accuracy",
                                                        "next_sentence_loss"]
    assert "global_step = 120" in lines
    assert results["loss"] == pytest.approx(results["masked_lm_loss"] + results["next_sentence_loss"], rel=1e-4)
    assert set(_events(str(tmp_path), "eval")) >= {"masked_lm_accuracy", "loss"}
    # The model directory is one a fine-tuning run can start from.
    assert json.loads((tmp_path / "bert_config.json").read_text())["hidden_size"] == 32
    assert (tmp_path / "vocab.txt").exists()
    assert json.loads((tmp_path / "bert_tf_info.json").read_text())["do_lower_case"] is True


def test_packed_rows_under_xla_learn_with_one_compilation(data, tmp_path):
    """--pack_sequences with jit_compile: several instances per row, static shapes, so the compiled
    step is traced (and compiled) once for the whole run; the model learns; eval reads every instance."""
    from bert_tf.runners import pretraining

    # Records of short instances: documents of two half-verses (the corpus's own instances fill every row).
    with open(SAMPLE_CORPUS, encoding="utf-8") as f:
        halves = [" ".join(line.split()[:8]) for line in f if len(line.split()) >= 8]
    corpus = tmp_path / "short_docs.txt"
    corpus.write_text("".join(f"{a}\n{b}\n\n" for a, b in zip(halves[::2], halves[1::2], strict=False)), encoding="utf-8")
    records = str(tmp_path / "short.tfrecord")
    pretraining_job.create_pretraining_data(pretraining_job.PretrainingDataConfig(
        input_file=str(corpus), output_file=records, vocab_file=str(data / "vocab.txt"), max_seq_length=2 * SEQ,
        max_predictions_per_seq=2 * PREDS, dupe_factor=1, num_workers=1))
    config = PretrainingConfig(
        bert_config=BertConfig.from_json_file(str(data / "bert_config.json")),
        input_files=[records], output_dir=str(tmp_path / "model"), max_seq_length=2 * SEQ,
        max_predictions_per_seq=2 * PREDS, do_train=True, do_eval=True, train_batch_size=16, eval_batch_size=16,
        num_train_steps=60, num_warmup_steps=5, max_eval_steps=5, pack_sequences=True,
        train=TrainSettings(learning_rate=2e-3, iterations_per_loop=5, save_checkpoints_steps=60, jit_compile=True))
    config.validate()
    trainer = build_trainer(config, strategy_lib.get_strategy("one_device"))
    batches = list(pretraining._dataset_fn(config, config.input_files, is_training=True)(None, 16).take(20))
    assert all(b["input_ids"].shape == (16, 2 * SEQ) for b in batches)
    per_row = np.concatenate([tf.reduce_max(b["sequence_ids"], axis=1).numpy() for b in batches])
    assert per_row.mean() > 1.3  # rows really hold several instances
    trainer.train(pretraining._dataset_fn(config, config.input_files, is_training=True))
    assert trainer._grad_fn.experimental_get_tracing_count() == 1  # 60 steps, 12 loops: one XLA program
    loss = _events(str(tmp_path / "model"))["loss"]
    assert np.mean([loss[s] for s in (50, 55, 60)]) < loss[5] - 0.5, loss
    # Evaluation, unpacked and packed: every batch one shape (the last one filled), one program each,
    # every instance read once: the same metrics either way.
    results = {}
    for packed in (False, True):
        config = dataclasses.replace(config, pack_sequences=packed)
        evaluator = build_trainer(config, strategy_lib.get_strategy("one_device"))
        assert evaluator.restore() is not None  # the trained model
        results[packed] = evaluator.evaluate(pretraining._dataset_fn(config, config.input_files, is_training=False), 16)
        assert evaluator._eval_fn.experimental_get_tracing_count() == 1, packed
    for key in ("masked_lm_accuracy", "masked_lm_loss", "next_sentence_accuracy", "next_sentence_loss"):
        assert results[True][key] == pytest.approx(results[False][key], rel=1e-4), key
    with pytest.raises(ConfigError, match="pack_sequences needs a bidirectional objective"):
        PretrainingConfig(bert_config=config.bert_config, input_files=config.input_files, output_dir=str(tmp_path),
                          max_seq_length=2 * SEQ, max_predictions_per_seq=2 * PREDS, do_train=True, objective="ltr",
                          pack_sequences=True).validate()


def test_record_length_mismatch_is_one_line(data):
    path = str(data / "train.tfrecord")
    with pytest.raises(InputDataError) as info:
        pipelines.check_record_lengths(path, 128, 20)
    assert str(info.value) == (f"{path}: records were written with max_seq_length=32 (flag says 128), "
                               f"max_predictions_per_seq=5 (flag says 20); pass the values the data was created with")


def test_pipeline_shards_per_input_pipeline(data):
    files = [str(data / "train.tfrecord")]
    ids = []
    for pipeline in range(2):
        ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline, num_replicas_in_sync=2)
        ds = pipelines.pretraining_dataset(files, SEQ, PREDS, 8, is_training=False, input_context=ctx)
        batch = next(iter(ds))
        assert batch["input_ids"].shape == (8, SEQ) and batch["masked_lm_weights"].dtype == tf.float32
        ids.append(batch["input_ids"].numpy())
    whole = next(iter(pipelines.pretraining_dataset(files, SEQ, PREDS, 16, is_training=False)))["input_ids"]
    # One file, two pipelines: records are split round-robin, nothing read twice.
    np.testing.assert_array_equal(ids[0], whole.numpy()[0::2])
    np.testing.assert_array_equal(ids[1], whole.numpy()[1::2])


def test_filled_last_eval_batch_keeps_shapes_and_metrics(data):
    """fill_last_batch: every batch [B, S] (one XLA program), every instance read once, and the filler
    changes no metric: the last batch scores as the same instances unfilled."""
    from bert_tf.models import BertPretrainer
    from bert_tf.runners.pretraining import pretraining_loss_fn

    files = [str(data / "train.tfrecord")]
    plain = list(pipelines.pretraining_dataset(files, SEQ, PREDS, 12, is_training=False, drop_remainder=False))
    filled = list(pipelines.pretraining_dataset(files, SEQ, PREDS, 12, is_training=False, fill_last_batch=True))
    count = sum(len(b["input_ids"]) for b in plain)
    assert count % 12, "the fixture should end in a partial batch"
    assert len(filled) == len(plain) and all(b["input_ids"].shape == (12, SEQ) for b in filled)
    weights = np.concatenate([b["next_sentence_weights"].numpy() for b in filled])
    assert weights.sum() == count and (weights[count:] == 0).all()
    np.testing.assert_array_equal(filled[-1]["input_ids"][: count % 12], plain[-1]["input_ids"])
    tf.keras.utils.set_random_seed(0)
    model = BertPretrainer(BertConfig.from_json_file(str(data / "bert_config.json")))
    _, expected = pretraining_loss_fn(model, plain[-1], training=False)
    _, got = pretraining_loss_fn(model, filled[-1], training=False)
    for name, (value, weight) in expected.items():
        assert float(got[name][1]) == float(weight), name
        np.testing.assert_allclose(float(got[name][0]), float(value), rtol=1e-5, err_msg=name)


def _command(data, out, steps, **extra):
    flags = dict(bert_config_file=data / "bert_config.json", input_file=data / "train.tfrecord", output_dir=out,
                 max_seq_length=SEQ, max_predictions_per_seq=PREDS, do_train=True, train_batch_size=16,
                 num_train_steps=steps, num_warmup_steps=5, learning_rate=1e-3, iterations_per_loop=2,
                 save_checkpoints_steps=10)
    flags.update(extra)
    return [sys.executable, os.path.join(REPO, "run_pretraining.py")] + [f"--{k}={v}" for k, v in flags.items()]


def _run(cmd):
    return run_command(cmd, timeout=300)


def _wait_for_checkpoint(model_dir, step, proc, timeout=200):
    """Until model_dir's checkpoint state lists ckpt-<step> (or later): that save is complete."""
    start = time.time()

    def latest():
        path = tf.train.latest_checkpoint(model_dir)
        return int(path.rsplit("-", 1)[1]) if path else -1

    while latest() < step:
        assert proc.poll() is None, f"run ended before ckpt-{step}: {proc.stderr.read()[-2000:]}"
        assert time.time() - start < timeout
        time.sleep(0.02)


def test_sigkill_then_rerun_resumes_and_sigterm_saves(data, tmp_path):
    steps = 40
    # The uninterrupted reference, in this process: the same library call as the script's.
    ref_config = PretrainingConfig(
        bert_config=BertConfig.from_json_file(str(data / "bert_config.json")),
        input_files=[str(data / "train.tfrecord")], output_dir=str(tmp_path / "full"), max_seq_length=SEQ,
        max_predictions_per_seq=PREDS, do_train=True, train_batch_size=16, num_train_steps=steps,
        num_warmup_steps=5, train=TrainSettings(learning_rate=1e-3, iterations_per_loop=2, save_checkpoints_steps=10))
    run_pretraining(ref_config, strategy_lib.get_strategy("one_device"))

    out = tmp_path / "killed"
    cmd = _command(data, out, steps)
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, cwd=REPO)
    _wait_for_checkpoint(str(out), 10, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    killed_at = int(tf.train.latest_checkpoint(str(out)).rsplit("-", 1)[1])
    assert 10 <= killed_at < steps

    # Same command again: resumes; SIGTERM after the next checkpoint saves one at the current step and exits 143.
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, cwd=REPO)
    _wait_for_checkpoint(str(out), killed_at + 10, proc)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr[-2000:]
    assert "SIGTERM: saved checkpoint" in stderr
    term_at = int(tf.train.latest_checkpoint(str(out)).rsplit("-", 1)[1])
    assert term_at >= killed_at + 10

    final = _run(cmd)
    assert final.returncode == 0, final.stderr[-3000:]
    assert f"resumed from {out}/ckpt-{term_at}" in final.stderr
    assert tf.train.latest_checkpoint(str(out)).endswith(f"ckpt-{steps}")
    # Per-loop losses after each resume equal the uninterrupted run's (weights, optimizer, step and input
    # position come back from the checkpoint; float32 on one CPU, so only round-off may differ).
    ref, got = _events(str(tmp_path / "full"))["loss"], _events(str(out))["loss"]
    for step in range(term_at + 2, steps + 1, 2):
        assert got[step] == pytest.approx(ref[step], rel=1e-4), step


@pytest.mark.half_precision
def test_float16_packed_run_evaluates_and_logs_compile_time_apart(data, tmp_path):
    """The GPU user's choice, float16 (loss scaling) with --pack_sequences, through the script: it trains,
    evaluates (the packed masked-LM head ran its float32 bias in float16 here once and crashed) and writes
    eval_results.txt; the first loop's line reports the first step's tracing and compiling apart from
    examples/s and the ETA, and the eval line its first batch's."""
    out = tmp_path / "out"
    proc = _run(_command(data, out, 6, mixed_precision="float16", pack_sequences=True, do_eval=True,
                         max_eval_steps=2, iterations_per_loop=3, save_checkpoints_steps=6))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = (out / "eval_results.txt").read_text().splitlines()
    assert "global_step = 6" in lines and any(line.startswith("masked_lm_accuracy = ") for line in lines)
    steps = [line for line in proc.stderr.splitlines() if " step 3/6 " in line or " step 6/6 " in line]
    assert len(steps) == 2, proc.stderr[-3000:]
    assert steps[0].endswith(": tracing and compiling, not counted)") and "examples/s ETA" in steps[0]
    assert "first step" not in steps[1]
    assert "first batch" in next(line for line in proc.stderr.splitlines() if "eval at step 6" in line)


@pytest.mark.parametrize("extra,message", [
    (dict(max_seq_length=64), "records were written with max_seq_length=32 (flag says 64)"),
    (dict(train_batch_size=10, gradient_accumulation_steps=4),
     "train_batch_size 10 must be a positive multiple of replicas (1) x gradient_accumulation_steps (4)"),
])
def test_bad_flags_fail_in_one_line(data, tmp_path, extra, message):
    """run_pretraining.py's main in this process: its exit code is the one `error:` line (a fresh process shows
    that line on stderr: tests/test_gate.py)."""
    code = run_script_main("run_pretraining", *_command(data, tmp_path / "out", 20, **extra)[2:])
    assert isinstance(code, str) and code.startswith("error: ") and "\n" not in code and message in code, code
    assert not (tmp_path / "out" / "checkpoint").exists()


@pytest.mark.parametrize("jit_compile", [False, True])
def test_the_pretrainer_skips_padding_unless_xla_compiled(tmp_path, jit_compile):
    """The run chooses the encoder's work-skipping: XLA compiles per shape, and the real-token count is one."""
    config = PretrainingConfig(bert_config=BertConfig(vocab_size=40, **TINY), input_files=[], output_dir=str(tmp_path),
                               max_seq_length=SEQ, max_predictions_per_seq=PREDS, do_train=True, num_train_steps=2,
                               num_warmup_steps=0, train=TrainSettings(jit_compile=jit_compile))
    trainer = build_trainer(config, strategy_lib.get_strategy("one_device"))
    assert trainer.model.skip_padding is not jit_compile



# The pretraining loss, too big to allocate (conftest.out_of_memory_command).
PRETRAINING_TOO_BIG = ("from bert_tf.runners import pretraining\n"
                       "pretraining.pretraining_loss_fn = too_big(pretraining.pretraining_loss_fn)")


def test_out_of_device_memory_is_one_line_and_writes_no_checkpoint(data, tmp_path):
    """A batch that does not fit (here a 4 TiB tensor in the loss) is one line naming the flags, as in
    fine-tuning; no checkpoint is written."""
    # Under XLA the whole step as one program (the GPU default), gradient accumulation inside it. The same
    # handler (the Trainer's) without XLA: test_run_classifier's out-of-memory test.
    command = _command(data, tmp_path / "out", 4, num_warmup_steps=1, jit_compile=True, gradient_accumulation_steps=2,
                       compile_whole_step=True)
    proc = _run(out_of_memory_command(PRETRAINING_TOO_BIG, *command[1:]))
    assert proc.returncode == 1, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last == ("error: out of device memory in training on CPU:0: a batch of 8 sequences per replica x 32 "
                    "tokens in float32 does not fit; lower it with --train_batch_size, "
                    "--gradient_accumulation_steps (the same batch in micro-batches) or --mixed_precision "
                    "(bfloat16; float16 on GPUs without bfloat16)"), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out" / "checkpoint").exists()
    assert "XLA: on, the whole step as one program" in proc.stderr


def test_whole_step_without_xla_is_one_line_before_training(data, tmp_path):
    code = run_script_main("run_pretraining", *_command(data, tmp_path / "out", 4, num_warmup_steps=1,
                                                        compile_whole_step=True)[2:])
    assert code == (
        "error: --compile_whole_step compiles the step with XLA: it needs --jit_compile (off by default on CPU)")
    assert not (tmp_path / "out" / "checkpoint").exists()
