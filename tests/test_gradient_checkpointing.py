"""Gradient checkpointing (BertEncoder.gradient_checkpointing, --gradient_checkpointing): the same gradients
as keeping the activations, dropout on, with and without XLA; the Trainer turns it on; a Hugging Face
config.json that asks for it turns it on, logged."""

import json
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO, float32_tolerance, imported_script, tiny_pretraining_folder

from bert_tf.configs import BertConfig, asks_gradient_checkpointing
from bert_tf.models.encoder import BertEncoder
from bert_tf.pretrained import resolve_pretrained
from bert_tf.runners.pretraining import _dataset_fn, build_trainer
from bert_tf.runners.pretraining_config import PretrainingConfig
from bert_tf.training import strategy as strategy_lib
from bert_tf.training.settings import TrainSettings

B, S = 2, 12
CONFIG = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                    max_position_embeddings=32, hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.2)


def _inputs():
    rng = np.random.RandomState(0)
    mask = np.ones((B, S), np.int32)
    mask[1, 7:] = 0  # a padded row: the paths that skip padding lay out fewer rows
    return {"input_ids": tf.constant(rng.randint(0, 40, (B, S)), tf.int32), "input_mask": tf.constant(mask),
            "segment_ids": tf.constant(np.repeat([[0] * 6 + [1] * 6], B, 0), tf.int32)}


def _outputs(encoder, path, inputs):
    """[B, *, H] float32: what a head of each kind reads, in training (dropout on)."""
    if path == "call":
        out = encoder(inputs, training=True)["sequence_output"]
    elif path == "outputs_at":  # the pretrainer's and classifier's path, padding skipped
        out = encoder.outputs_at(inputs, tf.constant([[1, 3], [2, 5]]), training=True)["position_output"]
    else:
        out = encoder.mean_output(inputs, training=True)[:, None, :]
    return tf.cast(out, tf.float32)


def _gradients(checkpointing, path, jit_compile, other_masks=False, steps=2):
    """Each of `steps` training steps' loss and gradients [(loss, [grad])] of a fresh encoder (weights and
    dropout seeds from seed 1; `other_masks`: the dropout seed generators moved on); jit_compile None: eager."""
    keras.utils.set_random_seed(1)
    encoder = BertEncoder(CONFIG, gradient_checkpointing=checkpointing)
    for v in encoder.non_trainable_variables if other_masks else ():
        if "seed_generator" in v.path:
            v.assign(v.numpy() + 1)
    weights = tf.random.stateless_normal((B, 2, CONFIG.hidden_size), seed=(3, 4))

    def step(inputs):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(_outputs(encoder, path, inputs) ** 2 * weights[:, :1, :])
        grads = tape.gradient(loss, encoder.trainable_variables)
        return loss, [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                      for g, v in zip(grads, encoder.trainable_variables, strict=True)]

    if jit_compile is not None:
        step = tf.function(step, jit_compile=jit_compile)
    results = []
    for _ in range(steps):
        loss, grads = step(_inputs())
        results.append((float(loss), [g.numpy() for g in grads]))
    return results


@pytest.mark.parametrize("path,jit_compile", [("call", None), ("outputs_at", False), ("outputs_at", True),
                                              ("mean_output", False)])
def test_checkpointed_gradients_are_the_kept_ones_with_dropout_on(path, jit_compile):
    """Two steps (the second one's masks come from the advanced seed generators): the same losses and
    gradients within float32 rounding; other dropout masks move them far more (dropout is on, and a
    recomputation with fresh masks would fail; checked without XLA, whose compilations are slow)."""
    kept = _gradients(False, path, jit_compile)
    recomputed = _gradients(True, path, jit_compile)
    largest = max(float(np.abs(g).max()) for g in kept[0][1])
    # Every gradient is a sum over the B * S tokens of products through the blocks' sums (over I at most):
    # rounding in another order (XLA fuses the two programs apart) errs by float32_tolerance of the
    # largest gradient (some, e.g. the key biases', are cancellations that are 0 in exact arithmetic).
    tolerance = float32_tolerance(largest, summed_terms=B * S * CONFIG.intermediate_size)
    for (loss, grads), (loss_r, grads_r) in zip(kept, recomputed, strict=True):
        assert loss_r == pytest.approx(loss, rel=1e-5)
        for g, g_r in zip(grads, grads_r, strict=True):
            np.testing.assert_allclose(g_r, g, rtol=0, atol=tolerance)
    if not jit_compile:
        other_masks = _gradients(False, path, jit_compile, other_masks=True, steps=1)
        moved = max(float(np.abs(a - b).max()) for a, b in zip(kept[0][1], other_masks[0][1], strict=True))
        assert moved > 1000 * tolerance
    assert kept[1][0] != kept[0][0]  # the second step drew new masks


