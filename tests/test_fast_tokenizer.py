"""FastTokenizer gives exactly FullTokenizer's words, wordpieces and ids (docs/reference.md §5)."""

import glob
import json
import pickle
import unicodedata

import pytest
from conftest import shared_path

from bert_tf.tokenization.fast import FastTokenizer
from bert_tf.tokenization.full import BasicTokenizer, FullTokenizer

# (do_lower_case, strip_accents): the original's two modes and our keep-accents extension.
MODES = [(True, None), (False, None), (True, False)]

HARD_CASES = [
    "",
    "   \t\n  ",
    "UNwant\u00e9d,running",
    " \tHeLLo!how  \n Are yoU?  ",
    "ah\u535a\u63a8zz",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\uc785\ub2c8\ub2e4.",  # Korean Hangul syllables
    "\u1100\u1161\u11a8 jamo",  # conjoining jamo
    "\u6771\u4eac\u3067\u3059\u3002\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a",  # kanji + kana
    "\u4e2d\u6587\uff0c\u6807\u70b9\u3002\u300c\u5f15\u53f7\u300d",  # Chinese with full-width punctuation
    "\U00020000\U0002a6df\U0002a700\U0002b820\U0002ceaf\uf900\ufaff\U0002f800\u3400",  # ideograph range ends
    "\U0002ceb0\U0002f7ff\u4dc0\ua000",  # just outside the ranges
    "emoji \U0001f600\U0001f44d\U0001f3fd ok\U0001f468\u200d\U0001f469\u200d\U0001f467 \u2764\ufe0f end",
    "e\u0301 a\u0300\u0301\u0302 \u00c5ngstr\u00f6m na\u00efve Cr\u00e8me Br\u00fbl\u00e9e \u0130stanbul",
    "\u0391\u03a3 \u039f\u0394\u039f\u03a3. \u0391\u03a3'\u0392 \u0391\u03a3\u200b\u0392 \u03a3",  # final sigma contexts
    "zero\u200bwidth\u200djoiner\ufeffbom soft\u00adhyphen \u2060wj \u180emvs",
    "nul\x00byte rep\ufffdlacement bell\x07 del\x7f c1\x85\x9f",
    "tab\there\nnew\rline\x0bvt\x0cff\x1cfs\x1dgs\x1ers\x1fus",
    "nbsp\u00a0here\u2002en\u3000ideo\u2028line\u2029para\u202fnarrow\u205fmath",
    "$+<=>^`|~ a$b+c<d=e>f^g`h|i~j !\"#%&'()*,-./:;?@[\\]_{}",
    "\u00bfQu\u00e9? \u00a1S\u00ed! \u2014dash\u2013 \u2026 \u00ab\u00bb \u201equote\u201c \u0387 \u037e \u1fef\u1fed",
    "\u0661\u0662 \u0627\u0644\u0639\u0631\u0628\u064a\u0629\u061f \u0939\u093f\u0928\u094d\u0926\u0940\u0964",
    "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22 \u0420\u0443\u0441\u0441\u043a\u0438\u0439 \u0419\u0439",
    "\ue000private \U000e0001tag \U000e0041 \u0378unassigned \ufdd0nonchar",
    "\ufb01 \u2126 \u212b \u1e9e \u00df \u0149 \uff21\uff42\uff43",  # compatibility / special casing
    "a" * 200 + " " + "a" * 201 + " " + "low" * 67 + " " + "x" * 199 + "\u0301",
    "\u00e9" * 200 + " " + "e\u0301" * 150,  # 200 chars before NFD, 300 after
    "runn" + "ing" * 70 + ". wantwantwant,unwanted",
    "lone \ud800 surrogate \udfff",
]


def _tokenizer_pair(vocab_file, do_lower_case, strip_accents, **kwargs):
    return (FullTokenizer(vocab_file, do_lower_case=do_lower_case, strip_accents=strip_accents),
            FastTokenizer(vocab_file, do_lower_case=do_lower_case, strip_accents=strip_accents, **kwargs))


