"""Dynamic masking (bert_tf/data/masking.py): the original's rule drawn in tf.data, deterministic, resumable,
and run_pretraining.py on records without masks (kinds, vocab, resume through the script, two workers packed and not)."""

import dataclasses
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from conftest import run_script_main
from test_run_pretraining import PREDS, REPO, SEQ, _command, _events, _run, _wait_for_checkpoint, data  # noqa: F401

from bert_tf.configs import BertConfig
from bert_tf.data import masking, pipelines, pretraining_job
from bert_tf.errors import ConfigError
from bert_tf.resources import SAMPLE_CORPUS
from bert_tf.runners.pretraining import run_pretraining
from bert_tf.runners.pretraining_config import PretrainingConfig
from bert_tf.tokenization import load_vocab
from bert_tf.training import strategy as strategy_lib
from bert_tf.training.settings import TrainSettings

CLS, SEP, MASK, V = 2, 3, 4, 50
CONT = 40  # ids >= CONT are "##" pieces


@pytest.fixture(scope="module")
def dyn(data):  # noqa: F811  (the pretraining fixture: vocab, bert_config, static records)
    pretraining_job.create_pretraining_data(pretraining_job.PretrainingDataConfig(
        input_file=SAMPLE_CORPUS, output_file=str(data / "dyn.tfrecord"), vocab_file=str(data / "vocab.txt"),
        max_seq_length=SEQ, max_predictions_per_seq=PREDS, num_workers=1, masking="dynamic"))
    return data


def _options(wwm=False, preds=PREDS):
    return masking.MaskingOptions(preds, V, CLS, SEP, MASK, do_whole_word_mask=wwm,
                                  is_continuation=tuple(i >= CONT for i in range(V)))


