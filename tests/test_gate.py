"""The gate: every script checks its settings before TensorFlow loads (bert_flags.py, README "Development").

In-process tests of the messages (milliseconds: the gate imports no TensorFlow), one fresh process
that shows the gate's modules never import it, and one fresh process per script that a bad setting
ends in one `error:` line, non-zero, without TensorFlow ever imported.
"""

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, run_script_main

from bert_tf import fileio
from bert_tf.configs import BertConfig
from bert_tf.errors import ConfigError
from bert_tf.runners.pretraining_config import PretrainingConfig
from bert_tf.training.settings import TrainSettings

# Runs a script as `python script.py ...` would, then says on stderr whether TensorFlow was imported.
WRAPPER = ("import atexit, runpy, sys; atexit.register(lambda: print('tensorflow imported' if 'tensorflow' in "
           "sys.modules else 'no tensorflow', file=sys.stderr)); sys.argv = sys.argv[1:]; "
           "sys.path.insert(0, '.'); runpy.run_path(sys.argv[0], run_name='__main__')")


def _fresh(*args, cwd=REPO):
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-c", WRAPPER, *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=120)


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "bert_config.json"
    path.write_text(json.dumps(dict(vocab_size=40, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=16, max_position_embeddings=64)))
    return path


def _classifier(tmp_path, *extra):
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    return run_script_main("run_classifier", "--task_name=user", f"--data_dir={data}",
                           f"--output_dir={tmp_path / 'out'}", "--do_train", *extra)


def _pretraining(tmp_path, config_file, *extra):
    return run_script_main("run_pretraining", f"--bert_config_file={config_file}", "--input_file=records.tfrecord",
                           f"--output_dir={tmp_path / 'out'}", "--do_train", "--max_seq_length=32",
                           "--max_predictions_per_seq=5", "--num_train_steps=20", "--num_warmup_steps=2", *extra)


def _one_line_error(code, message):
    assert isinstance(code, str) and code.startswith("error: ") and "\n" not in code, code
    assert message in code, code


@pytest.mark.parametrize("extra, message", [
    # fine-tuning trained with --learning_rate=-1e-5 before the gate (and saved a checkpoint)
    (["--learning_rate=-1e-5"], "learning_rate must be positive, got -1e-05"),
    (["--head_learning_rate=0"], "head_learning_rate must be positive, got 0.0"),
    (["--iterations_per_loop=0"], "iterations_per_loop must be positive, got 0"),
    (["--gradient_accumulation_steps=0"], "gradient_accumulation_steps must be positive, got 0"),
    (["--profile_steps=3,2"], "--profile_steps must be N,M (global steps, 1 <= N <= M), got '3,2'"),
    (["--use_tpu", "--distribution_strategy=mirrored"], "--use_tpu contradicts --distribution_strategy=mirrored"),
    (["--compile_whole_step", "--jit_compile=false"], "--compile_whole_step compiles the step with XLA: it needs "
                                                      "--jit_compile"),
    # (these four ran a TensorFlow process each in test_run_classifier.py; the same messages)
    (["--pack_sequences", "--dynamic_padding"], "--dynamic_padding and --pack_sequences cannot be combined"),
    (["--pack_sequences", "--length_buckets=4"], "--length_buckets cannot be combined with --pack_sequences"),
    (["--long_inputs=windows", "--doc_stride=0"], "--doc_stride must be positive, got 0"),
    (["--pack_sequences", "--max_sequences_per_row=0"], "max_sequences_per_row must be >= 1, got 0"),
])
def test_fine_tuning_flags_no_run_can_use_are_one_line(tmp_path, extra, message):
    _one_line_error(_classifier(tmp_path, *extra), message)
    assert not (tmp_path / "out").exists()


def test_fine_tuning_export_dir_must_be_new_or_empty(tmp_path):
    full = tmp_path / "export"
    full.mkdir()
    (full / "saved_model.pb").write_text("a served model")
    _one_line_error(_classifier(tmp_path, f"--export_dir={full}"),
                    f"{full}: --export_dir exists and is not empty; pass a new folder (e.g. the next version number)")
    assert (full / "saved_model.pb").read_text() == "a served model"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("script, args, message", [
    ("run_classifier", ["--data_dir=x", "--output_dir=y"], "--task_name and --data_dir are required"),
    ("run_ner", ["--output_dir=y"], "--data_dir is required"),
    ("run_swag", ["--output_dir=y"], "--data_dir is required"),
    ("run_swag", ["--data_dir=x"], "--output_dir is required"),
    ("run_squad", ["--do_predict"], "--output_dir is required"),
    ("run_pretraining", ["--input_file=x", "--output_dir=y"], "--bert_config_file is required"),
])
def test_required_flags_are_one_line(script, args, message):
    _one_line_error(run_script_main(script, *args), message)


