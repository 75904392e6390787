"""create_pretraining_data: schema, the original's statistics, whole-word masking, determinism, inputs, errors."""

import importlib.util
import os
import random

import numpy as np
import pytest
from conftest import run_script, shared_path

from bert_tf.data import pretraining, pretraining_job, schema, text_input

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = [f"w{i}" for i in range(60)]
SUFFIXES = [f"##x{i}" for i in range(10)]
VOCAB = SPECIALS + ["."] + WORDS + SUFFIXES
CLS, SEP, MASK = 2, 3, 4
SEQ, PRED = 48, 8  # round(48 * 0.15) = 7 <= 8


def _sentence(rng, n_words):
    words = []
    for _ in range(n_words):
        w = rng.choice(WORDS)
        if rng.random() < 0.3:  # a word of 2-3 wordpieces
            w += "".join(rng.choice(SUFFIXES)[2:] for _ in range(rng.randint(1, 2)))
        words.append(w)
    return " ".join(words) + " ."


def _corpus(rng, num_docs, sentences=(1, 12), words=(2, 14)):
    docs = []
    for _ in range(num_docs):
        docs.append("\n".join(_sentence(rng, rng.randint(*words)) for _ in range(rng.randint(*sentences))))
    return "\n\n".join(docs) + "\n"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("pretraining")
    (d / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    rng = random.Random(0)
    (d / "corpus_a.txt").write_text(_corpus(rng, 200), encoding="utf-8")
    (d / "corpus_b.txt").write_text(_corpus(rng, 200), encoding="utf-8")
    return d


def _config(d, out, **kw):
    args = dict(input_file=f"{d}/corpus_*.txt", output_file=str(out), vocab_file=f"{d}/vocab.txt",
                max_seq_length=SEQ, max_predictions_per_seq=PRED, dupe_factor=3, num_workers=1,
                block_bytes=4096, shuffle_buffer_size=500)
    args.update(kw)
    return pretraining_job.PretrainingDataConfig(**args)


def _read(path):
    """All records of a file as dict of numpy arrays (via our own TFRecord reader and TF's protobuf)."""
    rows = [schema.decode_example(r) for r in schema.read_records(path)]
    return {k: np.array([r[k] for r in rows]) for k in rows[0]}


@pytest.fixture(scope="module")
def instances(data_dir):
    out = data_dir / "out.tfrecord"
    summary = pretraining_job.create_pretraining_data(_config(data_dir, out))
    assert summary["instances"] > 3000
    return _read(out)


# ------------------------------------------------------------------ schema
def test_encoder_matches_protobuf_deterministic_serialization():
    import tensorflow as tf

    enc = schema.PretrainingRecordEncoder(SEQ, PRED, vocab_size=40000)
    ids = [CLS, 300, 20000, SEP, 7, SEP] + [0] * (SEQ - 6)
    data = enc.encode(ids, 6, 4, [1, 2] + [0] * (PRED - 2), [35000, 9] + [0] * (PRED - 2), 2, 1)
    feats = {
        "input_ids": ids, "input_mask": [1] * 6 + [0] * (SEQ - 6), "segment_ids": [0] * 4 + [1] * 2 + [0] * (SEQ - 6),
        "masked_lm_positions": [1, 2] + [0] * (PRED - 2), "masked_lm_ids": [35000, 9] + [0] * (PRED - 2),
        "next_sentence_labels": [1]}
    example = tf.train.Example()
    for k, v in feats.items():
        example.features.feature[k].int64_list.value.extend(v)
    example.features.feature["masked_lm_weights"].float_list.value.extend([1.0, 1.0] + [0.0] * (PRED - 2))
    assert data == example.SerializeToString(deterministic=True)
    assert schema.encode_example({**feats, "masked_lm_weights": [1.0, 1.0] + [0.0] * (PRED - 2)}) == data


def test_records_have_every_feature_dtype_and_length(data_dir, instances):
    import tensorflow as tf

    path = str(data_dir / "out.tfrecord")
    first = next(schema.read_records(path))
    example = tf.train.Example.FromString(first)
    for name, (dtype, length) in schema.feature_spec(SEQ, PRED).items():
        feature = example.features.feature[name]
        assert feature.WhichOneof("kind") == ("int64_list" if dtype == schema.INT64 else "float_list"), name
        assert len(getattr(feature, feature.WhichOneof("kind")).value) == length, name
    assert set(example.features.feature) == set(schema.FEATURE_NAMES)
    assert schema.inspect_record_file(path) == {"max_seq_length": SEQ, "max_predictions_per_seq": PRED,
                                                "masking": "static"}
    # TF's reader sees the same records, and our parser gives the original's tensors.
    raw = [r.numpy() for r in tf.data.TFRecordDataset(path)]
    assert raw == list(schema.read_records(path))
    batch = schema.parse_pretraining_example(tf.constant(raw[:16]), SEQ, PRED)
    assert batch["input_ids"].shape == (16, SEQ) and batch["input_ids"].dtype == tf.int32
    assert batch["masked_lm_weights"].dtype == tf.float32 and batch["next_sentence_labels"].shape == (16, 1)
    np.testing.assert_array_equal(batch["input_ids"].numpy(), instances["input_ids"][:16])
    single = schema.parse_pretraining_example(tf.constant(raw[0]), SEQ, PRED)
    assert single["masked_lm_positions"].shape == (PRED,)


def test_layout_segments_padding(instances):
    ids, mask, seg = instances["input_ids"], instances["input_mask"], instances["segment_ids"]
    pos, w = instances["masked_lm_positions"], instances["masked_lm_weights"]
    n = mask.sum(1)
    assert (ids[:, 0] == CLS).all()
    col = np.arange(SEQ)[None, :]
    assert ((mask == 1) == (col < n[:, None])).all()
    assert (ids[col >= n[:, None]] == 0).all() and (seg[col >= n[:, None]] == 0).all()
    masked = np.zeros_like(ids, dtype=bool)
    rows = np.repeat(np.arange(len(ids)), PRED)
    masked[rows[w.ravel() > 0], pos.ravel()[w.ravel() > 0]] = True
    for r in range(len(ids)):
        seps = np.flatnonzero((ids[r] == SEP) & ~masked[r])
        assert len(seps) == 2 and seps[1] == n[r] - 1, r
        # segment 0 through the first [SEP], 1 through the last.
        expected = np.where(col[0] <= seps[0], 0, np.where(col[0] < n[r], 1, 0))
        np.testing.assert_array_equal(seg[r], expected)
        assert seps[0] >= 2 and seps[1] - seps[0] >= 2  # A and B non-empty


def test_masking_statistics(instances):
    ids, pos, labels, w = (instances[k] for k in ("input_ids", "masked_lm_positions", "masked_lm_ids",
                                                   "masked_lm_weights"))
    n = instances["input_mask"].sum(1)
    num_pred = (w > 0).sum(1)
    # The original's count, exactly: min(max_pred, max(1, round(n * 0.15))), round half to even.
    expected = [min(PRED, max(1, int(round(x * 0.15)))) for x in n]
    np.testing.assert_array_equal(num_pred, expected)
    # About 15% of the real tokens are predicted (tolerance 1 point).
    assert abs(num_pred.sum() / n.sum() - 0.15) < 0.01
    valid = w > 0
    p = pos[valid]
    assert (p > 0).all()
    assert (labels[valid] != CLS).all() and (labels[valid] != SEP).all()  # never [CLS]/[SEP]
    for r in range(len(ids)):  # positions sorted, distinct, inside the sequence; padding zero
        k = num_pred[r]
        assert (np.diff(pos[r, :k]) > 0).all() and pos[r, k - 1] < n[r] - 1
        assert (pos[r, k:] == 0).all() and (labels[r, k:] == 0).all() and (w[r, k:] == 0).all()
    rows = np.nonzero(valid)[0]
    now = ids[rows, p]
    total = len(p)
    assert total > 20000
    frac_mask = (now == MASK).mean()
    frac_kept = (now == labels[valid]).mean()
    # 80/10/10 within 1.5 points; a random id equals the label 1/len(VOCAB) of the time.
    assert abs(frac_mask - 0.8) < 0.015
    assert abs(frac_kept - (0.1 + 0.1 / len(VOCAB))) < 0.015
    assert abs(1 - frac_mask - frac_kept - 0.1 * (1 - 1 / len(VOCAB))) < 0.015


def test_random_next_fraction(instances, data_dir, tmp_path):
    # Corpus of multi-sentence documents: about half random, a bit more from single-sentence chunks.
    frac = instances["next_sentence_labels"].mean()
    assert 0.5 < frac < 0.62
    # Every chunk a single long sentence: always random next, as in the original.
    rng = random.Random(1)
    (tmp_path / "corpus_long.txt").write_text(_corpus(rng, 40, sentences=(1, 4), words=(60, 80)))
    out = tmp_path / "long.tfrecord"
    pretraining_job.create_pretraining_data(_config(data_dir, out, input_file=str(tmp_path / "corpus_long.txt")))
    assert _read(out)["next_sentence_labels"].min() == 1


def test_short_seq_fraction_and_pairs():
    # One-token sentences: a document's first pair has exactly target tokens, so it is
    # shorter than max_num_tokens iff a short target (< max) was drawn.
    max_seq, docs = 20, 6000
    block = pretraining.build_block([[[7]] * 30 for _ in range(docs)])
    rng = random.Random(5)
    short = is_next = 0
    for d in range(docs):
        pairs = pretraining.document_pairs(block, d, max_seq, 0.1, rng)
        a0, a1, b0, b1, is_random = pairs[0]
        if not is_random:  # (a random B may stop short at the end of the other document)
            is_next += 1
            short += (a1 - a0) + (b1 - b0) < max_seq - 3
        for a0, a1, b0, b1, is_random in pairs:
            assert a1 > a0 and b1 > b0 and (a1 - a0) + (b1 - b0) <= max_seq - 3
            if not is_random:  # IsNext: B continues A in the same document
                assert b0 == a1 and block.sentence_starts[block.document_starts[d]] <= a0
                assert b1 <= block.sentence_starts[block.document_starts[d + 1]]
    expected = 0.1 * (1 - 1 / (max_seq - 3 - 1))
    assert is_next > 2500 and abs(short / is_next - expected) < 0.02


def test_random_next_uses_another_document():
    block = pretraining.build_block([[[d] * 3] * 5 for d in range(1, 9)])  # doc d is made of id d
    rng = random.Random(2)
    for _ in range(50):
        for d in range(block.num_documents):
            for a0, a1, b0, b1, is_random in pretraining.document_pairs(block, d, 20, 0.0, rng):
                assert (block.tokens[a0:a1] == d + 1).all()
                assert (block.tokens[b0:b1] != d + 1).all() if is_random else (block.tokens[b0:b1] == d + 1).all()


def test_whole_word_masking_keeps_pieces_together(data_dir, tmp_path):
    out = tmp_path / "wwm.tfrecord"
    pretraining_job.create_pretraining_data(_config(data_dir, out, do_whole_word_mask=True, dupe_factor=2))
    inst = _read(out)
    cont = np.array([t.startswith("##") for t in VOCAB])
    checked = 0
    for ids, pos, labels, w, n in zip(inst["input_ids"], inst["masked_lm_positions"], inst["masked_lm_ids"],
                                      inst["masked_lm_weights"], inst["input_mask"].sum(1), strict=True):
        k = int((w > 0).sum())
        assert k <= min(PRED, max(1, round(n * 0.15)))
        original = ids.copy()
        original[pos[:k]] = labels[:k]
        masked = np.zeros(SEQ, dtype=bool)
        masked[pos[:k]] = True
        for i in range(2, n - 1):
            if cont[original[i]] and original[i - 1] != SEP:
                assert masked[i] == masked[i - 1], (i, original[: n])
                checked += masked[i]
    assert checked > 500


# ------------------------------------------------------------------ determinism
def test_same_seed_same_bytes_for_any_worker_count(data_dir, instances, tmp_path):  # instances: out.tfrecord
    paths = []
    for name, workers in (("a", 1), ("b", 1), ("c", 2)):
        out = tmp_path / f"{name}.tfrecord"
        pretraining_job.create_pretraining_data(_config(data_dir, out, num_workers=workers))
        paths.append(out)
    data = [p.read_bytes() for p in paths]
    assert data[0] == data[1] == data[2]
    assert data[0] == (data_dir / "out.tfrecord").read_bytes()
    other = tmp_path / "d.tfrecord"
    pretraining_job.create_pretraining_data(_config(data_dir, other, random_seed=7))
    assert other.read_bytes() != data[0]


def test_sharded_gzip_output(data_dir, tmp_path):
    import tensorflow as tf

    out = tmp_path / "g.tfrecord"
    summary = pretraining_job.create_pretraining_data(_config(data_dir, f"{out},{tmp_path}/h.tfrecord",
                                                              num_output_shards=2, gzip=True))
    files = summary["output_files"]
    assert [os.path.basename(f) for f in files] == ["g.tfrecord-00000-of-00002", "g.tfrecord-00001-of-00002",
                                                    "h.tfrecord-00000-of-00002", "h.tfrecord-00001-of-00002"]
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(f) for f in files)  # no temp files left
    counts = [sum(1 for _ in tf.data.TFRecordDataset(f, compression_type="GZIP")) for f in files]
    assert counts == summary["records_per_file"] and max(counts) - min(counts) <= 1
    plain = list(schema.read_records(str(_write_plain(data_dir, tmp_path))))
    gz = [r for f in files for r in schema.read_records(f)]
    assert sorted(plain) == sorted(gz)


