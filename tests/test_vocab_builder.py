"""create_vocab: layout, coverage, determinism, casing options, errors."""

import random
import subprocess
import sys

from conftest import REPO, shared_path

from bert_tf.data.pretraining_job import make_tokenizer, read_vocab
from bert_tf.tokenization import vocab_builder

CORPUS = """The quick brown fox jumps over the lazy dog.
Jumping foxes jumped; the dogs were lazier than the foxes.
Café owners in Zürich serve crème brûlée to 42 quick visitors!
北京 is a city. Unbelievably, the unbelievers believed.
"""


def _corpus_lines(n=400, seed=0):
    rng = random.Random(seed)
    stems = ["jump", "walk", "talk", "believe", "fox", "dog", "quick", "lazy", "city", "owner", "serve"]
    suffixes = ["", "s", "ed", "ing", "er", "ers", "able", "ly"]
    lines = []
    for _ in range(n):
        words = [rng.choice(["un", "re", ""]) + rng.choice(stems) + rng.choice(suffixes)
                 for _ in range(rng.randint(3, 12))]
        lines.append(" ".join(words) + rng.choice([".", "!", "?"]))
    return lines + CORPUS.splitlines()


def test_layout_and_special_tokens():
    words = vocab_builder.count_words(_corpus_lines())
    vocab = vocab_builder.learn_wordpiece_vocab(words, vocab_size=300)
    assert len(vocab) == 300 and len(set(vocab)) == 300
    assert vocab[0] == "[PAD]" and vocab[1] == "[unused0]" and vocab[99] == "[unused98]"
    assert vocab[100:104] == ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    # every character and its ## form is in: no word of the corpus is [UNK]
    chars = {c for w in words for c in w}
    assert chars <= set(vocab)
    assert {"##" + c for w in words for c in w[1:]} <= set(vocab)
    stats = vocab_builder.word_stats(vocab, words)
    assert stats["unk"] == 0
    # learned pieces shorten words: far fewer pieces than characters
    chars_per_word = sum(len(w) * n for w, n in words.items()) / sum(words.values())
    assert stats["pieces_per_word"] < 0.5 * chars_per_word


def test_bigger_vocab_gives_fewer_pieces_and_is_deterministic():
    words = vocab_builder.count_words(_corpus_lines())
    small = vocab_builder.learn_wordpiece_vocab(words, vocab_size=200, num_unused=0)
    big = vocab_builder.learn_wordpiece_vocab(words, vocab_size=400, num_unused=0)
    assert vocab_builder.word_stats(big, words)["pieces_per_word"] < vocab_builder.word_stats(small, words)[
        "pieces_per_word"]
    assert vocab_builder.learn_wordpiece_vocab(dict(reversed(list(words.items()))), 400, 0) == big
    assert big[:len(small)] == small  # pieces are learned in a fixed order
    assert "jump" in big and "##ing" in big


def test_min_frequency_stops_early():
    vocab = vocab_builder.learn_wordpiece_vocab({"abc": 1, "abd": 1}, vocab_size=100, num_unused=0)
    assert set(vocab[5:]) == {"a", "b", "c", "d", "##a", "##b", "##c", "##d", "ab"}  # only a+##b occurs twice
    vocab = vocab_builder.learn_wordpiece_vocab({"abc": 1, "abd": 1}, vocab_size=100, num_unused=0,
                                                min_frequency=1)
    assert {"ab", "abc", "abd"} <= set(vocab)


def test_casing_and_accents(tmp_path):
    lines = CORPUS.splitlines()
    uncased = vocab_builder.count_words(lines)
    assert "cafe" in uncased and "zurich" in uncased and "the" in uncased and "The" not in uncased
    assert "北" in uncased and "京" in uncased and "." in uncased
    keep = vocab_builder.count_words(lines, do_lower_case=True, strip_accents=False)
    assert "café" in keep and "zürich" in keep
    cased = vocab_builder.count_words(lines, do_lower_case=False)
    assert "The" in cased and "Café" in cased
    prefixed = vocab_builder.count_words(["Ge1:1 In the beginning"], line_prefix_regex=r"^\S+\s")
    assert set(prefixed) == {"in", "the", "beginning"}


def test_vocab_works_with_full_tokenizer(tmp_path):
    words = vocab_builder.count_words(_corpus_lines())
    vocab = vocab_builder.learn_wordpiece_vocab(words, vocab_size=250)
    path = tmp_path / "vocab.txt"
    vocab_builder.write_vocab(str(path), vocab)
    ids = read_vocab(str(path))  # the original's vocab rules (TensorFlow-free loader)
    assert ids == {t: i for i, t in enumerate(vocab)}
    tok = make_tokenizer(str(path), do_lower_case=True, strip_accents=None)
    pieces = tok.tokenize_batch(["Unbelievably quick foxes jumped!"])[0]
    assert "[UNK]" not in pieces and "".join(p.replace("##", "") for p in pieces) == "unbelievablyquickfoxesjumped!"
    assert [ids[t] for t in ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]] == [100, 101, 102, 103]


def _script(tmp_path, *args):
    return subprocess.run([sys.executable, str(REPO / "create_vocab.py"), *args], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)


def test_script_and_errors(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(_corpus_lines()) + "\n")
    out = tmp_path / "vocab.txt"
    proc = _script(tmp_path, f"--input_file={corpus}", f"--vocab_file={out}", "--vocab_size=220")
    assert proc.returncode == 0, proc.stderr
    assert len(out.read_text().splitlines()) == 220 and "[UNK] 0.0000%" in proc.stderr
    for args, expected in ((["--input_file=nothing*.txt"], "matches no file"),
                           ([f"--input_file={corpus}", "--vocab_size=50"], "vocab_size"),):
        proc = _script(tmp_path, *args, f"--vocab_file={tmp_path}/v2.txt")
        assert proc.returncode != 0
        assert proc.stderr.strip().splitlines()[-1].startswith("create_vocab.py: error:") and expected in proc.stderr
        assert not (tmp_path / "v2.txt").exists()


def test_kjv_vocab_coverage():
    kjv = shared_path("corpora", "kjv.txt")
    with open(kjv, encoding="utf-8") as f:
        words = vocab_builder.count_words(f, line_prefix_regex=r"^\S+\s")
    vocab = vocab_builder.learn_wordpiece_vocab(words, vocab_size=4000)
    stats = vocab_builder.word_stats(vocab, words)
    assert stats["unk_rate"] == 0.0
    assert stats["pieces_per_word"] < 1.15
