"""benchmarks/bench_pretraining.py --input_file: real records reach every variant unchanged and in file order."""

import argparse

import numpy as np
import pytest
from conftest import benchmark_module

from bert_tf.data import schema
from bert_tf.data.pipelines import InputDataError

SEQ, PRED, BATCH = 16, 3, 4


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """10 records; record i has 5 + i real tokens, ids 100 * i + position, 2 predictions."""
    path = str(tmp_path_factory.mktemp("bench") / "data.tfrecord")
    enc = schema.PretrainingRecordEncoder(SEQ, PRED, vocab_size=30522)
    writer = schema.RecordFileWriter(path)
    for i in range(10):
        n = 5 + i
        ids = [100 * i + p for p in range(n)] + [0] * (SEQ - n)
        writer.write(schema.frame_record(enc.encode(ids, n, 3, [1, 2, 0], [7, 8 + i, 0], 2, i % 2)))
    writer.close()
    return path


def test_real_batches_keep_file_order_shapes_and_padding(records, tmp_path):
    bench = benchmark_module("bench_pretraining")
    out = str(tmp_path / "batches.npz")
    info = bench.read_real_batches(records, BATCH, 2, out)
    real = sum(5 + i for i in range(8))  # two full batches of 4; the last 2 records are left over
    assert info == dict(seq=SEQ, preds=PRED, padding=pytest.approx(1 - real / (8 * SEQ)), distinct_rows=2)

    args = argparse.Namespace(batches_file=out, batch=BATCH, seq=SEQ, preds=PRED, steps=2)
    batches = bench._batches(args)
    assert len(batches) == 2
    second = batches[1]
    assert second["input_ids"].shape == (BATCH, SEQ) and second["masked_lm_ids"].shape == (BATCH, PRED)
    assert second["next_sentence_labels"].shape == (BATCH, 1)
    np.testing.assert_array_equal(second["input_ids"][:, 1], [401, 501, 601, 701])  # records 4-7, in order
    np.testing.assert_array_equal(second["input_mask"].sum(1), [9, 10, 11, 12])
    np.testing.assert_array_equal(second["masked_lm_ids"][:, 1], [12, 13, 14, 15])
    np.testing.assert_array_equal(second["masked_lm_weights"][0], [1.0, 1.0, 0.0])


def test_real_batches_refuse_too_little_data(records, tmp_path):
    with pytest.raises(InputDataError, match=r"2 full batches of 4, the run needs 3"):
        benchmark_module("bench_pretraining").read_real_batches(records, BATCH, 3, str(tmp_path / "b.npz"))
    assert not (tmp_path / "b.npz").exists()
