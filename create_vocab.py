"""Learn a WordPiece vocab.txt from a corpus (for a new language or domain).

    python create_vocab.py --input_file=corpus/*.txt --vocab_file=vocab.txt --vocab_size=30522 \\
        --do_lower_case=True

Reads the same layouts as create_pretraining_data.py (one sentence per line,
or WikiExtractor <doc> files). Deterministic: the same corpus and flags give
the same file. Logs the [UNK] rate and wordpieces per word on the corpus.
"""

import logging
import sys

from absl import app, flags

from bert_tf.data import text_input
from bert_tf.tokenization import vocab_builder

FLAGS = flags.FLAGS

flags.DEFINE_string("input_file", None, "Input raw text file (or comma-separated list of files); globs allowed.")
flags.DEFINE_string("vocab_file", None, "Output vocab file, one token per line.")
flags.DEFINE_integer("vocab_size", vocab_builder.DEFAULT_VOCAB_SIZE, "Tokens in the vocab, special tokens included.")
flags.DEFINE_bool("do_lower_case", True, "Lower-case the text (an uncased vocab).")
flags.DEFINE_bool("strip_accents", None, "Strip accents; default: follow do_lower_case, as the original.")
flags.DEFINE_integer("num_unused", vocab_builder.DEFAULT_NUM_UNUSED,
                     "Reserved [unusedN] tokens after [PAD] (99 gives the original's ids 100-103 for "
                     "[UNK]/[CLS]/[SEP]/[MASK]).")
flags.DEFINE_integer("min_frequency", vocab_builder.DEFAULT_MIN_FREQUENCY,
                     "Stop learning pieces when the best pair occurs fewer times than this.")
flags.DEFINE_string("line_prefix_regex", None,
                    "Regex removed from the start of each line before counting, e.g. '^\\S+ ' for "
                    "'Ge1:1 In the beginning' verse references.")
flags.DEFINE_enum("input_format", "auto", ["auto", "lines", "wiki"], "As in create_pretraining_data.py.")


def _lines(files, input_format):
    for doc in text_input.read_documents(files, input_format):
        yield from doc.lines


def main(_):
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    log = logging.getLogger("create_vocab")
    try:
        files = text_input.expand_input_patterns(FLAGS.input_file)
        words = vocab_builder.count_words(_lines(files, FLAGS.input_format), FLAGS.do_lower_case,
                                          FLAGS.strip_accents, FLAGS.line_prefix_regex)
        if not words:
            raise ValueError(f"input_file: no words in {', '.join(files)} (empty corpus)")
        log.info("%d distinct words, %d in all", len(words), sum(words.values()))
        vocab = vocab_builder.learn_wordpiece_vocab(words, FLAGS.vocab_size, FLAGS.num_unused, FLAGS.min_frequency)
    except (ValueError, OSError) as e:
        sys.exit(f"create_vocab.py: error: {e}")
    vocab_builder.write_vocab(FLAGS.vocab_file, vocab)
    log.info("Wrote %d tokens to %s", len(vocab), FLAGS.vocab_file)
    stats = vocab_builder.word_stats(vocab, words)
    log.info("On the corpus: [UNK] %.4f%% of wordpieces, %.3f wordpieces per word",
             100 * stats["unk_rate"], stats["pieces_per_word"])


if __name__ == "__main__":
    flags.mark_flag_as_required("input_file")
    flags.mark_flag_as_required("vocab_file")
    app.run(main)
