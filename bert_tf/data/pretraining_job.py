"""create_pretraining_data as a library call: files in, sharded TFRecords out.

    text files --iter_input_blocks--> blocks of documents, file by file (main process, streaming)
      --workers: tokenize once, `dupe_factor` seeded passes, encode, shuffle-->
    framed records, in block order --bounded shuffle buffer--> output files, round robin

Reproducibility: block boundaries depend only on each input file and
`block_bytes` (a block never spans two files); every random draw inside a
block comes from rngs seeded by (random_seed, file index, block index in the
file, dupe pass); results are consumed in block order and the final shuffle
buffer has its own seeded rng. The Beam pipeline (bert_tf/beam/pretraining.py)
computes the same blocks with the same BlockWorker, so it writes the same
records (in another order). So the same inputs and flags give the
same bytes on any machine and with any `num_workers` (workers only change
which process computes a block).

Memory: the main process holds at most `2 * num_workers` blocks in flight plus
the shuffle buffer; no process imports TensorFlow for local files. Nothing
grows with the corpus.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import random
import time
from collections import deque
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np

from bert_tf import fileio, tokenization
from bert_tf.data import pretraining, schema, text_input
from bert_tf.errors import InputDataError
from bert_tf.progress import format_eta
from bert_tf.tokenization import check_special_tokens, load_vocab

logger = logging.getLogger("bert_tf.data")

# Defaults that change the output (they are part of "the same flags").
DEFAULT_BLOCK_BYTES = 1 << 19  # ~512 KB of text per block: the random-next pool and the unit of parallel work
DEFAULT_SHUFFLE_BUFFER = 50_000  # records held for the final shuffle (~40 MB at max_seq_length 128)
REQUIRED_TOKENS = ("[UNK]", "[CLS]", "[SEP]", "[MASK]")
PROGRESS_SECONDS = 10.0


PretrainingDataError = InputDataError  # the old name, kept importable (bert_tf/errors.py: what can go wrong)


@dataclass(frozen=True)
class PretrainingDataConfig:
    """Everything create_pretraining_data needs; defaults are the original's flags."""

    input_file: str
    output_file: str
    vocab_file: str
    do_lower_case: bool = True
    strip_accents: Optional[bool] = None
    do_whole_word_mask: bool = False
    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    random_seed: int = 12345
    dupe_factor: int = 10
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    num_workers: int = 0  # 0: all cores
    num_output_shards: int = 1  # files per output_file entry
    gzip: bool = False
    input_format: str = text_input.AUTO
    block_bytes: int = DEFAULT_BLOCK_BYTES
    shuffle_buffer_size: int = DEFAULT_SHUFFLE_BUFFER
    # schema.STATIC: dupe_factor masked copies (the original); schema.DYNAMIC: one unmasked copy
    # (dupe_factor is not used), masks drawn while training (bert_tf/data/masking.py).
    masking: str = schema.STATIC

    @property
    def num_passes(self) -> int:
        """Passes over every block: dupe_factor, or one for dynamic masking."""
        return 1 if self.masking == schema.DYNAMIC else self.dupe_factor

    @property
    def instance_options(self) -> pretraining.InstanceOptions:
        return pretraining.InstanceOptions(self.max_seq_length, self.max_predictions_per_seq, self.masked_lm_prob,
                                           self.short_seq_prob, self.do_whole_word_mask)


# ------------------------------------------------------------------ vocab and tokenizer
def read_vocab(vocab_file: str) -> Dict[str, int]:
    """token -> id (the original's rules) with the tokens the data tool needs; one-line errors."""
    try:
        vocab = load_vocab(vocab_file)
        check_special_tokens(vocab, vocab_file, REQUIRED_TOKENS)
    except InputDataError as e:
        raise InputDataError(f"vocab_file: {e}") from None
    return dict(vocab)


def make_tokenizer(vocab_file: str, do_lower_case: bool, strip_accents: Optional[bool]):
    """The fast batch tokenizer (exactly FullTokenizer's output); FullTokenizer if the fast one is absent."""
    try:
        cls = tokenization.FastTokenizer
    except (AttributeError, ImportError):  # the fast path is optional
        cls = tokenization.FullTokenizer
    return cls(vocab_file, do_lower_case=do_lower_case, strip_accents=strip_accents)


