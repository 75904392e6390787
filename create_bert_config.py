"""Writes a bert_config.json of a named size, its vocab_size taken from the vocab, without writing JSON by hand.

    python create_bert_config.py --size=base --vocab_file=vocab.txt --output=bert_config.json

The sizes of the BERT paper and of Turc et al. 2019 ("Well-Read Students Learn Better"), the
released checkpoints' shapes: tiny (2 layers, hidden 128), mini (4, 256), small (4, 512),
medium (8, 512), base (12, 768), large (24, 1024); always hidden/64 attention heads and an
intermediate size of 4 x hidden, GELU, dropout 0.1, 512 positions, 2 segment types.
--max_position_embeddings lowers the longest sequence the model can take (a smaller model).
"""

import sys

from absl import app, flags

from bert_tf.configs import RELEASED_SIZES, BertConfig
from bert_tf.errors import ConfigError

FLAGS = flags.FLAGS

flags.DEFINE_enum("size", None, list(RELEASED_SIZES), "The model size (layers and hidden size).")
flags.DEFINE_string("vocab_file", None, "The vocab the model is for: vocab_size is its number of lines.")
flags.DEFINE_string("output", "bert_config.json", "Where to write the bert_config.json (folders are created).")
flags.DEFINE_integer("max_position_embeddings", None, "Longest sequence the model takes (default 512).")
flags.DEFINE_bool("overwrite", False, "Replace an existing --output.")


def main(argv):
    del argv
    from bert_tf import fileio
    from bert_tf.errors import InputDataError
    from bert_tf.tokenization import load_vocab

    try:
        if fileio.exists(FLAGS.output) and not FLAGS.overwrite:
            raise ConfigError(f"{FLAGS.output} exists; pass --overwrite to replace it")
        overrides = {}
        if FLAGS.max_position_embeddings is not None:
            overrides["max_position_embeddings"] = FLAGS.max_position_embeddings
        config = BertConfig.named(FLAGS.size, vocab_size=len(load_vocab(FLAGS.vocab_file)), **overrides)
        config.to_json_file(FLAGS.output)
    except (ConfigError, InputDataError, OSError) as e:
        print(f"create_bert_config.py: error: {e}", file=sys.stderr)
        sys.exit(1)
    print(f"wrote {FLAGS.output}: {FLAGS.size}, {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
          f"{config.num_attention_heads} heads, vocab_size {config.vocab_size}")


if __name__ == "__main__":
    flags.mark_flags_as_required(["size", "vocab_file"])
    app.run(main)
