"""BertConfig: the original bert_config.json format, validation, named sizes, casing."""

import json

import pytest
from conftest import shared_path

from bert_tf.configs import BertConfig, check_casing, write_run_info
from bert_tf.errors import ConfigError


def test_json_round_trip_matches_original_format(tmp_path):
    config = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, type_vocab_size=2)
    path = tmp_path / "bert_config.json"
    config.to_json_file(str(path))
    text = path.read_text()
    values = json.loads(text)
    assert text == json.dumps(values, indent=2, sort_keys=True) + "\n"
    assert list(values) == sorted(values)
    assert values["intermediate_size"] == 37 and values["hidden_act"] == "gelu"
    assert BertConfig.from_json_file(str(path)) == config
    assert not list(tmp_path.glob("*.tmp-*"))


def test_released_config_with_extra_keys():
    config = BertConfig.from_json_file(str(shared_path("fixtures", "checkpoints", "chinese_base_index", "bert_config.json")))
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers, config.type_vocab_size) == (21128, 768, 12, 2)
    assert "pooler_type" not in config.to_dict()


def test_defaults_follow_original():
    config = BertConfig(vocab_size=10)
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (768, 12, 12)
    assert (config.intermediate_size, config.max_position_embeddings, config.type_vocab_size) == (3072, 512, 16)
    assert config.hidden_dropout_prob == 0.1 and config.initializer_range == 0.02


@pytest.mark.parametrize(
    "values, message",
    [
        ({"hidden_size": 10}, "missing required field vocab_size"),
        ({"vocab_size": 10, "hidden_size": 30, "num_attention_heads": 4}, "not a multiple of num_attention_heads"),
        ({"vocab_size": 0}, "vocab_size must be positive"),
        ({"vocab_size": "30522"}, "vocab_size must be an integer"),
        ({"vocab_size": 10, "hidden_act": "swish2"}, "unknown hidden_act"),
        ({"vocab_size": 10, "hidden_dropout_prob": 1.5}, r"hidden_dropout_prob must be in \[0, 1\)"),
        ({"vocab_size": 10, "hiden_size": 8}, "unknown field"),
        ([1, 2], "expected a JSON object"),
    ],
)
def test_validation_errors(tmp_path, values, message):
    path = tmp_path / "bert_config.json"
    path.write_text(json.dumps(values))
    with pytest.raises(ConfigError, match=message) as info:
        BertConfig.from_json_file(str(path))
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        BertConfig.from_json_file(str(tmp_path / "nope.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{\"vocab_size\": 3,")
    with pytest.raises(ConfigError, match="not valid JSON"):
        BertConfig.from_json_file(str(bad))


def test_direct_construction_validates():
    with pytest.raises(ConfigError, match="not a multiple"):
        BertConfig(vocab_size=10, hidden_size=10, num_attention_heads=3)


def test_named_sizes():
    base = BertConfig.named("base")
    assert (base.num_hidden_layers, base.hidden_size, base.num_attention_heads, base.intermediate_size) == (12, 768, 12, 3072)
    large = BertConfig.named("large", vocab_size=28996)
    assert (large.num_hidden_layers, large.hidden_size, large.num_attention_heads, large.vocab_size) == (24, 1024, 16, 28996)
    tiny = BertConfig.named("tiny")
    assert (tiny.num_hidden_layers, tiny.hidden_size, tiny.num_attention_heads, tiny.intermediate_size) == (2, 128, 2, 512)
    with pytest.raises(ConfigError, match="unknown model size"):
        BertConfig.named("huge")


def test_casing_from_folder_name_and_run_info(tmp_path):
    assert check_casing(True, "/m/uncased_L-12_H-768_A-12/bert_model.ckpt") is None
    with pytest.raises(ConfigError, match="do_lower_case=False"):
        check_casing(True, "/m/cased_L-12_H-768_A-12/bert_model.ckpt")
    warning = check_casing(True, "/m/multi_cased_L-12_H-768_A-12/bert_model.ckpt", allow_mismatch=True)
    assert "do_lower_case=False" in warning
    # Our own checkpoints record casing; the folder name no longer matters.
    write_run_info(str(tmp_path), do_lower_case=False)
    with pytest.raises(ConfigError):
        check_casing(True, str(tmp_path / "ckpt-10"))
    assert check_casing(False, str(tmp_path / "ckpt-10")) is None
    # Unknown folder names stay silent.
    assert check_casing(True, "/m/my_model/bert_model.ckpt") is None


def test_create_bert_config_script_writes_a_named_size_for_a_vocab(tmp_path, capsys):
    """create_bert_config.py: a bert_config.json without writing JSON by hand (README, "Model size")."""
    from conftest import run_script_main

    def run(*args):
        return run_script_main("create_bert_config", *args)

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"t{i}\n" for i in range(4259)))
    out = tmp_path / "model" / "bert_config.json"  # a folder that does not exist yet
    assert run("--size=base", f"--vocab_file={vocab}", f"--output={out}") == 0
    assert capsys.readouterr().out.strip() == (f"wrote {out}: base, 12 layers, hidden 768, 12 heads, "
                                               "vocab_size 4259")
    assert BertConfig.from_json_file(str(out)) == BertConfig(
        vocab_size=4259, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        type_vocab_size=2)
    before = out.read_text()
    assert run("--size=mini", f"--vocab_file={vocab}", f"--output={out}") == 1  # never replaced unasked
    assert "exists; pass --overwrite to replace it" in capsys.readouterr().err and out.read_text() == before
    assert run("--size=mini", f"--vocab_file={vocab}", f"--output={out}", "--overwrite",
               "--max_position_embeddings=128") == 0
    mini = BertConfig.from_json_file(str(out))
    assert (mini.num_hidden_layers, mini.hidden_size, mini.num_attention_heads, mini.intermediate_size,
            mini.max_position_embeddings) == (4, 256, 4, 1024, 128)
    capsys.readouterr()
    assert run("--size=base", f"--vocab_file={tmp_path / 'missing.txt'}", f"--output={tmp_path / 'b.json'}") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "vocab file not found" in err and not (tmp_path / "b.json").exists()