# ------------------------------------------------------------------ worker side
class BlockWorker:
    """Per-process state: tokenizer, ids of the special tokens, the record encoder."""

    def __init__(self, config: PretrainingDataConfig, vocab: Dict[str, int]):
        self.config = config
        self.options = config.instance_options
        self.tokenizer = make_tokenizer(config.vocab_file, config.do_lower_case, config.strip_accents)
        self.vocab_size = max(vocab.values()) + 1
        self.cls_id, self.sep_id, self.mask_id = vocab["[CLS]"], vocab["[SEP]"], vocab["[MASK]"]
        self.is_continuation = np.zeros(self.vocab_size, dtype=bool)
        for token, i in vocab.items():
            if token.startswith("##"):
                self.is_continuation[i] = True
        self.encoder = schema.PretrainingRecordEncoder(config.max_seq_length, config.max_predictions_per_seq,
                                                       self.vocab_size, config.masking)

    def tokenize_block(self, block: text_input.Block) -> pretraining.TokenizedBlock:
        sentences: List[str] = []
        counts = []
        for doc in block.documents:
            lines = text_input.document_sentences(doc)
            sentences.extend(lines)
            counts.append(len(lines))
        ids = self.tokenizer.encode_batch(sentences)
        docs, at = [], 0
        for c in counts:
            docs.append(ids[at:at + c])
            at += c
        return pretraining.build_block(docs)

    def run(self, block: text_input.Block):
        """(block key, documents, bytes, framed records of every dupe pass over the block, shuffled)."""
        tokenized = self.tokenize_block(block)
        records: List[bytes] = []
        if tokenized.num_documents:
            for dupe in range(self.config.num_passes):
                pair_rng, mask_rng = rngs(self.config.random_seed, _PASS_STREAM, *block.key, dupe)
                batch = pretraining.block_instances(tokenized, self.options, pair_rng, mask_rng, self.vocab_size,
                                                    self.cls_id, self.sep_id, self.mask_id, self.is_continuation,
                                                    mask=self.config.masking == schema.STATIC)
                records.extend(self.encode_batch(batch))
            rngs(self.config.random_seed, _BLOCK_SHUFFLE_STREAM, *block.key)[0].shuffle(records)
        return block.key, tokenized.num_documents, block.num_bytes, records

    def encode_batch(self, batch: pretraining.InstanceBatch) -> List[bytes]:
        encode, frame = self.encoder.encode, schema.frame_record
        columns = (batch.input_ids.tolist(), batch.num_tokens.tolist(), batch.num_segment_a.tolist(),
                   batch.masked_lm_positions.tolist(), batch.masked_lm_ids.tolist(),
                   batch.num_predictions.tolist(), batch.next_sentence_labels.tolist())
        return [frame(encode(*row)) for row in zip(*columns, strict=True)]


# Rng streams, so that no two uses share draws (SHARD_ORDER_STREAM: the Beam pipeline's shard order).
_PASS_STREAM, _BLOCK_SHUFFLE_STREAM, _FINAL_SHUFFLE_STREAM, SHARD_ORDER_STREAM = 0, 1, 2, 3


def rngs(seed: int, stream: int, *parts: int):
    """(random.Random, numpy Generator) for one use, e.g. one (file, block, dupe pass); independent of all others."""
    seq = np.random.SeedSequence([seed & 0xFFFFFFFFFFFFFFFF, stream, *parts])
    state = seq.generate_state(4, np.uint64)
    py_seed = int(state[0]) << 64 | int(state[1])
    return random.Random(py_seed), np.random.Generator(np.random.PCG64(seq.spawn(1)[0]))


_WORKER: Optional[BlockWorker] = None


def _init_worker(config, vocab):
    global _WORKER
    _WORKER = BlockWorker(config, vocab)


def _run_block(block):
    return _WORKER.run(block)


# ------------------------------------------------------------------ main process
def output_paths(config: PretrainingDataConfig) -> List[str]:
    """The files written: each comma-separated output_file, or N shards of it with --num_output_shards N."""
    paths = [p.strip() for p in config.output_file.split(",") if p.strip()]
    if not paths:
        raise InputDataError("output_file: no output file given")
    n = config.num_output_shards
    if n > 1:
        paths = [f"{p}-{i:05d}-of-{n:05d}" for p in paths for i in range(n)]
    return paths


def _check_config(config: PretrainingDataConfig) -> None:
    try:
        config.instance_options.validate()
    except ValueError as e:
        raise InputDataError(str(e)) from None
    if config.masking not in schema.MASKINGS:
        raise InputDataError(f"masking: expected one of {', '.join(schema.MASKINGS)}, got {config.masking!r}")
    if config.dupe_factor < 1:
        raise InputDataError(f"dupe_factor: must be >= 1, got {config.dupe_factor}")
    if config.num_output_shards < 1:
        raise InputDataError(f"num_output_shards: must be >= 1, got {config.num_output_shards}")
    if config.block_bytes < 1 or config.shuffle_buffer_size < 1:
        raise InputDataError("block_bytes and shuffle_buffer_size must be >= 1")
    if config.num_workers < 0:
        raise InputDataError(f"num_workers: must be >= 0 (0: all cores), got {config.num_workers}")


