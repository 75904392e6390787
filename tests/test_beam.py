"""The Beam pipelines (bert_tf/beam) on the local runner with 2 worker processes: the local tools' outputs.

create_pretraining_data: the local tool's records as a multiset (seq 128 and 512, with and without
whole-word masking, and records for dynamic masking), the same bytes per shard for 1 and 2 workers; create_vocab: the same vocab (also
extended); predict / extract_features: the single-process rows. Bad inputs: one line naming the file,
no final output.
"""

import glob
import json
import os
import random
import subprocess
import sys

import pytest
from conftest import REPO, TINY_VOCAB

pytestmark = pytest.mark.slow

pytest.importorskip("apache_beam")

from test_predict import _model_dir  # noqa: E402  (a tiny task model_dir with spread-out weights)
from test_pretraining_data import VOCAB, _corpus  # noqa: E402  (the local tool's test corpus)

from bert_tf.beam import common, inference, pretraining, vocab  # noqa: E402
from bert_tf.data import pretraining_job, schema  # noqa: E402
from bert_tf.errors import InputDataError  # noqa: E402
from bert_tf.tokenization import vocab_builder  # noqa: E402

BEAM = ["--direct_num_workers=2"]  # the local runner's default mode: worker processes
IN_PROCESS = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]  # one worker, in this process


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("beam_corpus")
    (d / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    rng = random.Random(0)
    for name, docs in (("a", 40), ("b", 25), ("c", 1)):  # c: a one-document file is a block of its own
        (d / f"corpus_{name}.txt").write_text(_corpus(rng, docs), encoding="utf-8")
    return d


def _config(d, out, seq, wwm, **kw):
    args = dict(input_file=f"{d}/corpus_*.txt", output_file=str(out), vocab_file=f"{d}/vocab.txt",
                max_seq_length=seq, max_predictions_per_seq=20 if seq == 128 else 77, dupe_factor=2,
                do_whole_word_mask=wwm, num_workers=2, block_bytes=2048, num_output_shards=2)
    args.update(kw)
    return pretraining_job.PretrainingDataConfig(**args)


def _records(paths):
    return [list(schema.read_records(p)) for p in paths]


# ------------------------------------------------------------------ create_pretraining_data
@pytest.mark.parametrize("seq,wwm,masking", [(128, False, "static"), (128, True, "static"), (512, False, "static"),
                                             (512, True, "static"), (128, False, "dynamic")])
def test_pretraining_data_beam_writes_the_local_records(corpus, tmp_path, seq, wwm, masking):
    local = pretraining_job.create_pretraining_data(_config(corpus, tmp_path / "local.tfrecord", seq, wwm,
                                                            num_workers=1, masking=masking))
    summary = pretraining.run(_config(corpus, tmp_path / "beam.tfrecord", seq, wwm, masking=masking), BEAM)
    assert [os.path.basename(p) for p in summary["output_files"]] == [
        "beam.tfrecord-00000-of-00002", "beam.tfrecord-00001-of-00002"]
    beam_shards = _records(summary["output_files"])
    local_records = [r for f in _records(local["output_files"]) for r in f]
    assert len(local_records) == local["instances"] == summary["instances"] > 50
    assert sorted(r for s in beam_shards for r in s) == sorted(local_records)  # the same multiset
    sizes = [len(s) for s in beam_shards]
    assert min(sizes) > 0.3 * sum(sizes)  # blocks spread over both shards
    assert beam_shards[0][:20] != sorted(beam_shards[0])[:20]  # interleaved, not in block or byte order
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in
                                                  local["output_files"] + summary["output_files"])  # no temp files


def test_pretraining_data_beam_same_bytes_for_1_and_2_workers(corpus, tmp_path):
    paths = {}
    for workers, args in ((1, IN_PROCESS), (2, BEAM)):
        config = _config(corpus, tmp_path / f"w{workers}.tfrecord", 128, False, num_output_shards=3, gzip=True)
        paths[workers] = pretraining.run(config, args)["output_files"]
    for one, two in zip(paths[1], paths[2], strict=True):
        with open(one, "rb") as a, open(two, "rb") as b:
            assert a.read() == b.read()
    assert all(len(r) > 0 for r in _records(paths[1]))


