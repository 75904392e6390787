"""Packed pretraining rows (bert_tf/data/packing.py): the packer keeps every instance intact, the tf.data
pipeline gives static shapes, and a packed batch has the losses and gradients of the same instances unpacked."""

import collections

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import float32_tolerance, shared_path

from bert_tf.configs import BertConfig
from bert_tf.data import packing, pretraining_job, schema
from bert_tf.models import BertPretrainer
from bert_tf.resources import SAMPLE_CORPUS
from bert_tf.tokenization import vocab_builder
from bert_tf.training.step import dtype_policy

SEQ, PRED = 128, 20  # round(128 * 0.15) = 19 <= 20
SHORT_SEQ_PROB = 0.5  # KJV verses are ~30 tokens: more short targets, so that rows have room to share
CLS_ID = 2  # special_tokens(0): [PAD] [UNK] [CLS] [SEP] [MASK]


def _read(path):
    """All records of a file as a dict of numpy arrays [N, ...], in file order."""
    rows = [schema.decode_example(r) for r in schema.read_records(str(path))]
    out = {k: np.array([r[k] for r in rows]) for k in rows[0]}
    out["masked_lm_weights"] = out["masked_lm_weights"].astype("float32")
    return out


def _make_records(tmp_path, corpus, vocab_file, seq, pred, name, **options):
    out = tmp_path / f"{name}.tfrecord"
    pretraining_job.create_pretraining_data(pretraining_job.PretrainingDataConfig(
        input_file=str(corpus), output_file=str(out), vocab_file=str(vocab_file), max_seq_length=seq,
        max_predictions_per_seq=pred, dupe_factor=1, num_workers=1, **options))
    return out


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """Real instances from the bundled KJV sample, with a word-level vocab of it (no downloads)."""
    d = tmp_path_factory.mktemp("packing")
    with open(SAMPLE_CORPUS, encoding="utf-8") as f:
        words = sorted(vocab_builder.count_words(f))
    vocab = vocab_builder.special_tokens(0) + words
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    path = _make_records(d, SAMPLE_CORPUS, d / "vocab.txt", SEQ, PRED, "kjv", short_seq_prob=SHORT_SEQ_PROB)
    return {"path": path, "features": _read(path), "vocab_size": len(vocab)}


def _unpacked_instances(packed):
    """Packed rows -> the instances they hold, each as a hashable (tokens, segments, predictions, label)
    with prediction positions relative to the sequence's [CLS]; checks the row layout on the way."""
    found = []
    for r in range(len(packed["input_ids"])):
        seq_ids = packed["sequence_ids"][r]
        weights = packed["masked_lm_weights"][r]
        assert np.array_equal(weights != 0, np.arange(len(weights)) < np.count_nonzero(weights))  # real ones first
        for k in range(1, seq_ids.max() + 1):
            where = np.flatnonzero(seq_ids == k)
            start = packed["cls_positions"][r, k - 1]
            assert np.array_equal(where, np.arange(start, start + len(where)))  # contiguous, from its [CLS]
            assert packed["input_ids"][r, start] == CLS_ID
            np.testing.assert_array_equal(packed["position_ids"][r, where], np.arange(len(where)))  # restart at 0
            assert packed["next_sentence_weights"][r, k - 1] == 1.0
            positions = packed["masked_lm_positions"][r][weights != 0]
            mine = (positions >= start) & (positions < start + len(where))
            ids = packed["masked_lm_ids"][r][weights != 0][mine]
            found.append((tuple(packed["input_ids"][r, where]), tuple(packed["segment_ids"][r, where]),
                          tuple(positions[mine] - start), tuple(ids), int(packed["next_sentence_labels"][r, k - 1])))
        slots = seq_ids.max()
        assert not packed["next_sentence_weights"][r, slots:].any() and not packed["cls_positions"][r, slots:].any()
        assert not packed["input_ids"][r][seq_ids == 0].any() and not packed["position_ids"][r][seq_ids == 0].any()
    return found


def _original_instances(features):
    out = []
    for i in range(len(features["input_ids"])):
        n = int(features["input_mask"][i].sum())
        real = features["masked_lm_weights"][i] != 0
        out.append((tuple(features["input_ids"][i, :n]), tuple(features["segment_ids"][i, :n]),
                    tuple(features["masked_lm_positions"][i][real]), tuple(features["masked_lm_ids"][i][real]),
                    int(features["next_sentence_labels"][i, 0])))
    return out


