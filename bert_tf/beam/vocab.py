"""create_vocab on Apache Beam: word counting as a combine over the files, then the local tool's vocab learning.

    input files --Reshuffle--> per file: chunk counts -> word counts (vocab_builder.count_chunks, chunk_words)
      --CombinePerKey(sum)--> the corpus's word counts --one worker--> vocab_builder.make_vocab

Counts add up, so the combined counts are the local tool's and the vocab (or
the extended vocab and its JSON) is the same file.
"""

from __future__ import annotations

import logging
from typing import Iterator, List, Optional, Sequence, Tuple

import apache_beam as beam

from bert_tf.beam import common
from bert_tf.data import text_input
from bert_tf.errors import InputDataError
from bert_tf.tokenization import vocab_builder

logger = logging.getLogger("bert_tf.beam")


def _file_words(path: str, input_format: str, do_lower_case: bool, strip_accents: Optional[bool],
                line_prefix_regex: Optional[str]) -> Iterator[Tuple[str, int]]:
    chunks = vocab_builder.count_chunks(
        (line for doc in text_input.read_file_documents(path, input_format) for line in doc.lines),
        line_prefix_regex)
    yield from vocab_builder.chunk_words(chunks, do_lower_case, strip_accents).items()


def _make_vocab(counts: List[Tuple[str, int]], settings: vocab_builder.VocabSettings, source: str) -> Iterator[int]:
    try:
        vocab = vocab_builder.make_vocab(dict(sorted(counts)), settings, logger, source)
    except ValueError as e:
        raise InputDataError(str(e)) from None
    yield len(vocab)


def run(input_files: List[str], input_format: str, do_lower_case: bool, strip_accents: Optional[bool],
        line_prefix_regex: Optional[str], settings: vocab_builder.VocabSettings, beam_args: Sequence[str] = (),
        runner: Optional[str] = None, num_workers: int = 0) -> None:
    """Counts on Beam and writes settings.vocab_file; raises InputDataError (one line) on bad input."""
    for path in input_files:
        text_input.check_readable(path)
    options = common.pipeline_options(beam_args, runner, num_workers)
    if common.is_local(options):
        common.quiet_local_logs()
    pipeline = common.make_pipeline(options)
    _ = (pipeline
         | "Files" >> beam.Create(input_files)
         | "SpreadFiles" >> beam.Reshuffle()
         | "CountWords" >> beam.FlatMap(_file_words, input_format, do_lower_case, strip_accents, line_prefix_regex)
         | "Sum" >> beam.CombinePerKey(sum)
         | "AllWords" >> beam.combiners.ToList()
         | "MakeVocab" >> beam.FlatMap(_make_vocab, settings, ", ".join(input_files)))
    common.run(pipeline)
    logger.info("Wrote %s", settings.vocab_file)
