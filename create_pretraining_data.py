"""Create masked-LM / next-sentence pretraining TFRecords (the original's flags, docs/reference.md §6).

    python create_pretraining_data.py --input_file=corpus/*.txt --output_file=out/train.tfrecord \\
        --vocab_file=vocab.txt --max_seq_length=128 --max_predictions_per_seq=20 --dupe_factor=10

--masking=dynamic writes one copy of each instance without masks (tokens, segments, next-sentence
label; bert_tf/data/schema.py); run_pretraining.py then draws the masks while reading them.

Streams the corpus through `--num_workers` processes; output is identical for
the same inputs and flags on any machine and with any number of workers.

Beyond one machine (Apache Beam, `pip install -e ".[beam]"`): add --runner and Beam's own
pipeline options; the same records (as a multiset) in --num_output_shards files, README
"Beyond one machine":

    python create_pretraining_data.py ... --runner=DirectRunner --num_workers=2   # local processes
    python create_pretraining_data.py ... --runner=DataflowRunner --project=P --region=R \
        --temp_location=gs://B/tmp --setup_file=./setup.py
"""

import logging
import sys

from absl import app, flags

import bert_flags
import bert_setup
from bert_tf.data import pretraining_job
from bert_tf.errors import InputDataError

FLAGS = flags.FLAGS

flags.DEFINE_string("input_file", None, "Input raw text file (or comma-separated list of files); globs allowed.")
flags.DEFINE_string("output_file", None, "Output TF example file (or comma-separated list of files).")
flags.DEFINE_string("vocab_file", None, "The vocabulary file that the BERT model was trained on.")
flags.DEFINE_bool("do_lower_case", True, "Whether to lower case the input text. Should be True for uncased "
                  "models and False for cased models.")
flags.DEFINE_bool("strip_accents", None, "Strip accents; default: follow do_lower_case, as the original.")
flags.DEFINE_bool("do_whole_word_mask", False, "Whether to use whole word masking rather than per-WordPiece masking.")
flags.DEFINE_integer("max_seq_length", 128, "Maximum sequence length.")
flags.DEFINE_integer("max_predictions_per_seq", 20, "Maximum number of masked LM predictions per sequence.")
flags.DEFINE_integer("random_seed", 12345, "Random seed for data generation.")
flags.DEFINE_integer("dupe_factor", 10, "Number of times to duplicate the input data (with different masks).")
flags.DEFINE_float("masked_lm_prob", 0.15, "Masked LM probability.")
flags.DEFINE_float("short_seq_prob", 0.1, "Probability of creating sequences which are shorter than the "
                   "maximum length.")
flags.DEFINE_enum("masking", "static", ["static", "dynamic"],
                  "static: dupe_factor copies with masks written in (the original); dynamic: one copy without "
                  "masks, run_pretraining.py draws them each time a sequence is read (docs/pretraining.md).")
flags.DEFINE_integer("num_workers", 0, "Worker processes; 0 = all cores. Does not change the output.")
flags.DEFINE_integer("num_output_shards", 1, "Split each output_file into this many files "
                     "(<output_file>-00000-of-0000N); records go round robin as across output_file entries.")
flags.DEFINE_bool("gzip", False, "Write GZIP-compressed TFRecords (read with compression_type='GZIP').")
flags.DEFINE_enum("input_format", "auto", ["auto", "lines", "wiki"],
                  "lines: one sentence per line, blank line between documents; wiki: WikiExtractor <doc> files "
                  "(paragraphs split into sentences); auto: wiki if a file starts with <doc.")
flags.DEFINE_integer("block_bytes", pretraining_job.DEFAULT_BLOCK_BYTES,
                     "Text per block: the unit of parallel work and the pool random-next segments are drawn from. "
                     "Changes the output.")
flags.DEFINE_integer("shuffle_buffer_size", pretraining_job.DEFAULT_SHUFFLE_BUFFER,
                     "Records held for the final shuffle. Changes the output. (Not used with --runner.)")
bert_flags.define_beam_flags()


def main(argv):
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    beam_args = bert_flags.beam_args(argv, "create_pretraining_data.py")
    problem = None  # the gate: flags checked before anything loads TensorFlow
    if FLAGS.masking == "dynamic":
        # Flags that only shape written masks: with dynamic masking run_pretraining.py takes them.
        given = [f"--{name}" for name, used in (("dupe_factor", FLAGS.dupe_factor > 1),
                                                 ("do_whole_word_mask", FLAGS.do_whole_word_mask),
                                                 ("masked_lm_prob", FLAGS.masked_lm_prob != 0.15))
                 if FLAGS[name].present and used]
        if given:
            problem = (f"{', '.join(given)}: --masking=dynamic writes one copy without masks; run_pretraining.py "
                       "draws them (it takes --do_whole_word_mask and --masked_lm_prob)")
    # gs:// input, vocab or output that cannot be reached (TensorFlow's file system, for remote paths only)
    problem = problem or bert_setup.remote_path_problem()
    if problem:
        sys.exit(f"create_pretraining_data.py: error: {problem}")
    config = pretraining_job.PretrainingDataConfig(
        input_file=FLAGS.input_file, output_file=FLAGS.output_file, vocab_file=FLAGS.vocab_file,
        do_lower_case=FLAGS.do_lower_case, strip_accents=FLAGS.strip_accents,
        do_whole_word_mask=FLAGS.do_whole_word_mask, max_seq_length=FLAGS.max_seq_length,
        max_predictions_per_seq=FLAGS.max_predictions_per_seq, random_seed=FLAGS.random_seed,
        dupe_factor=FLAGS.dupe_factor, masked_lm_prob=FLAGS.masked_lm_prob, short_seq_prob=FLAGS.short_seq_prob,
        num_workers=FLAGS.num_workers, num_output_shards=FLAGS.num_output_shards, gzip=FLAGS.gzip,
        input_format=FLAGS.input_format, block_bytes=FLAGS.block_bytes,
        shuffle_buffer_size=FLAGS.shuffle_buffer_size, masking=FLAGS.masking)
    try:
        if FLAGS.runner:
            from bert_tf.beam import pretraining

            pretraining.run(config, beam_args, FLAGS.runner)
        else:
            pretraining_job.create_pretraining_data(config)
    except (InputDataError, OSError) as e:
        sys.exit(f"create_pretraining_data.py: error: {e}")


if __name__ == "__main__":
    flags.mark_flag_as_required("input_file")
    flags.mark_flag_as_required("output_file")
    flags.mark_flag_as_required("vocab_file")
    app.run(main, flags_parser=bert_flags.parse_flags_and_beam_options)
