"""XLA's static batch shapes (bert_tf.runners.shapes, arrays.py): a few lengths chosen from the data, the
least padding for their number, batches cut to them, and training and prediction on cut batches equal to
the same batches padded to max_seq_length."""

import itertools

import numpy as np
import pytest
import tensorflow as tf
from conftest import float32_tolerance

from bert_tf.configs import BertConfig
from bert_tf.models import BertClassifier, BertEncoder
from bert_tf.runners import shapes
from bert_tf.runners.arrays import Predictor, arrays_dataset_fn
from bert_tf.runners.classifier import classification_loss
from bert_tf.training import optimizer as optimizer_lib
from bert_tf.training.loop import Trainer
from bert_tf.training.settings import TrainSettings
from bert_tf.training.strategy import get_strategy

SEQ, VOCAB, BATCH = 48, 40, 4
CONFIG = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=64, max_position_embeddings=64)
# Dropout draws its masks over the batch's shape, so a cut batch and the same batch padded get other
# masks: the training comparison runs without it (and on one layer: each shape is one XLA compile of the step).
NO_DROPOUT = BertConfig(**dict(CONFIG.to_dict(), hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                               num_hidden_layers=1))
TOLERANCE = float32_tolerance(10.0, CONFIG.num_hidden_layers * (32 + 64 + SEQ) + 64)


def _arrays(lengths, seed=0):
    rng = np.random.default_rng(seed)
    n = len(lengths)
    mask = (np.arange(SEQ) < np.asarray(lengths)[:, None]).astype(np.int32)
    ids = rng.integers(5, VOCAB, size=(n, SEQ)).astype(np.int32) * mask
    ids[:, 0] = 2
    return {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(mask),
            "label_ids": (ids[:, 1] % 2).astype(np.int32), "is_real_example": np.ones(n, np.int32)}


def _padded_positions(lengths, chosen):
    return int(shapes.padded_to(lengths, chosen).sum())


