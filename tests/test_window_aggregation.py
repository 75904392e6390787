"""bert_tf.tasks.window_aggregation: the one definition of each window aggregation, and the three paths that call it
(evaluation's numpy windows, the export's graph windows, training's window slots) giving the same numbers."""

import numpy as np
import pytest
import tensorflow as tf

from bert_tf.runners.window_slots import slot_logits
from bert_tf.serving.windows import aggregate
from bert_tf.tasks.window_aggregation import aggregate_slots
from bert_tf.tasks.windows import AGGREGATIONS, aggregate_windows, windows_in_slots

COUNTS = [3, 1, 4, 2, 1]  # windows per input: one-window inputs among longer ones


def _windows(num_labels=3, seed=7):
    rng = np.random.default_rng(seed)
    window_example = np.repeat(np.arange(len(COUNTS)), COUNTS)
    return rng.normal(scale=4.0, size=(len(window_example), num_labels)).astype(np.float32), window_example


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_every_path_gives_the_same_numbers(aggregation):
    """The same window logits through the numpy path, the export's graph (traced with unknown shapes, as the
    SavedModel's signatures are) and training's slots (empty slots full of junk) agree to float32 rounding, raw
    (no softmax: under "any" a one-window input keeps its logits on every path), and a one-window input gets
    exactly its window's outputs on each."""
    logits, window_example = _windows()
    numpy_path = aggregate_windows(logits, window_example, len(COUNTS), aggregation)
    spec = [tf.TensorSpec([None, None], tf.float32), tf.TensorSpec([None], tf.int32), tf.TensorSpec([None], tf.int64)]
    graph = tf.function(lambda x, e, c: aggregate(x, e, c, aggregation), input_signature=spec, autograph=False)
    served = graph(logits, window_example.astype(np.int32), np.array(COUNTS, np.int64)).numpy()
    slots = windows_in_slots({"logits": logits}, window_example, per_input=(), slots=6)
    slots["logits"][slots["window_mask"] == 0] = 1e4  # what sits in an empty slot must not count
    trained = aggregate_slots(slots["logits"], slots["window_mask"], aggregation).numpy()

    assert numpy_path.dtype == served.dtype == trained.dtype == np.float32
    assert numpy_path.shape == served.shape == trained.shape == (len(COUNTS), 3)
    np.testing.assert_allclose(served, numpy_path, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(trained, numpy_path, rtol=1e-6, atol=1e-6)
    for out in (numpy_path, served, trained):
        np.testing.assert_array_equal(out[[1, 4]], logits[[3, 10]])  # the one-window inputs
    assert np.abs(numpy_path[0] - logits[0]).max() > 0.1 or aggregation == "first"  # the others' windows count


def test_what_each_aggregation_computes():
    """The definition on one input of three windows, against the formulas written out; "any" in probabilities."""
    x = np.array([[[1.0, -1.0, 0.0], [3.0, 0.0, 2.0], [-2.0, 5.0, 1.0], [9.0, 9.0, 9.0]]])  # [1, K=4, 3]
    mask = np.array([[1, 1, 1, 0]])
    real = x[0, :3]
    p = np.exp(real) / np.exp(real).sum(-1, keepdims=True)
    p_first = p[:, 0].prod()
    share = p[:, 1:].sum(0) / p[:, 1:].sum()
    expected = {"mean": real.mean(0), "max": real.max(0), "first": real[0],
                "logmeanexp": np.log(np.exp(real).mean(0)),
                "any": np.log([p_first, *((1 - p_first) * share)])}
    for aggregation in AGGREGATIONS:
        np.testing.assert_allclose(aggregate_slots(x, mask, aggregation).numpy()[0], expected[aggregation],
                                   rtol=1e-12, err_msg=aggregation)
    with pytest.raises(ValueError, match=r"^unknown window aggregation 'median'$"):
        aggregate_slots(x, mask, "median")
    with pytest.raises(ValueError, match=r"^window aggregation 'any' needs two or more labels"):
        aggregate_slots(x[:, :, :1], mask, "any")


def test_training_aggregates_the_models_window_slots():
    """slot_logits (the training loss's input) runs the model on every slot and aggregates them by the definition."""
    logits, window_example = _windows(num_labels=2, seed=3)
    ids = np.arange(len(logits), dtype=np.int32)[:, None]  # each window's one token: its row of `logits`
    slots = windows_in_slots({"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids)},
                             window_example, per_input=())

    def model(batch, training):
        return tf.gather(logits, batch["input_ids"][:, 0])

    for aggregation in AGGREGATIONS:
        np.testing.assert_allclose(slot_logits(model, slots, False, aggregation).numpy(),
                                   aggregate_windows(logits, window_example, len(COUNTS), aggregation),
                                   rtol=1e-6, atol=1e-6, err_msg=aggregation)
