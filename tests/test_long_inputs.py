"""Inputs longer than max_seq_length (--long_inputs=windows): the windows, their aggregation into one output per
input, training on that aggregate (window slots, where the gradient goes), the same outputs as truncation where an
input fits, the same outputs from the runner and the export, and a task only windows can learn."""

import json

import numpy as np
import pytest
from conftest import TINY_PROB_TOLERANCE, float32_tolerance

from bert_tf.tasks import TaskDataError, glue
from bert_tf.tasks.windows import (
    DEFAULT_WINDOW_TRAINING,
    aggregate_windows,
    any_start_bias,
    check_window_settings,
    doc_spans_for,
    first_label_calibration,
    window_weights,
    windows_in_slots,
)
from bert_tf.tokenization import FullTokenizer

TINY_CONFIG_OVERRIDES = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # conftest's tiny_model, no dropout
SEQ = 16  # max_seq_length of these tests: 14 pieces of a single text per window
FILLER = ["the", "a", "dog", "sat", "on", "mat", "how", "are", "you", "hello", "low", "."]  # one piece each


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return FullTokenizer(str(tiny_model / "vocab.txt"), do_lower_case=True)


def _settings(tiny_model, learning_rate=1e-3):
    from bert_tf.pretrained import resolve_pretrained
    from bert_tf.runners.common import RunSettings
    from bert_tf.training.loop import TrainSettings
    from bert_tf.training.strategy import get_strategy

    pretrained = resolve_pretrained(None, str(tiny_model / "bert_config.json"), str(tiny_model / "vocab.txt"))
    return RunSettings(pretrained=pretrained, strategy=get_strategy("one_device"),
                       train=TrainSettings(learning_rate=learning_rate, iterations_per_loop=50,
                                           save_checkpoints_steps=1000))


def _write_split(path, rows, with_label=True):
    header = "id\ttext\tlabel" if with_label else "id\ttext"
    lines = [header] + [f"{i}\t{text}\t{label}" if with_label else f"{i}\t{text}" for i, (text, label) in
                        enumerate(rows)]
    path.write_text("\n".join(lines) + "\n")


def _run(tiny_model, data_dir, out, learning_rate=1e-3, labels=("no", "yes"), **kw):
    """run_classifier's library on a user task (labels: () reads them from train.tsv, as without --labels)."""
    from bert_tf.runners.classifier import ClassifierRunConfig, run

    task = glue.user_task("text", "label", labels=list(labels), index="id")
    cfg = ClassifierRunConfig(task=task, data_dir=str(data_dir), output_dir=str(out),
                              run=_settings(tiny_model, learning_rate),
                              max_seq_length=SEQ, train_batch_size=16, eval_batch_size=8, predict_batch_size=8,
                              **kw)
    return run(cfg)


# ------------------------------------------------------------------ featurization
def test_a_text_that_fits_is_one_window_equal_to_the_truncated_feature(tokenizer):
    examples = [glue.InputExample("s", "the cat sat on the mat .", label="yes"),
                glue.InputExample("p", "how are you ?", "hello , the dog sat .", label="no")]
    truncated = glue.convert_examples_to_features(examples, ["no", "yes"], SEQ, tokenizer)
    windows, window_example = glue.convert_examples_to_windows(examples, ["no", "yes"], SEQ, tokenizer, doc_stride=4)
    assert windows == truncated and window_example == [0, 1]


def test_long_text_and_pair_windows(tokenizer):
    rng = np.random.default_rng(0)
    words = list(rng.choice(FILLER, size=3 * (SEQ - 2)))  # three windows' worth of single-piece words
    ids = tokenizer.convert_tokens_to_ids(words)
    cls, sep = tokenizer.convert_tokens_to_ids(["[CLS]", "[SEP]"])
    features, window_example = glue.convert_examples_to_windows(
        [glue.InputExample("a", " ".join(words), label="yes")], ["no", "yes"], SEQ, tokenizer, doc_stride=10)
    spans = doc_spans_for(len(words), SEQ - 2, 10)
    assert spans == [(0, 14), (10, 14), (20, 14), (30, 12)] and window_example == [0, 0, 0, 0]
    for feature, (start, length) in zip(features, spans, strict=True):
        assert feature.input_ids == [cls] + ids[start:start + length] + [sep]
        assert feature.segment_ids == [0] * (length + 2) and feature.label_id == 1
    # A pair: the windows run over text_b, text_a whole in each ([CLS] A [SEP] B-span [SEP]).
    question = ["how", "are", "you", "?"]
    q_ids = tokenizer.convert_tokens_to_ids(question)
    features, window_example = glue.convert_examples_to_windows(
        [glue.InputExample("p", " ".join(question), " ".join(words), label="no")], ["no", "yes"], SEQ, tokenizer,
        doc_stride=5)
    room = SEQ - len(question) - 3
    spans = doc_spans_for(len(words), room, 5)
    assert len(features) == len(spans) == 8 and window_example == [0] * 8
    for feature, (start, length) in zip(features, spans, strict=True):
        assert feature.input_ids == [cls] + q_ids + [sep] + ids[start:start + length] + [sep]
        assert feature.segment_ids == [0] * (len(question) + 2) + [1] * (length + 1)
    with pytest.raises(TaskDataError, match=r"^example p: text_a has 14 word pieces, which leaves no room for "
                                            r"text_b in max_seq_length 16 .*put the long text in text_b"):
        glue.convert_examples_to_windows([glue.InputExample("p", " ".join(words[:14]), "the cat", label="no")],
                                         ["no", "yes"], SEQ, tokenizer, doc_stride=5)