def test_chosen_lengths_are_the_least_padding_for_their_number():
    rng = np.random.default_rng(0)
    for trial in range(20):
        lengths = rng.integers(1, 100, size=rng.integers(1, 60))
        k = int(rng.integers(1, 5))
        chosen = shapes.choose_lengths(lengths, 100, k, multiple=8)
        assert 1 <= len(chosen) <= k and list(chosen) == sorted(set(chosen))
        assert chosen[-1] >= lengths.max() and all(c % 8 == 0 or c == 100 for c in chosen)
        # Brute force over every set of k candidate lengths that holds the longest example.
        candidates = sorted({min(-(-int(n) // 8) * 8, 100) for n in lengths})
        best = min(_padded_positions(lengths, c + (candidates[-1],))
                   for r in range(k) for c in itertools.combinations(candidates[:-1], r))
        assert _padded_positions(lengths, chosen) == best, (trial, chosen)
    # Every example its own length: nothing padded beyond the multiple; one length: max_seq_length's padding.
    assert shapes.choose_lengths([8, 16, 24], 128, 3) == (8, 16, 24)
    assert shapes.choose_lengths([5, 17, 30, 100], 128, 1) == (104,)
    assert shapes.real_share([8, 16, 24], (8, 16, 24)) == 1.0
    with pytest.raises(ValueError, match="max_shapes must be >= 1"):
        shapes.choose_lengths([3], 8, 0)


def test_training_batches_take_only_the_chosen_shapes_and_keep_every_token():
    rng = np.random.default_rng(1)
    lengths = np.concatenate([rng.integers(3, 12, 40), rng.integers(12, 30, 20), rng.integers(30, SEQ + 1, 8)])
    arrays = _arrays(lengths)
    chosen = shapes.choose_lengths(lengths, SEQ, 3)
    assert len(chosen) == 3
    dataset = arrays_dataset_fn(arrays, training=True, lengths=chosen)(tf.distribute.InputContext(), BATCH)
    seen = set()
    for batch in dataset.take(60):
        mask = batch["input_mask"].numpy()
        longest = mask.sum(-1).max()
        seen.add(mask.shape)
        # cut to the shortest chosen length that holds the batch's longest example ...
        assert mask.shape[-1] == shapes.padded_to([longest], chosen)[0]
        # ... whose bucket holds all of it: nothing padded beyond the bucket below
        below = max([c for c in chosen if c < mask.shape[-1]], default=0)
        assert (mask.sum(-1) > below).all()
        assert batch["input_ids"].shape == mask.shape and batch["label_ids"].shape == (BATCH,)
    assert seen == {(BATCH, c) for c in chosen}
    # Gradient accumulation stacks micro-batches into one step: they come in runs of one shape, with dynamic
    # padding (the CPU default) as with chosen lengths.
    for lengths_option in (chosen, None):
        grouped = arrays_dataset_fn(arrays, training=True, lengths=lengths_option, micro_batches=3)(
            tf.distribute.InputContext(), BATCH).batch(3, drop_remainder=True)  # as Trainer.distribute does
        shapes_seen = [tuple(stacked["input_mask"].shape) for stacked in grouped.take(12)]
        assert len(shapes_seen) == 12 and all(shape[:2] == (3, BATCH) for shape in shapes_seen)
    share = shapes.real_share(lengths, chosen)
    assert share > 2 * lengths.sum() / (len(lengths) * SEQ)  # more than twice the real share of padding to SEQ
    assert shapes.describe("train", lengths, chosen, BATCH, SEQ).startswith(
        f"train: XLA batch shapes [{BATCH}, {chosen[0]}], [{BATCH}, {chosen[1]}], [{BATCH}, {chosen[2]}] chosen")


def _trainer(tmp_path, name):
    settings = TrainSettings(learning_rate=1e-3, jit_compile=True, iterations_per_loop=3,
                             save_checkpoints_steps=10**6, seed=7)
    return Trainer(get_strategy("one_device"), settings, lambda: BertClassifier(BertEncoder(NO_DROPOUT), 2),
                   classification_loss, optimizer_lib.optimizer_fn(settings, 100, 2), model_dir=str(tmp_path / name),
                   train_steps=9, global_batch_size=BATCH, checkpoint_input_pipeline=False)


def test_training_on_cut_batches_under_xla_equals_the_same_batches_padded(tmp_path):
    """Per-step losses and the trained weights of 9 XLA steps on bucketed batches equal those of the same
    batches padded back to SEQ (without dropout, whose masks depend on the shape); the step is traced once
    for all its shapes."""
    rng = np.random.default_rng(2)
    lengths = np.concatenate([rng.integers(3, 10, 30), rng.integers(20, SEQ + 1, 12)])
    arrays = _arrays(lengths, seed=3)
    chosen = shapes.choose_lengths(lengths, SEQ, 2)
    cut = [{k: v.numpy() for k, v in b.items()} for b in
           arrays_dataset_fn(arrays, training=True, lengths=chosen)(tf.distribute.InputContext(), BATCH).take(9)]
    assert {b["input_ids"].shape[-1] for b in cut} == set(chosen)  # both shapes in the 9 steps
    padded = [{k: np.pad(v, [(0, 0), (0, SEQ - v.shape[-1])]) if v.ndim == 2 else v for k, v in b.items()}
              for b in cut]

    def dataset_fn(batches):
        spec = {k: tf.TensorSpec((BATCH,) + (None,) * (v.ndim - 1), v.dtype) for k, v in batches[0].items()}
        return lambda ctx, batch_size: tf.data.Dataset.from_generator(lambda: iter(batches), output_signature=spec)

    results = {}
    for name, batches in (("cut", cut), ("padded", padded)):
        trainer = _trainer(tmp_path, name)
        trainer.train(dataset_fn(batches))
        results[name] = (np.array(trainer.step_losses), [v.numpy() for v in trainer.model.trainable_variables])
        assert trainer.train_step_traces == 1
    np.testing.assert_allclose(results["cut"][0], results["padded"][0], rtol=0, atol=TOLERANCE)
    for a, b in zip(results["cut"][1], results["padded"][1], strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=TOLERANCE)


def test_prediction_on_chosen_lengths_equals_padded_with_one_program_per_shape():
    rng = np.random.default_rng(4)
    lengths = np.concatenate([rng.integers(3, 10, 13), rng.integers(20, SEQ + 1, 6)])
    arrays = _arrays(rng.permutation(lengths), seed=5)
    tf.keras.utils.set_random_seed(1)
    model = BertClassifier(BertEncoder(CONFIG), 2)
    bucketed = Predictor(model, dynamic_padding=False, jit_compile=True, length_buckets=2)
    padded = Predictor(model, dynamic_padding=False, jit_compile=True)
    got = bucketed(arrays, BATCH)
    np.testing.assert_allclose(got, padded(arrays, BATCH), rtol=0, atol=TOLERANCE)
    assert bucketed.lengths == shapes.choose_lengths(lengths, SEQ, 2) and len(bucketed.lengths) == 2
    assert bucketed.traces == 2 and padded.traces == 1  # the last partial batch is filled up: no new shape
    bucketed(arrays, BATCH)  # a second evaluation compiles nothing new
    assert bucketed.traces == 2 and bucketed.compile_seconds > 0


def test_compile_time_is_the_first_step_plus_the_first_loops_excess_over_the_later_pace():
    history = [dict(steps=11, seconds=30.0, compile_seconds=4.0), dict(steps=10, seconds=5.0, compile_seconds=0.0),
               dict(steps=5, seconds=3.0, compile_seconds=0.0)]
    text = shapes.training_compile_text(history, 3)
    assert text.startswith("training step at 3 shape(s): ~28.5 s (the first step 4.0 s, then 30.0 s for 10 steps "
                           "at the later loops' 0.550 s per step)"), text
    assert shapes.training_compile_text(history[:1], 1).startswith(
        "training step at 1 shape(s): first step 4.0 s (one loop")
    assert shapes.training_compile_text([], 2) == "training step at 2 shape(s): nothing trained in this run"
