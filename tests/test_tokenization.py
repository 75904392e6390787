"""The exact tokenizer: the original's golden cases and the rules of docs/reference.md §5."""

import pytest
from conftest import shared_path

from bert_tf.errors import InputDataError
from bert_tf.tokenization import BasicTokenizer, FullTokenizer, WordpieceTokenizer, load_vocab
from bert_tf.tokenization.full import is_control, is_punctuation, is_whitespace

GOLDEN_VOCAB = ["[UNK]", "[CLS]", "[SEP]", "want", "##want", "##ed", "wa", "un", "runn", "##ing", ","]


@pytest.fixture
def golden_vocab_file(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("".join(t + "\n" for t in GOLDEN_VOCAB), encoding="utf-8")
    return str(path)


def test_full_tokenizer_golden(golden_vocab_file):
    tok = FullTokenizer(golden_vocab_file, do_lower_case=True)
    tokens = tok.tokenize("UNwant\u00e9d,running")
    assert tokens == ["un", "##want", "##ed", ",", "runn", "##ing"]
    assert tok.convert_tokens_to_ids(tokens) == [7, 4, 5, 10, 8, 9]
    assert tok.convert_ids_to_tokens([7, 4, 5, 10, 8, 9]) == tokens
    assert tok.inv_vocab[3] == "want" and tok.vocab["##ing"] == 9


def test_basic_lower_and_cased():
    text = " \tHeLLo!how  \n Are yoU?  "
    assert BasicTokenizer(do_lower_case=True).tokenize(text) == ["hello", "!", "how", "are", "you", "?"]
    assert BasicTokenizer(do_lower_case=True).tokenize("H\u00e9llo") == ["hello"]
    assert BasicTokenizer(do_lower_case=False).tokenize(text) == ["HeLLo", "!", "how", "Are", "yoU", "?"]
    # Cased mode neither lower-cases nor strips accents.
    assert BasicTokenizer(do_lower_case=False).tokenize("H\u00e9llo") == ["H\u00e9llo"]


def test_chinese_characters_split_but_not_kana_or_hangul():
    basic = BasicTokenizer(do_lower_case=True)
    assert basic.tokenize("ah\u535a\u63a8zz") == ["ah", "\u535a", "\u63a8", "zz"]
    # Hiragana and Katakana are not in the CJK ranges: they stay one word
    # (cased, since lower-casing would strip the dakuten of が).
    assert BasicTokenizer(do_lower_case=False).tokenize("\u3072\u3089\u304c\u306a\u30ab\u30bf\u30ab\u30ca") == ["\u3072\u3089\u304c\u306a\u30ab\u30bf\u30ab\u30ca"]
    assert basic.tokenize("\u304c") == ["\u304b"]
    # Extension B ideograph (outside the BMP) is split too.
    assert basic.tokenize("a\U00020000b") == ["a", "\U00020000", "b"]


def test_lowercase_decomposes_hangul_and_accent_option_keeps_it():
    word = "\ud55c\uad6d\uc5b4"  # 한국어
    stripped = BasicTokenizer(do_lower_case=True).tokenize(word)
    assert len(stripped) == 1 and stripped[0] != word
    assert all(0x1100 <= ord(c) <= 0x11FF for c in stripped[0])  # conjoining Jamo
    assert BasicTokenizer(do_lower_case=True, strip_accents=False).tokenize(word) == [word]
    assert BasicTokenizer(do_lower_case=True, strip_accents=False).tokenize("H\u00c9LLO") == ["h\u00e9llo"]


def test_cleaning_rules():
    basic = BasicTokenizer(do_lower_case=False)
    # NUL, U+FFFD, controls (Cc) and format characters (Cf) vanish without splitting.
    assert basic.tokenize("a\x00b\ufffdc\x07d\u200be\u00adf") == ["abcdef"]
    # Tab, newline, CR and no-break / ideographic spaces separate words.
    assert basic.tokenize("a\tb\nc\rd\u00a0e\u3000f") == ["a", "b", "c", "d", "e", "f"]
    # Bytes are decoded as UTF-8 with undecodable bytes dropped.
    assert basic.tokenize(b"ca\xfffe") == ["cafe"]


def test_punctuation_rules():
    basic = BasicTokenizer(do_lower_case=True)
    assert basic.tokenize("a$b+c<d=e>f^g`h|i~j") == list("a$b+c<d=e>f^g`h|i~j")
    assert basic.tokenize("\u00bfqu\u00e9?\u300cx\u300d") == ["\u00bf", "que", "?", "\u300c", "x", "\u300d"]
    # Unicode symbols outside ASCII (category S) are not punctuation.
    assert basic.tokenize("a\u20acb") == ["a\u20acb"]
    assert is_punctuation("-") and is_punctuation("^") and not is_punctuation("A") and not is_punctuation(" ")
    assert is_whitespace(" ") and is_whitespace("\t") and is_whitespace("\u00a0") and not is_whitespace("A")
    assert is_control("\x05") and is_control("\u200d") and not is_control("\t") and not is_control("\r")


def test_wordpiece_rules():
    vocab = {t: i for i, t in enumerate(GOLDEN_VOCAB + ["a", "##a"])}
    wp = WordpieceTokenizer(vocab)
    assert wp.tokenize("") == []
    assert wp.tokenize("unwanted running") == ["un", "##want", "##ed", "runn", "##ing"]
    # One unmatched position makes the whole word [UNK], not just the tail.
    assert wp.tokenize("unwantedX running") == ["[UNK]", "runn", "##ing"]
    # The 200-character limit: 200 still tokenizes, 201 is [UNK].
    assert wp.tokenize("a" * 200) == ["a"] + ["##a"] * 199
    assert wp.tokenize("a" * 201) == ["[UNK]"]


def test_real_vocab_examples():
    tok = FullTokenizer(str(shared_path("fixtures", "vocab", "bert-base-uncased-vocab.txt")))
    assert len(tok.vocab) == 30522
    assert [tok.vocab[t] for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [0, 100, 101, 102, 103]
    assert tok.tokenize("I have a new GPU!") == ["i", "have", "a", "new", "gp", "##u", "!"]


def test_vocab_errors(tmp_path):
    with pytest.raises(InputDataError, match="not found"):
        load_vocab(str(tmp_path / "missing.txt"))
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"[PAD]\n\xff\xfe\n")
    with pytest.raises(InputDataError, match="not UTF-8"):
        load_vocab(str(bad))
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(InputDataError, match="empty"):
        load_vocab(str(empty))