def _write_plain(data_dir, tmp_path):
    out = tmp_path / "plain" / "p.tfrecord"
    out.parent.mkdir()
    pretraining_job.create_pretraining_data(_config(data_dir, out))
    return out


# ------------------------------------------------------------------ inputs
WIKI = """<doc id="1" url="https://example.org/?curid=1" title="W1 Page">
W1 Page

w1 w2 w3. W4 w5 w6x1! Dr. W7 w8 w9 w10? W11 w12.

w13 w14 J. R. W15 w16.
</doc>
<doc id="2" url="https://example.org/?curid=2" title="Other">
Other
w20 w21 w22. W23 w24.
</doc>
"""


def test_wikiextractor_input(tmp_path):
    path = tmp_path / "wiki_00"
    path.write_text(WIKI)
    assert text_input.detect_format(str(path)) == text_input.WIKI
    docs = list(text_input.read_documents([str(path)]))
    assert [text_input.document_sentences(d) for d in docs] == [
        ["w1 w2 w3.", "W4 w5 w6x1!", "Dr. W7 w8 w9 w10?", "W11 w12.", "w13 w14 J. R. W15 w16."],
        ["w20 w21 w22.", "W23 w24."]]


def test_split_sentences():
    assert text_input.split_sentences('He said "Go." Then Mr. Smith left (e.g. St. Ives). 3 came! "Why?" Al asked.') == [
        'He said "Go."', "Then Mr. Smith left (e.g. St. Ives).", "3 came!", '"Why?"', "Al asked."]
    assert text_input.split_sentences("Ends here. and lower case continues. Next one.") == [
        "Ends here. and lower case continues.", "Next one."]


