"""benchmarks/bench_pretraining_accuracy.py: held-out text, variant names and the noise comparison."""

import pytest
from conftest import benchmark_module

bench = benchmark_module("bench_pretraining_accuracy")


def test_corpus_split_holds_out_whole_documents():
    text = "a\nb\n\nc\nd\ne\nf\n\ng\nh\n"
    train, held_out = bench.split_corpus(text, eval_fraction=0.3)
    assert train == "a\nb\n\nc\nd\ne\nf\n" and held_out == "g\nh\n"  # cut at the blank line after line 7
    with pytest.raises(ValueError, match="no blank line"):
        bench.split_corpus("a\n\nb\nc\nd\n", eval_fraction=0.5)


def test_variant_names():
    assert bench.parse_variant("gpu-fp16-xla") == ("gpu", "float16", True)
    assert bench.parse_variant("cpu-bf16-graph") == ("cpu", "bfloat16", False)
    for bad in ("tpu-bf16-xla", "cpu-int8-graph", "cpu-fp32", "cpu-fp32-eager"):
        with pytest.raises(ValueError, match="bad variant"):
            bench.parse_variant(bad)


def test_agreement_is_the_mean_difference_against_the_reference_noise():
    reference = [dict(masked_lm_accuracy=a, next_sentence_accuracy=0.6) for a in (0.30, 0.32, 0.34)]
    close = [dict(masked_lm_accuracy=a, next_sentence_accuracy=0.6) for a in (0.33, 0.35)]
    far = [dict(masked_lm_accuracy=0.08, next_sentence_accuracy=0.5)]
    a = bench.agreement(reference, close)["masked_lm_accuracy"]
    assert a["diff"] == pytest.approx(0.02) and a["reference_sd"] == pytest.approx(0.02) and a["within_noise"]
    b = bench.agreement(reference, far)
    assert b["masked_lm_accuracy"]["diff"] == pytest.approx(-0.24) and not b["masked_lm_accuracy"]["within_noise"]
    # NSP equal on every seed: sd 0, a difference of 0.1 is outside it; equal means are within.
    assert not b["next_sentence_accuracy"]["within_noise"]
    assert bench.agreement(reference, close)["next_sentence_accuracy"]["within_noise"]
    assert not bench.agreement(reference[:1], close)["masked_lm_accuracy"]["within_noise"]  # one seed: no noise known
