"""TaskRecord: the typed task part of bert_tf_info.json that a fine-tuning run writes, builds its model
from, and matches when it resumes."""

import json

import pytest

from bert_tf import model_dir
from bert_tf.configs import BertConfig, TaskRecord
from bert_tf.errors import CheckpointError, ConfigError

TINY = BertConfig(vocab_size=8, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
                  max_position_embeddings=16)


def test_record_round_trips_through_bert_tf_info(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n")
    record = TaskRecord("classification", task="user", label_list=("no", "yes"), long_inputs="windows",
                        doc_stride=64, window_aggregation="max")
    model_dir.write_finetuned(str(tmp_path), TINY, str(vocab), record, do_lower_case=True, max_seq_length=32)
    info = json.loads((tmp_path / "bert_tf_info.json").read_text())
    assert info == {"task_type": "classification", "task": "user", "label_list": ["no", "yes"],
                    "long_inputs": "windows", "doc_stride": 64, "window_aggregation": "max",
                    "do_lower_case": True, "max_seq_length": 32}  # what says nothing is left out
    assert TaskRecord.from_info(info) == record
    assert model_dir.build_task_model(TINY, info).num_labels == 2
    # a setting that is off is still a fact (SQuAD v1.1); only the two flags are left out when off
    assert TaskRecord("span", version_2_with_negative=False, doc_stride=0).to_info() == {
        "task_type": "span", "version_2_with_negative": False, "doc_stride": 0}


@pytest.mark.parametrize("info, message", [
    ({"task_type": "translation"}, "task_type 'translation'; expected one of classification"),
    ({"task_type": "classification"}, "label_list must be a non-empty list of str for task_type classification"),
    ({"task_type": "tagging", "label_list": [1, 2]}, "label_list must be a non-empty list of str"),
    ({"task_type": "regression", "label_list": 5}, "label_list must be a list of str for task_type regression"),
    ({"task_type": "multiple_choice", "num_choices": 1}, "num_choices must be an int >= 2"),
    ({"task_type": "tagging", "label_list": ["O"], "feature_based": True}, "feature_layers must be"),
])
def test_a_record_of_the_wrong_kind_is_one_line(info, message):
    with pytest.raises(ConfigError, match=message):
        TaskRecord.from_info(info)
    with pytest.raises(CheckpointError, match=message):  # as restore, export and predict see it
        model_dir.build_task_model(TINY, info)


def test_resuming_another_task_is_refused_and_settings_are_not_matched(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n")
    record = TaskRecord("classification", task="user", label_list=("no", "yes"), long_inputs="truncate")
    model_dir.write_finetuned(str(tmp_path), TINY, str(vocab), record, do_lower_case=True, max_seq_length=32)
    model_dir.check_matches(str(tmp_path), record, TINY)  # no checkpoint yet: anything goes
    (tmp_path / "ckpt-3.index").write_text("")  # a run's checkpoint is there
    model_dir.check_matches(str(tmp_path), record, TINY)
    # a setting (windows) may change between runs; the labels and the task may not
    model_dir.check_matches(str(tmp_path), TaskRecord("classification", task="user", label_list=("no", "yes"),
                                                      long_inputs="windows", doc_stride=32), TINY)
    with pytest.raises(CheckpointError, match=r"holds a run with label_list=\['no', 'yes'\], not \['yes', 'no'\]"):
        model_dir.check_matches(str(tmp_path), TaskRecord("classification", task="user", label_list=("yes", "no")))
    with pytest.raises(CheckpointError, match="holds a run with task_type='classification', not 'tagging'"):
        model_dir.check_matches(str(tmp_path), TaskRecord("tagging", task="ner", label_list=("O",)))