def test_inference_calls_are_the_same_and_the_setting_round_trips():
    keras.utils.set_random_seed(1)
    plain = BertEncoder(CONFIG)
    keras.utils.set_random_seed(1)
    checkpointed = BertEncoder(CONFIG, gradient_checkpointing=True)
    np.testing.assert_array_equal(checkpointed(_inputs())["pooled_output"], plain(_inputs())["pooled_output"])
    assert BertEncoder.from_config(checkpointed.get_config()).gradient_checkpointing is True
    assert BertEncoder.from_config(plain.get_config()).gradient_checkpointing is False


@pytest.fixture(scope="module")
def pretraining_data(tmp_path_factory):
    return tiny_pretraining_folder(tmp_path_factory.mktemp("data"), hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)


def _pretrain(data, out, **settings):
    """A Trainer's 4 steps of tiny pretraining: (its weights, its run summary)."""
    config = PretrainingConfig(
        bert_config=BertConfig.from_json_file(str(data / "bert_config.json")), input_files=[str(data / "train.tfrecord")],
        output_dir=str(out), max_seq_length=32, max_predictions_per_seq=5, do_train=True, train_batch_size=8,
        num_train_steps=4, num_warmup_steps=1,
        train=TrainSettings(learning_rate=1e-3, iterations_per_loop=2, save_checkpoints_steps=4, **settings))
    trainer = build_trainer(config, strategy_lib.get_strategy("one_device"))
    summary = trainer.run_summary()
    trainer.train(_dataset_fn(config, config.input_files, is_training=True))
    return [v.numpy() for v in trainer.model.trainable_variables], summary, trainer


@pytest.mark.parametrize("xla", [dict(), dict(jit_compile=True, compile_whole_step=True)],
                         ids=["no_xla", "whole_step"])
@pytest.mark.slow
def test_the_trainer_recomputes_and_trains_the_same_weights(pretraining_data, tmp_path, xla):
    """The pretrainer (masked LM at a few positions, NSP) trained 4 steps, dropout on: the same weights with
    and without checkpointing, under the graph step without XLA and the whole step as one XLA program."""
    kept, summary, trainer = _pretrain(pretraining_data, tmp_path / "kept", **xla)
    recomputed, summary_r, trainer_r = _pretrain(pretraining_data, tmp_path / "recomputed", gradient_checkpointing=True,
                                                 **xla)
    assert "gradient checkpointing: off" in summary and "gradient checkpointing: on" in summary_r
    assert trainer_r.model.encoder.gradient_checkpointing and not trainer.model.encoder.gradient_checkpointing
    assert trainer_r.hparams()["gradient_checkpointing"] is True
    assert trainer_r.step_losses == pytest.approx(trainer.step_losses, rel=1e-5)
    for a, b in zip(kept, recomputed, strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)


@pytest.mark.half_precision
@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
@pytest.mark.slow
def test_mixed_precision_trains_the_same_weights(pretraining_data, tmp_path, precision):
    """Under a mixed policy (float16 with its loss scale) the recomputed blocks give the kept ones' steps
    within half-precision rounding."""
    kept, _, trainer = _pretrain(pretraining_data, tmp_path / "kept", mixed_precision=precision)
    recomputed, _, trainer_r = _pretrain(pretraining_data, tmp_path / "recomputed", mixed_precision=precision,
                                         gradient_checkpointing=True)
    assert trainer_r.step_losses == pytest.approx(trainer.step_losses, rel=1e-2)
    for a, b in zip(kept, recomputed, strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=2e-3)