# ------------------------------------------------------------------ the packer
def test_best_fit_decreasing_by_hand():
    # Longest first: 6 opens row 0 (room 2), 5 row 1 (room 3), 4 row 2 (room 4);
    # 3 takes the tightest room that fits (row 1), 2 then row 0.
    row, slot = packing.best_fit_decreasing([5, 3, 4, 2, 6], [1, 1, 1, 1, 1], max_seq_length=8,
                                            max_sequences_per_row=2, max_predictions_per_row=10)
    assert row.tolist() == [1, 1, 2, 0, 0] and slot.tolist() == [0, 1, 0, 1, 0]
    # A row closes at K sequences, and predictions are a capacity too.
    row, _ = packing.best_fit_decreasing([2, 2, 2], [1, 1, 1], 8, max_sequences_per_row=2)
    assert row.tolist() == [0, 0, 1]
    row, _ = packing.best_fit_decreasing([2, 2, 2], [3, 3, 3], 8, max_sequences_per_row=3, max_predictions_per_row=6)
    assert row.tolist() == [0, 0, 1]
    with pytest.raises(ValueError, match="lengths"):
        packing.best_fit_decreasing([9], [1], 8)


def test_default_prediction_room_holds_every_row_of_the_tool(records):
    f = records["features"]
    predictions = (f["masked_lm_weights"] != 0).sum(1)
    assert predictions.max() == 19  # a full row: round(128 * 0.15)
    q = packing.default_max_predictions_per_row(PRED, packing.MAX_SEQUENCES_PER_ROW)
    unlimited, _ = packing.best_fit_decreasing(f["input_mask"].sum(1), predictions, SEQ, max_predictions_per_row=None)
    bounded, _ = packing.best_fit_decreasing(f["input_mask"].sum(1), predictions, SEQ, max_predictions_per_row=q)
    np.testing.assert_array_equal(bounded, unlimited)  # Q = P + K never binds on the tool's records


def test_every_instance_is_packed_once_and_intact(records):
    f = records["features"]
    packed = packing.pack_features(f, max_sequences_per_row=4)
    n, rows = len(f["input_ids"]), len(packed["input_ids"])
    assert rows < n and packed["sequence_ids"].max() > 1  # some rows hold several sequences
    assert packed["input_ids"].shape == (rows, SEQ) and packed["cls_positions"].shape == (rows, 4)
    assert packed["masked_lm_ids"].shape == (rows, PRED + 4)
    assert collections.Counter(_unpacked_instances(packed)) == collections.Counter(_original_instances(f))
    # Masked positions point at the same tokens ([MASK] or its replacement) as before.
    assert packed["masked_lm_weights"].sum() == f["masked_lm_weights"].sum()
    at = np.take_along_axis(packed["input_ids"], packed["masked_lm_positions"], 1)[packed["masked_lm_weights"] != 0]
    before = np.take_along_axis(f["input_ids"], f["masked_lm_positions"], 1)[f["masked_lm_weights"] != 0]
    assert collections.Counter(at.tolist()) == collections.Counter(before.tolist())
    # Efficiency: real tokens / all tokens, the real tokens conserved.
    real = int(f["input_mask"].sum())
    assert packing.packing_efficiency(f["input_mask"]) == real / (n * SEQ)
    assert packing.packing_efficiency(packed["sequence_ids"]) == real / (rows * SEQ)
    assert np.count_nonzero(packed["sequence_ids"]) == real


def test_packer_refuses_instances_not_in_the_schema(records):
    f = dict(records["features"])
    f["input_mask"] = f["input_mask"].copy()
    f["input_mask"][0, 0] = 0  # a hole before real tokens
    with pytest.raises(ValueError, match="input_mask"):
        packing.pack_features(f)


@pytest.mark.parametrize("seq,pred,before,at_least", [(128, 20, 0.929, 0.97), (512, 77, 0.699, 0.99)])
@pytest.mark.slow
def test_kjv_records_pack_to_at_least_97_percent(tmp_path, seq, pred, before, at_least):
    """The issue's measurement: KJV pretraining records (uncased vocab, dupe 1) packed a buffer at a time.
    At 128 no packer can pass 97.9%: the 93% of instances longer than 64 tokens each need a row."""
    corpus = shared_path("corpora", "kjv_pretraining.txt")
    vocab = shared_path("fixtures", "vocab", "bert-base-uncased-vocab.txt")
    f = _read(_make_records(tmp_path, corpus, vocab, seq, pred, f"kjv{seq}"))
    assert packing.packing_efficiency(f["input_mask"]) == pytest.approx(before, abs=1e-3)
    rows = real = 0
    for start in range(0, len(f["input_ids"]), packing.PACKING_BUFFER_SIZE):
        packed = packing.pack_features({k: v[start:start + packing.PACKING_BUFFER_SIZE] for k, v in f.items()})
        rows += len(packed["input_ids"])
        real += np.count_nonzero(packed["sequence_ids"])
    assert real == f["input_mask"].sum() and real / (rows * seq) >= at_least


