"""Learn a WordPiece vocab.txt from a corpus (for a new language or domain), or extend one.

    python create_vocab.py --input_file=corpus/*.txt --vocab_file=vocab.txt --vocab_size=30522 \\
        --do_lower_case=True

    # a domain vocab for an existing checkpoint: its [unusedN] slots take the corpus's most useful words
    python create_vocab.py --input_file=kjv.txt --extend_vocab=<checkpoint>/vocab.txt \\
        --vocab_file=kjv_vocab.txt --do_lower_case=True

Reads the same layouts as create_pretraining_data.py (one sentence per line,
or WikiExtractor <doc> files). Deterministic: the same corpus and flags give
the same file. Logs the [UNK] rate and wordpieces per word on the corpus
(before and after, when extending). --extend_vocab keeps every existing id and
changes only [unused] slots; it writes <vocab_file stem>.extension.json beside
the new vocab, listing each new token and the old pieces it replaces (its
embedding starts from their mean when the vocab is used with the checkpoint).

--runner=DirectRunner|DataflowRunner|... counts words on Apache Beam (a combine over the files;
Beam's pipeline options pass through) and learns the same vocab (README "Beyond one machine").
"""

import logging
import sys

from absl import app, flags

import bert_flags
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
                     "Stop learning pieces when the best pair occurs fewer times than this (with "
                     "--extend_vocab: the fewest occurrences of a word added).")
flags.DEFINE_string("line_prefix_regex", None,
                    "Regex removed from the start of each line before counting, e.g. '^\\S+ ' for "
                    "'Ge1:1 In the beginning' verse references.")
flags.DEFINE_enum("input_format", "auto", ["auto", "lines", "wiki"], "As in create_pretraining_data.py.")
flags.DEFINE_string("extend_vocab", None, "An existing vocab.txt to extend instead of learning one: its "
                    "[unusedN] slots take the corpus's words that it splits into the most wordpieces, weighted "
                    "by frequency (--vocab_size and --num_unused are then unused).")
flags.DEFINE_integer("max_new_tokens", None, "With --extend_vocab: fill at most this many [unused] slots "
                     "(default: all of them).")
flags.DEFINE_integer("num_workers", 0, "With --runner=DirectRunner: local worker processes (0 = all cores).")
bert_flags.define_beam_flags()


def main(argv):
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    log = logging.getLogger("create_vocab")
    beam_args = bert_flags.beam_args(argv, "create_vocab.py")
    settings = vocab_builder.VocabSettings(FLAGS.vocab_file, FLAGS.vocab_size, FLAGS.num_unused, FLAGS.min_frequency,
                                           FLAGS.extend_vocab, FLAGS.max_new_tokens)
    try:
        settings.check()
        files = text_input.expand_input_patterns(FLAGS.input_file)
        if FLAGS.runner:
            from bert_tf.beam import vocab

            vocab.run(files, FLAGS.input_format, FLAGS.do_lower_case, FLAGS.strip_accents,
                      FLAGS.line_prefix_regex, settings, beam_args, FLAGS.runner, FLAGS.num_workers)
        else:
            chunks = vocab_builder.count_chunks(
                (line for doc in text_input.read_documents(files, FLAGS.input_format) for line in doc.lines),
                FLAGS.line_prefix_regex)
            words = vocab_builder.chunk_words(chunks, FLAGS.do_lower_case, FLAGS.strip_accents)
            vocab_builder.make_vocab(words, settings, log, ', '.join(files))
    except (ValueError, OSError) as e:  # every BertError (bert_tf/errors.py) is a ValueError
        sys.exit(f"create_vocab.py: error: {e}")


if __name__ == "__main__":
    flags.mark_flag_as_required("input_file")
    flags.mark_flag_as_required("vocab_file")
    app.run(main, flags_parser=bert_flags.parse_flags_and_beam_options)