def prepare(config: PretrainingDataConfig):
    """Checks flags, vocab, inputs and output directories before any work: (vocab, input files, output paths)."""
    _check_config(config)
    vocab = read_vocab(config.vocab_file)
    input_files = text_input.expand_input_patterns(config.input_file)
    paths = output_paths(config)
    for p in paths:  # missing local folders are made, as `mkdir -p` (a bucket has none to make)
        if fileio.is_remote(p):
            continue
        try:
            fileio.make_parent_dirs(os.path.abspath(p))
        except OSError as e:
            raise InputDataError(f"output_file: {e}") from None
    return vocab, input_files, paths


def empty_corpus_error(input_files: List[str]) -> InputDataError:
    return InputDataError(f"input_file: no text found in {', '.join(input_files)} (empty corpus)")


class _Progress:
    def __init__(self, total_bytes: int):
        self.start = self.last = time.monotonic()
        self.total_bytes = total_bytes
        self.documents = self.instances = self.bytes_done = 0

    def update(self, documents: int, instances: int, num_bytes: int, force: bool = False) -> None:
        self.documents += documents
        self.instances += instances
        self.bytes_done += num_bytes
        now = time.monotonic()
        if force or now - self.last >= PROGRESS_SECONDS:
            self.last = now
            elapsed = max(now - self.start, 1e-9)
            rate = self.instances / elapsed
            eta = ""
            if self.total_bytes and self.bytes_done:
                frac = min(self.bytes_done / self.total_bytes, 1.0)
                eta = f", {100 * frac:.1f}% of input, ETA {format_eta(elapsed * (1 - frac) / max(frac, 1e-9))}"
            logger.info("documents %d, instances %d, %.0f documents/s, %.0f instances/s%s", self.documents,
                        self.instances, self.documents / elapsed, rate, eta)


def create_pretraining_data(config: PretrainingDataConfig) -> Dict[str, object]:
    """Writes the pretraining TFRecords; returns a summary (files, instances, documents, seconds).

    Raises InputDataError (one line) on bad flags or inputs; outputs are
    written under temporary names and renamed only when everything succeeded.
    """
    vocab, input_files, paths = prepare(config)
    num_workers = config.num_workers or os.cpu_count() or 1
    logger.info("*** Reading from %d input file(s), %d worker(s) ***", len(input_files), num_workers)
    for f in input_files:
        logger.info("  %s", f)

    progress = _Progress(text_input.input_size_bytes(input_files))
    writers: List[schema.RecordFileWriter] = []
    shuffle_rng = rngs(config.random_seed, _FINAL_SHUFFLE_STREAM)[0]
    buffer: List[bytes] = []
    writer_index = 0

    def emit(record: bytes) -> None:
        nonlocal writer_index
        writers[writer_index].write(record)
        writer_index = (writer_index + 1) % len(writers)

    def consume(result) -> None:
        _, num_docs, num_bytes, records = result
        for record in records:
            if len(buffer) < config.shuffle_buffer_size:
                buffer.append(record)
            else:  # emit a random buffered record, keep the new one in its slot
                j = shuffle_rng.randrange(len(buffer))
                emit(buffer[j])
                buffer[j] = record
        progress.update(num_docs, len(records), num_bytes)

    pool = None
    try:
        for p in paths:
            writers.append(schema.RecordFileWriter(p, gzip_output=config.gzip))
        blocks = text_input.iter_input_blocks(input_files, config.input_format, config.block_bytes)
        if num_workers == 1:
            _init_worker(config, vocab)
            for block in blocks:
                consume(_run_block(block))
        else:
            ctx = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
            pool = ctx.Pool(num_workers, initializer=_init_worker, initargs=(config, vocab))
            in_flight: deque = deque()
            for block in blocks:
                in_flight.append(pool.apply_async(_run_block, (block,)))
                while len(in_flight) >= 2 * num_workers:
                    consume(in_flight.popleft().get())
            while in_flight:
                consume(in_flight.popleft().get())
            pool.close()
            pool.join()
            pool = None
        shuffle_rng.shuffle(buffer)
        for record in buffer:
            emit(record)
        if progress.instances == 0:
            raise empty_corpus_error(input_files)
        for w in writers:
            w.close()
    except BaseException:
        if pool is not None:
            pool.terminate()
        for w in writers:
            w.abort()
        raise
    progress.update(0, 0, 0, force=True)
    seconds = time.monotonic() - progress.start
    logger.info("Wrote %d total instances to %d file(s) in %.1fs", progress.instances, len(paths), seconds)
    return {"output_files": paths, "instances": progress.instances, "documents": progress.documents,
            "seconds": seconds, "records_per_file": [w.num_records for w in writers]}