@pytest.mark.parametrize("extra, message", [
    (["--pack_sequences", "--max_sequences_per_row=0"], "max_sequences_per_row must be >= 1, got 0"),
    (["--max_seq_length=128", "--max_predictions_per_seq=5"],
     "max_seq_length 128 is longer than the model's max_position_embeddings 64"),
    (["--num_warmup_steps=500"], "num_warmup_steps must be in [0, num_train_steps=20], got 500"),
    (["--do_train=false"], "at least one of do_train or do_eval must be True"),
    (["--learning_rate=0"], "learning_rate must be positive, got 0.0"),
    (["--objective=ltr", "--pack_sequences"], "pack_sequences needs a bidirectional objective (mlm_nsp or mlm)"),
    (["--objective=mlm", "--use_next_sentence_prediction=true"],
     "--use_next_sentence_prediction=True contradicts --objective=mlm"),
    (["--masked_lm_prob=0"], "masked_lm_prob must be in (0, 1], got 0.0"),
    (["--steps_per_program=4", "--save_checkpoints_steps=6"],
     "save_checkpoints_steps 6 must be a multiple of steps_per_program 4"),
    (["--steps_per_program=8", "--save_checkpoints_steps=8"], "num_train_steps 20 must be a multiple of "
                                                              "steps_per_program 8"),
])
def test_pretraining_flags_no_run_can_use_are_one_line(tmp_path, config_file, extra, message):
    _one_line_error(_pretraining(tmp_path, config_file, *extra), message)
    assert not (tmp_path / "out").exists()


def test_overwrite_never_deletes_an_input(tmp_path, config_file):
    out = tmp_path / "out"
    out.mkdir()
    (out / "ckpt-2.index").write_text("a checkpoint")
    code = _pretraining(tmp_path, config_file, f"--init_checkpoint={out / 'ckpt-2'}", "--overwrite_output_dir")
    _one_line_error(code, f"--overwrite_output_dir would delete {out / 'ckpt-2'}")
    assert (out / "ckpt-2.index").read_text() == "a checkpoint"


def test_train_settings_checks_are_one_line_values_only_the_run_knows_are_validate():
    for settings, message in [(TrainSettings(mixed_precision="fp8"), "mixed_precision must be one of float32, "
                                                                      "bfloat16, float16"),
                              (TrainSettings(head_learning_rate=0.0), "head_learning_rate must be positive, got 0.0"),
                              (TrainSettings(learning_rate=-1e-5), "learning_rate must be positive, got -1e-05"),
                              (TrainSettings(optimizer="sgd"), "unknown optimizer 'sgd'; expected one of adamw, lamb"),
                              (TrainSettings(profile_steps=(0, 2)), "1 <= N <= M"),
                              (TrainSettings(profile_steps=(3, 2)), "1 <= N <= M")]:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            settings.check()
    TrainSettings().check()
    with pytest.raises(ValueError, match=r"train_batch_size 10 must be a positive multiple of replicas \(1\) x "
                                         r"gradient_accumulation_steps \(4\)"):
        TrainSettings(gradient_accumulation_steps=4).validate(1, train_steps=1, global_batch_size=10)
    with pytest.raises(ValueError, match="num_train_steps must be positive, got 0"):
        TrainSettings().validate(1, train_steps=0, global_batch_size=8)


def test_pretraining_config_checks_values_before_the_model_and_the_vocab(tmp_path):
    config = BertConfig(vocab_size=40, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=64)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"w{i}\n" for i in range(50)))
    base = dict(bert_config=config, input_files=["x"], output_dir=str(tmp_path), max_seq_length=32,
                max_predictions_per_seq=5, do_train=True, num_train_steps=20, num_warmup_steps=2)
    PretrainingConfig(**base).validate()
    with pytest.raises(ConfigError, match="unknown optimizer 'sgd'; expected one of adamw, lamb"):
        PretrainingConfig(**base, train=TrainSettings(optimizer="sgd")).validate()
    with pytest.raises(ConfigError, match="50 tokens"):  # against the model's vocab_size 40
        PretrainingConfig(**base, vocab_file=str(vocab)).validate()
    PretrainingConfig(**{**base, "bert_config": None}, vocab_file=str(vocab)).check_values()  # no model needed


