"""convert_checkpoint.py end to end: tf1 -> ours -> tf1 keeps names and values; bad input fails in one line.

One test runs the script as a process (exit code, stderr); the others call its main() in this
process with parsed flags, because each TensorFlow start costs ~10-20 s on the shared CPU.
"""

import re

import numpy as np
import pytest
import tensorflow as tf
from conftest import imported_script, run_script, shared_path

pytestmark = pytest.mark.slow


def run(*args):
    return run_script("convert_checkpoint.py", *args, env={"TF_CPP_MIN_LOG_LEVEL": "3"}, timeout=300)


def run_in_process(capsys, *args):
    """(exit code, stderr) of convert_checkpoint.main with these flags."""
    with imported_script("convert_checkpoint") as script:
        script.FLAGS.unparse_flags()
        script.FLAGS(["convert_checkpoint.py", *args])
        code = 0
        try:
            script.main([])
        except SystemExit as e:
            code = e.code
    return code, capsys.readouterr().err


def last_line(text):
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


@pytest.fixture(scope="module")
def tiny():
    return shared_path("fixtures", "checkpoints", "tiny_tf1")


def test_tf1_to_ours_to_tf1_round_trip(tiny, tmp_path, capsys):
    ours = tmp_path / "ours" / "ckpt-0"
    code, err = run_in_process(
        capsys,
        f"--input_checkpoint={tiny / 'bert_model.ckpt'}",
        f"--bert_config_file={tiny / 'bert_config.json'}",
        f"--output_checkpoint={ours}",
    )
    assert code == 0, err
    assert (tmp_path / "ours" / "bert_config.json").exists()
    assert (tmp_path / "ours" / "vocab.txt").read_text() == (tiny / "vocab.txt").read_text()
    assert any(n == "_CHECKPOINTABLE_OBJECT_GRAPH" for n, _ in tf.train.list_variables(str(ours)))

    back = tmp_path / "tf1" / "bert_model.ckpt"
    code, err = run_in_process(
        capsys,
        f"--input_checkpoint={ours}",
        f"--bert_config_file={tmp_path / 'ours' / 'bert_config.json'}",
        f"--output_checkpoint={back}",
        "--output_format=tf1",
    )
    assert code == 0, err
    original = tf.train.load_checkpoint(str(tiny / "bert_model.ckpt"))
    written = tf.train.load_checkpoint(str(back))
    expected = {n for n in original.get_variable_to_shape_map() if "adam_" not in n and n != "global_step"}
    assert set(written.get_variable_to_shape_map()) == expected
    for name in expected:
        np.testing.assert_array_equal(written.get_tensor(name), original.get_tensor(name), err_msg=name)


def test_missing_input_fails_in_one_line(tiny, tmp_path):
    missing = run(
        f"--input_checkpoint={tmp_path / 'nope.ckpt'}",
        f"--bert_config_file={tiny / 'bert_config.json'}",
        f"--output_checkpoint={tmp_path / 'out' / 'x'}",
    )
    assert missing.returncode != 0
    assert "nope.ckpt" in last_line(missing.stderr) and "no checkpoint found" in last_line(missing.stderr)
    assert "Traceback" not in missing.stderr


def test_config_mismatch_fails_in_one_line(tiny, tmp_path, capsys):
    wrong = tmp_path / "wrong_config.json"
    wrong.write_text((tiny / "bert_config.json").read_text().replace('"vocab_size": 15', '"vocab_size": 99'))
    code, err = run_in_process(
        capsys,
        f"--input_checkpoint={tiny / 'bert_model.ckpt'}",
        f"--bert_config_file={wrong}",
        f"--output_checkpoint={tmp_path / 'out2' / 'x'}",
    )
    assert code != 0
    assert err.count("\n") == 1 and err.startswith("convert_checkpoint.py: error: ")
    assert "vocab size mismatch" in err and "[15, 4]" in err and "vocab_size=99" in err
    assert not (tmp_path / "out2").exists() or not list((tmp_path / "out2").glob("x*"))


def test_hf_to_tf1(tmp_path, capsys):
    from test_checkpoints import TINY, randomize, write_hf

    from bert_tf.checkpoints import tf1_variable_map
    from bert_tf.models import BertPretrainer

    source = BertPretrainer(TINY)
    randomize(source)
    write_hf(source, tmp_path / "hf", TINY)
    (tmp_path / "hf" / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    out = tmp_path / "tf1" / "bert_model.ckpt"
    code, err = run_in_process(
        capsys, f"--input_checkpoint={tmp_path / 'hf'}", f"--output_checkpoint={out}", "--output_format=tf1"
    )
    assert code == 0, err
    reader = tf.train.load_checkpoint(str(out))
    names = tf1_variable_map(source)
    assert set(reader.get_variable_to_shape_map()) == set(names)
    for name, variable in names.items():
        np.testing.assert_array_equal(reader.get_tensor(name), variable.numpy(), err_msg=name)
    assert (tmp_path / "tf1" / "vocab.txt").exists()
    assert '"vocab_size": 20' in (tmp_path / "tf1" / "bert_config.json").read_text()


def test_from_a_training_folder_is_quiet_about_optimizer_slots(tmp_path):
    """A bert_tf training checkpoint holds Adam slots and the step besides the weights; converting it reads
    the weights only and says one line, with no warning per slot left unread."""
    import keras

    from bert_tf.configs import BertConfig
    from bert_tf.models import BertEncoder

    config = BertConfig(vocab_size=40, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=16, type_vocab_size=2)
    encoder = BertEncoder(config)
    optimizer = keras.optimizers.Adam()
    optimizer.build(encoder.trainable_variables)
    folder = tmp_path / "model"
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=encoder, optimizer=optimizer,
                                                             global_step=tf.Variable(7, dtype=tf.int64)),
                                         str(folder), max_to_keep=1, checkpoint_name="ckpt")
    manager.save(checkpoint_number=7)
    config.to_json_file(str(folder / "bert_config.json"))
    (folder / "vocab.txt").write_text("\n".join(f"t{i}" for i in range(40)) + "\n")
    result = run(f"--input_checkpoint={folder}", f"--output_checkpoint={tmp_path / 'hf'}", "--output_format=hf")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == f"wrote hf checkpoint {tmp_path / 'hf'}"
    warnings = [line for line in result.stderr.splitlines() if re.match(r"(W\d{4} |WARNING)", line)]
    assert "could not be found" not in result.stderr and not warnings, result.stderr[-3000:]
    assert (tmp_path / "hf" / "model.safetensors").exists()