def _batch(n=256, seed=0):
    """Unmasked instances: [CLS] A [SEP] B [SEP] of random lengths, 30% of ids "##" pieces."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((n, SEQ), np.int32)
    mask = np.zeros((n, SEQ), np.int32)
    for r in range(n):
        length = int(rng.integers(5, SEQ + 1))
        sep = int(rng.integers(2, length - 2))
        row = np.where(rng.random(length) < 0.3, rng.integers(CONT, V, length), rng.integers(5, CONT, length))
        row[0], row[sep], row[length - 1] = CLS, SEP, SEP
        ids[r, :length], mask[r, :length] = row, 1
    return {"input_ids": tf.constant(ids), "input_mask": tf.constant(mask), "segment_ids": tf.zeros_like(ids),
            "next_sentence_labels": tf.zeros([n, 1], tf.int32)}


def _words(ids, length):
    """The original's whole-word groups of one row: a ## piece joins the previous candidate's group."""
    groups = []
    for pos in range(1, length):
        if ids[pos] in (CLS, SEP):
            continue
        if ids[pos] >= CONT and groups:
            groups[-1].append(pos)
        else:
            groups.append([pos])
    return groups


@pytest.mark.parametrize("wwm", [False, True])
def test_masks_follow_the_original_rule(wwm):
    features = _batch()
    out = {k: v.numpy() for k, v in masking.draw_masks(features, masking.batch_key(7, 0, 0), _options(wwm)).items()}
    ids, lengths = features["input_ids"].numpy(), features["input_mask"].numpy().sum(1)
    kinds = []
    for r in range(len(ids)):
        n = int(lengths[r])
        k = min(PREDS, max(1, round(n * 0.15)))
        w = out["masked_lm_weights"][r]
        count = int(w.sum())
        assert (w[:count] == 1).all() and (w[count:] == 0).all()
        pos = out["masked_lm_positions"][r][:count]
        assert (np.diff(pos) > 0).all() and (out["masked_lm_positions"][r][count:] == 0).all()
        assert all(ids[r, p] not in (CLS, SEP) and p < n for p in pos)  # never [CLS]/[SEP]/padding
        np.testing.assert_array_equal(out["masked_lm_ids"][r][:count], ids[r, pos])
        unchanged = np.ones(SEQ, bool)
        unchanged[pos] = False
        np.testing.assert_array_equal(out["input_ids"][r][unchanged], ids[r][unchanged])
        got = out["input_ids"][r][pos]
        kinds += ["mask" if g == MASK else "keep" if g == o else "random" for g, o in zip(got, ids[r, pos], strict=False)]
        if not wwm:
            assert count == min(k, n - 3)
        else:  # whole words only, and the greedy fill: every word left out is larger than the room left
            chosen = set(pos.tolist())
            groups = _words(ids[r], n)
            assert all(set(g) <= chosen or not set(g) & chosen for g in groups)
            assert count <= k  # (0 when every word is longer than k, as in the original)
            assert all(len(g) > k - count for g in groups if not set(g) & chosen)
    share = {kind: kinds.count(kind) / len(kinds) for kind in ("mask", "keep", "random")}
    assert abs(share["mask"] - 0.8) < 0.03 and 0.07 < share["keep"] < 0.15 and 0.05 < share["random"] < 0.13, share


def test_every_candidate_is_equally_likely_and_keys_decide_the_masks():
    features = _batch(n=1, seed=3)
    n = int(features["input_mask"].numpy().sum())
    options = _options()
    counts = np.zeros(SEQ)
    for i in range(600):
        out = masking.draw_masks(features, masking.batch_key(1, 0, i), options)
        counts[out["masked_lm_positions"].numpy()[0][out["masked_lm_weights"].numpy()[0] > 0]] += 1
    ids = features["input_ids"].numpy()[0]
    candidates = [p for p in range(n) if ids[p] not in (CLS, SEP)]
    share = counts[candidates] / counts.sum()
    assert np.abs(share - 1 / len(candidates)).max() < 0.5 / len(candidates)  # ~600*k/n draws each
    assert counts.sum() == 600 * min(PREDS, max(1, round(n * 0.15)))

    def draw(*key):
        return masking.draw_masks(_batch(), masking.batch_key(*key), options)["input_ids"].numpy()

    np.testing.assert_array_equal(draw(1, 0, 5), draw(1, 0, 5))  # a function of the key
    for other in [(2, 0, 5), (1, 1, 5), (1, 0, 6)]:  # seed, input pipeline, batch index
        assert (draw(*other) != draw(1, 0, 5)).any(), other


def _take(ds, n):
    return [{k: v.numpy() for k, v in b.items()} for b in ds.take(n)]


def test_pipeline_masks_are_a_function_of_the_position_in_the_input(dyn):
    files = [str(dyn / "dyn.tfrecord")]
    vocab = load_vocab(str(dyn / "vocab.txt"))
    options = masking.options_from_vocab(vocab, PREDS)

    def dataset(seed=5, ctx=None, is_training=True):
        return pipelines.pretraining_dataset(files, SEQ, PREDS, 8, is_training=is_training, seed=seed,
                                             input_context=ctx, dynamic_masking=options, mask_seed=seed)

    first = _take(dataset(), 6)
    assert set(first[0]) == {"input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
                             "masked_lm_weights", "next_sentence_labels"}
    assert first[0]["masked_lm_positions"].shape == (8, PREDS) and (first[0]["input_ids"] == vocab["[MASK]"]).any()
    again = _take(dataset(), 6)
    for a, b in zip(first, again, strict=False):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    # Resumed by skipping the consumed batches (Mirrored, MultiWorker, TPU): the same masks follow.
    for a, b in zip(first[3:], _take(dataset().skip(3), 3), strict=False):
        np.testing.assert_array_equal(a["input_ids"], b["input_ids"])
    # Resumed from a saved iterator (one device): the same masks follow.
    iterator = iter(dataset())
    for _ in range(3):
        next(iterator)
    saved = tf.train.Checkpoint(it=iterator).write(str(dyn / "it" / "ckpt"))
    fresh = iter(dataset())
    tf.train.Checkpoint(it=fresh).read(saved).assert_consumed()
    np.testing.assert_array_equal(next(fresh)["masked_lm_positions"], first[3]["masked_lm_positions"])
    # Another seed: other masks on the same records in the same order... (order follows seed too: compare masks)
    other = _take(pipelines.pretraining_dataset(files, SEQ, PREDS, 8, is_training=True, seed=5,
                                                dynamic_masking=options, mask_seed=6), 1)[0]
    assert (other["masked_lm_positions"] != first[0]["masked_lm_positions"]).any()
    # Two input pipelines: different records and different keys.
    halves = [_take(dataset(ctx=tf.distribute.InputContext(2, i, 2), is_training=False), 1)[0] for i in range(2)]
    assert (halves[0]["input_ids"] != halves[1]["input_ids"]).any()
    # Evaluation (read in order, once): the same masks every time.
    np.testing.assert_array_equal(_take(dataset(is_training=False), 2)[1]["input_ids"],
                                  _take(dataset(is_training=False), 2)[1]["input_ids"])


def _config(d, tmp_path, files=("dyn.tfrecord",), **kw):
    args = dict(bert_config=BertConfig.from_json_file(str(d / "bert_config.json")),
                input_files=[str(d / f) for f in files], output_dir=str(tmp_path / "out"), max_seq_length=SEQ,
                max_predictions_per_seq=PREDS, do_train=True, do_eval=True, train_batch_size=16, eval_batch_size=16,
                num_train_steps=4, num_warmup_steps=1, max_eval_steps=3, vocab_file=str(d / "vocab.txt"),
                train=TrainSettings(learning_rate=1e-3, iterations_per_loop=2))
    args.update(kw)
    return PretrainingConfig(**args)


@pytest.mark.parametrize("objective,pack,wwm", [("mlm_nsp", False, True), ("mlm", True, False)])
def test_pretraining_on_records_without_masks(dyn, tmp_path, objective, pack, wwm):
    """Both objectives, packed and not, whole words or pieces: trains and evaluates on masks drawn in the
    pipeline; evaluation's masks (and so its results) are the same on every run."""
    config = _config(dyn, tmp_path, objective=objective, pack_sequences=pack, do_whole_word_mask=wwm)
    first = run_pretraining(config, strategy_lib.get_strategy("one_device"))
    assert first["global_step"] == 4 and 0 <= first["masked_lm_accuracy"] <= 1
    assert ("next_sentence_accuracy" in first) == (objective == "mlm_nsp")
    again = run_pretraining(dataclasses.replace(config, do_train=False),
                            strategy_lib.get_strategy("one_device"))
    assert again == first