def _assert_same(full, fast, texts):
    """Words, wordpieces and ids all equal the original's, text by text."""
    words = fast.basic_tokenize_batch(texts)
    pieces = fast.tokenize_batch(texts)
    ids = fast.encode_batch(texts)
    for i, text in enumerate(texts):
        expected = full.tokenize(text)
        assert words[i] == full.basic_tokenizer.tokenize(text), repr(text[:200])
        assert pieces[i] == expected, repr(text[:200])
        assert ids[i] == full.convert_tokens_to_ids(expected), repr(text[:200])


# ---------------------------------------------------------------- tiny vocab, no shared files
def test_golden_cases(tiny_vocab_file):
    fast = FastTokenizer(tiny_vocab_file)
    assert fast.tokenize("UNwant\u00e9d,running") == ["un", "##want", "##ed", ",", "runn", "##ing"]
    assert fast.basic_tokenize_batch([" \tHeLLo!how  \n Are yoU?  ", "ah\u535a\u63a8zz"]) == [
        ["hello", "!", "how", "are", "you", "?"], ["ah", "\u535a", "\u63a8", "zz"]]
    assert fast.encode_batch(["hello how are you?"]) == [[15, 16, 17, 18, 20]]


@pytest.mark.parametrize("do_lower_case,strip_accents", MODES)
def test_hard_cases_match_original(tiny_vocab_file, do_lower_case, strip_accents):
    full, fast = _tokenizer_pair(tiny_vocab_file, do_lower_case, strip_accents)
    texts = HARD_CASES + [" ".join(HARD_CASES), "".join(HARD_CASES)]
    _assert_same(full, fast, texts)
    _assert_same(full, fast, texts)  # second pass: answers from the caches


def test_bytes_input_decodes_like_the_original(tiny_vocab_file):
    full, fast = _tokenizer_pair(tiny_vocab_file, True, None)
    texts = [b"hello \xff\xfehow", "Cr\u00e8me \u4e2d".encode("utf-8"), b"are\xc3 you", b"\xe2\x80\x8bthe\x00cat"]
    assert fast.tokenize_batch(texts) == [full.tokenize(t) for t in texts]
    assert fast.tokenize(b"hello \xff\xfehow") == ["hello", "how"]


def test_tiny_cache_gives_the_same_answers(tiny_vocab_file):
    full, fast = _tokenizer_pair(tiny_vocab_file, True, None, cache_size=2)
    texts = ["the cat sat on the mat.", "the dog sat, the cat sat!", "unwanted running dogs"] * 3
    _assert_same(full, fast, texts)
    assert len(fast._pieces) <= 2


def test_full_tokenizer_interface(tiny_vocab_file):
    full, fast = _tokenizer_pair(tiny_vocab_file, True, None)
    assert fast.vocab == full.vocab and fast.inv_vocab == full.inv_vocab
    ids = fast.encode_batch(["The cat sat on the mat."])[0]
    assert fast.convert_ids_to_tokens(ids) == fast.tokenize("The cat sat on the mat.")
    assert fast.convert_tokens_to_ids(fast.convert_ids_to_tokens(ids)) == ids


def test_pickles_without_caches_and_rejects_a_bare_text(tiny_vocab_file):
    fast = FastTokenizer(tiny_vocab_file)
    texts = ["The cat sat, unwanted!", "how are you?"]
    expected = fast.tokenize_batch(texts)
    clone = pickle.loads(pickle.dumps(fast))
    assert len(clone._pieces) == 0 and clone.tokenize_batch(texts) == expected
    with pytest.raises(TypeError, match="single text"):
        fast.tokenize_batch("the cat")


def test_returned_lists_are_fresh(tiny_vocab_file):
    fast = FastTokenizer(tiny_vocab_file)
    first = fast.tokenize_batch(["the cat"])[0]
    first.append("mutated")
    assert fast.tokenize_batch(["the cat"])[0] == ["the", "cat"]


@pytest.mark.parametrize("do_lower_case,strip_accents", MODES)
def test_every_ascii_pair_matches_original(tiny_vocab_file, do_lower_case, strip_accents):
    """ASCII texts take their own path (str.split, translate): every ordered pair of ASCII characters."""
    full, fast = _tokenizer_pair(tiny_vocab_file, do_lower_case, strip_accents)
    texts = [f"Un{chr(a)}{chr(b)}Want" for a in range(128) for b in range(128)]
    assert all(t.isascii() for t in texts)
    assert fast.tokenize_batch(texts) == full.tokenize_batch(texts)
    assert fast.basic_tokenize_batch(texts) == full.basic_tokenize_batch(texts)