def _hf_config(path, **extra):
    values = dict(model_type="bert", architectures=["BertForMaskedLM"], vocab_size=30, hidden_size=32,
                  num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    path.write_text(json.dumps(dict(values, **extra)))
    return str(path)


def test_which_config_files_ask_for_it(tmp_path, tiny_vocab_file):
    assert asks_gradient_checkpointing(_hf_config(tmp_path / "on.json", gradient_checkpointing=True))
    assert not asks_gradient_checkpointing(_hf_config(tmp_path / "off.json", gradient_checkpointing=False))
    assert not asks_gradient_checkpointing(_hf_config(tmp_path / "absent.json"))
    original = tmp_path / "bert_config.json"  # not a Hugging Face file: BertConfig refuses the key itself
    original.write_text(json.dumps(dict(vocab_size=30, gradient_checkpointing=True)))
    assert not asks_gradient_checkpointing(str(original))
    (tmp_path / "broken.json").write_text("{")
    assert not asks_gradient_checkpointing(str(tmp_path / "broken.json"))
    asked = resolve_pretrained(None, _hf_config(tmp_path / "config.json", gradient_checkpointing=True), tiny_vocab_file)
    assert asked.gradient_checkpointing and asked.config.hidden_size == 32
    assert not resolve_pretrained(None, str(tmp_path / "off.json"), tiny_vocab_file).gradient_checkpointing


def test_a_config_that_asks_turns_it_on_unless_the_flag_says_otherwise(tmp_path, tiny_vocab_file, caplog):
    """Fine-tuning's settings from a Hugging Face config.json with "gradient_checkpointing": true, as the
    flags leave it, turn it off or agree (one import of the script: its flags are defined once)."""
    config = _hf_config(tmp_path / "config.json", gradient_checkpointing=True)
    cases = [([], True, "on"), (["--gradient_checkpointing=false"], False, "--gradient_checkpointing=False keeps it off"),
             (["--gradient_checkpointing"], True, "--gradient_checkpointing=True agrees")]
    with imported_script("run_classifier") as script:
        import bert_flags
        import bert_setup

        for flag, expected, logged in cases:
            caplog.clear()
            script.FLAGS.unparse_flags()
            script.FLAGS(["run_classifier.py", f"--bert_config_file={config}", f"--vocab_file={tiny_vocab_file}",
                          f"--output_dir={tmp_path / 'out'}", "--task_name=user", *flag])
            with caplog.at_level("INFO", logger="bert_tf"):
                settings = bert_setup.finetune_settings(bert_flags.check_finetune_flags())
            assert settings.train.gradient_checkpointing is expected
            assert [r.getMessage() for r in caplog.records if "gradient_checkpointing" in r.getMessage()] == [
                f"the model's config.json asks for gradient_checkpointing: {logged}"]


@pytest.mark.slow
def test_the_flag_through_run_pretraining(pretraining_data, tmp_path):
    """--gradient_checkpointing as typed, in a fresh process, relative paths, XLA's whole step: the run
    summary says so, the run trains and finishes; a bert_config.json that is not Hugging Face's asks nothing."""
    out = tmp_path / "model"
    result = subprocess.run(
        [sys.executable, str(REPO / "run_pretraining.py"), "--input_file=train.tfrecord",
         "--bert_config_file=bert_config.json", f"--output_dir={out}", "--do_train", "--train_batch_size=8",
         "--max_seq_length=32", "--max_predictions_per_seq=5", "--num_train_steps=3", "--num_warmup_steps=1",
         "--iterations_per_loop=3", "--gradient_checkpointing", "--jit_compile", "--compile_whole_step"],
        capture_output=True, text=True, timeout=300, cwd=pretraining_data)
    assert result.returncode == 0, result.stderr[-3000:]
    [summary_line] = [line for line in result.stderr.splitlines() if "precision: float32, XLA:" in line]
    assert "XLA: on, the whole step as one program" in summary_line
    assert summary_line.endswith("gradient checkpointing: on")
    assert "asks for gradient_checkpointing" not in result.stderr
    assert (out / "ckpt-3.index").exists()