def test_pretraining_data_beam_bad_inputs(corpus, tmp_path):
    unreadable = tmp_path / "corpus_bad.txt.gz"
    unreadable.write_bytes(b"\x1f\x8b not gzip")
    with pytest.raises(InputDataError, match="vocab_file: .*\\[MASK\\]"):
        bad_vocab = tmp_path / "vocab.txt"
        bad_vocab.write_text("\n".join(t for t in VOCAB if t != "[MASK]") + "\n")
        pretraining.run(_config(corpus, tmp_path / "out.tfrecord", 128, False, vocab_file=str(bad_vocab)), BEAM)
    with pytest.raises(Exception, match=f"^{unreadable}: cannot read it"):
        pretraining.run(_config(corpus, tmp_path / "out.tfrecord", 128, False, input_file=str(unreadable)), BEAM)
    assert not glob.glob(str(tmp_path / "out.tfrecord*")) and not glob.glob(str(tmp_path / ".out*"))


def test_pretraining_data_script_on_beam_is_offline_and_quiet(corpus, tmp_path):
    """The script's --runner=DirectRunner: no connection beyond this machine, no error or Prism line; bad input: one line."""
    guard = tmp_path / "guard"
    guard.mkdir()
    # Every process of the run (the launcher and the Beam workers) refuses connections off this machine.
    (guard / "sitecustomize.py").write_text(
        "import socket\n"
        "_connect = socket.socket.connect\n"
        "def connect(self, address):\n"
        "    host = address[0] if isinstance(address, tuple) else address\n"
        "    if self.family in (socket.AF_INET, socket.AF_INET6) and host not in "
        "('127.0.0.1', 'localhost', '::1', '0.0.0.0', '[::]'):\n"
        "        open(%r, 'a').write(repr(address) + '\\n')\n"
        "        raise OSError('network access in a local Beam run: %%r' %% (address,))\n"
        "    return _connect(self, address)\n"
        "socket.socket.connect = connect\n" % str(tmp_path / "attempts.txt"))
    env = dict(os.environ, PYTHONPATH=f"{guard}{os.pathsep}{REPO}")
    common_args = [sys.executable, str(REPO / "create_pretraining_data.py"), f"--vocab_file={corpus}/vocab.txt",
                   "--max_seq_length=128", "--max_predictions_per_seq=20", "--dupe_factor=1", "--runner=DirectRunner",
                   "--num_workers=2", "--num_output_shards=2"]
    ok = subprocess.run(common_args + [f"--input_file={corpus}/corpus_*.txt", f"--output_file={tmp_path}/s.tfrecord"],
                        capture_output=True, text=True, env=env, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert not (tmp_path / "attempts.txt").exists()
    lines = ok.stderr.splitlines()
    assert not [line for line in lines if "error" in line.lower() or "prism" in line.lower() or line.startswith("E")]
    assert any("FnApiRunner" in line for line in lines)
    assert len(glob.glob(f"{tmp_path}/s.tfrecord-0000?-of-00002")) == 2

    bad = subprocess.run(common_args + [f"--input_file={tmp_path}/nothing_*.txt", f"--output_file={tmp_path}/t.tfrecord"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode != 0
    assert bad.stderr.strip().splitlines()[-1] == (f"create_pretraining_data.py: error: input_file: "
                                                   f"'{tmp_path}/nothing_*.txt' matches no file")
    assert "Traceback" not in bad.stderr and not glob.glob(f"{tmp_path}/t.tfrecord*")


# ------------------------------------------------------------------ create_vocab
def test_vocab_beam_is_the_local_vocab(corpus, tmp_path):
    files = sorted(glob.glob(f"{corpus}/corpus_*.txt"))
    lines = (line for f in files for line in open(f, encoding="utf-8"))
    words = vocab_builder.count_words(lines)
    learned = vocab_builder.VocabSettings(str(tmp_path / "beam_vocab.txt"), vocab_size=90, num_unused=3,
                                          min_frequency=1)
    vocab.run(files, "auto", True, None, None, learned, BEAM)
    expected = vocab_builder.learn_wordpiece_vocab(words, 90, 3, 1)
    assert (tmp_path / "beam_vocab.txt").read_text(encoding="utf-8").splitlines() == expected
    assert len(expected) == 90 and any(len(t.replace("##", "")) > 1 and t[0] != "[" for t in expected)  # merged

    extended = vocab_builder.VocabSettings(str(tmp_path / "ext.txt"), min_frequency=1,
                                           extend_vocab=str(tmp_path / "beam_vocab.txt"))
    vocab.run(files, "auto", True, None, None, extended, BEAM)
    expected_ext, new_tokens = vocab_builder.extend_vocab(expected, words, None, 1)
    assert (tmp_path / "ext.txt").read_text(encoding="utf-8").splitlines() == expected_ext
    assert len(new_tokens) == 3
    listed = json.loads((tmp_path / "ext.extension.json").read_text())["new_tokens"]
    assert [t["token"] for t in listed] == [t.token for t in new_tokens]

    with pytest.raises(ValueError, match="vocab_size: 50 leaves no room"):
        vocab_builder.VocabSettings(str(tmp_path / "v.txt"), vocab_size=50, num_unused=99).check()


# ------------------------------------------------------------------ batch inference
@pytest.fixture(scope="module")
def classifier_export(tmp_path_factory):
    from bert_tf.export import export_model_dir

    base = tmp_path_factory.mktemp("beam_classifier")
    _model_dir(base / "model", {"task_type": "classification", "label_list": ["neg", "pos", "mid"]})
    export_model_dir(str(base / "model"), str(base / "export"))
    return base / "export"


def _texts(rng, n):
    words = TINY_VOCAB[5:]
    return [" ".join(rng.choice(words).lstrip("#") for _ in range(rng.randint(1, 12))) for _ in range(n)]


def _read_shards(paths):
    return [line for p in paths for line in open(p, encoding="utf-8").read().splitlines()]


def test_predict_beam_rows_are_the_single_process_rows(classifier_export, tmp_path):
    from bert_tf.serving.predictor import Predictor, iter_rows

    rng = random.Random(3)
    a, b = _texts(rng, 70), _texts(rng, 70)
    (tmp_path / "in_1.tsv").write_text("".join(f"{x}\t{y}\n" for x, y in zip(a, b, strict=True)), encoding="utf-8")
    (tmp_path / "in_2.jsonl").write_text("".join(json.dumps({"text": x}) + "\n" for x in a[:45]), encoding="utf-8")
    summary = inference.run_predict(str(classifier_export), f"{tmp_path}/in_*", str(tmp_path / "pred.jsonl"),
                                    batch_size=8, num_output_shards=2, beam_args=BEAM)
    beam_lines = _read_shards(summary["output_files"])
    predictor = Predictor(str(classifier_export), batch_size=8)  # what predict.py --format=json prints
    single = [line for name in ("in_1.tsv", "in_2.jsonl") for line in predictor.lines(list(iter_rows(
        str(tmp_path / name))))]
    assert summary["rows"] == len(beam_lines) == 115
    assert beam_lines == single  # the same rows, numbers and order
    rows = [json.loads(line) for line in beam_lines]
    assert rows[0]["text_b"] == b[0] and "text_b" not in rows[70] and set(rows[0]["probabilities"]) == {
        "neg", "pos", "mid"}
    assert len({tuple(r["probabilities"].values()) for r in rows}) > 100
    assert all(len(open(p).read().splitlines()) > 40 for p in summary["output_files"])  # rows cut into 2 runs

    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.jsonl").write_text('{"text": "the cat"}\n{"text": "the dog",\n', encoding="utf-8")
    with pytest.raises(InputDataError) as e:
        inference.run_predict(str(classifier_export), f"{tmp_path}/bad/x.jsonl", str(tmp_path / "bad" / "o.jsonl"),
                              beam_args=IN_PROCESS)
    assert str(e.value).startswith(f"{tmp_path}/bad/x.jsonl:2: not a JSON line")
    assert "\n" not in str(e.value)
    assert os.listdir(tmp_path / "bad") == ["x.jsonl"]  # no output, no temporary files


def test_extract_features_beam_lines_are_the_single_process_lines(tmp_path):
    from bert_tf.checkpoints import write_tf1_checkpoint
    from bert_tf.configs import BertConfig
    from bert_tf.feature_extraction import ExtractorSettings, read_examples, write_features
    from bert_tf.models import BertEncoder

    config = BertConfig(vocab_size=len(TINY_VOCAB), hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=32)
    (tmp_path / "model").mkdir()
    write_tf1_checkpoint(BertEncoder(config), str(tmp_path / "model" / "bert_model.ckpt"))
    config.to_json_file(str(tmp_path / "model" / "bert_config.json"))
    (tmp_path / "model" / "vocab.txt").write_text("\n".join(TINY_VOCAB) + "\n", encoding="utf-8")
    rng = random.Random(5)
    texts = _texts(rng, 40)
    (tmp_path / "in_1.txt").write_text("\n".join(texts[:25]) + "\n", encoding="utf-8")
    (tmp_path / "in_2.txt").write_text("\n".join(f"{x} ||| {y}" for x, y in zip(texts[25:], texts[:15],
                                                                               strict=True)) + "\n")
    settings = ExtractorSettings(str(tmp_path / "model" / "bert_model.ckpt"),
                                 str(tmp_path / "model" / "bert_config.json"), max_seq_length=16, layers=(-1, 0))
    summary = inference.run_features(settings, f"{tmp_path}/in_1.txt,{tmp_path}/in_2.txt",
                                     str(tmp_path / "features.jsonl"), batch_size=4, num_output_shards=3,
                                     beam_args=BEAM)
    beam_lines = _read_shards(summary["output_files"])
    extractor = settings.build()
    single = []
    for name in ("in_1.txt", "in_2.txt"):
        write_features(extractor, read_examples(str(tmp_path / name)), str(tmp_path / f"{name}.jsonl"), 4)
        single += (tmp_path / f"{name}.jsonl").read_text().splitlines()
    assert summary["rows"] == len(beam_lines) == 40
    assert beam_lines == single
    assert [json.loads(line)["linex_index"] for line in beam_lines] == list(range(25)) + list(range(15))


def test_runner_values_beam_cannot_use_are_one_line_before_any_work():
    """A --runner Beam does not know, a dotted path that does not import, a negative --num_workers, and a
    remote runner missing its options each raise InputDataError with one line (Beam's own errors were
    tracebacks of 20+ lines); Beam's names pass in any case, with or without "Runner"."""
    for name in ("DirectRunner", "direct", "dataflowrunner", "FlinkRunner", "apache_beam.runners.DirectRunner"):
        common.check_runner(name)
    for name, message in (("NoSuchRunner", "--runner=NoSuchRunner: not a Beam runner (one of "),
                          ("no_such_pkg.Runner", "--runner=no_such_pkg.Runner: cannot import no_such_pkg"),
                          ("apache_beam.runners.NoSuchRunner", "--runner=apache_beam.runners.NoSuchRunner: apache_beam.runners has no ")):
        with pytest.raises(InputDataError) as info:
            common.check_runner(name)
        assert str(info.value).startswith(message) and "\n" not in str(info.value)
    with pytest.raises(InputDataError, match="^--num_workers: must be >= 0 \\(0: all cores\\), got -1$"):
        common.pipeline_options([], "DirectRunner", num_workers=-1)
    options = common.pipeline_options([], "DataflowRunner")
    with pytest.raises(InputDataError) as info:
        common.make_pipeline(options)
    assert "\n" not in str(info.value) and "project" in str(info.value) and "region" in str(info.value)