@pytest.mark.parametrize("do_lower_case,strip_accents", MODES + [(False, True)])
def test_every_code_point_matches_basic_tokenizer(tiny_vocab_file, do_lower_case, strip_accents):
    """Each code point alone inside a word, and in a run of its neighbours.

    Every code point except unassigned, private-use and undecomposable
    other-letters (CJK, syllabaries), which the rules treat alike: of those
    every 16th (~90,000 in all; the full 1.1M would take minutes).
    """
    basic = BasicTokenizer(do_lower_case=do_lower_case, strip_accents=strip_accents)
    fast = FastTokenizer(tiny_vocab_file, do_lower_case=do_lower_case, strip_accents=strip_accents)
    code_points = [cp for cp in range(0x110000) if cp % 16 == 0 or unicodedata.decomposition(chr(cp))
                   or unicodedata.category(chr(cp)) not in ("Cn", "Co", "Lo")]
    block = 512
    for start in range(0, len(code_points), block):
        chars = [chr(cp) for cp in code_points[start:start + block]]
        texts = [" ".join("A" + c + "b" for c in chars), "".join(chars)]
        got = fast.basic_tokenize_batch(texts)
        assert got == [basic.tokenize(t) for t in texts], f"block from U+{ord(chars[0]):04X}"


# ---------------------------------------------------------------- real vocab and real multilingual text
def _xquad_texts():
    texts = []
    paths = sorted(glob.glob(str(shared_path("fixtures", "squad", "xquad") / "*.json")))
    assert len(paths) >= 11  # ar de el en es hi ru th tr vi zh
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for article in json.load(f)["data"]:
                for paragraph in article["paragraphs"]:
                    texts.append(paragraph["context"])
                    texts.extend(qa["question"] for qa in paragraph["qas"])
    return texts


def _lines(paths, stride):
    texts = []
    for path in paths:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            texts.extend(f.read().splitlines()[::stride])
    return texts


@pytest.fixture(scope="module")
def real_texts():
    """XQuAD (11 languages), the pretraining fixtures, every 4th line of the corpora, the hard cases."""
    corpora = sorted(glob.glob(str(shared_path("corpora") / "*.txt")))
    pretraining = sorted(glob.glob(str(shared_path("fixtures", "pretraining") / "*")))
    return _xquad_texts() + _lines(pretraining, 1) + _lines(corpora, 4) + HARD_CASES


# The original tokenizer is the slow part (~100k wordpieces/s): the cased and
# keep-accents modes check every 5th of those texts.
@pytest.mark.parametrize("do_lower_case,strip_accents,stride", [(True, None, 1), (False, None, 5), (True, False, 5)])
@pytest.mark.slow
def test_real_text_matches_original(real_texts, do_lower_case, strip_accents, stride):
    vocab = str(shared_path("fixtures", "vocab", "bert-base-uncased-vocab.txt"))
    full, fast = _tokenizer_pair(vocab, do_lower_case, strip_accents)
    texts = real_texts[::stride]
    expected = full.tokenize_batch(texts)
    assert sum(map(len, expected)) > 50_000 // stride
    assert fast.tokenize_batch(texts) == expected
    assert fast.encode_batch(texts) == [full.convert_tokens_to_ids(pieces) for pieces in expected]
    multilingual = [t for t in texts if not t.isascii()]
    assert fast.basic_tokenize_batch(multilingual) == full.basic_tokenize_batch(multilingual)


def test_word_length_limit_on_real_vocab():
    vocab = str(shared_path("fixtures", "vocab", "bert-base-uncased-vocab.txt"))
    fast = FastTokenizer(vocab)
    word = "ab" * 100
    exactly, over = fast.tokenize_batch([word, word + "a"])
    assert exactly != ["[UNK]"] and "".join(p.lstrip("#") for p in exactly) == word
    assert over == ["[UNK]"]
