"""Packed fine-tuning (bert_tf.data.packing.pack_examples, the task models' packed paths): every example lands
in one row intact, predictions come back one per example in input order, and a packed batch has the logits,
losses and gradients of the same examples unpacked."""

import numpy as np
import pytest
import tensorflow as tf
from conftest import float32_tolerance

from bert_tf.configs import BertConfig
from bert_tf.data.packing import pack_examples
from bert_tf.models import BertClassifier, BertEncoder, BertMultipleChoice, BertTokenClassifier
from bert_tf.runners.classifier import classification_loss
from bert_tf.runners.common import PACKED_INPUTS
from bert_tf.runners.ner import IGNORE_LABEL_ID, tagging_loss

SEQ, VOCAB, CHOICES, LABELS = 32, 50, 3, 4
CONFIG = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=64, max_position_embeddings=SEQ)
# Two float32 computations of the logits differ only in the order of their sums: each layer adds about
# hidden + intermediate + SEQ terms; magnitude 10 bounds the activations before LayerNorm.
TOLERANCE = float32_tolerance(10.0, CONFIG.num_hidden_layers * (32 + 64 + SEQ) + 64)


def _examples(num, rng, choices=None, min_len=3, max_len=SEQ):
    """Featurized arrays as the tasks make them: [CLS] a [SEP] (b [SEP]), zero-padded; lengths from min..max."""
    shape = (num,) if choices is None else (num, choices)
    lengths = rng.integers(min_len, max_len + 1, size=shape)
    ids = rng.integers(5, VOCAB, size=shape + (SEQ,)).astype(np.int32)
    mask = (np.arange(SEQ) < lengths[..., None]).astype(np.int32)
    segments = ((np.arange(SEQ) >= lengths[..., None] // 2) & (mask == 1)).astype(np.int32)
    ids[..., 0] = 2
    return {"input_ids": ids * mask, "input_mask": mask, "segment_ids": segments,
            "label_ids": rng.integers(0, choices or LABELS, size=num).astype(np.int32),
            "is_real_example": np.ones(num, np.int32)}


def _batches(arrays, keys):
    return {k: tf.constant(arrays[k]) for k in keys}


@pytest.fixture(scope="module")
def encoder():
    tf.keras.utils.set_random_seed(1)
    return BertEncoder(CONFIG)


def test_every_example_lands_once_intact_and_comes_back_in_order():
    rng = np.random.default_rng(0)
    arrays = _examples(200, rng, max_len=SEQ // 2)
    arrays["token_tags"] = np.where(arrays["input_mask"] == 1, rng.integers(0, 9, size=(200, SEQ)), -7)
    packed = pack_examples(arrays, max_sequences_per_row=8, pad_values={"token_tags": -7})
    rows = packed.arrays
    assert rows["input_ids"].shape == (packed.num_rows, SEQ) and rows["cls_positions"].shape == (packed.num_rows, 8)
    assert packed.num_rows < 200 / 2  # short examples share rows
    real = arrays["input_mask"].sum(1)
    for i in range(200):
        r, k, o, n = packed.row[i], packed.slot[i], packed.offset[i], real[i]
        assert rows["cls_positions"][r, k] == o and rows["label_ids"][r, k] == arrays["label_ids"][i]
        np.testing.assert_array_equal(rows["input_ids"][r, o:o + n], arrays["input_ids"][i, :n])
        np.testing.assert_array_equal(rows["segment_ids"][r, o:o + n], arrays["segment_ids"][i, :n])
        np.testing.assert_array_equal(rows["token_tags"][r, o:o + n], arrays["token_tags"][i, :n])
        np.testing.assert_array_equal(rows["position_ids"][r, o:o + n], np.arange(n))
        assert (rows["sequence_ids"][r, o:o + n] == k + 1).all()
    # Every real token once, nothing else: padding has sequence id 0 and the pad value.
    assert np.count_nonzero(rows["sequence_ids"]) == real.sum()
    assert (rows["token_tags"][rows["sequence_ids"] == 0] == -7).all()
    assert rows["is_real_example"].sum() == 200  # empty slots weigh 0
    # Outputs per slot and per token come back one per example, in input order.
    per_slot = np.arange(packed.num_rows * 8, dtype=np.float32).reshape(packed.num_rows, 8, 1)
    np.testing.assert_array_equal(packed.unpack(per_slot)[:, 0], packed.row * 8 + packed.slot)
    per_token = rows["input_ids"][..., None].astype(np.float32)
    back = packed.unpack(per_token, sequence_outputs=True)[..., 0]
    np.testing.assert_array_equal(np.where(arrays["input_mask"] == 1, back, 0), arrays["input_ids"])
    assert (back[arrays["input_mask"] == 0] == -1e4).all()


def test_efficiency_on_a_glue_like_length_mix():
    """Short sentences (CoLA/SST-2-like, 6..40 pieces) at seq 128: mostly padding unpacked, >= 97% packed."""
    rng = np.random.default_rng(1)
    lengths = np.clip(rng.lognormal(np.log(14), 0.5, size=2000).astype(int), 4, 128)
    mask = (np.arange(128) < lengths[:, None]).astype(np.int32)
    packed = pack_examples({"input_ids": mask, "input_mask": mask, "segment_ids": 0 * mask,
                            "label_ids": np.zeros(2000, np.int32)})
    assert mask.mean() < 0.15
    assert packed.efficiency() >= 0.97, packed.efficiency()


def test_multiple_choice_groups_keep_an_example_in_one_slot_of_every_choice_row():
    rng = np.random.default_rng(2)
    arrays = _examples(60, rng, choices=CHOICES, max_len=SEQ // 3)
    packed = pack_examples(arrays, max_sequences_per_row=4)
    rows = packed.arrays
    assert rows["input_ids"].shape == (packed.num_rows, CHOICES, SEQ)
    for i in range(60):
        r, k, o = packed.row[i], packed.slot[i], packed.offset[i]
        for c in range(CHOICES):
            n = arrays["input_mask"][i, c].sum()
            np.testing.assert_array_equal(rows["input_ids"][r, c, o:o + n], arrays["input_ids"][i, c, :n])
            assert (rows["sequence_ids"][r, c, o:o + n] == k + 1).all()


def _grads(model, loss_fn, batch, mode="eager"):
    """mode: "eager", "graph" (tf.function: the runners' CPU default) or "xla" (jit_compile)."""
    def run(batch):
        with tf.GradientTape() as tape:
            loss, metrics = loss_fn(model, batch, training=False)
        return loss, metrics, tape.gradient(loss, model.trainable_variables)

    if mode != "eager":
        run = tf.function(run, jit_compile=mode == "xla", autograph=False)
    return run(batch)


def _assert_same_loss_and_grads(model, loss_fn, unpacked, packed, unused=0):
    """Packed = unpacked (eager) in eager, graph and XLA modes. `unused`: variables the loss does not
    reach (a tagger's pooler), without a gradient either way."""
    loss_u, metrics_u, grads_u = _grads(model, loss_fn, unpacked)
    for mode in ("eager", "graph", "xla"):
        loss_p, metrics_p, grads_p = _grads(model, loss_fn, packed, mode)
        assert abs(float(loss_u) - float(loss_p)) <= TOLERANCE, mode
        for name, (value, weight) in metrics_u.items():
            assert float(weight) == float(metrics_p[name][1]), (mode, name)
            assert abs(float(value) - float(metrics_p[name][0])) <= TOLERANCE, (mode, name)
        compared = 0
        for g_u, g_p in zip(grads_u, grads_p, strict=True):
            if g_u is None:
                assert g_p is None
                continue
            g_u, g_p = tf.convert_to_tensor(g_u).numpy(), tf.convert_to_tensor(g_p).numpy()
            np.testing.assert_allclose(g_p, g_u, atol=TOLERANCE * max(1.0, np.abs(g_u).max()), err_msg=mode)
            compared += 1
        assert compared == len(model.trainable_variables) - unused, mode


@pytest.mark.parametrize("skip_padding, num_labels, pooling", [(False, LABELS, "cls"), (True, LABELS, "cls"),
                                                                (False, 1, "cls"), (True, LABELS, "mean"),
                                                                (False, LABELS, "mean")])
def test_packed_classifier_equals_unpacked(encoder, skip_padding, num_labels, pooling):
    """Classification (with and without skipping padding) and regression (num_labels 1, float targets); read at
    [CLS] or as the mean of each example's own tokens (the pooler then gets no gradient either way)."""
    rng = np.random.default_rng(3)
    arrays = _examples(24, rng, max_len=SEQ // 2)
    if num_labels == 1:
        arrays["label_ids"] = rng.normal(size=24).astype(np.float32)
    packed = pack_examples(arrays, max_sequences_per_row=6)
    assert packed.num_rows < 12 and packed.arrays["label_ids"].dtype == arrays["label_ids"].dtype
    model = BertClassifier(encoder, num_labels=num_labels, skip_padding=skip_padding, pooling=pooling)
    unpacked_batch = _batches(arrays, ("input_ids", "input_mask", "segment_ids", "label_ids", "is_real_example"))
    packed_batch = _batches(packed.arrays, PACKED_INPUTS + ("label_ids", "is_real_example"))
    logits = model(unpacked_batch).numpy()
    packed_logits = model(packed_batch).numpy()
    assert packed_logits.shape == (packed.num_rows, 6, num_labels)
    np.testing.assert_allclose(packed.unpack(packed_logits), logits, atol=TOLERANCE)
    _assert_same_loss_and_grads(model, classification_loss, unpacked_batch, packed_batch,
                                unused=2 if pooling == "mean" else 0)


def test_packed_multiple_choice_equals_unpacked(encoder):
    rng = np.random.default_rng(4)
    arrays = _examples(12, rng, choices=CHOICES, max_len=SEQ // 3)
    packed = pack_examples(arrays, max_sequences_per_row=4)
    model = BertMultipleChoice(encoder, num_choices=CHOICES, skip_padding=False)
    unpacked_batch = _batches(arrays, ("input_ids", "input_mask", "segment_ids", "label_ids", "is_real_example"))
    packed_batch = _batches(packed.arrays, PACKED_INPUTS + ("label_ids", "is_real_example"))
    packed_logits = model(packed_batch).numpy()
    assert packed_logits.shape == (packed.num_rows, 4, CHOICES)
    np.testing.assert_allclose(packed.unpack(packed_logits), model(unpacked_batch).numpy(), atol=TOLERANCE)
    _assert_same_loss_and_grads(model, classification_loss, unpacked_batch, packed_batch)


def test_packed_tagger_equals_unpacked(encoder):
    rng = np.random.default_rng(5)
    arrays = _examples(16, rng, max_len=SEQ // 2)
    arrays["label_ids"] = np.where(arrays["input_mask"] == 1, rng.integers(0, LABELS, size=(16, SEQ)),
                                   IGNORE_LABEL_ID).astype(np.int32)
    arrays["label_ids"][:, 0] = IGNORE_LABEL_ID  # [CLS] carries no tag
    packed = pack_examples(arrays, max_sequences_per_row=6, pad_values={"label_ids": IGNORE_LABEL_ID})
    model = BertTokenClassifier(encoder, num_labels=LABELS)
    unpacked_batch = _batches(arrays, ("input_ids", "input_mask", "segment_ids", "label_ids"))
    packed_batch = _batches(packed.arrays, PACKED_INPUTS + ("label_ids",))
    logits = model(unpacked_batch).numpy()
    back = packed.unpack(model(packed_batch).numpy(), sequence_outputs=True)
    real = arrays["input_mask"] == 1
    np.testing.assert_allclose(back[real], logits[real], atol=TOLERANCE)
    _assert_same_loss_and_grads(model, tagging_loss, unpacked_batch, packed_batch, unused=2)  # pooler kernel, bias


REPLICATED_PREDICTION = """
import json, sys
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
sys.path.insert(0, sys.argv[1])
from test_finetune_packing import CONFIG, _examples
from bert_tf.data.packing import pack_examples
from bert_tf.runners.arrays import Predictor
from bert_tf.models import BertClassifier, BertEncoder
from bert_tf.runners.common import PACKED_INPUTS

strategy = tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")])
tf.keras.utils.set_random_seed(0)
with strategy.scope():
    model = BertClassifier(BertEncoder(CONFIG), num_labels=4, skip_padding=False)
packed = pack_examples(_examples(30, np.random.default_rng(6), max_len=12), max_sequences_per_row=4)
out = {}
for name, kwargs in (("local", {}), ("replicated", {"strategy": strategy})):
    predictor = Predictor(model, dynamic_padding=False, jit_compile=True, **kwargs)
    out[name] = predictor(packed.arrays, 4, PACKED_INPUTS).tolist()
    out[name + "_traces"] = predictor.traces
print("RESULT" + json.dumps(dict(out, rows=packed.num_rows, replicas=strategy.num_replicas_in_sync)))
"""


def test_prediction_on_two_replicas_keeps_the_order_and_the_numbers():
    """Predictor with a MirroredStrategy on two logical CPUs (as on GPUs / TPU cores): each replica takes
    a slice of every batch, the last batch filled up; the joined outputs equal one device's, in order."""
    import json
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    result = subprocess.run([sys.executable, "-c", REPLICATED_PREDICTION, here], capture_output=True, text=True,
                            timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES=""),
                            cwd=os.path.dirname(here))
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.split("RESULT", 1)[1])
    assert out["replicas"] == 2 and out["rows"] % 4  # a partial last batch
    local, replicated = np.array(out["local"]), np.array(out["replicated"])
    assert local.shape == (out["rows"], 4, 4)
    np.testing.assert_allclose(replicated, local, atol=TOLERANCE)
    assert out["local_traces"] == 1 and out["replicated_traces"] <= 2  # one program (per replica device)


@pytest.mark.half_precision
@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
@pytest.mark.parametrize("kind", ["classifier", "multiple_choice", "tagger"])
def test_packed_heads_in_half_precision_equal_unpacked(precision, kind):
    """Every packed fine-tuning head in each mixed precision: packed = unpacked in eager, graph and XLA
    mode. Bound (as tests/test_packing.py's half-precision test): packing only moves where the half type
    rounds, so packed and unpacked differ by about twice what rounding to it costs the unpacked result
    (measured against the same weights in float32), 3x leaving room."""
    from bert_tf.training.step import dtype_policy

    rng = np.random.default_rng(7)
    if kind == "multiple_choice":
        arrays = _examples(12, rng, choices=CHOICES, max_len=SEQ // 3)
        packed = pack_examples(arrays, max_sequences_per_row=4)
    else:
        arrays = _examples(16, rng, max_len=SEQ // 2)
        if kind == "tagger":
            arrays["label_ids"] = np.where(arrays["input_mask"] == 1, rng.integers(0, LABELS, size=(16, SEQ)),
                                           IGNORE_LABEL_ID).astype(np.int32)
        packed = pack_examples(arrays, max_sequences_per_row=6,
                               pad_values={"label_ids": IGNORE_LABEL_ID} if kind == "tagger" else None)

    def build():
        tf.keras.utils.set_random_seed(2)
        encoder = BertEncoder(CONFIG)
        if kind == "classifier":
            return BertClassifier(encoder, num_labels=LABELS, skip_padding=False)
        if kind == "multiple_choice":
            return BertMultipleChoice(encoder, num_choices=CHOICES, skip_padding=False)
        return BertTokenClassifier(encoder, num_labels=LABELS)

    loss_fn = tagging_loss if kind == "tagger" else classification_loss
    keys = ("input_ids", "input_mask", "segment_ids", "label_ids") + (() if kind == "tagger" else ("is_real_example",))
    unpacked_batch = _batches(arrays, keys)
    packed_batch = _batches(packed.arrays, PACKED_INPUTS + keys[3:])
    exact = build()
    with dtype_policy(precision):
        model = build()
    exact(unpacked_batch), model(unpacked_batch)
    for e, m in zip(exact.weights, model.weights, strict=True):  # beyond init scale: gradients far from 0
        value = rng.normal(0.0, 0.2, e.shape).astype("float32") + (1.0 if e.path.endswith("gamma") else 0.0)
        e.assign(value)
        m.assign(value)
    loss_x, _, grads_x = _grads(exact, loss_fn, unpacked_batch)
    loss_u, _, grads_u = _grads(model, loss_fn, unpacked_batch)
    pairs = [(tf.convert_to_tensor(a).numpy(), tf.convert_to_tensor(b).numpy())
             for a, b in zip(grads_u, grads_x, strict=True) if a is not None]
    loss_bound = 3 * abs(float(loss_u) - float(loss_x)) + TOLERANCE
    scale = max(np.abs(b).max() for _, b in pairs)
    grad_bound = 3 * max(np.abs(a - b).max() for a, b in pairs) + TOLERANCE * scale
    assert grad_bound < 0.5 * scale  # the bound says something
    for mode in ("eager", "graph", "xla"):
        loss_p, _, grads_p = _grads(model, loss_fn, packed_batch, mode)
        assert abs(float(loss_p) - float(loss_u)) <= loss_bound, (mode, float(loss_p), float(loss_u))
        for g_p, g_u, v in zip(grads_p, grads_u, model.trainable_variables, strict=True):
            if g_u is None:
                assert g_p is None
                continue
            g_p = tf.convert_to_tensor(g_p).numpy()
            assert g_p.dtype == np.float32, v.path
            np.testing.assert_allclose(g_p, tf.convert_to_tensor(g_u).numpy(), rtol=0, atol=grad_bound,
                                       err_msg=f"{v.path} {mode}")
