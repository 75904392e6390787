"""from_pretrained: a model and its tokenizer in one call each from an original TF1 checkpoint, a Hugging Face
folder or a bert_tf model dir, equal to what the existing loading path (resolve_pretrained, load_pretrained)
gives; one-line errors."""

import numpy as np
import pytest
import tensorflow as tf
from conftest import shared_path

from bert_tf import checkpoints, model_dir
from bert_tf.configs import BertConfig, TaskRecord
from bert_tf.errors import CheckpointError, ConfigError
from bert_tf.models import BertClassifier, BertEncoder, BertMultipleChoice, BertPretrainer
from bert_tf.pretrained import BertTokenizer, from_pretrained, resolve_pretrained
from bert_tf.tasks.glue import InputExample, convert_examples_to_features
from bert_tf.tokenization import FullTokenizer

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "a", "dog", "ran", "far",
         "##s", "Cat"]
TINY = BertConfig(vocab_size=len(VOCAB), hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=16, max_position_embeddings=16, type_vocab_size=2)
TEXTS = ["The cat sat on the mat", "A dog ran", "the cats ran far far far far far far"]
PAIRS = ["a dog", "The Cat sat on a mat on the mat", "a cat"]


def randomize(model, seed=0):
    rng = np.random.default_rng(seed)
    for v in model.weights:
        v.assign(rng.normal(0, 0.3, v.shape).astype("float32"))


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def classifier():
    model = BertClassifier(BertEncoder(TINY), num_labels=2)
    randomize(model)
    return model


def features(vocab_file, do_lower_case, max_seq_length, texts=TEXTS, pairs=PAIRS):
    """The fine-tuning scripts' features (run_classifier.py's, padded) for texts and pairs: the existing path."""
    examples = [InputExample(guid=str(i), text_a=a, text_b=b, label=None)
                for i, (a, b) in enumerate(zip(texts, pairs or [None] * len(texts), strict=True))]
    out = convert_examples_to_features(examples, None, max_seq_length, FullTokenizer(vocab_file, do_lower_case),
                                       pad_to_max_length=True)
    return {name: np.array([getattr(f, name) for f in out], "int32")
            for name in ("input_ids", "input_mask", "segment_ids")}


# ------------------------------------------------------------------ tokenizer
@pytest.mark.parametrize("do_lower_case, pairs", [(True, PAIRS), (False, PAIRS), (True, None)])
def test_tokenizer_gives_the_scripts_features(vocab_file, do_lower_case, pairs):
    tokenizer = BertTokenizer(vocab_file, do_lower_case=do_lower_case, max_seq_length=9)
    got = tokenizer(TEXTS, pairs)
    expected = features(vocab_file, do_lower_case, 9, pairs=pairs)
    assert got.keys() == expected.keys()
    for name in expected:
        assert got[name].dtype == np.int32 and got[name].shape == (3, 9)
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    assert got["input_mask"][2].sum() == 9  # truncated to fit
    as_tf = tokenizer(TEXTS, pairs, max_seq_length=12, return_tensors="tf")
    assert isinstance(as_tf["input_ids"], tf.Tensor) and as_tf["input_ids"].shape == (3, 12)
    one = tokenizer(TEXTS[0], pairs[0] if pairs else None)  # a single text (and pair): a batch of one
    np.testing.assert_array_equal(one["input_ids"], got["input_ids"][:1])


def test_tokenizer_errors(vocab_file):
    tokenizer = BertTokenizer(vocab_file)
    with pytest.raises(ValueError, match="3 texts but 2 pairs"):
        tokenizer(TEXTS, PAIRS[:2])
    with pytest.raises(ValueError, match="return_tensors 'pt'"):
        tokenizer(TEXTS, return_tensors="pt")
    with pytest.raises(ValueError, match="max_seq_length must be >= 3"):
        tokenizer(TEXTS, max_seq_length=2)


# ------------------------------------------------------------------ the three checkpoint kinds
def test_original_tf1_checkpoint():
    folder = shared_path("fixtures", "checkpoints", "tiny_tf1")
    prefix = str(folder / "bert_model.ckpt")
    pretrained = resolve_pretrained(prefix)
    reference = BertPretrainer(pretrained.config)
    checkpoints.load_pretrained(reference, prefix)
    tokenizer = BertTokenizer.from_pretrained(folder)  # the folder or the prefix
    assert tokenizer.do_lower_case and tokenizer.max_seq_length == pretrained.config.max_position_embeddings
    texts, pairs = ["All work and no play", "makes Jack a dull boy"], ["jack", "no play"]
    x = tokenizer(texts, pairs)
    np.testing.assert_array_equal(x["input_ids"], features(str(folder / "vocab.txt"), True, 16, texts, pairs)["input_ids"])
    expected = reference.encoder(x)
    encoder = from_pretrained(BertEncoder, folder)
    for key in ("sequence_output", "pooled_output"):
        np.testing.assert_array_equal(encoder(x)[key], expected[key])
    model = from_pretrained(BertClassifier, prefix, num_labels=3, skip_padding=False)
    assert model.num_labels == 3 and not model.skip_padding
    np.testing.assert_array_equal(model.encoder(x)["pooled_output"], expected["pooled_output"])
    assert model(x).shape == (2, 3)