def test_lines_input_documents(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("\n\na b\n  c  \n\n\n\nd\n \ne\n")
    assert [d.lines for d in text_input.read_documents([str(path)])] == [["a b", "c"], ["d"], ["e"]]


def test_real_wiki_fixture(tmp_path):
    wiki = shared_path("fixtures", "pretraining", "wiki_00")
    vocab = shared_path("fixtures", "vocab", "bert-base-uncased-vocab.txt")
    out = tmp_path / "w.tfrecord"
    summary = pretraining_job.create_pretraining_data(pretraining_job.PretrainingDataConfig(
        input_file=str(wiki), output_file=str(out), vocab_file=str(vocab), dupe_factor=1, num_workers=1))
    assert summary["documents"] == 2 and summary["instances"] > 100
    assert schema.inspect_record_file(str(out)) == {"max_seq_length": 128, "max_predictions_per_seq": 20,
                                                   "masking": "static"}


def test_missing_output_folders_are_created(data_dir, tmp_path):
    # The README's --output_file=data/train.tfrecord in a fresh directory: data/ is made, as `mkdir -p` would.
    out = tmp_path / "data" / "seq128" / "train.tfrecord"
    summary = pretraining_job.create_pretraining_data(pretraining_job.PretrainingDataConfig(
        input_file=str(data_dir / "corpus_a.txt"), output_file=str(out), vocab_file=str(data_dir / "vocab.txt"),
        max_seq_length=32, max_predictions_per_seq=5, dupe_factor=1, num_workers=1))
    assert summary["output_files"] == [str(out)] and summary["instances"] > 0
    assert schema.inspect_record_file(str(out)) == {"max_seq_length": 32, "max_predictions_per_seq": 5,
                                                   "masking": "static"}


def test_blocks_do_not_depend_on_anything_but_input():
    docs = [text_input.RawDocument(["x" * n], False, n + 1) for n in (10, 500, 30, 30, 700, 5)]
    blocks = list(text_input.iter_blocks(docs, block_bytes=100))
    # A block closes at >= 100 bytes and >= 2 documents; the 1-document tail joins the last block.
    assert [len(b.documents) for b in blocks] == [2, 4]
    assert [b.first_document for b in blocks] == [0, 2] and [b.index for b in blocks] == [0, 1]


def test_blocks_never_span_files(tmp_path):
    """The unit of work is a block of one file, keyed (file index, block index), so files can be read apart."""
    (tmp_path / "a.txt").write_text("a b\n\nc d\n\ne f\n")
    (tmp_path / "b.txt").write_text("g h\n")  # one document: its own block
    paths = [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]
    blocks = list(text_input.iter_input_blocks(paths, "lines", block_bytes=8))
    assert [b.key for b in blocks] == [(0, 0), (1, 0)]
    assert [[d.lines for d in b.documents] for b in blocks] == [[["a b"], ["c d"], ["e f"]], [["g h"]]]
    assert [b.key for b in text_input.iter_file_blocks(paths[1], 1, "lines", 8)] == [(1, 0)]


# ------------------------------------------------------------------ records for dynamic masking
def test_dynamic_records_are_one_unmasked_copy_of_the_static_instances(data_dir, tmp_path):
    """--masking=dynamic: dupe pass 0's instances without masks, in the schema without masked_lm_*, at most
    1/dupe_factor of the static records' bytes."""
    static = pretraining_job.create_pretraining_data(_config(data_dir, tmp_path / "s.tfrecord", dupe_factor=1))
    dynamic = pretraining_job.create_pretraining_data(_config(data_dir, tmp_path / "d.tfrecord", dupe_factor=5,
                                                              masking="dynamic"))
    assert dynamic["instances"] == static["instances"] > 1000  # one copy: dupe_factor not used
    assert schema.inspect_record_file(str(tmp_path / "d.tfrecord")) == {
        "max_seq_length": SEQ, "max_predictions_per_seq": None, "masking": "dynamic"}
    first = schema.decode_example(next(schema.read_records(str(tmp_path / "d.tfrecord"))))
    assert set(first) == set(schema.DYNAMIC_FEATURE_NAMES)
    got = _read(tmp_path / "d.tfrecord")
    masked = _read(tmp_path / "s.tfrecord")
    unmasked = masked["input_ids"].copy()
    for r in range(len(unmasked)):  # the static instances with their masked tokens put back
        real = masked["masked_lm_weights"][r] > 0
        unmasked[r, masked["masked_lm_positions"][r][real]] = masked["masked_lm_ids"][r][real]
    assert not (got["input_ids"] == MASK).any()
    key = np.lexsort(unmasked.T)
    np.testing.assert_array_equal(got["input_ids"][np.lexsort(got["input_ids"].T)], unmasked[key])
    for name in ("input_mask", "segment_ids", "next_sentence_labels"):
        assert sorted(map(tuple, got[name])) == sorted(map(tuple, masked[name])), name
    five = pretraining_job.create_pretraining_data(_config(data_dir, tmp_path / "s5.tfrecord", dupe_factor=5))
    assert 5 * os.path.getsize(tmp_path / "d.tfrecord") <= os.path.getsize(tmp_path / "s5.tfrecord")
    assert five["instances"] > 4.5 * dynamic["instances"]


# ------------------------------------------------------------------ bad input
def _run_script(tmp_path, *args):
    return run_script("create_pretraining_data.py", *args, cwd=tmp_path, timeout=120)


@pytest.mark.parametrize("case", ["missing_input", "empty_corpus", "no_mask", "too_few_predictions",
                                  "unreadable_vocab", "output_dir_is_a_file", "negative_workers", "no_such_runner",
                                  "no_vocab_flag", "dynamic_with_copies"])
def test_bad_input_gives_one_line_error(case, data_dir, tmp_path):
    vocab = str(data_dir / "vocab.txt")
    inp = str(data_dir / "corpus_a.txt")
    out = str(tmp_path / "out.tfrecord")
    extra = []
    expect = {"missing_input": "matches no file", "empty_corpus": "empty corpus", "no_mask": "[MASK]",
              "too_few_predictions": "max_predictions_per_seq", "unreadable_vocab": "vocab_file",
              "output_dir_is_a_file": "cannot create directory", "negative_workers": "num_workers: must be >= 0",
              # (Beam's own error was a 23-line traceback; without Beam installed, an ImportError's)
              "no_such_runner": "--runner=NoSuchRunner: not a Beam runner" if importlib.util.find_spec("apache_beam")
              else "--runner=NoSuchRunner needs Apache Beam",
              "no_vocab_flag": "flag --vocab_file=None",
              "dynamic_with_copies": "--dupe_factor, --do_whole_word_mask: --masking=dynamic writes one copy "
                                     "without masks"}[case]
    if case == "missing_input":
        inp = str(tmp_path / "nothing_*.txt")
    elif case == "empty_corpus":
        inp = str(tmp_path / "empty.txt")
        (tmp_path / "empty.txt").write_text("\n\n  \n")
    elif case == "no_mask":
        vocab = str(tmp_path / "v.txt")
        (tmp_path / "v.txt").write_text("\n".join(t for t in VOCAB if t != "[MASK]"))
    elif case == "too_few_predictions":
        extra = ["--max_seq_length=512", "--max_predictions_per_seq=20"]
    elif case == "unreadable_vocab":
        vocab = str(tmp_path / "no_vocab.txt")
    elif case == "output_dir_is_a_file":
        (tmp_path / "a_file").write_text("not a folder")
        out = str(tmp_path / "a_file" / "out.tfrecord")
    elif case == "negative_workers":
        extra = ["--num_workers=-1"]
    elif case == "no_such_runner":
        extra = ["--runner=NoSuchRunner"]
    elif case == "dynamic_with_copies":
        extra = ["--masking=dynamic", "--dupe_factor=5", "--do_whole_word_mask"]
    flags = [f"--input_file={inp}", f"--output_file={out}", "--num_workers=1"]
    flags += [] if case == "no_vocab_flag" else [f"--vocab_file={vocab}"]
    proc = _run_script(tmp_path, *flags, *extra)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("create_pretraining_data.py: error: ") and expect in last, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not any(name.startswith("out.tfrecord") for name in os.listdir(tmp_path))


def test_script_end_to_end(data_dir, instances, tmp_path):  # instances writes out.tfrecord
    out = tmp_path / "s.tfrecord"
    proc = _run_script(tmp_path, f"--input_file={data_dir}/corpus_*.txt", f"--output_file={out}",
                       f"--vocab_file={data_dir}/vocab.txt", f"--max_seq_length={SEQ}",
                       f"--max_predictions_per_seq={PRED}", "--dupe_factor=3", "--num_workers=1",
                       "--block_bytes=4096", "--shuffle_buffer_size=500")
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == (data_dir / "out.tfrecord").read_bytes()
    assert "instances/s" in proc.stderr


def _reference_pairs(docs, d, max_seq, short_prob, rng):
    """docs/reference.md §6 written plainly on lists of token lists (pool = all documents)."""
    doc, max_tokens = docs[d], max_seq - 3
    target = rng.randint(2, max_tokens) if rng.random() < short_prob else max_tokens
    out, chunk, length, i = [], [], 0, 0
    while i < len(doc):
        chunk.append(doc[i])
        length += len(doc[i])
        if i == len(doc) - 1 or length >= target:
            a_end = 1 if len(chunk) < 2 else rng.randint(1, len(chunk) - 1)
            a = [t for s in chunk[:a_end] for t in s]
            if len(chunk) == 1 or rng.random() < 0.5:
                for _ in range(10):
                    other = rng.randint(0, len(docs) - 1)
                    if other != d:
                        break
                b = []
                for sentence in docs[other][rng.randint(0, len(docs[other]) - 1):]:
                    b.extend(sentence)
                    if len(b) >= target - len(a):
                        break
                i -= len(chunk) - a_end
                is_random = 1
            else:
                b, is_random = [t for s in chunk[a_end:] for t in s], 0
            while len(a) + len(b) > max_tokens:
                longer = a if len(a) > len(b) else b
                longer.pop(0) if rng.random() < 0.5 else longer.pop()
            out.append((a, b, is_random))
            chunk, length = [], 0
        i += 1
    return out


def test_pairs_are_the_original_procedure_draw_for_draw():
    # Same rng, same draws: our span arithmetic must give exactly the plain list version's pairs.
    rng = random.Random(11)
    docs = [[[rng.randint(5, 90) for _ in range(rng.randint(1, 40))] for _ in range(rng.randint(1, 15))]
            for _ in range(300)]
    block = pretraining.build_block(docs)
    for max_seq in (16, 64):
        ours_rng, ref_rng = random.Random(max_seq), random.Random(max_seq)
        for d in range(len(docs)):
            ours = [(block.tokens[a0:a1].tolist(), block.tokens[b0:b1].tolist(), r)
                    for a0, a1, b0, b1, r in pretraining.document_pairs(block, d, max_seq, 0.3, ours_rng)]
            assert ours == _reference_pairs(docs, d, max_seq, 0.3, ref_rng)
