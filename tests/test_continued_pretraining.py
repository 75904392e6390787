"""Continued pretraining: run_pretraining from each checkpoint kind, extended vocabs, a run that learns.

A tiny BERT's weights are written as an original TF1 checkpoint (with and without
heads), a Hugging Face folder (encoder only) and .safetensors file (MLM + NSP heads),
and a bert_tf model dir (MLM head only), then loaded into the pretrainer.
"""

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from conftest import run_script_main

from bert_tf import checkpoints, pretrained
from bert_tf.configs import BertConfig
from bert_tf.data import pretraining_job, schema
from bert_tf.errors import CheckpointError, ConfigError
from bert_tf.models import BertEncoder, BertPretrainer
from bert_tf.resources import SAMPLE_CORPUS
from bert_tf.runners.pretraining import build_trainer, run_pretraining
from bert_tf.runners.pretraining_config import PretrainingConfig
from bert_tf.tokenization import vocab_builder
from bert_tf.training import strategy as strategy_lib
from bert_tf.training.settings import TrainSettings

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEQ, PREDS = 32, 5
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=64, type_vocab_size=2)
MLM_BIAS, NSP_WEIGHTS = "cls/predictions/output_bias", "cls/seq_relationship/output_weights"


def _records(vocab_file, out, lines, seed=1):
    text = out + ".txt"
    with open(text, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    pretraining_job.create_pretraining_data(pretraining_job.PretrainingDataConfig(
        input_file=text, output_file=out, vocab_file=vocab_file, max_seq_length=SEQ, max_predictions_per_seq=PREDS,
        dupe_factor=2, num_workers=1, random_seed=seed))
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The vocab (with 30 [unused] slots), its KJV extension, records, and the source model in every format."""
    root = tmp_path_factory.mktemp("continued")
    with open(SAMPLE_CORPUS, encoding="utf-8") as f:
        lines = f.read().splitlines()
    words = vocab_builder.count_words(lines)
    base = vocab_builder.learn_wordpiece_vocab(words, vocab_size=400, num_unused=30)
    vocab = str(root / "vocab.txt")
    vocab_builder.write_vocab(vocab, base)
    extended, new_tokens = vocab_builder.extend_vocab(base, words)
    ext_vocab = str(root / "kjv_vocab.txt")
    vocab_builder.write_vocab(ext_vocab, extended)
    vocab_builder.write_extension(ext_vocab, vocab, new_tokens)
    split = int(len(lines) * 0.9)
    data = dict(train=_records(vocab, str(root / "train.tfrecord"), lines[:split]),
                heldout=_records(vocab, str(root / "heldout.tfrecord"), lines[split:], seed=2),
                ext_train=_records(ext_vocab, str(root / "ext_train.tfrecord"), lines[:split]),
                ext_heldout=_records(ext_vocab, str(root / "ext_heldout.tfrecord"), lines[split:], seed=2))
    config = BertConfig(vocab_size=len(base), **TINY)
    source = BertPretrainer(config)
    rng = np.random.default_rng(0)
    for v in source.weights:
        v.assign(rng.normal(0, 0.05, v.shape).astype("float32"))

    def beside(folder):
        os.makedirs(folder, exist_ok=True)
        config.to_json_file(os.path.join(folder, "bert_config.json"))
        tf.io.gfile.copy(vocab, os.path.join(folder, "vocab.txt"), overwrite=True)

    kinds = {}
    beside(str(root / "tf1_full"))
    kinds["tf1_full"] = checkpoints.write_tf1_checkpoint(source, str(root / "tf1_full" / "bert_model.ckpt"))
    beside(str(root / "tf1_encoder"))
    kinds["tf1_encoder"] = checkpoints.write_tf1_checkpoint(source.encoder,
                                                            str(root / "tf1_encoder" / "bert_model.ckpt"))
    kinds["hf_folder"] = checkpoints.write_hf_checkpoint(source.encoder, str(root / "hf_encoder"), vocab, True)
    hf_full = checkpoints.write_hf_checkpoint(source, str(root / "hf_full"), vocab, True)
    kinds["hf_safetensors"] = os.path.join(hf_full, "model.safetensors")
    # A bert_tf model dir: an MLM-only pretraining run (2 steps from the source weights).
    ours = str(root / "ours_mlm")
    run_pretraining(_config(config, data["train"], ours, vocab_file=vocab, objective="mlm", num_train_steps=2,
                            init_checkpoint=kinds["tf1_full"]), strategy_lib.get_strategy("one_device"))
    kinds["ours_dir"] = ours
    return dict(root=root, vocab=vocab, ext_vocab=ext_vocab, new_tokens=new_tokens, base=base, data=data,
                config=config, source=source, kinds=kinds)


def _config(config, records, output_dir, **changes):
    base = dict(bert_config=config, input_files=[records], output_dir=str(output_dir), max_seq_length=SEQ,
                max_predictions_per_seq=PREDS, do_train=True, train_batch_size=16, num_train_steps=2,
                num_warmup_steps=0, train=TrainSettings(learning_rate=1e-3, iterations_per_loop=2, seed=3),
                do_lower_case=True)
    base.update(changes)
    return PretrainingConfig(**base)


def _restore(setup, init, output_dir, objective="mlm_nsp", vocab_file=None):
    config = _config(setup["config"], setup["data"]["train"], output_dir, init_checkpoint=init, objective=objective,
                     vocab_file=vocab_file)
    trainer = build_trainer(config, strategy_lib.get_strategy("one_device"))
    assert trainer.restore() is None  # a fresh output_dir: init_checkpoint, not a resume
    return trainer


def _values(model):
    return {n: v.numpy() for n, v in checkpoints.tf1_variable_map(model).items()}


# kind -> (objective of the continued run, heads the log names as fresh)
KINDS = {
    "tf1_full": ("mlm_nsp", []),
    "tf1_encoder": ("mlm_nsp", ["masked LM (cls/predictions/*)", "next sentence (cls/seq_relationship/*)"]),
    "hf_folder": ("mlm", ["masked LM (cls/predictions/*)"]),
    "hf_safetensors": ("mlm_nsp", []),
    "ours_dir": ("mlm_nsp", ["next sentence (cls/seq_relationship/*)"]),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_checkpoint_kind_loads_into_the_pretrainer(setup, kind, tmp_path, caplog):
    objective, fresh = KINDS[kind]
    path = setup["kinds"][kind]
    with caplog.at_level(logging.INFO, logger="bert_tf.pretraining"):
        trainer = _restore(setup, path, tmp_path / "out", objective)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("initialised from")]
    assert len(lines) == 1
    want = f"heads not in the checkpoint start fresh: {', '.join(fresh)}" if fresh else "every head restored"
    assert lines[0].endswith(want), lines[0]
    assert int(trainer.global_step.numpy()) == 0  # optimizer state and step start fresh
    got = _values(trainer.model)
    source = _values(setup["source"])
    if kind == "ours_dir":  # trained 2 steps (MLM only) from the source: its own weights are the reference
        mlm_only = BertPretrainer(setup["config"], use_next_sentence_prediction=False)
        checkpoints.load_checkpoint(mlm_only, path)
        source.update(_values(mlm_only))
        assert not np.array_equal(source["bert/embeddings/word_embeddings"],
                                  _values(setup["source"])["bert/embeddings/word_embeddings"])
    fresh_prefixes = tuple(p for label, p in pretrained.PRETRAINING_HEADS.values() if f"{label} ({p}*)" in fresh)
    for name, value in got.items():
        if name.startswith(fresh_prefixes):
            assert not np.allclose(value, source[name]), name  # a fresh head, not the source's
        else:
            np.testing.assert_allclose(value, source[name], rtol=1e-6, atol=1e-7, err_msg=name)


def test_a_checkpoint_in_output_dir_is_resumed_instead(setup, tmp_path, caplog):
    out = tmp_path / "out"
    strategy = strategy_lib.get_strategy("one_device")
    run_pretraining(_config(setup["config"], setup["data"]["train"], out, init_checkpoint=setup["kinds"]["tf1_full"],
                            vocab_file=setup["vocab"]), strategy)
    with caplog.at_level(logging.INFO):
        run_pretraining(_config(setup["config"], setup["data"]["train"], out, num_train_steps=4,
                                init_checkpoint=setup["kinds"]["tf1_full"], vocab_file=setup["vocab"]), strategy)
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(f"{out} holds a checkpoint: resuming from it; init_checkpoint") for m in messages)
    assert any(m.startswith(f"resumed from {out}/ckpt-2 at step 2") for m in messages)
    assert not any(m.startswith("initialised from") for m in messages)
    assert tf.train.latest_checkpoint(str(out)).endswith("ckpt-4")


def test_data_of_another_vocab_is_one_line(setup, tmp_path):
    strategy = strategy_lib.get_strategy("one_device")
    init = setup["kinds"]["tf1_full"]
    small = BertConfig(**{**setup["config"].to_dict(), "vocab_size": 300})
    with pytest.raises(ConfigError) as info:  # records hold ids the checkpoint has no rows for
        run_pretraining(_config(small, setup["data"]["train"], tmp_path / "a", init_checkpoint=init), strategy)
    largest = max(max(schema.decode_example(r)["input_ids"]) for r in schema.read_records(setup["data"]["train"]))
    assert largest >= 300
    assert str(info.value).startswith(f"{setup['data']['train']}: token id ")
    assert str(info.value).endswith(f"but {init} has vocab_size 300; the data was made with another vocab than "
                                    "the checkpoint's")
    other = tmp_path / "other_vocab.txt"
    vocab_builder.write_vocab(str(other), setup["base"][:350])
    with pytest.raises(ConfigError) as info:  # a vocab of another size than the checkpoint's (the gate's)
        _config(setup["config"], setup["data"]["train"], tmp_path / "b", init_checkpoint=init,
                vocab_file=str(other)).validate()
    assert str(info.value).startswith(f"{other}: 350 tokens but {init} has vocab_size 400;")


def test_new_tokens_start_from_the_mean_of_their_old_pieces(setup, tmp_path):
    new_tokens = setup["new_tokens"]
    assert len(new_tokens) == 30
    trainer = _restore(setup, setup["kinds"]["tf1_full"], tmp_path / "out", vocab_file=setup["ext_vocab"])
    emb = trainer.model.encoder.embeddings.word_embeddings.embeddings.numpy()
    bias = trainer.model.masked_lm.output_bias.numpy()
    src_emb = setup["source"].encoder.embeddings.word_embeddings.embeddings.numpy()
    src_bias = setup["source"].masked_lm.output_bias.numpy()
    new_ids = [t.id for t in new_tokens]
    for t in new_tokens:
        np.testing.assert_allclose(emb[t.id], src_emb[list(t.old_piece_ids)].mean(axis=0), rtol=1e-6, atol=1e-7)
        assert bias[t.id] == pytest.approx(float(src_bias[list(t.old_piece_ids)].mean()), abs=1e-7)
        assert not np.allclose(emb[t.id], src_emb[t.id])
    others = np.setdiff1d(np.arange(len(emb)), new_ids)
    np.testing.assert_array_equal(emb[others], src_emb[others])
    np.testing.assert_array_equal(bias[others], src_bias[others])


def test_a_checkpoint_that_knows_the_new_tokens_keeps_their_rows(setup, tmp_path):
    """Its own vocab.txt has the new tokens: its rows were trained, so they are left alone."""
    folder = tmp_path / "trained_with_extension"
    prefix = checkpoints.write_tf1_checkpoint(setup["source"], str(folder / "bert_model.ckpt"))
    tf.io.gfile.copy(setup["ext_vocab"], str(folder / "vocab.txt"))
    model = BertPretrainer(setup["config"])
    checkpoints.load_pretrained(model, prefix)
    assert pretrained.init_new_token_embeddings(model, setup["ext_vocab"], prefix) == []
    np.testing.assert_array_equal(model.encoder.embeddings.word_embeddings.embeddings.numpy(),
                                  setup["source"].encoder.embeddings.word_embeddings.embeddings.numpy())
    wrong = list(setup["base"])
    wrong[setup["new_tokens"][0].id] = "something"
    vocab_builder.write_vocab(str(folder / "vocab.txt"), wrong)
    with pytest.raises(CheckpointError, match="extended from another vocab than the checkpoint's"):
        pretrained.init_new_token_embeddings(model, setup["ext_vocab"], prefix)


def test_the_extended_vocab_initialises_fine_tuning_too(setup):
    from bert_tf.pretrained import resolve_pretrained

    pretrained = resolve_pretrained(setup["kinds"]["tf1_encoder"], vocab_file=setup["ext_vocab"])
    encoder = BertEncoder(setup["config"])
    pretrained.init_fn(encoder)
    src = setup["source"].encoder.embeddings.word_embeddings.embeddings.numpy()
    t = setup["new_tokens"][-1]
    np.testing.assert_allclose(encoder.embeddings.word_embeddings.embeddings.numpy()[t.id],
                               src[list(t.old_piece_ids)].mean(axis=0), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("vocab", ["base", "extended"])
def test_a_tiny_continued_run_lowers_held_out_mlm_loss(setup, tmp_path, vocab):
    strategy = strategy_lib.get_strategy("one_device")
    init = setup["kinds"]["hf_safetensors"]
    if vocab == "base":
        records, vocab_file, heldout = setup["data"]["train"], setup["vocab"], setup["data"]["heldout"]
    else:
        records, vocab_file, heldout = setup["data"]["ext_train"], setup["ext_vocab"], setup["data"]["ext_heldout"]
    common = dict(init_checkpoint=init, vocab_file=vocab_file, eval_input_files=[heldout], eval_batch_size=32,
                  max_eval_steps=4, objective="mlm")
    before = run_pretraining(_config(setup["config"], records, tmp_path / "before", do_train=False, do_eval=True,
                                     **common), strategy)
    after = run_pretraining(_config(setup["config"], records, tmp_path / "after", do_eval=True, num_train_steps=60,
                                    num_warmup_steps=5, **common), strategy)
    assert before["global_step"] == 0 and after["global_step"] == 60
    assert after["masked_lm_loss"] < before["masked_lm_loss"] - 0.5, (before, after)


# ------------------------------------------------------------------ from the command line
@pytest.mark.parametrize("kind", ["tf1_encoder", "hf_folder", "ours_dir"])
def test_the_command_line_continues_from_each_kind(setup, kind, tmp_path, capsys):
    """No --bert_config_file, --vocab_file or --do_lower_case: all come from the checkpoint's folder. The
    Hugging Face folder through the script in a fresh process, as a user runs it; the other kinds through its
    main in this process (the same flags and log; a TensorFlow start less each)."""
    out = tmp_path / "out"
    flags = [f"--init_checkpoint={setup['kinds'][kind]}",
             f"--input_file={setup['data']['train']}", f"--output_dir={out}", "--do_train", "--objective=mlm",
             f"--max_seq_length={SEQ}", f"--max_predictions_per_seq={PREDS}", "--train_batch_size=8",
             "--num_train_steps=2", "--num_warmup_steps=0", "--iterations_per_loop=2"]
    if kind == "hf_folder":
        proc = subprocess.run([sys.executable, os.path.join(REPO, "run_pretraining.py"), *flags],
                              capture_output=True, text=True, timeout=300, cwd=REPO)
        assert proc.returncode == 0, proc.stderr[-3000:]
        log = proc.stderr
    else:
        code = run_script_main("run_pretraining", *flags)
        log = capsys.readouterr().err
        assert code == 0, log[-3000:]
    lines = [x for x in log.splitlines() if "initialised from" in x]
    assert len(lines) == 1
    fresh = "heads not in the checkpoint start fresh: masked LM (cls/predictions/*)"
    assert lines[0].endswith(fresh if kind != "ours_dir" else "every head restored"), lines[0]
    assert tf.train.latest_checkpoint(str(out)).endswith("ckpt-2")
    with open(out / "vocab.txt", encoding="utf-8") as f, open(setup["vocab"], encoding="utf-8") as g:
        assert f.read() == g.read()
    assert BertConfig.from_json_file(str(out / "bert_config.json")).hidden_size == TINY["hidden_size"]
    with open(out / "bert_tf_info.json", encoding="utf-8") as f:
        assert json.load(f)["do_lower_case"] is True