@pytest.mark.parametrize("case,message", [
    ("mixed", "input_file: mixes records with masks ({d}/train.tfrecord) and without ({d}/dyn.tfrecord, "
              "create_pretraining_data.py --masking=dynamic); use records of one kind"),
    ("expect_static", "{d}/dyn.tfrecord: records without masks (create_pretraining_data.py --masking=dynamic), "
                      "but masking=static was asked"),
    ("expect_dynamic", "{d}/train.tfrecord: records with masks (create_pretraining_data.py --masking=static), "
                       "but masking=dynamic was asked"),
    ("wwm_on_static", "do_whole_word_mask and masked_lm_prob apply to records without masks; these records hold "
                      "theirs ({d}/train.tfrecord): set them in create_pretraining_data.py"),
    ("no_vocab", "{d}/dyn.tfrecord: records without masks need vocab_file (the [MASK] id, the special tokens and "
                 "the ## pieces come from it)"),
    ("small_vocab", "{d}/dyn.tfrecord: token id "),
    ("other_vocab", "{d}/dyn.tfrecord: records start with token id(s) [2], but [CLS] is 0 in {t}/other.txt; the "
                    "records were made with another vocab"),
])
def test_the_wrong_kind_or_vocab_is_one_line_before_training(dyn, tmp_path, case, message):
    changes = {"mixed": dict(files=("train.tfrecord", "dyn.tfrecord")), "expect_static": dict(masking="static"),
               "expect_dynamic": dict(files=("train.tfrecord",), masking="dynamic"),
               "wwm_on_static": dict(files=("train.tfrecord",), do_whole_word_mask=True),
               "no_vocab": dict(vocab_file=None)}.get(case, {})
    words = (dyn / "vocab.txt").read_text().splitlines()
    if case == "small_vocab":  # the first 100 entries: the records' ids run past its end
        (tmp_path / "other.txt").write_text("\n".join(words[:100]) + "\n")
    elif case == "other_vocab":  # as many entries, specials elsewhere
        (tmp_path / "other.txt").write_text("\n".join(words[2:3] + words[:2] + words[3:]) + "\n")
    if case in ("small_vocab", "other_vocab"):
        changes = dict(vocab_file=str(tmp_path / "other.txt"))
    with pytest.raises(ConfigError) as info:
        run_pretraining(_config(dyn, tmp_path, **changes), strategy_lib.get_strategy("one_device"))
    assert message.format(d=dyn, t=tmp_path) in str(info.value) and "\n" not in str(info.value)
    if case == "small_vocab":
        assert "other.txt has 100 tokens; the records were made with another vocab" in str(info.value)
    assert not (tmp_path / "out").exists()


