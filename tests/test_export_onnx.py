"""The ONNX export (export_savedmodel.py --export_format=onnx): every export type's model.onnx equals our Keras
model, and predict.py answers raw text from it exactly as from the SavedModel of the same model_dir."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO, TINY_VOCAB, run_script, tiny_task_model_dir

from bert_tf.errors import ExportError
from bert_tf.export import EXPORT_TYPES, export_checkpoint, export_model_dir
from bert_tf.serving.predictor import Predictor, load, rows_of, run_batch

onnxruntime = pytest.importorskip("onnxruntime")  # the [onnx] extra, part of [test]

SEQ = 24
LABELS = ["neg", "pos", "mid"]
TAGS = ["O", "B-PER", "I-PER"]
# export type -> the model_dir's task info (an encoder export comes from a classifier's model_dir).
INFOS = {
    "classification": {"task_type": "classification", "label_list": LABELS, "pooling": "mean"},  # as sentence-transformers
    "regression": {"task_type": "regression"},
    "span": {"task_type": "span", "max_query_length": 6},
    "multiple_choice": {"task_type": "multiple_choice", "num_choices": 3},
    "tagging": {"task_type": "tagging", "label_list": TAGS},
    "encoder": {"task_type": "classification", "label_list": LABELS},
}
# Raw-text rows (text, text_b) per export type, with long ones that are truncated.
ROWS = {
    "span": [("how are you ? the cat sat on the mat", "the dog sat on a mat . the cat sat ."),
             ("who sat ?", "the cat " * 20), ("lowest", "")],
    "multiple_choice": [("the cat sat", "on the mat|on a dog|hello"), ("a dog " * 12, "ran|sat .|" + "mat " * 15)],
    "tagging": [("unwanted cats sat, lowest",), ("hello",), ("the cat sat on the mat " * 5,)],
}
PAIRS = [("The cat sat on the mat.", ""), ("HELLO, how are you?", "The dog sat."), ("unwanted running dog", "lowest"),
         ("a " * 30, "the mat " * 20)]


def _model_dir(folder, info):
    return tiny_task_model_dir(folder, info, seq=SEQ, hidden=16, layers=2, weight_sd=0.5, seed=3)


def _export(model_dir, kind, fmt):
    export_dir = model_dir.parent / f"{kind}_{fmt}"
    export_model_dir(str(model_dir), str(export_dir), export_type=kind if kind == "encoder" else None,
                     export_format=fmt, max_answer_length=4)
    return export_dir


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """export type -> (Keras model, its model_dir, ONNX export): a few seconds each."""
    base = tmp_path_factory.mktemp("onnx")
    out = {}
    for kind, info in INFOS.items():
        model = _model_dir(base / f"{kind}_dir", info)
        out[kind] = (model, base / f"{kind}_dir", _export(base / f"{kind}_dir", kind, "onnx"))
    return out


@pytest.fixture(scope="module")
def saved_models(exports):
    """export type -> the SavedModel export of the same model_dir (the reference for predict.py's answers)."""
    return {kind: _export(model_dir, kind, "savedmodel") for kind, (_, model_dir, _) in exports.items()}


def _ids(shape, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, len(TINY_VOCAB), shape).astype(np.int32)
    mask = np.ones(shape, np.int32)
    mask[..., shape[-1] - 4:] = 0  # padding at the end of every row
    mask[0, ..., 3:] = 0  # and a short first row
    types = np.zeros(shape, np.int32)
    types[..., 5:] = 1
    return {"input_word_ids": ids * mask, "input_mask": mask, "input_type_ids": types * mask}


def test_layer_norm_traced_for_export_is_the_same_function():
    from bert_tf.layers.normalization import layer_norm, plain_layer_norm

    rng = np.random.default_rng(0)
    x, gamma, beta = (tf.constant(rng.normal(m, s, shape).astype("float32"))
                      for m, s, shape in ((3.0, 2.0, (4, 7, 32)), (1.0, 0.3, (32,)), (0.0, 0.5, (32,))))
    np.testing.assert_allclose(plain_layer_norm(x, gamma, beta, 1e-12), layer_norm(x, gamma, beta, 1e-12),
                               atol=2e-6, rtol=0)


def test_every_export_type_is_tested():
    assert set(INFOS) == set(EXPORT_TYPES)


@pytest.mark.parametrize("kind", list(INFOS))
def test_float32_onnx_equals_the_keras_model(exports, kind):
    model, _, onnx_dir = exports[kind]
    session = onnxruntime.InferenceSession(str(onnx_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["input_word_ids", "input_mask", "input_type_ids"]
    for shape in ([(2, 3, 11)] if kind == "multiple_choice" else [(3, 11), (1, 20)]):  # dynamic batch and length
        hub = _ids(shape, seed=shape[-1])
        got = dict(zip([o.name for o in session.get_outputs()], session.run(None, hub), strict=True))
        served = model.encoder if kind == "encoder" else model
        ref = served({"input_ids": hub["input_word_ids"], "input_mask": hub["input_mask"],
                      "segment_ids": hub["input_type_ids"]}, training=False)
        if kind == "encoder":
            expected = {"pooled_output": ref["pooled_output"], "sequence_output": ref["sequence_output"],
                        **{f"encoder_outputs{'' if i == 0 else f'_{i}'}": x
                           for i, x in enumerate(ref["encoder_outputs"])}}
        elif kind == "span":
            expected = ref
        elif kind == "regression":
            expected = {"score": ref[:, 0]}
        else:
            expected = {"logits": ref, "probabilities": tf.nn.softmax(ref, axis=-1)}
        assert sorted(got) == sorted(expected)
        mask = hub["input_mask"].astype(bool)
        for name, value in expected.items():
            value = np.asarray(value)
            assert got[name].shape == value.shape, name
            if value.ndim >= 2 and value.shape[:2] == mask.shape:  # per position: padding is anyone's
                value, got[name] = value[mask], got[name][mask]
            np.testing.assert_allclose(got[name], value, atol=1e-5, rtol=0, err_msg=f"{kind} {name}")


def _rows(kind):
    return [(r[0], r[1] if len(r) > 1 else "") for r in ROWS.get(kind, PAIRS)]


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(INFOS))
def test_onnx_serves_raw_text_as_the_savedmodel(exports, saved_models, kind):
    onnx_dir, saved_dir = exports[kind][2], saved_models[kind]
    rows = _rows(kind)
    serve_onnx, meta_onnx = load(str(onnx_dir))
    serve_saved, meta_saved = load(str(saved_dir))
    assert meta_onnx["format"] == "bert_tf ONNX" and meta_onnx["export_type"] == meta_saved["export_type"]
    got, want = run_batch(serve_onnx, kind, meta_onnx, rows), run_batch(serve_saved, kind, meta_saved, rows)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].shape == want[name].shape, name
        if want[name].dtype == object:  # strings: labels, answers, words, tags
            assert got[name].tolist() == want[name].tolist(), name
        else:
            np.testing.assert_allclose(got[name], want[name], atol=1e-5, rtol=0, err_msg=name)
    # and the rows predict.py prints (labels, spans, tags) are the SavedModel's
    assert list(rows_of(kind, meta_onnx, got, rows))[0].keys() == list(rows_of(kind, meta_saved, want, rows))[0].keys()


def _script(name, *args, env=None):
    result = run_script(name, *args, env=env, timeout=300)
    errors = [line for line in result.stderr.splitlines() if line.startswith(name)]
    return result.returncode, result.stdout, errors


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(INFOS))
def test_predict_cli_on_the_onnx_export_prints_the_savedmodels_rows(exports, saved_models, kind, tmp_path):
    onnx_dir, saved_dir = exports[kind][2], saved_models[kind]
    rows = _rows(kind)
    inputs = tmp_path / "in.jsonl"
    inputs.write_text("".join(json.dumps({"text": a, "text_b": b}) + "\n" for a, b in rows), encoding="utf-8")
    code, stdout, errors = _script("predict.py", f"--export_dir={onnx_dir}", f"--input_file={inputs}",
                                   "--format=json")
    assert code == 0 and not errors, errors
    got = [json.loads(line) for line in stdout.splitlines()]
    expected = Predictor(str(saved_dir)).lines(rows)
    assert len(got) == len(expected) == len(rows)
    for g, e in zip(got, map(json.loads, expected), strict=True):
        assert g.keys() == e.keys()
        for key in g:
            if key in ("probabilities", "pooled_output", "score"):
                np.testing.assert_allclose(np.asarray(list(g[key].values()) if isinstance(g[key], dict) else g[key]),
                                           np.asarray(list(e[key].values()) if isinstance(e[key], dict) else e[key]),
                                           atol=1e-5)
            else:
                assert g[key] == e[key], key


