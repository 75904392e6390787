"""Inputs longer than max_seq_length (--long_inputs=windows), in this process: the windows, their aggregation into
one output per input, the calibration, window slots and where the gradient goes, packing, the serving windows,
window selection and the absent label's order. Runs: tests/test_long_inputs_training.py; trained models and
their exports: tests/test_long_inputs_models.py."""


import numpy as np
import pytest
from long_inputs import (
    FILLER,
    SEQ,
    TINY_CONFIG_OVERRIDES,  # noqa: F401  (conftest's tiny_model reads it)
    _doc,
    _write_split,
)

from bert_tf.errors import InputDataError
from bert_tf.tasks import glue
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


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return FullTokenizer(str(tiny_model / "vocab.txt"), do_lower_case=True)


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
    with pytest.raises(InputDataError, match=r"^example p: text_a has 14 word pieces, which leaves no room for "
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
    from bert_tf.errors import ConfigError
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
    with pytest.raises(ConfigError, match=r"^--window_aggregation=any needs labels .* this task is a regression$"):
        task("any", regression=True)
    assert task("max", regression=True).window_training == "each"  # nothing to calibrate
    for training in ("each_then_calibrate", "clean_negatives"):
        with pytest.raises(ConfigError, match=rf"^--window_training={training} needs labels, one meaning "
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
