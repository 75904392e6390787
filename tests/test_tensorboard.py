"""A real TensorBoard server on the output of a short fine-tuning run and a short pretraining run, read
through its HTTP data API as the browser reads it: shared train/eval tags, one eval point per
evaluation, the speed and input scalars, the HParams table and (with the profile plugin) the capture."""

import gzip
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from conftest import CPU_ONLY, TESTDATA, TINY_VOCAB, run_script, tiny_pretraining_folder

pytestmark = pytest.mark.slow

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, type_vocab_size=2,
            max_position_embeddings=64)
SERVER_SECONDS = 120  # the server's start and its first load of the logdir, at most
SPEED_TAGS = {"speed/seconds_per_step", "speed/input_wait_seconds_per_step", "speed/compute_seconds_per_step",
              "speed/input_wait_fraction", "speed/examples_per_second_per_replica", "input/real_tokens_per_position"}


def _script(name, *args):
    return run_script(name, *args, env=CPU_ONLY, check=True)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    """Two runs side by side under one --logdir, as a user compares them."""
    root = tmp_path_factory.mktemp("tensorboard")
    model = root / "model"
    model.mkdir()
    (model / "vocab.txt").write_text("\n".join(TINY_VOCAB) + "\n")
    (model / "bert_config.json").write_text(json.dumps(dict(TINY, vocab_size=len(TINY_VOCAB))))
    # 48 examples, batch 8: 6 steps an epoch, 3 epochs; evaluated at the end of each (default).
    finetune = _script("run_classifier.py", "--task_name=user", f"--data_dir={TESTDATA / 'classifier'}",
                       "--index_column=id", f"--vocab_file={model / 'vocab.txt'}",
                       f"--bert_config_file={model / 'bert_config.json'}", f"--output_dir={root / 'logs' / 'finetune'}",
                       "--max_seq_length=32", "--train_batch_size=8", "--eval_batch_size=8", "--do_train",
                       "--do_eval", "--num_train_epochs=3", "--learning_rate=1e-3", "--iterations_per_loop=4",
                       "--profile_steps=5,6")
    data = root / "data"
    data.mkdir()
    tiny_pretraining_folder(data, **TINY)
    pretrain = _script("run_pretraining.py", f"--input_file={data / 'train.tfrecord'}",
                       f"--output_dir={root / 'logs' / 'pretrain'}", f"--bert_config_file={data / 'bert_config.json'}",
                       f"--vocab_file={data / 'vocab.txt'}", "--do_train", "--do_eval", "--train_batch_size=8",
                       "--eval_batch_size=8", "--max_seq_length=32", "--max_predictions_per_seq=5",
                       "--num_train_steps=6", "--num_warmup_steps=1", "--iterations_per_loop=3",
                       "--max_eval_steps=2", "--learning_rate=1e-3", "--pack_sequences")
    return root / "logs", finetune, pretrain


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Board:
    def __init__(self, url):
        self.url = url

    def get(self, path, **params):
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=30) as response:
            body = response.read()
            # (the profile plugin gzips its answers whatever the request accepts)
            return json.loads(gzip.decompress(body) if response.headers.get("Content-Encoding") == "gzip" else body)

    def post(self, path, body):
        request = urllib.request.Request(f"{self.url}{path}", data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json", "X-XSRF-Protected": "1"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())


@pytest.fixture(scope="module")
def board(logdir):
    """`tensorboard --logdir` on loopback, up once it has loaded both runs' scalars; killed afterwards."""
    port = _free_port()
    log = open(logdir[0].parent / "tensorboard.log", "w")  # noqa: SIM115 - closed in the finally
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", f"--logdir={logdir[0]}",
                               "--host=127.0.0.1", f"--port={port}", "--reload_interval=1"],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        client = _Board(f"http://127.0.0.1:{port}")
        deadline = time.time() + SERVER_SECONDS
        while True:
            try:
                tags = client.get("/data/plugin/scalars/tags")
                if {"finetune/eval", "pretrain/eval"} <= set(tags):
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert server.poll() is None, (logdir[0].parent / "tensorboard.log").read_text()[-2000:]
            assert time.time() < deadline, "TensorBoard did not load the runs in time"
            time.sleep(1)
        yield client
    finally:
        server.kill()
        server.wait(timeout=30)
        log.close()


def test_runs_list_both_runs_train_eval_and_hparams(board):
    runs = set(board.get("/data/runs"))
    assert {"finetune", "finetune/train", "finetune/eval", "pretrain", "pretrain/train", "pretrain/eval"} <= runs


@pytest.mark.parametrize("run, shared", [("finetune", {"accuracy", "loss"}),
                                         ("pretrain", {"loss", "masked_lm_accuracy", "masked_lm_loss",
                                                       "next_sentence_accuracy", "next_sentence_loss"})])