def test_aggregations_and_weights():
    logits = np.array([[1.0, -1.0], [3.0, 0.0], [-2.0, 5.0], [0.5, 0.25]], np.float32)
    window_example = [0, 0, 0, 1]
    np.testing.assert_allclose(aggregate_windows(logits, window_example, 2, "mean"), [[2 / 3, 4 / 3], [0.5, 0.25]])
    np.testing.assert_array_equal(aggregate_windows(logits, window_example, 2, "max"), [[3.0, 5.0], [0.5, 0.25]])
    np.testing.assert_array_equal(aggregate_windows(logits, window_example, 2, "first"), [[1.0, -1.0], [0.5, 0.25]])
    # logmeanexp: log(mean(exp)) per unit, between the mean and the max; one window gives itself.
    expected = [[np.log(np.mean(np.exp([1.0, 3.0, -2.0]))), np.log(np.mean(np.exp([-1.0, 0.0, 5.0])))], [0.5, 0.25]]
    np.testing.assert_allclose(aggregate_windows(logits, window_example, 2, "logmeanexp"), expected, rtol=1e-6)
    big = aggregate_windows(np.array([[1000.0], [999.0]], np.float32), [0, 0], 1, "logmeanexp")  # no overflow
    np.testing.assert_allclose(big, [[999.0 + np.log((np.e + 1) / 2)]], rtol=1e-6)
    np.testing.assert_allclose(window_weights(window_example), [1 / 3, 1 / 3, 1 / 3, 1.0])
    with pytest.raises(ValueError, match="every one of the 3 inputs needs at least one window"):
        aggregate_windows(logits, window_example, 3, "mean")
    # any: a noisy-OR, the first label ("no") only when every window says so; one window gives its own probabilities.
    p_no = np.prod([1 / (1 + np.exp(-2.0)), 1 / (1 + np.exp(-3.0)), 1 / (1 + np.exp(7.0))])
    any_ = aggregate_windows(logits, window_example, 2, "any")
    np.testing.assert_allclose(np.exp(any_[0]), [p_no, 1 - p_no], rtol=1e-6)
    np.testing.assert_array_equal(any_[1], logits[3])  # one window: its own logits, exactly
    three = np.array([[0.0, 1.0, 2.0], [0.0, 3.0, -1.0]], np.float32)  # the others share 1 - P(first)
    p = np.exp(three) / np.exp(three).sum(-1, keepdims=True)
    share = np.array([p[:, 1].sum(), p[:, 2].sum()])
    np.testing.assert_allclose(np.exp(aggregate_windows(three, [0, 0], 1, "any"))[0],
                               [p[:, 0].prod(), *((1 - p[:, 0].prod()) * share / share.sum())], rtol=1e-6)
    with pytest.raises(ValueError, match="window aggregation 'any' needs two or more labels"):
        aggregate_windows(logits[:, :1], window_example, 2, "any")
    assert DEFAULT_WINDOW_TRAINING == {"mean": "each", "max": "clean_negatives", "logmeanexp": "each",
                                       "any": "each_then_calibrate", "first": "each"}
    with pytest.raises(ValueError, match=r"^--window_training must be one of each, aggregate, each_then_aggregate, "
                                         r"each_then_calibrate, clean_negatives, got 'all'$"):
        check_window_settings("windows", 8, "max", "all")


@pytest.mark.parametrize("aggregation", ["max", "any"])
def test_the_first_label_calibration_sets_the_threshold_of_windows_that_lean_toward_their_inputs_label(aggregation):
    """Windows trained each alone: every window of a "yes" input leans "yes" (logit difference ~1), its evidence
    window strongly (~5), and a "no" input's windows lean "yes" just as much (~1), so max and any call every
    input "yes". The fitted shift of the "no" logit sets the threshold between the two, the scale sharpens them
    short of certainty; applied once, a second fit finds nothing left to move."""
    rng = np.random.default_rng(0)
    n, k = 60, 4
    labels = np.arange(n) % 2
    lean = rng.normal(1.0, 0.3, size=(n, k))
    lean[labels == 1, rng.integers(0, k, size=n)[labels == 1]] = rng.normal(5.0, 0.3, size=(labels == 1).sum())
    logits = np.stack([np.zeros(n * k), lean.ravel()], axis=1)  # [M, 2]: "no", "yes"
    window_example = np.repeat(np.arange(n), k)

    def calibrated(shift, scale):
        return scale * (logits + np.array([shift, 0.0]))

    def accuracy(moved):
        return np.mean(aggregate_windows(moved, window_example, n, aggregation).argmax(-1) == labels)

    shift, scale = first_label_calibration(logits, window_example, labels, aggregation)
    assert accuracy(logits) == 0.5 and accuracy(calibrated(shift, scale)) == 1.0, (shift, scale)
    assert 1.5 < shift < 6.0 and 1.0 < scale < 10.0, (shift, scale)  # separable: the fit sharpens the logits
    out = aggregate_windows(calibrated(shift, scale), window_example, n, aggregation)
    sure = np.exp(out.max(-1) - np.log(np.exp(out).sum(-1)))
    # Platt's softened targets (31/32 here: 30 inputs per label) keep it from running to certainty
    assert 0.9 < sure.max() < 0.999, sure.max()
    again = first_label_calibration(calibrated(shift, scale), window_example, labels, aggregation)
    assert abs(again[0]) < 0.01 and again[1] == pytest.approx(1.0, abs=0.01), again
    with pytest.raises(ValueError, match="calibration needs two or more labels"):
        first_label_calibration(logits[:, :1], window_example, labels, aggregation)


def test_the_calibration_scales_squeezed_logits_where_a_shift_alone_misses_every_input():
    """The subtle needle's failure (docs/finetuning.md): the documents' logit differences span ~0.1 and carry
    a weak signal; fitted by cross-entropy, a shift alone must make the mean probability match the label share
    of the fitted inputs (here 53% "yes"), which at scale 1 puts the threshold past every input. With the scale
    fitted too (Platt scaling) the threshold lands inside the scores, near where accuracy is best."""
    rng = np.random.default_rng(1)
    n = 400
    labels = (rng.random(n) < 0.53).astype(np.int64)
    score = rng.normal(-0.08, 0.02, n) + 0.02 * labels  # the "yes" - "no" logit difference after the max
    logits = np.stack([np.zeros(n), score], axis=1)
    window_example = np.arange(n)

    def accuracy(shift, scale):
        moved = scale * (logits + np.array([shift, 0.0]))
        return np.mean(aggregate_windows(moved, window_example, n, "max").argmax(-1) == labels)

    threshold_only = first_label_calibration_shift_only(logits, labels)
    assert accuracy(threshold_only, 1.0) == pytest.approx(labels.mean())  # every input called "yes"
    shift, scale = first_label_calibration(logits, window_example, labels, "max")
    best = max(np.mean((score > t) == labels) for t in score)
    assert scale > 10 and accuracy(shift, scale) > best - 0.03 > labels.mean(), (shift, scale, best)


def first_label_calibration_shift_only(logits, labels):
    """The cross-entropy's best shift of the first label's logit at scale 1, on a fine grid (the calibration
    before its scale was fitted too)."""
    shifts = np.linspace(-1.0, 1.0, 4001)
    diff = logits[:, 1] - logits[:, 0]
    losses = [np.mean(np.logaddexp(0, -(2 * labels - 1) * (diff - s))) for s in shifts]
    return float(shifts[int(np.argmin(losses))])


def test_windows_in_slots_keep_each_inputs_windows_together():
    """Training on the aggregate: one row per input, its windows in the first slots, the rest zero and masked."""
    window_example = [0, 0, 0, 1, 2, 2]
    arrays = {"input_ids": np.arange(1, 13, dtype=np.int32).reshape(6, 2), "label_ids": np.array([1, 1, 1, 0, 1, 1]),
              "is_real_example": np.ones(6, np.int32)}
    slots = windows_in_slots(arrays, window_example, per_input=("label_ids", "is_real_example"))
    np.testing.assert_array_equal(slots["window_mask"], [[1, 1, 1], [1, 0, 0], [1, 1, 0]])
    np.testing.assert_array_equal(slots["input_ids"], [[[1, 2], [3, 4], [5, 6]], [[7, 8], [0, 0], [0, 0]],
                                                       [[9, 10], [11, 12], [0, 0]]])
    np.testing.assert_array_equal(slots["label_ids"], [1, 0, 1])
    np.testing.assert_array_equal(slots["is_real_example"], [1, 1, 1])
    assert windows_in_slots(arrays, window_example, ("label_ids",), slots=5)["input_ids"].shape == (3, 5, 2)
    with pytest.raises(ValueError, match="an input has 3 windows, more than the 2 slots"):
        windows_in_slots(arrays, window_example, ("label_ids",), slots=2)
    with pytest.raises(ValueError, match="windows must come in input order"):
        windows_in_slots(arrays, [0, 1, 0, 1, 2, 2], ("label_ids",))