@pytest.mark.slow
def test_beam_batch_inference_runs_the_onnx_export(exports, tmp_path):
    _, _, onnx_dir = exports["classification"]
    inputs = tmp_path / "in.tsv"
    inputs.write_text("".join(f"{a}\t{b}\n" if b else f"{a}\n" for a, b in PAIRS), encoding="utf-8")
    code, _, errors = _script("predict.py", f"--export_dir={onnx_dir}", f"--input_file={inputs}",
                              f"--output_file={tmp_path / 'out.jsonl'}", "--runner=DirectRunner", "--num_workers=1")
    assert code == 0 and not errors, errors
    written = [json.loads(line) for line in (tmp_path / "out.jsonl-00000-of-00001").read_text().splitlines()]
    assert written == [json.loads(line) for line in Predictor(str(onnx_dir)).lines(PAIRS)]


def test_int8_export_quantizes_the_matmuls_and_keeps_the_answers_close(exports, tmp_path):
    _, model_dir, onnx_dir = exports["classification"]
    int8_dir = tmp_path / "int8"
    export_model_dir(str(model_dir), str(int8_dir), export_format="onnx", quantize="int8")
    meta = json.loads((int8_dir / "assets" / "bert_tf_export.json").read_text())
    assert meta["quantization"] == "int8-dynamic"
    import onnx

    ops = {n.op_type for n in onnx.load(str(int8_dir / "model.onnx")).graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} & ops, ops
    fp32 = run_batch(load(str(onnx_dir))[0], "classification", meta, PAIRS)
    int8 = run_batch(load(str(int8_dir))[0], "classification", meta, PAIRS)
    np.testing.assert_allclose(int8["probabilities"], fp32["probabilities"], atol=0.1)