def test_hugging_face_folder(tmp_path, classifier, vocab_file):
    folder = checkpoints.write_hf_checkpoint(classifier, str(tmp_path / "hf"), vocab_file, do_lower_case=False,
                                             label_list=["no", "yes"])
    model = from_pretrained(BertClassifier, folder, num_labels=2)
    tokenizer = BertTokenizer.from_pretrained(folder, max_seq_length=10)
    assert tokenizer.do_lower_case is False  # tokenizer_config.json
    x = tokenizer(TEXTS, PAIRS)
    np.testing.assert_array_equal(x["input_ids"], features(vocab_file, False, 10)["input_ids"])
    np.testing.assert_allclose(model(x), classifier(x), atol=1e-6)  # the head came along
    encoder = from_pretrained(BertEncoder, str(tmp_path / "hf" / "model.safetensors"))
    np.testing.assert_allclose(encoder(x)["pooled_output"], classifier.encoder(x)["pooled_output"], atol=1e-6)


def write_model_dir(model, folder, vocab_file, record, **casing_and_length):
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(folder), max_to_keep=1,
                                         checkpoint_name=model_dir.CHECKPOINT_NAME)
    manager.save(checkpoint_number=7)
    model_dir.write_finetuned(str(folder), model.encoder.config, vocab_file, record, **casing_and_length)
    return str(folder)


def test_bert_tf_model_dir(tmp_path, classifier, vocab_file):
    folder = write_model_dir(classifier, tmp_path / "run", vocab_file, TaskRecord("classification", label_list=("no", "yes")),
                             do_lower_case=True, max_seq_length=11)
    tokenizer = BertTokenizer.from_pretrained(folder)
    assert tokenizer.do_lower_case is True and tokenizer.max_seq_length == 11  # bert_tf_info.json
    x = tokenizer(TEXTS, PAIRS)
    reference = model_dir.restore(folder)  # the existing path of predict.py and the export
    model = from_pretrained(BertClassifier, folder, num_labels=2)
    np.testing.assert_array_equal(model(x), reference(x))
    np.testing.assert_array_equal(model(x), classifier(x))
    with pytest.raises(CheckpointError, match="does not match the model built from bert_config") as error:
        from_pretrained(BertClassifier, folder, num_labels=3)  # the saved head has 2 labels
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="do_lower_case=False but .* do_lower_case=True"):
        BertTokenizer.from_pretrained(folder, do_lower_case=False)


def test_causal_model_dir_gives_a_causal_model(tmp_path, vocab_file):
    source = BertMultipleChoice(BertEncoder(TINY, causal=True), num_choices=2)
    randomize(source, seed=1)
    folder = write_model_dir(source, tmp_path / "ltr", vocab_file,
                             TaskRecord("multiple_choice", num_choices=2, causal_attention=True),
                             do_lower_case=True, max_seq_length=8)
    model = from_pretrained(BertMultipleChoice, folder, num_choices=2)
    assert model.encoder.causal
    tokenizer = BertTokenizer.from_pretrained(folder)
    flat = tokenizer(["the cat", "the cat", "a dog", "a dog"], ["sat", "ran", "ran far", "sat on"])
    x = {k: v.reshape(2, 2, -1) for k, v in flat.items()}  # [N, C, S]
    np.testing.assert_array_equal(model(x), source(x))


def test_errors_are_one_line(tmp_path, vocab_file):
    with pytest.raises(ConfigError, match="nope: not a readable checkpoint") as error:
        from_pretrained(BertEncoder, str(tmp_path / "nope"))
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="a folder with no checkpoint"):
        from_pretrained(BertClassifier, str(tmp_path), num_labels=2)
    with pytest.raises(ConfigError, match="needs a checkpoint path"):
        BertTokenizer.from_pretrained("")
    source = BertEncoder(TINY)
    prefix = checkpoints.write_tf1_checkpoint(source, str(tmp_path / "orig" / "bert_model.ckpt"))
    TINY.to_json_file(str(tmp_path / "orig" / "bert_config.json"))
    (tmp_path / "orig" / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    wider = tmp_path / "wider.json"
    TINY.replace(intermediate_size=12).to_json_file(str(wider))
    with pytest.raises(CheckpointError,
                       match=r"intermediate/dense/\w+ has shape \[16\] in the checkpoint but \[12\]") as error:
        from_pretrained(BertEncoder, prefix, bert_config_file=str(wider))  # config mismatch
    assert "\n" not in str(error.value)
    with pytest.raises(TypeError, match="unexpected argument.*num_labels"):
        from_pretrained(BertEncoder, prefix, num_labels=2)
    with pytest.raises(ConfigError, match="max_seq_length 64 exceeds max_position_embeddings 16"):
        BertTokenizer.from_pretrained(prefix, max_seq_length=64)