@pytest.mark.parametrize("labels", [2, 3])
def test_the_any_start_bias_gives_the_first_label_its_share_of_the_inputs(labels):
    """Every window scoring the start bias alone (a fresh head's weights are ~0): the noisy-OR of n windows gives
    the first label the share asked, where zero logits would give it 0.5 ** n (2 labels, 8 windows: 0.004)."""
    for share in (0.5, 0.2, 0.9):
        for n in (1, 2, 8):
            bias = any_start_bias(share, n, labels)
            logits = np.tile(bias, (n, 1))
            p_first = np.exp(aggregate_windows(logits, [0] * n, 1, "any"))[0, 0] if n > 1 else \
                np.exp(bias[0]) / np.exp(bias).sum()
            assert p_first == pytest.approx(share, rel=1e-5), (share, n)
            np.testing.assert_array_equal(bias[1:], 0.0)
    assert np.exp(aggregate_windows(np.zeros((8, labels)), [0] * 8, 1, "any"))[0, 0] < 0.01 * labels
    assert any_start_bias(0.0, 8, labels)[0] == any_start_bias(0.01, 8, labels)[0]  # clipped: a finite bias
    with pytest.raises(ValueError, match="'any' needs two or more labels, got 1"):
        any_start_bias(0.5, 8, 1)


def test_window_training_settings_that_cannot_run_fail_in_one_line(tmp_path):
    """The default window training per aggregation, and the combinations refused before any work: 'any' on a
    regression, the aggregate with --pack_sequences (its windows stay together in slots, not packed rows)."""
    from bert_tf.pretrained import FinetuneError
    from bert_tf.runners.classifier import ClassifierRunConfig, ClassifierTask

    def task(aggregation, training=None, regression=False):
        spec = glue.user_task("text", "label", labels=None if regression else ["no", "yes"], regression=regression)
        return ClassifierTask(ClassifierRunConfig(task=spec, data_dir=str(tmp_path), output_dir=str(tmp_path),
                                                  long_inputs="windows", doc_stride=8, window_aggregation=aggregation,
                                                  window_training=training))

    assert [task(a).window_training for a in ("mean", "max", "logmeanexp", "any", "first")] == \
        ["each", "clean_negatives", "each", "each_then_calibrate", "each"]
    assert task("max", "each").not_packable == "" and task("any").not_packable == ""
    assert task("max", "each_then_calibrate").not_packable == ""
    # what the run's summary says of the default trainings
    assert task("max").summary()["long inputs"] == (
        "windows every 8 word pieces, every window of a 'no' input trained as 'no', another input's aggregate "
        "(clean_negatives/), then calibrated; max of their logits per input")
    assert task("any").summary()["long inputs"] == ("windows every 8 word pieces, each weighted 1/windows of its "
                                                    "input (each_window/), then calibrated; any of their logits per input")
    assert task("max").not_packable == ("--window_training=clean_negatives keeps each input's windows together in "
                                        "slots (--window_aggregation=max's default; --window_training="
                                        "each_then_calibrate packs)")
    assert task("mean", "aggregate").not_packable.startswith("--window_training=aggregate keeps each input's")
    assert task("any", "each_then_aggregate").not_packable.startswith(
        "--window_training=each_then_aggregate keeps each input's")
    with pytest.raises(ValueError, match=r"^--window_training must be one of each, aggregate, each_then_aggregate, "
                                         r"each_then_calibrate, clean_negatives, got 'both'$"):
        task("any", "both")
    with pytest.raises(FinetuneError, match=r"^--window_aggregation=any needs labels .* this task is a regression$"):
        task("any", regression=True)
    assert task("max", regression=True).window_training == "each"  # nothing to calibrate
    for training in ("each_then_calibrate", "clean_negatives"):
        with pytest.raises(FinetuneError, match=rf"^--window_training={training} needs labels, one meaning "
                                                r"'found nowhere' \(--absent_label\); this task is a regression$"):
            task("max", training, regression=True)
    assert task("max", "clean_negatives").not_packable.startswith(
        "--window_training=clean_negatives keeps each input's")
    for aggregation in ("mean", "first"):  # a "no" input's every window is "no" only where "yes" means "somewhere"
        with pytest.raises(ValueError, match=r"^--window_training=clean_negatives takes every window of a first-label "
                                             r"input as that label \('found nowhere'\), which needs "
                                             rf"--window_aggregation max, logmeanexp, any, not {aggregation}$"):
            task(aggregation, "clean_negatives")