def test_a_padded_batch_runs_its_dense_layers_on_real_tokens_and_the_session_flushes_denormals(exports):
    """Batch throughput: the export keeps the task model's skip_padding (tf.where -> NonZero picks the real
    tokens' rows), a padded row answers as when alone, and the predictor's session sets FTZ/DAZ and spins
    idle threads unless BERT_TF_ORT_SPINNING=0 (a shared machine)."""
    import onnx

    from bert_tf.serving.onnx_predictor import SESSION_CONFIG, SPINNING_ENV, OnnxServe, session_config

    _, _, onnx_dir = exports["classification"]
    ops = {n.op_type for n in onnx.load(str(onnx_dir / "model.onnx")).graph.node}
    assert "NonZero" in ops, ops
    meta = json.loads((onnx_dir / "assets" / "bert_tf_export.json").read_text())
    serve = OnnxServe(str(onnx_dir), meta)
    options = serve.session.get_session_options()
    assert {k: options.get_session_config_entry(k) for k in SESSION_CONFIG} == {
        "session.set_denormal_as_zero": "1", "session.intra_op.allow_spinning": "1"}
    assert session_config({SPINNING_ENV: "0"}) == {
        "session.set_denormal_as_zero": "1", "session.intra_op.allow_spinning": "0"}
    assert session_config({SPINNING_ENV: "1"}) == session_config({}) == SESSION_CONFIG
    batch = _ids((4, 16), seed=4)  # rows of 3 and 12 real tokens, padded to 16
    together = serve.run(batch)["logits"]
    for i in range(4):
        n = int(batch["input_mask"][i].sum())
        alone = serve.run({k: v[i:i + 1, :n] for k, v in batch.items()})["logits"]
        np.testing.assert_allclose(together[i:i + 1], alone, atol=1e-5, rtol=0)


def test_the_conversion_without_weight_copies_gives_the_same_model_and_restores_tf2onnx():
    """The memory fix of the conversion (no per-pass deep copies, a fresh NodeProto per update) changes no byte
    of tf2onnx's output, and tf2onnx is as it was afterwards."""
    import tf2onnx
    from tf2onnx.graph import Node

    from bert_tf.serving.onnx_export import _tf2onnx_without_weight_copies

    weight = tf.Variable(np.random.default_rng(0).normal(size=(8, 4)).astype("float32"))
    spec = [tf.TensorSpec([None, 8], tf.float32, name="x")]
    function = tf.function(lambda x: {"y": tf.nn.relu(tf.matmul(x, weight) + 1.0)}, input_signature=spec)
    plain = tf2onnx.convert.from_function(function, input_signature=spec, opset=17)[0]
    refill = Node.update_proto
    with _tf2onnx_without_weight_copies():
        assert os.environ["TF2ONNX_CATCH_ERRORS"] == "FALSE" and Node.update_proto is not refill
        fixed = tf2onnx.convert.from_function(function, input_signature=spec, opset=17)[0]
    from onnx import numpy_helper

    def content(model):  # tf2onnx numbers its generated names per conversion: compare ops, weights and outputs
        x = np.random.default_rng(1).normal(size=(3, 8)).astype("float32")
        session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return ([n.op_type for n in model.graph.node],
                sorted(numpy_helper.to_array(t).tobytes() for t in model.graph.initializer), session.run(None, {"x": x}))

    (ops, weights, out), (ops_ref, weights_ref, out_ref) = content(fixed), content(plain)
    assert ops == ops_ref and weights == weights_ref and "MatMul" in ops
    np.testing.assert_array_equal(out[0], out_ref[0])
    assert Node.update_proto is refill and "TF2ONNX_CATCH_ERRORS" not in os.environ


