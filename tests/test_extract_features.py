"""extract_features.py: the original's JSONL layout, layer indexes, pairs, and values equal to the encoder's."""

import json

import numpy as np
import pytest
from conftest import TINY_VOCAB, float32_tolerance, run_script_main

from bert_tf.configs import BertConfig
from bert_tf.feature_extraction import encode_example, extract_features, read_examples
from bert_tf.models import BertEncoder
from bert_tf.tokenization import FullTokenizer

CONFIG = BertConfig(
    vocab_size=len(TINY_VOCAB),
    hidden_size=8,
    num_hidden_layers=4,
    num_attention_heads=2,
    intermediate_size=16,
    max_position_embeddings=16,
    type_vocab_size=2,
)


@pytest.fixture(scope="module")
def encoder():
    return BertEncoder(CONFIG)


def test_pairs_and_truncation(tiny_vocab_file, tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("the cat sat\nhello ||| how are you\n")
    examples = read_examples(str(path))
    assert examples == [(0, "the cat sat", None), (1, "hello", "how are you")]
    tokenizer = FullTokenizer(tiny_vocab_file)
    tokens, ids, mask, segments = encode_example(tokenizer, "hello", "how are you", 6)
    assert tokens == ["[CLS]", "hello", "[SEP]", "how", "are", "[SEP]"]  # longer side truncated first
    assert segments == [0, 0, 0, 1, 1, 1] and mask == [1] * 6
    tokens, ids, mask, segments = encode_example(tokenizer, "the cat", None, 6)
    assert tokens == ["[CLS]", "the", "cat", "[SEP]"] and mask == [1, 1, 1, 1, 0, 0] and ids[-2:] == [0, 0]


def test_jsonl_matches_encoder_outputs(encoder, tiny_vocab_file, tmp_path):
    tokenizer = FullTokenizer(tiny_vocab_file)
    examples = [(0, "the cat sat on the mat", None), (1, "hello", "how are you"), (2, "the dog", None)]
    out = tmp_path / "out.jsonl"
    count = extract_features(encoder, tokenizer, examples, str(out), layers=[-1, 0], max_seq_length=10, batch_size=2)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert count == len(lines) == 3
    assert [line["linex_index"] for line in lines] == [0, 1, 2]
    second = lines[1]["features"]
    assert [f["token"] for f in second] == ["[CLS]", "hello", "[SEP]", "how", "are", "you", "[SEP]"]
    assert [layer["index"] for layer in second[0]["layers"]] == [-1, 0]
    tokens, ids, mask, segments = encode_example(tokenizer, "hello", "how are you", 10)
    outputs = encoder(
        {"input_ids": np.array([ids]), "input_mask": np.array([mask]), "segment_ids": np.array([segments])}
    )
    for t in range(len(tokens)):
        for layer in second[t]["layers"]:
            expected = outputs["encoder_outputs"][layer["index"]].numpy()[0, t]
            # the file's 6 decimals (half a unit: 5e-7) on float32 values computed in another batch (the
            # script's batch of 2 against this batch of 1: other summation orders over 4 layers of H 8, I 16)
            atol = 5e-7 + float32_tolerance(float(np.abs(expected).max()), CONFIG.num_hidden_layers * 16)
            np.testing.assert_allclose(layer["values"], expected, atol=atol)
            assert all(round(v, 6) == v for v in layer["values"])
    assert len(second[0]["layers"][0]["values"]) == CONFIG.hidden_size
    assert not list(tmp_path.glob("*.tmp-*"))


def run_script(*args):
    """extract_features.py's main in this process: its exit code."""
    return run_script_main("extract_features", *args)


def test_script_from_tf1_checkpoint_and_bad_layers(encoder, tiny_vocab_file, tmp_path, capsys):
    from bert_tf.checkpoints import write_tf1_checkpoint

    ckpt = tmp_path / "model" / "bert_model.ckpt"
    write_tf1_checkpoint(encoder, str(ckpt))
    CONFIG.to_json_file(str(tmp_path / "model" / "bert_config.json"))
    (tmp_path / "in.txt").write_text("the cat\n")
    run = run_script

    common = [
        f"--input_file={tmp_path / 'in.txt'}",
        f"--output_file={tmp_path / 'out.jsonl'}",
        f"--vocab_file={tiny_vocab_file}",
        f"--bert_config_file={tmp_path / 'model' / 'bert_config.json'}",
        f"--init_checkpoint={ckpt}",
        "--max_seq_length=8",
    ]
    assert run(*common) == 0
    line = json.loads((tmp_path / "out.jsonl").read_text())
    assert [layer["index"] for layer in line["features"][0]["layers"]] == [-1, -2, -3, -4]
    capsys.readouterr()
    assert run(*common, "--layers=-1,-9") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "-9 is out of range for a 4-layer model" in err


def test_script_takes_a_checkpoint_folder_and_refuses_another_vocab(encoder, tiny_vocab_file, tmp_path, capsys):
    """--init_checkpoint=<an original download's folder> finds bert_model.ckpt, bert_config.json and vocab.txt
    there (the fine-tuning scripts' resolver); a vocab that does not fit the checkpoint is one line, no output."""
    from bert_tf.checkpoints import write_tf1_checkpoint

    folder = tmp_path / "uncased_L-4_H-8_A-2"
    write_tf1_checkpoint(encoder, str(folder / "bert_model.ckpt"))
    CONFIG.to_json_file(str(folder / "bert_config.json"))
    (folder / "vocab.txt").write_text("\n".join(TINY_VOCAB) + "\n")
    (tmp_path / "in.txt").write_text("the cat\n")
    out = tmp_path / "features" / "out.jsonl"  # a folder that does not exist yet is created
    common = [f"--input_file={tmp_path / 'in.txt'}", f"--output_file={out}", f"--init_checkpoint={folder}",
              "--max_seq_length=8"]
    assert run_script(*common) == 0
    tokens, ids, mask, segments = encode_example(FullTokenizer(tiny_vocab_file), "the cat", None, 8)
    expected = encoder({"input_ids": np.array([ids]), "input_mask": np.array([mask]),
                        "segment_ids": np.array([segments])})["encoder_outputs"][-1].numpy()[0, 1]
    line = json.loads(out.read_text())
    np.testing.assert_allclose(line["features"][1]["layers"][0]["values"], expected, atol=1e-6)
    out.unlink()
    capsys.readouterr()
    other = tmp_path / "other_vocab.txt"
    other.write_text("\n".join(TINY_VOCAB[:-4]) + "\n")
    assert run_script(*common, f"--vocab_file={other}") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"{other}: {len(TINY_VOCAB) - 4} tokens but {folder / 'bert_model.ckpt'} has vocab_size " \
           f"{len(TINY_VOCAB)}" in err
    assert not out.exists()