def test_script_refuses_records_of_the_other_kind(dyn, tmp_path):
    """run_pretraining.py's main in this process: its exit code is the one error line."""
    code = run_script_main("run_pretraining", *_command(dyn, tmp_path / "out", 10, vocab_file=dyn / "vocab.txt",
                                                        masking="dynamic")[2:])
    assert code == (
        f"error: {dyn}/train.tfrecord: records with masks (create_pretraining_data.py --masking=static), but "
        "masking=dynamic was asked")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_killed_and_resumed_draws_the_uninterrupted_masks(dyn, tmp_path):
    """Through the script: SIGKILL after ckpt-10, the same command again; from the resume on, every loop's
    loss (which depends on every mask drawn) equals the uninterrupted run's."""
    steps = 30
    reference = _config(dyn, tmp_path, output_dir=str(tmp_path / "full"), do_eval=False, num_train_steps=steps,
                        num_warmup_steps=5, do_whole_word_mask=True,
                        train=TrainSettings(learning_rate=1e-3, iterations_per_loop=2, save_checkpoints_steps=10))
    run_pretraining(reference, strategy_lib.get_strategy("one_device"))
    out = tmp_path / "killed"
    cmd = _command(dyn, out, steps, input_file=dyn / "dyn.tfrecord", vocab_file=dyn / "vocab.txt",
                   do_whole_word_mask=True)
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, cwd=REPO)
    _wait_for_checkpoint(str(out), 10, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = int(tf.train.latest_checkpoint(str(out)).rsplit("-", 1)[1])
    assert 10 <= killed_at < steps
    final = _run(cmd)
    assert final.returncode == 0, final.stderr[-3000:]
    assert f"resumed from {out}/ckpt-{killed_at}" in final.stderr and "input position restored" in final.stderr
    assert "masking: dynamic, 0.15 of the tokens up to 5, whole words" in final.stderr
    assert final.stderr.count("optimizer: adamw") == 1
    ref, got = _events(str(tmp_path / "full"))["loss"], _events(str(out))["loss"]
    resumed = [step for step in range(killed_at + 2, steps + 1, 2)]
    assert resumed and all(got[step] == pytest.approx(ref[step], rel=1e-4) for step in resumed), (got, ref)
    assert os.path.exists(out / "ckpt-30.index")


MIRRORED = """
import sys
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from test_dynamic_masking import _config
from bert_tf.data import masking
from bert_tf.tokenization import load_vocab
from bert_tf.runners import pretraining
from bert_tf.training import strategy as strategy_lib
from bert_tf.training.settings import TrainSettings
import pathlib
d, tmp = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
settings = TrainSettings(learning_rate=1e-3, iterations_per_loop=2, save_checkpoints_steps=4)
options = masking.options_from_vocab(load_vocab(str(d / "vocab.txt")), 5, do_whole_word_mask=True)
for name, stops in (("full", [8]), ("resumed", [4, 8])):
    config = _config(d, tmp, output_dir=str(tmp / name), num_train_steps=8, do_eval=False, train=settings)
    for stop in stops:  # the resumed run stops at step 4 of 8 (as if killed), then runs again
        trainer = pretraining.build_trainer(config, strategy_lib.get_strategy("mirrored"))
        trainer.train_steps = stop
        pretraining._train(config, trainer, config.input_files, options)
full, resumed = (tf.train.latest_checkpoint(str(tmp / n)) for n in ("full", "resumed"))
assert full.endswith("ckpt-8") and resumed.endswith("ckpt-8"), (full, resumed)
compared = 0
for name, _ in tf.train.list_variables(full):
    value = np.asarray(tf.train.load_variable(full, name))
    if value.dtype.kind == "f":
        np.testing.assert_allclose(tf.train.load_variable(resumed, name), value, rtol=1e-5, atol=1e-6, err_msg=name)
        compared += 1
assert compared > 20, compared
print("OK replicas", strategy_lib.get_strategy("mirrored").num_replicas_in_sync)
"""


@pytest.mark.slow
def test_mirrored_two_replicas_resume_to_the_uninterrupted_weights(dyn, tmp_path):
    """Two replicas (logical CPUs, a subprocess): the resumed run skips the consumed batches, draws the same
    masks after them and ends at the uninterrupted run's weights."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join([os.path.join(REPO, "tests"), REPO, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", MIRRORED, str(dyn), str(tmp_path)], capture_output=True, text=True,
                          cwd=REPO, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OK replicas 2" in proc.stdout


# run_pretraining.py itself, with a tap on masking.draw_masks: one line per batch it masks, to the file
# named first (the key, a fingerprint of the unmasked ids and one of the masked positions).
TAPPED_SCRIPT = """
import runpy
import sys
import tensorflow as tf
from bert_tf.data import masking
tap, draw = "file://" + sys.argv[1], masking.draw_masks

def fingerprint(x):  # int64: sum of x weighted by its row and column
    x = tf.cast(x, tf.int64)
    rows = tf.range(1, tf.shape(x, out_type=tf.int64)[0] + 1)[:, None]
    return tf.reduce_sum(x * rows * tf.range(1, x.shape[1] + 1, dtype=tf.int64)[None, :])

def tapped(features, key, options):
    out = draw(features, key, options)
    tf.print(key, fingerprint(features["input_ids"]), fingerprint(out["masked_lm_positions"]), output_stream=tap)
    return out

masking.draw_masks = tapped
sys.argv = ["run_pretraining.py"] + sys.argv[2:]
runpy.run_path("run_pretraining.py", run_name="__main__")
"""


def _taps(path):
    """{batch index: (seed, input pipeline, ids fingerprint, positions fingerprint)} from a tap file."""
    draws = {}
    for line in path.read_text().splitlines():
        key, rest = line.split("] ")  # "[seed pipeline index] ids positions"
        seed, pipeline, index = (int(k) for k in key.strip("[").split())
        draw = (seed, pipeline, *(int(v) for v in rest.split()))
        assert draws.setdefault(index, draw) == draw  # (a batch drawn twice: the same masks)
    return draws


@pytest.mark.slow
@pytest.mark.parametrize("pack", [False, True])
def test_two_workers_train_on_records_without_masks_with_masks_of_their_own(dyn, tmp_path, pack):
    """--distribution_strategy=multi_worker, two local worker processes (TF_CONFIG), packed and not: the run
    finishes on both; each worker is its own input pipeline, reading other records and drawing their masks
    from its own keys (seed, worker, batch index)."""
    from test_reliability import _free_ports

    steps, out = 6, tmp_path / "out"
    workers = [f"localhost:{p}" for p in _free_ports(2)]
    flags = dict(bert_config_file=dyn / "bert_config.json", input_file=dyn / "dyn.tfrecord", output_dir=out,
                 vocab_file=dyn / "vocab.txt", max_seq_length=SEQ, max_predictions_per_seq=PREDS, do_train=True,
                 train_batch_size=16, num_train_steps=steps, num_warmup_steps=1, learning_rate=1e-3,
                 iterations_per_loop=2, save_checkpoints_steps=steps, distribution_strategy="multi_worker",
                 pack_sequences=pack, seed=7)
    procs = []
    for index in range(2):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", PYTHONPATH=REPO, TF_CONFIG=json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}))
        cmd = [sys.executable, "-c", TAPPED_SCRIPT, str(tmp_path / f"tap{index}.txt")] + [
            f"--{k}={v}" for k, v in flags.items()]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                                      env=env))
    try:
        results = [proc.communicate(timeout=240) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, (_, stderr) in zip(procs, results, strict=True):
        assert proc.returncode == 0, stderr[-3000:]
    # Both workers train the same synchronous steps (MultiWorkerMirroredStrategy is CollectiveAllReduceStrategy)
    # and report the same all-reduced loss; the run summary names the optimizer once.
    last = []
    for _, stderr in results:
        assert "strategy: CollectiveAllReduceStrategy with 2 replica(s)" in stderr
        assert stderr.count("optimizer: adamw") == 1
        assert "masking: dynamic, 0.15 of the tokens up to 5, word pieces" in stderr
        last.append([line.split(" INFO ")[1] for line in stderr.splitlines() if f"step {steps}/{steps} loss" in line])
        assert len(last[-1]) == 1, stderr[-3000:]
    assert last[0][0].split(" lr ")[0] == last[1][0].split(" lr ")[0]  # (examples/s differ)
    assert tf.train.latest_checkpoint(str(out)) == f"{out}/ckpt-{steps}"
    taps = [_taps(tmp_path / f"tap{index}.txt") for index in range(2)]
    # Each worker masked the batches of its own pipeline, keyed (seed 7, its index, batch index); unpacked, one
    # batch per step (8 rows: the global 16 over 2 workers), packed, buffers of instances (prefetching draws more).
    for index, draws in enumerate(taps):
        assert {(seed, pipeline) for seed, pipeline, _, _ in draws.values()} == {(7, index)}
        assert set(range(1 if pack else steps)) <= set(draws), sorted(draws)
    # Other records, other masks: no batch of one worker is a batch of the other.
    assert not {d[2] for d in taps[0].values()} & {d[2] for d in taps[1].values()}
    assert not {d[3] for d in taps[0].values()} & {d[3] for d in taps[1].values()}