def test_a_pretrained_checkpoint_exports_its_encoder_to_onnx(exports, tmp_path):
    model, model_dir, _ = exports["encoder"]
    export_checkpoint(str(model_dir), None, None, True, str(tmp_path / "enc"), 16, export_format="onnx")
    session = onnxruntime.InferenceSession(str(tmp_path / "enc" / "model.onnx"), providers=["CPUExecutionProvider"])
    hub = _ids((2, 9), seed=9)
    pooled = session.run(["pooled_output"], hub)[0]
    ref = model.encoder({"input_ids": hub["input_word_ids"], "input_mask": hub["input_mask"],
                         "segment_ids": hub["input_type_ids"]})["pooled_output"]
    np.testing.assert_allclose(pooled, ref, atol=1e-5, rtol=0)
    assert json.loads((tmp_path / "enc" / "assets" / "bert_tf_export.json").read_text())["export_type"] == "encoder"


def test_metadata_and_vocab_sit_beside_the_model(exports):
    _, _, onnx_dir = exports["tagging"]
    assert sorted(os.listdir(onnx_dir)) == ["assets", "model.onnx"]
    meta = json.loads((onnx_dir / "assets" / "bert_tf_export.json").read_text())
    assert meta["label_list"] == TAGS and meta["max_seq_length"] == SEQ and meta["onnx"]["file"] == "model.onnx"
    assert meta["tokenizer"]["do_lower_case"] is True
    assert (onnx_dir / "assets" / "vocab.txt").read_text().split("\n")[:len(TINY_VOCAB)] == TINY_VOCAB


def test_no_checkpoint_and_unknown_type_are_one_line_and_write_nothing(exports, tmp_path):
    _, model_dir, _ = exports["classification"]
    empty = tmp_path / "no_ckpt"
    empty.mkdir()
    for name in ("vocab.txt", "bert_config.json", "bert_tf_info.json"):
        (empty / name).write_bytes((model_dir / name).read_bytes())
    with pytest.raises(ExportError, match="no ckpt-<step> checkpoint") as e:
        export_model_dir(str(empty), str(tmp_path / "out"), export_format="onnx")
    assert "\n" not in str(e.value) and not (tmp_path / "out").exists()
    with pytest.raises(ExportError, match="cannot be exported as span"):
        export_model_dir(str(model_dir), str(tmp_path / "out"), export_type="span", export_format="onnx")
    with pytest.raises(ExportError, match="preprocessor is a TF-Hub SavedModel"):
        export_model_dir(str(model_dir), str(tmp_path / "out"), export_type="preprocessor", export_format="onnx")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob("out.tmp*"))