# ------------------------------------------------------------------ tf.data
def test_pipeline_gives_static_batches_and_keeps_every_instance(records):
    f = records["features"]
    batch = 16
    ds = packing.packed_pretraining_dataset([str(records["path"])], SEQ, PRED, batch, is_training=False,
                                            buffer_size=300)
    for name, (_, size) in packing.PACKED_FEATURES.items():
        width = {"S": SEQ, "Q": PRED + packing.MAX_SEQUENCES_PER_ROW, "K": packing.MAX_SEQUENCES_PER_ROW}[size]
        assert ds.element_spec[name].shape == (batch, width), name  # static: one XLA program
    rows = {k: np.concatenate([b[k].numpy() for b in ds]) for k in packing.PACKED_FEATURES}
    assert collections.Counter(_unpacked_instances(rows)) == collections.Counter(_original_instances(f))
    assert len(rows["input_ids"]) % batch == 0 and not rows["sequence_ids"][-1].any()  # filled with empty rows
    train = packing.packed_pretraining_dataset([str(records["path"])], SEQ, PRED, batch, is_training=True, seed=1,
                                               buffer_size=300)
    for b in train.take(3):
        assert b["input_ids"].shape == (batch, SEQ) and b["sequence_ids"].numpy().max() >= 1


# ------------------------------------------------------------------ the model: packed = unpacked
def _config(vocab_size):
    return BertConfig(vocab_size=vocab_size, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=32, max_position_embeddings=SEQ, type_vocab_size=2,
                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _handful(features):
    """12 real instances: the 8 shortest (several share a row) and 4 full-length ones."""
    lengths = features["input_mask"].sum(1)
    pick = np.concatenate([np.argsort(lengths, kind="stable")[:8], np.flatnonzero(lengths == SEQ)[:4]])
    return {k: v[pick] for k, v in features.items()}


def _loss_and_grads(model, batch, skip_padding, mode="eager"):
    """mode: "eager", "graph" (tf.function, the CPU default of the runners) or "xla" (jit_compile)."""
    model.skip_padding = skip_padding

    def run(batch):
        with tf.GradientTape() as tape:
            out = model(batch, training=False)
        return out, tape.gradient(out["loss"], model.trainable_variables)

    if mode != "eager":
        run = tf.function(run, jit_compile=mode == "xla", autograph=False)
        batch = {k: tf.constant(v) for k, v in batch.items()}
    out, grads = run(batch)
    return {k: float(v) for k, v in out.items()}, [tf.convert_to_tensor(g).numpy() for g in grads]


def test_packed_losses_and_gradients_equal_unpacked(records):
    """float32, dropout off. Bound: a weight's gradient is a sum over the batch's real tokens, and the
    packed batch adds the same terms in another order (other matmul shapes, other rows); a sum of n
    terms in any order errs by at most n * eps of the terms' magnitude (conftest.float32_tolerance),
    with n = the real tokens and the magnitude taken as the largest gradient entry. Keys of other
    sequences add exact zeros to attention (their softmax weight underflows to 0), so nothing else differs.

    Two packings of the same instances: room for Q = P + K predictions per row, where the masked-LM
    head runs on the batch's real predictions only (they fit in B * P slots), and Q = P, where they do
    not fit in B * (Q - K) and the head runs on every slot (BertPretrainer._packed_masked_lm)."""
    unpacked = _handful(records["features"])
    model = BertPretrainer(_config(records["vocab_size"]))
    rng = np.random.default_rng(0)
    for v in model.weights:  # beyond init scale, so that attention and the pooler are far from linear
        v.assign(rng.normal(0.0, 0.2, v.shape).astype("float32") + (1.0 if v.path.endswith("gamma") else 0.0))
    want, want_grads = _loss_and_grads(model, unpacked, skip_padding=False)
    tokens = int(unpacked["input_mask"].sum())
    scale = max(np.abs(g).max() for g in want_grads)
    assert want["next_sentence_loss"] > 0.1 and want["masked_lm_loss"] > 1.0 and scale > 1e-2
    for room, compact in ((None, True), (PRED, False)):
        packed = packing.pack_features(unpacked, max_sequences_per_row=4, max_predictions_per_row=room)
        assert len(packed["input_ids"]) < 12 and packed["sequence_ids"].max() >= 3
        rows, slots = packed["masked_lm_weights"].shape
        capacity = rows * (slots - packed["cls_positions"].shape[1])
        assert (np.count_nonzero(packed["masked_lm_weights"]) <= capacity) == compact
        for skip, mode in ((False, "eager"), (True, "eager"), (True, "graph"), (False, "graph"), (False, "xla")):
            got, got_grads = _loss_and_grads(model, packed, skip_padding=skip, mode=mode)
            for name in ("masked_lm_loss", "next_sentence_loss", "loss", "masked_lm_accuracy", "next_sentence_accuracy"):
                assert abs(got[name] - want[name]) <= float32_tolerance(abs(want[name]), tokens), (room, skip, mode, name)
            for a, b, v in zip(got_grads, want_grads, model.trainable_variables, strict=True):
                np.testing.assert_allclose(a, b, rtol=0, atol=float32_tolerance(scale, tokens),
                                           err_msg=f"{v.path} {room} {skip} {mode}")
    # The packed model really reads each sequence on its own: unpacked positions change the loss.
    plain = dict(packed, position_ids=np.tile(np.arange(SEQ, dtype="int32"), (len(packed["input_ids"]), 1)))
    assert abs(float(model(plain)["loss"]) - want["loss"]) > 1e-3


def test_packed_step_compiles_once_under_xla_and_learns(records):
    """Packed batches have one shape: a jit_compile=True step traces (and compiles) once for all of them."""
    batch = 8
    ds = packing.packed_pretraining_dataset([str(records["path"])], SEQ, PRED, batch, is_training=True, seed=3,
                                            buffer_size=256)
    batches = list(ds.take(4))
    model = BertPretrainer(_config(records["vocab_size"]), skip_padding=False)
    optimizer = keras.optimizers.Adam(1e-2)
    variables = model.trainable_variables
    optimizer.build(variables)  # its slots exist before the first trace (a variable made inside retraces)
    traces = []

    @tf.function(jit_compile=True)
    def step(features):
        traces.append(1)  # Python runs only while tracing
        with tf.GradientTape() as tape:
            loss = model(features, training=True)["loss"]
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
        return loss

    first = np.mean([float(step(b)) for b in batches])
    for _ in range(4):
        last = np.mean([float(step(b)) for b in batches])
    assert len(traces) == 1 and step.experimental_get_tracing_count() == 1
    assert last < first - 0.5, (first, last)


@pytest.mark.half_precision
@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
def test_packed_losses_equal_unpacked_in_half_precision(records, precision):
    """The packed heads in each mixed precision (float16 is what GPU users pick): losses and gradients of
    packed rows are the unpacked batch's, in eager, graph and XLA mode, for both the compact masked-LM
    head and the every-slot one. Bound: packing changes the order of the sums and where the half type
    rounds them, so a packed result differs from the float32 one by rounding of the same kind as the
    unpacked result does (measured on Zen 5: 0.7-1.4x); by the triangle inequality packed and unpacked
    then differ by at most about twice that, 3x leaving room. The heads stay float32 (their own policy),
    so logits, losses and gradients are float32 whatever the encoder computes in."""
    unpacked = _handful(records["features"])
    with dtype_policy(precision):
        model = BertPretrainer(_config(records["vocab_size"]))
    reference = BertPretrainer(_config(records["vocab_size"]))
    rng = np.random.default_rng(0)
    for v, r in zip(model.weights, reference.weights, strict=True):
        value = rng.normal(0.0, 0.2, v.shape).astype("float32") + (1.0 if v.path.endswith("gamma") else 0.0)
        v.assign(value)
        r.assign(value)
    want, want_grads = _loss_and_grads(model, unpacked, skip_padding=False)
    exact, exact_grads = _loss_and_grads(reference, unpacked, skip_padding=False)
    tokens = int(unpacked["input_mask"].sum())
    scale = max(np.abs(g).max() for g in exact_grads)
    names = ("masked_lm_loss", "next_sentence_loss", "loss")
    bound = {n: 3 * abs(want[n] - exact[n]) + float32_tolerance(abs(exact[n]), tokens) for n in names}
    grad_bound = 3 * max(np.abs(a - b).max() for a, b in zip(want_grads, exact_grads, strict=False)) + float32_tolerance(scale, tokens)
    assert want["masked_lm_loss"] > 1.0 and want["next_sentence_loss"] > 0.1 and grad_bound < 0.5 * scale
    for room in (None, PRED):  # the compact head, then every slot
        packed = packing.pack_features(unpacked, max_sequences_per_row=4, max_predictions_per_row=room)
        for skip, mode in ((False, "eager"), (True, "graph"), (False, "xla")):
            got, got_grads = _loss_and_grads(model, packed, skip_padding=skip, mode=mode)
            for name in names:
                assert abs(got[name] - want[name]) <= bound[name], (precision, room, mode, name, got[name], want[name])
            for a, b, v in zip(got_grads, want_grads, model.trainable_variables, strict=True):
                assert a.dtype == np.float32, v.path
                np.testing.assert_allclose(a, b, rtol=0, atol=grad_bound, err_msg=f"{v.path} {precision} {room} {mode}")
