"""create_vocab: layout, coverage, determinism, casing options, errors."""

import json
import random

import pytest
from conftest import run_script, shared_path

from bert_tf.data.pretraining_job import make_tokenizer, read_vocab
from bert_tf.errors import InputDataError
from bert_tf.tokenization import vocab_builder
from bert_tf.tokenization.full import WordpieceTokenizer

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
    return run_script("create_vocab.py", *args, cwd=tmp_path, timeout=120)


def test_script_and_errors(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(_corpus_lines()) + "\n")
    out = tmp_path / "vocabs" / "kjv" / "vocab.txt"  # folders that do not exist yet are created
    proc = _script(tmp_path, f"--input_file={corpus}", f"--vocab_file={out}", "--vocab_size=220")
    assert proc.returncode == 0, proc.stderr
    assert len(out.read_text().splitlines()) == 220 and "[UNK] 0.0000%" in proc.stderr
    (tmp_path / "a_file").write_text("not a folder")
    for args, expected, vocab_file in (
            (["--input_file=nothing*.txt"], "matches no file", tmp_path / "v2.txt"),
            ([f"--input_file={corpus}", "--vocab_size=50"], "vocab_size", tmp_path / "v2.txt"),
            ([f"--input_file={corpus}", "--vocab_size=220"], "cannot create directory", tmp_path / "a_file" / "v2.txt")):
        proc = _script(tmp_path, *args, f"--vocab_file={vocab_file}")
        assert proc.returncode != 0
        assert proc.stderr.strip().splitlines()[-1].startswith("create_vocab.py: error:") and expected in proc.stderr
        assert "Traceback" not in proc.stderr
        assert not (tmp_path / "v2.txt").exists()


@pytest.mark.slow
def test_kjv_vocab_coverage():
    kjv = shared_path("corpora", "kjv.txt")
    with open(kjv, encoding="utf-8") as f:
        words = vocab_builder.count_words(f, line_prefix_regex=r"^\S+\s")
    vocab = vocab_builder.learn_wordpiece_vocab(words, vocab_size=4000)
    stats = vocab_builder.word_stats(vocab, words)
    assert stats["unk_rate"] == 0.0
    assert stats["pieces_per_word"] < 1.15


# ------------------------------------------------------------------ --extend_vocab
def _base_vocab():
    """A small vocab (10 [unused] slots) learned from a third of the corpus: many words still split."""
    lines = _corpus_lines()
    return vocab_builder.learn_wordpiece_vocab(vocab_builder.count_words(lines[::3]), vocab_size=150,
                                               num_unused=10), vocab_builder.count_words(lines)


def test_extend_vocab_keeps_old_ids_and_fills_only_unused_slots():
    base, words = _base_vocab()
    extended, new = vocab_builder.extend_vocab(base, words)
    assert len(extended) == len(base) and len(new) == 10
    changed = [i for i, (a, b) in enumerate(zip(base, extended, strict=True)) if a != b]
    assert changed == [t.id for t in new] == list(range(1, 11))  # [unused0..9]: ids 1-10, in order
    assert all(base[i] == f"[unused{i - 1}]" == t.replaced for i, t in zip(changed, new, strict=True))
    ids = {t: i for i, t in enumerate(base)}
    wordpiece = WordpieceTokenizer(vocab=ids)

    def saved(word):
        return words[word] * (len(wordpiece.tokenize_word(word)) - 1)

    for t in new:  # whole corpus words the old vocab split, with those pieces
        assert t.token in words and t.token not in ids and t.count == words[t.token]
        assert list(t.old_pieces) == wordpiece.tokenize_word(t.token) and len(t.old_pieces) >= 2
        assert [base[i] for i in t.old_piece_ids] == list(t.old_pieces)
    scores = [saved(t.token) for t in new]
    assert scores == sorted(scores, reverse=True)
    left_out = [w for w in words if w not in ids and w not in extended and words[w] >= 2]
    assert max(saved(w) for w in left_out) <= scores[-1]  # nothing better was left out
    before = vocab_builder.word_stats(base, words)["pieces_per_word"]
    after = vocab_builder.word_stats(extended, words)["pieces_per_word"]
    assert after < before
    assert vocab_builder.extend_vocab(base, words, max_new_tokens=3)[1] == new[:3]
    with pytest.raises(InputDataError, match="no \\[unusedN\\] slots"):
        vocab_builder.extend_vocab([t for t in base if not t.startswith("[unused")], words)


def test_extension_json_round_trip_and_tokenizer(tmp_path):
    base, words = _base_vocab()
    extended, new = vocab_builder.extend_vocab(base, words)
    path = tmp_path / "domain_vocab.txt"
    vocab_builder.write_vocab(str(path), extended)
    assert vocab_builder.write_extension(str(path), "base.txt", new) == str(tmp_path / "domain_vocab.extension.json")
    assert vocab_builder.read_extension(str(path)) == new
    tok = make_tokenizer(str(path), do_lower_case=True, strip_accents=None)
    assert tok.tokenize_batch([new[0].token])[0] == [new[0].token]  # one piece now
    stale = list(extended)
    stale[new[0].id] = base[new[0].id]
    vocab_builder.write_vocab(str(path), stale)
    with pytest.raises(InputDataError, match="the JSON belongs to another vocab"):
        vocab_builder.read_extension(str(path))
    assert vocab_builder.read_extension(str(tmp_path / "no_extension.txt")) == []


def test_extend_vocab_script_reports_pieces_per_word(tmp_path):
    base, words = _base_vocab()
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(_corpus_lines()) + "\n")
    vocab_builder.write_vocab(str(tmp_path / "base.txt"), base)
    proc = _script(tmp_path, f"--input_file={corpus}", f"--extend_vocab={tmp_path}/base.txt",
                   f"--vocab_file={tmp_path}/domain.txt", "--max_new_tokens=4")
    assert proc.returncode == 0, proc.stderr
    extended, _ = vocab_builder.extend_vocab(base, words, max_new_tokens=4)
    assert (tmp_path / "domain.txt").read_text().splitlines() == extended
    assert json.loads((tmp_path / "domain.extension.json").read_text())["new_tokens"][0]["token"] == extended[1]
    for vocab, name in ((base, "base.txt"), (extended, "domain.txt")):
        stats = vocab_builder.word_stats(vocab, words)
        assert (f"with {tmp_path}/{name}: [UNK] {100 * stats['unk_rate']:.4f}% of wordpieces, "
                f"{stats['pieces_per_word']:.3f} wordpieces per word") in proc.stderr


@pytest.mark.parametrize("field, value", [("num_unused", -1), ("min_frequency", -1), ("max_new_tokens", -2)])
def test_negative_settings_are_one_line_before_counting(tmp_path, field, value):
    """(-1 used to be taken silently: no [unused] slots, every word kept.)"""
    settings = vocab_builder.VocabSettings(str(tmp_path / "vocab.txt"), **{field: value})
    with pytest.raises(ValueError, match=f"^{field}: must be >= 0, got {value}$"):
        settings.check()