@pytest.mark.parametrize("aggregation", ["mean", "max", "logmeanexp", "any", "first"])
def test_slot_aggregation_is_the_runners_and_the_exports(aggregation):
    """The aggregation training takes its loss on (over window slots, empty ones masked) is the one evaluation
    (numpy, over windows) and the export (segment ops in the graph) compute: the same numbers."""
    import tensorflow as tf

    from bert_tf.runners.common import softmax
    from bert_tf.runners.window_slots import aggregate_slots
    from bert_tf.serving.windows import aggregate

    rng = np.random.default_rng(4)
    window_example = np.repeat(np.arange(5), [3, 1, 4, 2, 1])
    logits = rng.normal(scale=4.0, size=(len(window_example), 3)).astype(np.float32)
    expected = aggregate_windows(logits, window_example, 5, aggregation)
    slots = windows_in_slots({"logits": logits}, window_example, per_input=(), slots=6)
    slots["logits"][slots["window_mask"] == 0] = 1e4  # what sits in an empty slot must not count
    trained = aggregate_slots(tf.constant(slots["logits"]), tf.constant(slots["window_mask"]), aggregation).numpy()
    served = aggregate(tf.constant(logits), tf.constant(window_example, tf.int32), tf.constant(np.bincount(
        window_example)), aggregation).numpy()
    if aggregation == "any":  # log-probabilities; an input of one window keeps its logits: the same probabilities
        trained, served, expected = (softmax(x) for x in (trained, served, expected))
    np.testing.assert_allclose(trained, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(served, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("aggregation", ["max", "mean", "logmeanexp", "any"])
def test_training_on_the_aggregate_sends_the_gradient_to_the_windows_that_decide(aggregation):
    """classification_loss on inputs in window slots: the model scores every window, the loss is taken on their
    aggregate. A stand-in model gives each window the logits of a table row picked by its first piece: under max
    only each unit's largest window gets a gradient (the one that decides), under mean, logmeanexp and any every
    real window (logmeanexp more to the larger ones); an empty slot never does, whatever its content."""
    import tensorflow as tf

    from bert_tf.runners.classifier import classification_loss

    table = tf.Variable(np.array([[0.0, 0.0], [0.0, 3.0], [1.0, -1.0], [2.0, 0.5], [0.0, 1.0], [0.0, 9.0]],
                                 np.float32))

    def model(batch, training):  # [W, S] -> [W, 2]: the table row of each window's first piece
        assert batch["input_ids"].shape.rank == 2 and training
        return tf.gather(table, batch["input_ids"][:, 1])

    ids = np.zeros((2, 3, 4), np.int32)
    ids[0, :, 1] = [1, 2, 3]  # input 0: three windows, rows 1-3
    ids[1, :, 1] = [4, 0, 5]  # input 1: one window (row 4), an empty slot, and a masked slot holding row 5
    window_mask = np.array([[1, 1, 1], [1, 0, 0]], np.int32)
    batch = {"input_ids": tf.constant(ids), "input_mask": tf.constant((ids > 0).astype(np.int32)),
             "segment_ids": tf.zeros_like(ids), "window_mask": tf.constant(window_mask),
             "label_ids": tf.constant([1, 0]), "is_real_example": tf.constant([1, 1])}
    with tf.GradientTape() as tape:
        loss, metrics = classification_loss(model, batch, training=True, window_aggregation=aggregation)
    grad = tf.convert_to_tensor(tape.gradient(loss, table)).numpy()
    assert np.isfinite(loss.numpy()) and metrics["accuracy"][1].numpy() == 2.0
    np.testing.assert_array_equal(grad[[0, 5]], 0.0)  # the empty slot and the masked one (row 5's 9.0 is ignored)
    assert (grad[4] != 0).all()  # input 1's only window
    if aggregation == "max":  # unit 0's max of input 0 is row 3 (2.0), unit 1's row 1 (3.0)
        assert grad[3, 0] != 0 and grad[1, 1] != 0
        np.testing.assert_array_equal([grad[1, 0], grad[2, 0], grad[2, 1], grad[3, 1]], 0.0)
    else:
        assert (grad[1:4] != 0).all()
    if aggregation == "logmeanexp":  # unit 1: the largest window (row 1, 3.0) gets most
        assert abs(grad[1, 1]) > abs(grad[3, 1]) > abs(grad[2, 1])
    # The loss is the cross-entropy of the aggregate, computed here by hand.
    logits = np.array([[[0.0, 3.0], [1.0, -1.0], [2.0, 0.5]]])[0]
    p_no = np.prod(np.exp(logits[:, 0]) / np.exp(logits).sum(-1))
    combined = {"max": logits.max(0), "mean": logits.mean(0), "logmeanexp": np.log(np.exp(logits).mean(0)),
                "any": np.log([p_no, 1 - p_no])}[aggregation]
    expected = 0.5 * (-np.log(np.exp(combined[1]) / np.exp(combined).sum()) - np.log(np.exp(0) / (1 + np.e)))
    assert loss.numpy() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("aggregation", ["max", "any"])
def test_clean_negatives_trains_every_window_of_a_no_input_and_the_aggregate_of_a_yes_one(tmp_path, aggregation):
    """--window_training=clean_negatives' loss, through the task: a "no" input (the first label) is scored on each
    of its real windows against "no" (an empty slot left out), a "yes" one on the aggregate of its windows, so
    under max only its deciding window per unit gets a gradient; a padding row weighs nothing. The stand-in model
    of the test above; the loss checked against cross-entropies worked out here."""
    import tensorflow as tf

    from bert_tf.runners.classifier import ClassifierRunConfig, ClassifierTask

    spec = glue.user_task("text", "label", labels=["no", "yes"])
    task = ClassifierTask(ClassifierRunConfig(task=spec, data_dir=str(tmp_path), output_dir=str(tmp_path),
                                              long_inputs="windows", doc_stride=8, window_aggregation=aggregation,
                                              window_training="clean_negatives"))
    rows = np.array([[0, 0], [0, 1], [2, 0], [9, 9], [0, 3], [1, -1], [0, 0], [5, 0]], np.float32)
    table = tf.Variable(rows)

    def model(batch, training):  # [W, S] -> [W, 2]: the table row of each window's first piece
        return tf.gather(table, batch["input_ids"][:, 1])

    ids = np.zeros((3, 3, 4), np.int32)
    ids[:, :, 1] = [[1, 2, 3], [4, 5, 6], [7, 0, 0]]  # "no" (row 3 in an empty slot), "yes", padding
    window_mask = np.array([[1, 1, 0], [1, 1, 1], [1, 0, 0]], np.int32)
    batch = {"input_ids": tf.constant(ids), "input_mask": tf.constant((ids > 0).astype(np.int32)),
             "segment_ids": tf.zeros_like(ids), "window_mask": tf.constant(window_mask),
             "label_ids": tf.constant([0, 1, 1]), "is_real_example": tf.constant([1, 1, 0])}
    with tf.GradientTape() as tape:
        loss, metrics = task.loss(model, batch, training=True)
    grad = tf.convert_to_tensor(tape.gradient(loss, table)).numpy()

    def xent(logits, label):
        return -(logits - np.logaddexp(*logits))[label]

    negative = (xent(rows[1], 0) + xent(rows[2], 0)) / 2  # its two real windows against "no"
    aggregate = aggregate_windows(rows[[1, 2, 4, 5, 6]], [0, 0, 1, 1, 1], 2, aggregation)
    assert loss.numpy() == pytest.approx((negative + xent(aggregate[1], 1)) / 2, rel=1e-5)
    accuracy = np.mean(aggregate.argmax(-1) == [0, 1])  # max: both right; any: the "no" input is called "yes"
    assert metrics["accuracy"][0].numpy() == pytest.approx(accuracy) and metrics["accuracy"][1].numpy() == 2.0
    assert accuracy == {"max": 1.0, "any": 0.5}[aggregation]
    np.testing.assert_array_equal(grad[[0, 3, 7]], 0.0)  # unused, an empty slot, the padding row
    assert (grad[1:3] != 0).all()  # every window of the "no" input
    if aggregation == "max":  # the "yes" input's max: unit 0 from row 5 (1.0), unit 1 from row 4 (3.0)
        assert grad[5, 0] != 0 and grad[4, 1] != 0
        np.testing.assert_array_equal([grad[4, 0], grad[5, 1], grad[6, 0], grad[6, 1]], 0.0)
    else:
        assert (grad[4:7] != 0).all()


@pytest.mark.parametrize("skip_padding", [True, False])
def test_empty_window_slots_change_nothing_in_a_real_model(tiny_model, tokenizer, skip_padding):
    """A tiny BERT trained on the aggregate: more (empty) slots per input give the same loss and gradients, with
    the encoder skipping padding (an empty slot has no real token) and without (XLA's dense layout)."""
    import tensorflow as tf

    from bert_tf.configs import BertConfig
    from bert_tf.models.encoder import BertEncoder
    from bert_tf.models.task_models import BertClassifier
    from bert_tf.runners.classifier import classification_loss

    rng = np.random.default_rng(6)
    examples = [glue.InputExample(str(i), _doc(rng, n), label=label) for i, (n, label) in
                enumerate([(30, "yes"), (8, "no"), (20, "no")])]
    features, window_example = glue.convert_examples_to_windows(examples, ["no", "yes"], SEQ, tokenizer, 7)
    arrays = glue.features_to_arrays(features, SEQ)
    model = BertClassifier(BertEncoder(BertConfig.from_json_file(str(tiny_model / "bert_config.json"))), 2,
                           skip_padding=skip_padding)
    losses, grads = [], []
    for slots in (None, 6):
        batch = windows_in_slots(arrays, window_example, ("label_ids", "is_real_example"), slots=slots)
        with tf.GradientTape() as tape:
            loss, _ = classification_loss(model, {k: tf.constant(v) for k, v in batch.items()}, training=False,
                                          window_aggregation="max")
        losses.append(loss.numpy())
        grads.append([tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, model.trainable_variables)])
    assert batch["input_ids"].shape[1] == 6 > int(np.bincount(window_example).max())
    assert np.isfinite(losses[0]) and losses[0] == pytest.approx(losses[1], abs=1e-6)
    for a, b in zip(*grads, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)


# ------------------------------------------------------------------ runs
MARKER = ["want", "cat", "!"]  # the sentence "want cat !": none of its pieces is a filler word


def _doc(rng, pieces, marker_at=None):
    """`pieces` random filler words; MARKER in place of the words from `marker_at` on (clipped to the end)."""
    words = list(rng.choice(FILLER, size=pieces))
    if marker_at is not None:
        marker_at = min(marker_at, pieces - len(MARKER))
        words[marker_at:marker_at + len(MARKER)] = MARKER
    return " ".join(words)


ROOM = SEQ - 2  # pieces of a single text per window


def _long_task_split(rng, n):
    """n balanced documents of three windows; "yes" ones hold MARKER somewhere after their first window."""
    labels = rng.permutation([i % 2 for i in range(n)])
    return [(_doc(rng, 3 * ROOM, int(rng.integers(ROOM, 3 * ROOM)) if y else None), "yes" if y else "no")
            for y in labels]


@pytest.fixture(scope="module")
def windows_model(tiny_model, tmp_path_factory):
    """A classifier trained with --long_inputs=windows (max aggregation, by default clean negatives, then
    calibrated) on the long-document task: (data dir, model dir, dev accuracy)."""
    rng = np.random.default_rng(7)
    data = tmp_path_factory.mktemp("long_task")
    _write_split(data / "train.tsv", _long_task_split(rng, 256))
    _write_split(data / "dev.tsv", _long_task_split(rng, 64))
    out = tmp_path_factory.mktemp("windows_model") / "out"
    results = _run(tiny_model, data, out, do_train=True, do_eval=True, num_train_epochs=20, long_inputs="windows",
                   doc_stride=ROOM, window_aggregation="max")
    return data, out, results["dev"]["eval_accuracy"]


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


@pytest.mark.slow
def test_label_past_the_first_window_is_chance_truncated_and_learned_with_windows(tiny_model, windows_model,
                                                                                   tmp_path):
    """The falsifiable check: a document of three windows is "yes" when it holds the sentence "want cat !",
    always after its first window (at a random position in its second or third). Truncated, the model never
    sees the evidence and stays at chance; with windows (trained on every window, the max of their logits per
    document) it learns the task; the same model read through its first window only is at chance again.
    Measured with each window alone: truncate 0.48-0.53, windows 0.88-1.00 (0.89-1.00 with the mean), first
    window 0.47-0.56 over data seeds 1-4 and 7. Trained on the aggregate of the max instead: 1.00 at seeds 2, 3
    and 7, 0.50 at 1 and 4. Each window then calibrated: 1.00 at seed 7; clean negatives (max's default now):
    1.00 at seed 7."""
    data, out, windows_accuracy = windows_model
    accuracy = {"windows": windows_accuracy}
    results = _run(tiny_model, data, tmp_path / "truncate", do_train=True, do_eval=True, num_train_epochs=20)
    accuracy["truncate"] = results["dev"]["eval_accuracy"]
    results = _run(tiny_model, data, out, do_eval=True, long_inputs="windows", doc_stride=ROOM,
                   window_aggregation="first")
    accuracy["windows, first window only"] = results["dev"]["eval_accuracy"]
    print("dev accuracy", accuracy)
    # 64 balanced documents: chance is 0.5 with a standard deviation of 0.0625.
    assert accuracy["truncate"] <= 0.65 and accuracy["windows, first window only"] <= 0.65, accuracy
    assert accuracy["windows"] >= 0.8, accuracy


@pytest.mark.slow
def test_long_document_is_the_aggregation_of_its_windows_and_short_ones_are_unchanged(
        tiny_model, tokenizer, windows_model, tmp_path):
    """The trained windows model evaluates and predicts truncated and with windows. The dev documents all fit:
    eval_results.txt is byte-identical. A test document of 3x max_seq_length gets the aggregation of its
    windows' logits, computed here from the model one window at a time; the test documents that fit get the
    truncated run's outputs (up to float32 rounding: they share batches with other rows); one row per input in
    every file."""
    from bert_tf import model_dir
    from bert_tf.runners.common import softmax

    rng = np.random.default_rng(1)
    data = tmp_path / "data"
    data.mkdir()
    _write_split(data / "dev.tsv", [(_doc(rng, 5 + i, 2 if i % 3 else None), "yes" if i % 3 else "no")
                                    for i in range(9)])
    long_doc = _doc(rng, 3 * SEQ, marker_at=40)
    _write_split(data / "test.tsv", [(_doc(rng, 6), ""), (long_doc, ""), (_doc(rng, 10, 2), "")], with_label=False)
    out = windows_model[1]
    _run(tiny_model, data, out, do_eval=True, do_predict=True)
    truncated = {name: (out / name).read_text() for name in ("eval_results.txt", "test_results.tsv")}

    model = model_dir.restore(str(out))
    pieces = tokenizer.tokenize(long_doc)
    assert len(pieces) == 3 * SEQ
    spans = doc_spans_for(len(pieces), SEQ - 2, 6)
    assert len(spans) == 7
    window_logits = []
    for start, length in spans:
        ids = tokenizer.convert_tokens_to_ids(["[CLS]"] + pieces[start:start + length] + ["[SEP]"])
        batch = {"input_ids": np.array([ids], np.int32), "input_mask": np.ones((1, len(ids)), np.int32),
                 "segment_ids": np.zeros((1, len(ids)), np.int32)}
        window_logits.append(np.asarray(model(batch, training=False))[0])
    window_logits = np.array(window_logits, np.float64)
    tolerance = float32_tolerance(10.0, 2 * (32 + 64 + SEQ) + 64)

    for aggregation in ("mean", "max", "logmeanexp", "any", "first"):
        _run(tiny_model, data, out, do_eval=True, do_predict=True, long_inputs="windows", doc_stride=6,
             window_aggregation=aggregation)
        assert (out / "eval_results.txt").read_text() == truncated["eval_results.txt"]
        rows = [np.array(line.split("\t"), float) for line in (out / "test_results.tsv").read_text().splitlines()]
        before = [np.array(line.split("\t"), float) for line in truncated["test_results.tsv"].splitlines()]
        assert len(rows) == len(before) == 3
        assert len((out / "user.tsv").read_text().splitlines()) == 4  # header + one row per input
        np.testing.assert_allclose(rows[0], before[0], atol=tolerance)
        np.testing.assert_allclose(rows[2], before[2], atol=tolerance)
        expected = {"mean": window_logits.mean(0), "max": window_logits.max(0), "first": window_logits[0],
                    "logmeanexp": np.log(np.exp(window_logits).mean(0)),
                    "any": aggregate_windows(window_logits, [0] * len(spans), 1, "any")[0]}
        np.testing.assert_allclose(rows[1], softmax(expected[aggregation]), atol=tolerance)
        if aggregation != "first":  # the later windows count, by more than the tolerance
            assert np.abs(softmax(expected[aggregation]) - softmax(window_logits[0])).max() > 10 * tolerance
        info = json.loads((out / "bert_tf_info.json").read_text())
        assert (info["long_inputs"], info["doc_stride"], info["window_aggregation"]) == ("windows", 6, aggregation)
        # how the model was trained (max's default), kept by evaluation-only runs
        assert info["window_training"] == "clean_negatives"


def test_windows_pack_like_any_examples(tokenizer):
    """--pack_sequences with windows: the windows are examples to pack_examples, each with its weight in its slot,
    and the packed outputs come back one per window in order, ready to aggregate."""
    from bert_tf.data.packing import pack_examples

    rng = np.random.default_rng(3)
    examples = [glue.InputExample(str(i), _doc(rng, int(n)), label="no") for i, n in enumerate([5, 40, 3, 20, 9])]
    features, window_example = glue.convert_examples_to_windows(examples, ["no", "yes"], SEQ, tokenizer, 7)
    arrays = glue.features_to_arrays(features, SEQ)
    arrays["example_weights"] = window_weights(window_example)
    packed = pack_examples(arrays, max_sequences_per_row=4)
    assert packed.num_rows < len(features)  # short windows share rows
    np.testing.assert_array_equal(packed.arrays["example_weights"][packed.row, packed.slot], arrays["example_weights"])
    assert packed.arrays["example_weights"].sum() == pytest.approx(len(examples))  # every input weighs 1
    per_slot = np.arange(packed.num_rows * 4, dtype=np.float32).reshape(packed.num_rows, 4, 1)
    outputs = packed.unpack(per_slot)
    np.testing.assert_array_equal(aggregate_windows(outputs, window_example, 5, "first")[:, 0],
                                  outputs[np.searchsorted(window_example, np.arange(5)), 0])


@pytest.mark.slow
def test_exported_windows_classifier_windows_raw_text_in_the_graph(tiny_model, windows_model, tmp_path):
    """A model directory trained with windows exports a SavedModel whose text signatures cut long texts into the
    same windows and aggregate them as the runner does: its probabilities equal test_results.tsv (float32
    rounding) for texts shorter than a window, of 3x max_seq_length and in between; the metadata records it."""
    import tensorflow as tf

    from bert_tf.export import export_model_dir

    rng = np.random.default_rng(5)
    data = tmp_path / "data"
    data.mkdir()
    texts = [_doc(rng, 6), _doc(rng, 3 * SEQ, marker_at=30), _doc(rng, 20), _doc(rng, 3 * SEQ), _doc(rng, 14)]
    _write_split(data / "test.tsv", [(text, "") for text in texts], with_label=False)
    out = windows_model[1]
    tolerance = float32_tolerance(10.0, 2 * (32 + 64 + SEQ) + 64)
    for aggregation in ("mean", "max", "logmeanexp", "any"):
        _run(tiny_model, data, out, do_predict=True, long_inputs="windows", doc_stride=5,
             window_aggregation=aggregation)
        expected = np.loadtxt(out / "test_results.tsv", delimiter="\t")
        export = export_model_dir(str(out), str(tmp_path / f"export_{aggregation}"))
        metadata = json.loads((tmp_path / f"export_{aggregation}" / "assets" / "bert_tf_export.json").read_text())
        assert (metadata["long_inputs"], metadata["doc_stride"], metadata["window_aggregation"]) == \
            ("windows", 5, aggregation)
        loaded = tf.saved_model.load(export)
        single = loaded.signatures["serve_text"](text=tf.constant(texts))["probabilities"].numpy()
        default = loaded.signatures["serving_default"](text_a=tf.constant(texts),
                                                       text_b=tf.constant([""] * len(texts)))["probabilities"]
        np.testing.assert_allclose(single, expected, atol=tolerance)
        np.testing.assert_allclose(default.numpy(), expected, atol=tolerance)
        if aggregation in ("max", "logmeanexp"):  # the marker past the first window is found: the windows were read
            assert single[1].argmax() == 1 and single[3].argmax() == 0, single


def test_serving_windows_are_the_runner_windows(tokenizer, tiny_model):
    """The graph's windows (bert_tf.serving.windows.window_inputs) hold the ids, mask and segments of the runner's
    (glue.convert_examples_to_windows) for single texts and pairs, short and long, in the same order."""
    import tensorflow as tf

    from bert_tf.serving.tokenizer import InGraphTokenizer
    from bert_tf.serving.windows import window_inputs

    rng = np.random.default_rng(2)
    examples = [glue.InputExample("0", _doc(rng, 40)), glue.InputExample("1", _doc(rng, 5)),
                glue.InputExample("2", "how are you ?", _doc(rng, 30)), glue.InputExample("3", "hello", "a cat"),
                glue.InputExample("4", _doc(rng, 15))]
    features, window_example = glue.convert_examples_to_windows(examples, None, SEQ, tokenizer, doc_stride=5)
    arrays = glue.features_to_arrays(features, SEQ)
    graph_tokenizer = InGraphTokenizer(str(tiny_model / "vocab.txt"), do_lower_case=True)
    ids = graph_tokenizer.tokenize(tf.constant([e.text_a for e in examples] + [e.text_b or "" for e in examples]))
    hub, example, count = window_inputs(ids[:5], ids[5:], SEQ, 5, graph_tokenizer.lookup("[CLS]"),
                                        graph_tokenizer.lookup("[SEP]"))
    np.testing.assert_array_equal(example.numpy(), window_example)
    np.testing.assert_array_equal(count.numpy(), np.bincount(window_example))
    np.testing.assert_array_equal(hub["input_word_ids"].numpy(), arrays["input_ids"])
    np.testing.assert_array_equal(hub["input_mask"].numpy(), arrays["input_mask"])
    np.testing.assert_array_equal(hub["input_type_ids"].numpy(), arrays["segment_ids"])


# ------------------------------------------------------------------ the tagger (NER --doc_stride) served with windows
NER_STRIDE = 5
NER_TAGS = {"cat": "B-PER", "dogs": "B-ORG", "unwanted": "B-MISC"}  # dog ##s and un ##want ##ed: several pieces


def _ner_sentence(rng, pieces):
    """Words of exactly `pieces` word pieces: fillers and the tagged words of NER_TAGS."""
    words, left = [], pieces
    while left:
        word = str(rng.choice(FILLER + list(NER_TAGS)))
        size = {"dogs": 2, "unwanted": 3}.get(word, 1)
        if size <= left:
            words.append(word)
            left -= size
    return words


@pytest.fixture(scope="module")
def ner_model(tiny_model, tmp_path_factory):
    """A tagger trained with --doc_stride on sentences of up to two windows, its model dir and the texts to tag:
    one of 3x max_seq_length pieces, one of 20 and two shorter than a window."""
    from bert_tf.runners.ner import NerRunConfig, run

    rng = np.random.default_rng(11)
    data = tmp_path_factory.mktemp("ner_data")
    train = [_ner_sentence(rng, int(rng.integers(3, 2 * ROOM))) for _ in range(64)]
    (data / "train.txt").write_text("\n\n".join("\n".join(f"{w} {NER_TAGS.get(w, 'O')}" for w in s) for s in train)
                                    + "\n")
    texts = [_ner_sentence(rng, 3 * SEQ), _ner_sentence(rng, 5), _ner_sentence(rng, 20), _ner_sentence(rng, ROOM)]
    (data / "test.txt").write_text("\n\n".join("\n".join(s) for s in texts) + "\n")  # words only
    out = tmp_path_factory.mktemp("ner_model") / "out"
    settings = _settings(tiny_model)
    run(NerRunConfig(data_dir=str(data), output_dir=str(out), run=settings, max_seq_length=SEQ,
                     doc_stride=NER_STRIDE, do_train=True, train_batch_size=8, num_train_epochs=3.0))
    run(NerRunConfig(data_dir=str(data), output_dir=str(out), run=settings, max_seq_length=SEQ,
                     doc_stride=NER_STRIDE, do_predict=True))
    return out, texts


@pytest.mark.slow
def test_exported_tagger_tags_each_word_of_a_long_text_in_its_max_context_window(tiny_model, tokenizer, ner_model,
                                                                                 tmp_path):
    """A tagger trained with --doc_stride exports a SavedModel whose serving_default windows the text in the graph
    with the recorded stride: its tags are the runner's test_predictions.txt word for word (a text of 3x
    max_seq_length, one of 20 pieces, shorter ones), and each word's probabilities are those of the window giving
    its first piece the most context, computed here one window at a time (float32 rounding); another window
    holding the word would give other probabilities."""
    import tensorflow as tf

    from bert_tf import model_dir
    from bert_tf.export import export_model_dir
    from bert_tf.tasks.windows import check_is_max_context

    out, texts = ner_model
    export = export_model_dir(str(out), str(tmp_path / "tagger"))
    metadata = json.loads((tmp_path / "tagger" / "assets" / "bert_tf_export.json").read_text())
    assert (metadata["long_inputs"], metadata["doc_stride"], metadata["window_tags"]) == \
        ("windows", NER_STRIDE, "max_context")
    served = tf.saved_model.load(export).signatures["serving_default"](text=tf.constant([" ".join(t) for t in texts]))
    runner = [s.split("\n") for s in (out / "test_predictions.txt").read_text().strip().split("\n\n")]
    assert [len(s) for s in runner] == [len(t) for t in texts]
    assert served["num_words"].numpy().tolist() == [len(t) for t in texts]
    assert served["tags"].shape[1] == len(texts[0]) > SEQ  # as wide as the longest text
    for i, sentence in enumerate(runner):
        assert [line.split()[0] for line in sentence] == texts[i]
        assert [w.decode() for w in served["words"].numpy()[i][:len(texts[i])]] == texts[i]
        assert [t.decode() for t in served["tags"].numpy()[i][:len(texts[i])]] == [line.split()[1] for line in
                                                                                    sentence]
        assert served["tags"].numpy()[i][len(texts[i]):].tolist() == [b""] * (len(texts[0]) - len(texts[i]))

    model = model_dir.restore(str(out))
    labels = json.loads((out / "bert_tf_info.json").read_text())["label_list"]
    probabilities = served["probabilities"].numpy()
    assert probabilities.shape == (len(texts), len(texts[0]), len(labels))
    tolerance = float32_tolerance(10.0, 2 * (32 + 64 + SEQ) + 64)
    pieces = [tokenizer.tokenize(w) for w in texts[0]]
    flat = [p for word in pieces for p in word]
    assert len(flat) == 3 * SEQ
    spans = doc_spans_for(len(flat), ROOM, NER_STRIDE)
    window_probabilities = []
    for start, length in spans:
        ids = tokenizer.convert_tokens_to_ids(["[CLS]"] + flat[start:start + length] + ["[SEP]"])
        batch = {"input_ids": np.array([ids], np.int32), "input_mask": np.ones((1, len(ids)), np.int32),
                 "segment_ids": np.zeros((1, len(ids)), np.int32)}
        logits = np.asarray(model(batch, training=False), np.float64)[0]
        window_probabilities.append(np.exp(logits) / np.exp(logits).sum(-1, keepdims=True))
    first_piece = np.cumsum([0] + [len(p) for p in pieces[:-1]])
    other_windows_differ = 0
    for word, p in enumerate(first_piece):
        holding = [k for k, (start, length) in enumerate(spans) if start <= p < start + length]
        owner = [k for k in holding if check_is_max_context(spans, k, p)]
        assert len(owner) == 1
        expected = window_probabilities[owner[0]][p - spans[owner[0]][0] + 1]
        np.testing.assert_allclose(probabilities[0, word], expected, atol=tolerance)
        for k in holding:
            other = window_probabilities[k][p - spans[k][0] + 1]
            other_windows_differ += k != owner[0] and np.abs(other - expected).max() > 10 * tolerance
    # Which window a word is read in shows (measured: 13 (word, other window) pairs of the 41 words differ).
    assert other_windows_differ >= 5, other_windows_differ
    np.testing.assert_array_equal(probabilities[1, len(texts[1]):], 0.0)


@pytest.mark.slow
def test_exported_tagger_answers_texts_that_fit_as_without_windows(ner_model, tmp_path):
    """Texts shorter than one window: the windowed tagger gives what the tagger without windows (the export of
    the same model dir with windows=None) gives, at today's width of max_seq_length."""
    import tensorflow as tf

    from bert_tf.export import export_model_dir

    out, texts = ner_model
    short = tf.constant([" ".join(texts[1]), " ".join(texts[3]), "", "the cat sat"])
    windowed = tf.saved_model.load(export_model_dir(str(out), str(tmp_path / "windows")))
    plain = tf.saved_model.load(export_model_dir(str(out), str(tmp_path / "plain"), windows=None))
    assert "long_inputs" not in json.loads((tmp_path / "plain" / "assets" / "bert_tf_export.json").read_text())
    got = windowed.signatures["serving_default"](text=short)
    want = plain.signatures["serving_default"](text=short)
    assert set(got) == set(want) == {"words", "tags", "probabilities", "num_words"}
    assert got["tags"].shape[1] == SEQ
    for key in ("words", "tags", "num_words"):
        np.testing.assert_array_equal(got[key].numpy(), want[key].numpy())
    np.testing.assert_allclose(got["probabilities"].numpy(), want["probabilities"].numpy(), atol=1e-6)
    # The one without windows drops the words past its one window; the windowed one tags them all.
    long = tf.constant([" ".join(texts[0])])
    assert plain.signatures["serving_default"](text=long)["num_words"].numpy()[0] < len(texts[0])
    assert windowed.signatures["serving_default"](text=long)["num_words"].numpy()[0] == len(texts[0])


# ------------------------------------------------------------------ int8 with windows
@pytest.mark.slow
def test_int8_exports_with_windows_stay_within_the_int8_bound(windows_model, ner_model, tmp_path):
    """The windowed classifier and tagger exported in int8 answer long and short texts within the bound the
    suite holds non-windowed int8 exports to (tests/test_export_int8.py): probabilities within
    TINY_PROB_TOLERANCE of the float32 windowed export, the same labels and tags."""
    import tensorflow as tf

    from bert_tf.export import export_model_dir

    rng = np.random.default_rng(9)
    out = windows_model[1]
    texts = tf.constant([_doc(rng, 3 * SEQ, marker_at=30), _doc(rng, 6), _doc(rng, 3 * SEQ), _doc(rng, 20, 12)])
    serve = {name: tf.saved_model.load(export_model_dir(str(out), str(tmp_path / f"classifier_{name}"),
                                                        quantize=name)).signatures["serve_text"]
             for name in ("none", "int8")}
    fp32, int8 = (serve[name](text=texts) for name in ("none", "int8"))
    difference = np.abs(int8["probabilities"].numpy() - fp32["probabilities"].numpy()).max()
    print("classifier int8 vs float32, largest probability difference", difference)
    assert 0 < difference < TINY_PROB_TOLERANCE
    np.testing.assert_array_equal(int8["label"].numpy(), fp32["label"].numpy())

    out, ner_texts = ner_model
    texts = tf.constant([" ".join(t) for t in ner_texts])
    serve = {name: tf.saved_model.load(export_model_dir(str(out), str(tmp_path / f"tagger_{name}"),
                                                        quantize=name)).signatures["serving_default"]
             for name in ("none", "int8")}
    fp32, int8 = (serve[name](text=texts) for name in ("none", "int8"))
    assert json.loads((tmp_path / "tagger_int8" / "assets" / "bert_tf_export.json").read_text())["long_inputs"] == \
        "windows"
    difference = np.abs(int8["probabilities"].numpy() - fp32["probabilities"].numpy()).max()
    print("tagger int8 vs float32, largest probability difference", difference)
    assert 0 < difference < TINY_PROB_TOLERANCE
    np.testing.assert_array_equal(int8["tags"].numpy(), fp32["tags"].numpy())
    np.testing.assert_array_equal(int8["num_words"].numpy(), [len(t) for t in ner_texts])


def test_select_windows_takes_the_top_k_by_margin_and_the_hardest_of_the_first_label():
    """A "yes" input (label 1): its windows with the largest logit[1] - logit[0], labelled yes; a "no" input: its
    windows with the largest margin of another label, labelled no; ties go to the earlier window; an input with
    fewer windows than k gives all it has."""
    from bert_tf.tasks.windows import select_windows

    logits = np.array([[0, 1], [0, 3], [0, 2], [0, -1], [0, 5], [1, 0], [2, 2], [0, 0]], np.float32)
    window_example = [0, 0, 0, 1, 1, 2, 3, 3]
    rows, labels = select_windows(logits, window_example, [1, 0, 0, 1], k=1)
    assert rows.tolist() == [1, 4, 5, 6] and labels.tolist() == [1, 0, 0, 1]
    rows, labels = select_windows(logits, window_example, [0, 1, 1, 0], k=2)
    assert rows.tolist() == [1, 2, 3, 4, 5, 6, 7] and labels.tolist() == [0, 0, 1, 1, 1, 0, 0]
    with pytest.raises(ValueError, match="in input order"):
        select_windows(logits, [0, 1, 0, 1, 2, 2, 3, 3], [0, 1, 1, 0], k=1)


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


# ------------------------------------------------------------------ the absent label ("found nowhere")
def test_the_absent_label_goes_first_and_a_trusted_one_must_be_named(tmp_path):
    """order_labels: labels read from train.tsv sort "contains_nt" before "none"; a setting that trusts the absent
    label with none named is one line listing them; named (or recorded by the output_dir), it goes first; listed
    labels keep their order and refuse another one; a regression has none."""
    from bert_tf.tasks.absent_label import order_labels, trusting_setting

    assert trusting_setting("windows", "max", None) == \
        "--window_training=clean_negatives (--window_aggregation=max's default)"
    assert trusting_setting("windows", "any", None) == \
        "--window_training=each_then_calibrate (--window_aggregation=any's default)"
    assert trusting_setting("windows", "any", "each") == "--window_aggregation=any"
    assert trusting_setting("windows", "mean", "each_then_calibrate") == "--window_training=each_then_calibrate"
    assert [trusting_setting("windows", "max", "each"), trusting_setting("windows", "mean", None),
            trusting_setting("truncate", "max", None)] == [None, None, None]
    _write_split(tmp_path / "train.tsv", [("a b", "none"), ("c d", "contains_nt"), ("e f", "other")])
    unlisted = glue.user_task("text", "label", index="id")
    by = trusting_setting("windows", "max", None)
    with pytest.raises(ValueError, match=r"^--window_training=clean_negatives \(--window_aggregation=max's default\) "
                                         r"trusts one label to mean 'found nowhere', and the labels read from the "
                                         r"training file are contains_nt, none, other: name it with "
                                         r"--absent_label=<label> \(or give --labels in id order, that label first\)$"):
        order_labels(unlisted, str(tmp_path), None, by)
    assert order_labels(unlisted, str(tmp_path), None, None).labels == ("contains_nt", "none", "other")
    assert order_labels(unlisted, str(tmp_path), "none", by).labels == ("none", "contains_nt", "other")
    assert order_labels(unlisted, str(tmp_path), None, by, recorded="other").labels == ("other", "contains_nt", "none")
    assert order_labels(unlisted, str(tmp_path), "none", by, recorded="other").labels[0] == "none"  # the flag wins
    with pytest.raises(ValueError, match=r"^--absent_label 'absent' is not one of the labels of the training file "
                                         r"\(contains_nt, none, other\)$"):
        order_labels(unlisted, str(tmp_path), "absent", by)
    listed = glue.user_task("text", "label", labels=["none", "contains_nt"], index="id")
    assert order_labels(listed, str(tmp_path), None, by).labels == ("none", "contains_nt")
    assert order_labels(listed, str(tmp_path), "none", by).labels == ("none", "contains_nt")
    with pytest.raises(ValueError, match=r"^--absent_label=contains_nt but the labels are listed in id order "
                                         r"\(none, contains_nt\), the first meaning 'found nowhere': list "
                                         r"contains_nt first in --labels, or drop --absent_label$"):
        order_labels(listed, str(tmp_path), "contains_nt", by)
    regression = glue.user_task("text", "label", regression=True, index="id")
    assert order_labels(regression, str(tmp_path), None, by) is regression
    with pytest.raises(ValueError, match=r"^--absent_label needs labels; this task is a regression$"):
        order_labels(regression, str(tmp_path), "none", by)


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