def test_train_and_eval_runs_share_their_metric_tags(board, run, shared):
    tags = board.get("/data/plugin/scalars/tags")
    train, evaluation = set(tags[f"{run}/train"]), set(tags[f"{run}/eval"])
    assert shared <= train & evaluation
    assert not {t for t in evaluation if t.startswith("eval_")}  # no eval_accuracy beside accuracy


def test_eval_run_has_one_point_per_evaluation(board):
    # Fine-tuning: at the end of each of the 3 epochs of 6 steps; pretraining: once, at the end.
    points = board.get("/data/plugin/scalars/scalars", run="finetune/eval", tag="accuracy")
    assert [step for _, step, _ in points] == [6, 12, 18]
    assert all(0.0 <= value <= 1.0 for _, _, value in points)
    loss = board.get("/data/plugin/scalars/scalars", run="finetune/eval", tag="loss")
    assert [step for _, step, _ in loss] == [6, 12, 18]
    assert [step for _, step, _ in board.get("/data/plugin/scalars/scalars", run="pretrain/eval", tag="loss")] == [6]


def test_speed_and_padding_scalars_per_logged_step(board):
    tags = board.get("/data/plugin/scalars/tags")
    for run, steps in (("finetune/train", [4, 6, 10, 12, 16, 18]), ("pretrain/train", [3, 6])):
        assert SPEED_TAGS <= set(tags[run])
        for tag in SPEED_TAGS:
            points = board.get("/data/plugin/scalars/scalars", run=run, tag=tag)
            # One point per logged loop (fine-tuning: loops of 4 also end at each evaluation and the profile's edges).
            assert [step for _, step, _ in points] == steps, (run, tag)
            assert all(value >= 0 for _, _, value in points)
        real = [v for _, _, v in board.get("/data/plugin/scalars/scalars", run=run, tag="input/real_tokens_per_position")]
        assert all(0.0 < v <= 1.0 for v in real), real


def test_hparams_table_lists_each_run_with_its_hyperparameters_and_final_metrics(board):
    experiment = board.post("/data/plugin/hparams/experiment", {"experimentName": ""})
    names = {info["name"] for info in experiment["hparamInfos"]}
    assert {"learning_rate", "train_batch_size", "train_steps", "max_seq_length", "hidden_size", "num_hidden_layers",
            "precision", "pack_sequences", "optimizer"} <= names
    metrics = {(m["name"]["group"], m["name"]["tag"]) for m in experiment["metricInfos"]}
    assert {("eval", "accuracy"), ("eval", "loss"), ("train", "loss"), ("eval", "masked_lm_accuracy")} <= metrics
    groups = board.post("/data/plugin/hparams/session_groups", {
        "experimentName": "", "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE",
                                                  "STATUS_RUNNING"],
        "colParams": [], "startIndex": 0, "sliceSize": 100})["sessionGroups"]
    sessions = {s["name"]: (g["hparams"], s) for g in groups for s in g["sessions"]}
    assert set(sessions) == {"finetune", "pretrain"}
    hparams, session = sessions["finetune"]
    assert hparams["learning_rate"] == pytest.approx(1e-3) and hparams["train_batch_size"] == 8
    assert hparams["train_steps"] == 18 and hparams["max_seq_length"] == 32 and hparams["hidden_size"] == 32
    assert hparams["pack_sequences"] is False and hparams["task"] == "classification"
    final = {(m["name"]["group"], m["name"]["tag"]): m for m in session["metricValues"]}
    last_eval = board.get("/data/plugin/scalars/scalars", run="finetune/eval", tag="accuracy")[-1]
    assert final[("eval", "accuracy")]["value"] == pytest.approx(last_eval[2])
    assert final[("eval", "accuracy")]["trainingStep"] == 18
    hparams, session = sessions["pretrain"]
    assert hparams["pack_sequences"] is True and hparams["objective"] == "mlm_nsp" and hparams["train_steps"] == 6
    assert ("eval", "masked_lm_accuracy") in {(m["name"]["group"], m["name"]["tag"]) for m in session["metricValues"]}


def test_profile_capture_is_there_and_listed_by_the_profile_plugin(board, logdir):
    captures = list((logdir[0] / "finetune" / "train" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert len(captures) == 1 and captures[0].stat().st_size > 0
    assert "profiling steps 5-6 into" in logdir[1].stderr
    plugins = board.get("/data/plugins_listing")
    if "profile" not in plugins:
        pytest.skip("the TensorBoard profile plugin is not installed (pip install -e '.[profile]')")
    runs = board.get("/data/plugin/profile/runs")  # ["<run>/<capture time>", ...]
    assert [run.rsplit("/", 1)[0] for run in runs] == ["finetune/train"], runs
    tools = board.get("/data/plugin/profile/run_tools", run=runs[0])
    assert "trace_viewer@" in tools or "trace_viewer" in tools, tools


def test_the_runs_print_no_warning(logdir):
    for result in logdir[1:]:
        warnings = [line for line in result.stderr.splitlines() if "Warning" in line or " WARNING " in line]
        assert not warnings, warnings