@pytest.mark.slow
def test_missing_extra_is_one_line_naming_the_install_and_writes_nothing(exports, tmp_path):
    _, model_dir, onnx_dir = exports["classification"]
    blocked = tmp_path / "blocked"
    for name in ("tf2onnx", "onnxruntime"):  # stand-ins that fail to import, as when the extra is not installed
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(f"raise ImportError('No module named {name}', name={name!r})\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(blocked), str(REPO)]))
    code, _, errors = _script("export_savedmodel.py", f"--model_dir={model_dir}", f"--export_dir={tmp_path / 'out'}",
                              "--export_format=onnx", env=env)
    assert code == 1 and len(errors) == 1 and 'pip install -e ".[onnx]"' in errors[0], errors
    assert not (tmp_path / "out").exists()
    code, stdout, errors = _script("predict.py", f"--export_dir={onnx_dir}", "--text=hello", env=env)
    assert code == 1 and len(errors) == 1 and 'pip install -e ".[onnx]"' in errors[0] and not stdout, errors


def _op_counts(onnx_dir):
    import collections

    import onnx

    model = onnx.load(str(onnx_dir / "model.onnx"))
    return collections.Counter(n.op_type for n in model.graph.node), {o.domain for o in model.opset_import}


@pytest.mark.parametrize("kind", list(INFOS))
def test_onnx_runtimes_fused_ops_replace_layer_norm_and_gelu_chains(exports, kind):
    """Every export type (2 layers): each of the 5 LayerNorms (the embeddings', 2 a layer) one
    LayerNormalization, each layer's GELU one FastGelu; nothing of the chains is left (the one Tanh is the
    pooler's). Their outputs are test_float32_onnx_equals_the_keras_model's."""
    counts, domains = _op_counts(exports[kind][2])
    assert (counts["LayerNormalization"], counts["FastGelu"], counts["SkipLayerNormalization"]) == (5, 2, 0), counts
    assert counts["Pow"] == counts["Sqrt"] == counts["Erf"] == 0 and counts["Tanh"] <= 1, counts
    assert "com.microsoft" in domains


def test_a_fresh_model_with_exact_gelu_fuses_too_and_fusions_off_keeps_the_chains(tmp_path):
    """A freshly initialised model (LayerNorm scale 1 and shift 0, which tf2onnx folds away; zero biases) with
    the erf GELU (hidden_act gelu_exact): Gelu and LayerNorm ops, float32 and int8, both = the Keras model
    (float32 1e-5); --onnx_fusions=False keeps the op chains and ONNX's own ops only."""
    import keras

    keras.utils.set_random_seed(5)
    model = tiny_task_model_dir(tmp_path / "dir", INFOS["classification"], seq=SEQ, hidden=16, layers=2,
                                weight_sd=None, seed=0, hidden_act="gelu_exact")
    hub = _ids((3, 11), seed=1)
    ref = model({"input_ids": hub["input_word_ids"], "input_mask": hub["input_mask"],
                 "segment_ids": hub["input_type_ids"]}, training=False)
    outputs = {}
    for name, kwargs in (("fused", {}), ("int8", {"quantize": "int8"}), ("plain", {"onnx_fusions": False})):
        export_dir = tmp_path / name
        export_model_dir(str(tmp_path / "dir"), str(export_dir), export_format="onnx", **kwargs)
        counts, domains = _op_counts(export_dir)
        if name == "plain":
            assert counts["Erf"] == 2 and counts["Gelu"] == counts["LayerNormalization"] == 0, counts
            assert "com.microsoft" not in domains, domains
        else:
            assert counts["Gelu"] == 2 and counts["Erf"] == counts["Sqrt"] == 0, counts
            assert counts["LayerNormalization"] == 5, counts
        if name == "int8":  # 13 weighted MatMuls (6 a layer and the classifier; mean pooling has no pooler), but
            assert counts["MatMulInteger"] == 9, counts  # layer 0's 4 attention projections are int8
        session = onnxruntime.InferenceSession(str(export_dir / "model.onnx"), providers=["CPUExecutionProvider"])
        outputs[name] = session.run(["logits"], hub)[0]
    np.testing.assert_allclose(outputs["fused"], ref, atol=1e-5, rtol=0)
    np.testing.assert_allclose(outputs["plain"], ref, atol=1e-5, rtol=0)
    assert np.array_equal(outputs["int8"].argmax(-1), np.asarray(ref).argmax(-1))


def test_int8_keeps_the_first_layers_attention_projections_float32(exports, tmp_path):
    """The first layer's query, key, value and attention output stay float32 (ONNX MatMuls with float32
    weights), the other 9 MatMuls (6 a layer, the classifier) are int8."""
    import onnx

    export_dir = tmp_path / "int8"
    export_model_dir(str(exports["classification"][1]), str(export_dir), export_format="onnx", quantize="int8")
    graph = onnx.load(str(export_dir / "model.onnx")).graph
    integer = [n.name for n in graph.node if n.op_type == "MatMulInteger"]
    float_weights = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) == 2}
    kept = sorted(n.name.split("/attention_1/")[1].split("/")[0] for n in graph.node
                  if n.op_type in ("MatMul", "Gemm") and float_weights & set(n.input))
    assert len(integer) == 9 and not any("/layer_0_1/attention" in name for name in integer), integer
    assert kept == ["key_1", "output_dense_1", "query_1", "value_1"], kept