def test_the_export_folder_rule_is_one_function(tmp_path):
    assert fileio.export_dir_problem(str(tmp_path / "new"), "--export_dir", "x") is None
    assert fileio.export_dir_problem(str(tmp_path), "--export_dir", "x") is None  # empty
    (tmp_path / "f").write_text("")
    assert fileio.export_dir_problem(str(tmp_path), "export_dir", "pass --overwrite to replace it") == (
        f"{tmp_path}: export_dir exists and is not empty; pass --overwrite to replace it")
    assert fileio.export_dir_problem(str(tmp_path), "export_dir", "x", overwrite=True) is None
    assert fileio.export_dir_problem(str(tmp_path / "f"), "--export_dir", "x") == (
        f"{tmp_path / 'f'}: --export_dir exists and is not a directory")


def test_the_gate_modules_never_import_tensorflow():
    code = ("import sys; import bert_tf, bert_flags, bert_setup; "
            "from bert_tf.training.settings import TrainSettings; "
            "from bert_tf.runners.pretraining_config import PretrainingConfig; "
            "from bert_tf.tasks import glue, windows, conll; from bert_tf.runners import squad; "
            "from bert_tf.configs import BertConfig; from bert_tf import fileio; "
            "TrainSettings().check(); fileio.export_dir_problem('.', '--export_dir', 'x'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                            env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"


# One bad setting per script: the user's path, a fresh process (about 0.5 s: no TensorFlow).
BAD_SETTINGS = [
    ("run_classifier.py", ["--task_name=user", "--data_dir=.", "--output_dir=o", "--learning_rate=-1e-5"],
     "error: learning_rate must be positive, got -1e-05"),
    ("run_ner.py", ["--data_dir=.", "--output_dir=o", "--dynamic_padding", "--pack_sequences"],
     "error: --dynamic_padding and --pack_sequences cannot be combined: packed rows have one fixed length"),
    ("run_swag.py", ["--data_dir=.", "--output_dir=o", "--iterations_per_loop=0"],
     "error: iterations_per_loop must be positive, got 0"),
    ("run_squad.py", ["--output_dir=o", "--do_train", "--learning_rate=0"], "error: learning_rate must be positive, got 0.0"),
    ("run_pretraining.py", ["--input_file=x", "--output_dir=o", "--init_checkpoint=x", "--do_train",
                            "--num_warmup_steps=-1"],
     "error: num_warmup_steps must be in [0, num_train_steps=100000], got -1"),
    ("create_pretraining_data.py", ["--input_file=x", "--output_file=y", "--vocab_file=v", "--masking=dynamic",
                                    "--dupe_factor=5"],
     "create_pretraining_data.py: error: --dupe_factor: --masking=dynamic writes one copy without masks; "
     "run_pretraining.py draws them (it takes --do_whole_word_mask and --masked_lm_prob)"),
    ("export_savedmodel.py", ["--export_dir=e"], "export_savedmodel.py: error: pass exactly one of --model_dir and "
                                                 "--init_checkpoint"),
    ("extract_features.py", ["--input_file=x", "--output_file=y", "--init_checkpoint=c", "--layers=a"],
     "extract_features.py: error: --layers='a': expected comma-separated integers"),
    ("predict.py", ["--export_dir=e"], "predict.py: error: pass exactly one of --text and --input_file"),
    ("create_vocab.py", ["--input_file=x", "--vocab_file=v", "--vocab_size=3"], "create_vocab.py: error: "),
    ("create_bert_config.py", ["--size=base", "--vocab_file=/nonexistent/vocab.txt"], "create_bert_config.py: error: "),
    ("convert_checkpoint.py", ["--input_checkpoint=x"], "FATAL Flags parsing error: flag --output_checkpoint=None"),
]


@pytest.mark.parametrize("script, args, error", BAD_SETTINGS, ids=[s for s, _, _ in BAD_SETTINGS])
def test_a_bad_setting_is_one_line_without_tensorflow(tmp_path, script, args, error):
    result = _fresh(str(REPO / script), *args, cwd=tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0
    assert lines[-1] == "no tensorflow", result.stderr[-2000:]
    problem = [line for line in lines[:-1] if line.strip() and not line.startswith(("Pass --help", "  "))]
    assert len(problem) == 1 and problem[0].startswith(error), result.stderr[-2000:]
    assert os.listdir(tmp_path) == []  # nothing written


@pytest.mark.parametrize("script", ["run_classifier.py", "run_pretraining.py", "export_savedmodel.py"])
def test_help_needs_no_tensorflow(script):
    result = _fresh(str(REPO / script), "--help")
    assert result.stdout.rstrip().endswith("Try --helpfull to get a list of all flags."), result.stdout[-500:]
    assert result.stderr.strip().splitlines()[-1] == "no tensorflow", result.stderr[-2000:]
