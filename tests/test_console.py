"""What the scripts print: no TensorFlow start-up noise on CPU machines, remote paths that fail in one line."""

import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import REPO

from bert_tf import console, fileio
from bert_tf.errors import RemotePathError

# No network here (and in CI), so every bucket is unreachable.
BUCKET = "gs://bert-tf-no-such-bucket-17"

# absl's app.run, as in the scripts (it lets TensorFlow's absl INFO lines through), a device listing
# (the CUDA probe) and a small SavedModel (signature_serialization and Sharding callback INFO lines).
SAVE_A_MODEL = textwrap.dedent("""
    import sys
    from absl import app

    def main(_):
        import bert_tf  # noqa: F401
        import tensorflow as tf

        tf.config.list_physical_devices()
        m = tf.Module()
        m.v = tf.Variable(1.0)
        m.f = tf.function(lambda x: x * m.v, input_signature=[tf.TensorSpec([None], tf.float32)])
        tf.saved_model.save(m, sys.argv[1], signatures={"serving_default": m.f})
        print("saved")

    app.run(main)
""")
# (TensorFlow 2.21 logs the last two at import, before its log level is read: console.STARTUP_NOISE.)
NOISE = ("cuInit", "signature_serialization", "Sharding callback", "absl::InitializeLog", "Could not find cuda drivers",
         "oneDNN custom operations", "This TensorFlow binary is optimized")
# A script run with its exit status, then whether TensorFlow was imported, on stdout.
RUN_SCRIPT = textwrap.dedent("""
    import runpy, sys
    sys.argv = sys.argv[1:]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    finally:
        print("tensorflow" in sys.modules)
""")


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", console.VERBOSE_ENV)}
    return dict(env, **extra)


@pytest.mark.slow
def test_tensorflow_noise_is_hidden_and_bert_tf_verbose_brings_it_back(tmp_path):
    # (oneDNN forced on: TensorFlow then prints its notice on every CPU class)
    quiet = subprocess.run([sys.executable, "-c", SAVE_A_MODEL, str(tmp_path / "a")], capture_output=True,
                           text=True, env=_env(TF_ENABLE_ONEDNN_OPTS="1"), cwd=str(REPO), timeout=300)
    assert quiet.returncode == 0 and quiet.stdout.strip() == "saved", quiet.stderr[-2000:]
    assert [line for line in quiet.stderr.splitlines() if any(n in line for n in NOISE)] == []

    loud = subprocess.run([sys.executable, "-c", SAVE_A_MODEL, str(tmp_path / "b")], capture_output=True,
                          text=True, env=_env(BERT_TF_VERBOSE="1", TF_ENABLE_ONEDNN_OPTS="1"), cwd=str(REPO),
                          timeout=300)
    assert loud.returncode == 0, loud.stderr[-2000:]
    assert "signature_serialization" in loud.stderr and "Sharding callback" in loud.stderr
    assert "oneDNN custom operations are on" in loud.stderr
    if not console.cuda_driver_present():
        assert "failed call to cuInit" in loud.stderr and "Could not find cuda drivers" in loud.stderr


@pytest.fixture(scope="module")
def fake_cuda_driver(tmp_path_factory):
    """A folder holding a `libcuda.so.1` that loads but is no driver: with it on LD_LIBRARY_PATH,
    console.cuda_driver_present() is true, as on a GPU machine (TensorFlow's cuInit then fails)."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc to build a stand-in libcuda.so.1")
    d = tmp_path_factory.mktemp("fake_cuda")
    (d / "stub.c").write_text("int bert_tf_stand_in_for_libcuda;\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(d / "libcuda.so.1"), str(d / "stub.c")], check=True)
    return d


# TensorFlow turns its oneDNN ops on by default only on some CPUs (AVX-512 and newer) and then prints a
# notice at import; TF_ENABLE_ONEDNN_OPTS=1 and =0 force either way on any x86 CPU, so every CI machine
# sees both. "gpu": a (stand-in) CUDA driver is present, where TensorFlow keeps its log level.
@pytest.mark.parametrize("onednn", ["0", "1"])
@pytest.mark.parametrize("level", [None, "3", "gpu"])  # 3: what a script started by another script inherits
def test_a_script_that_loads_tensorflow_prints_nothing_but_its_own_line(tmp_path, level, onednn, request):
    # export_savedmodel.py loads TensorFlow, then finds the model_dir incomplete: its one error line is
    # all that reaches stderr (TensorFlow's start-up lines do not; the fast subset runs this on 2.21 too).
    env = _env(TF_ENABLE_ONEDNN_OPTS=onednn, **({"TF_CPP_MIN_LOG_LEVEL": level} if level in ("3",) else {}))
    if level == "gpu":
        fake = request.getfixturevalue("fake_cuda_driver")
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(fake), env.get("LD_LIBRARY_PATH")]))
    result = subprocess.run([sys.executable, "-c", RUN_SCRIPT, str(REPO / "export_savedmodel.py"),
                             f"--model_dir={tmp_path}", f"--export_dir={tmp_path}/export"],
                            capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300)
    assert result.returncode == 1 and result.stdout.strip() == "True"  # failed, after importing TensorFlow
    lines = result.stderr.splitlines()
    if level == "gpu":  # the stand-in driver's own failure is a real error on such a machine: kept
        lines = [line for line in lines if "failed call to cuInit" not in line]
    assert lines == [f"export_savedmodel.py: error: {tmp_path}/bert_config.json: not found "
                     "(a model_dir needs bert_config.json, vocab.txt, bert_tf_info.json)"]


def test_stderr_without_drops_exactly_the_noise_lines_and_keeps_the_rest_in_order(capfd):
    absl = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
    cuda = (b"I0000 00:00:1795513702.494869   22137 cudart_stub.cc:31] Could not find cuda drivers on your "
            b"machine, GPU will not be used.")
    onednn = (b"oneDNN custom operations are on. You may see slightly different numerical results due to "
              b"floating-point round-off errors from different computation orders. To turn them off, set the "
              b"environment variable `TF_ENABLE_ONEDNN_OPTS=0`.\n")
    features = (b"This TensorFlow binary is optimized to use available CPU instructions in performance-critical "
                b"operations.\nTo enable the following instructions: AVX2 AVX512F AVX512_VNNI AVX512_BF16 AMX_TILE "
                b"FMA, in other operations, rebuild TensorFlow with the appropriate compiler flags.\n")
    with console.stderr_without(console.STARTUP_NOISE.fullmatch):
        for line in (absl, b"E0000 00:00:1.5 7 real.cc:1] a real error\n", cuda + b"\n", cuda + b" And more.\n",
                     b"I0000 00:00:1795705170.323737   16467 port.cc:153] " + onednn,  # TF 2.21's prefix
                     b"2026-11-26 15:02:17.571941: I tensorflow/core/util/port.cc:153] " + onednn,  # TF 2.20's
                     b"I0000 00:00:1795705356.000392   18110 cpu_feature_guard.cc:227] " + features,
                     b"2026-11-26 15:02:17.658342: I tensorflow/core/platform/cpu_feature_guard.cc:210] " + features,
                     b"E0000 00:00:1.5 7 port.cc:153] " + onednn,  # not an INFO line: kept
                     b"no newline at the end"):
            os.write(2, line)
    assert capfd.readouterr().err == ("E0000 00:00:1.5 7 real.cc:1] a real error\n" + cuda.decode() +
                                      " And more.\nE0000 00:00:1.5 7 port.cc:153] " + onednn.decode() +
                                      "no newline at the end")


def test_tensorflow_info_filter_keeps_warnings_and_other_code():
    keep = console._TensorFlowInfoFilter()
    tf_file = os.path.join("site-packages", "tensorflow", "python", "saved_model", "save.py")

    def record(level, path):
        return __import__("logging").LogRecord("absl", level, path, 1, "msg", None, None)

    assert not keep.filter(record(20, tf_file))  # INFO from TensorFlow
    assert keep.filter(record(30, tf_file))  # its warnings stay
    assert keep.filter(record(20, os.path.join("bert_tf", "export.py")))  # and everyone else's INFO


def test_check_remote_names_the_path_of_an_unreachable_bucket_or_unknown_scheme():
    fileio.check_remote(str(REPO))  # local: nothing to check
    fileio.check_remote("grpc://10.0.0.2:8470")  # a server address, not a file
    start = time.time()
    with pytest.raises(RemotePathError, match=f"^{BUCKET}/train\\*: cannot reach or read it \\(.+\\)$"):
        fileio.check_remote(f"{BUCKET}/train*")
    with pytest.raises(RemotePathError, match=f"^{BUCKET}/vocab.txt: cannot reach or read it"):
        fileio.check_remote(f"{BUCKET}/vocab.txt")
    assert time.time() - start < 20  # no network: fails at once, not after retries
    with pytest.raises(RemotePathError, match="^nosuchfs://b/x: this TensorFlow has no file system for "
                                                     "nosuchfs:// \\(it has .*gs://"):
        fileio.check_remote("nosuchfs://b/x")


def _tiny_config(folder):
    """A bert_config.json the gate (before TensorFlow) accepts, so a run gets as far as the remote paths."""
    from bert_tf.configs import BertConfig

    BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=32).to_json_file(str(folder / "bert_config.json"))


@pytest.mark.parametrize("script, args, named", [
    ("run_pretraining.py", ["--input_file={b}/train*.tfrecord", "--output_dir={tmp}/out",
                            "--bert_config_file={tmp}/bert_config.json", "--do_train"], "--input_file={b}/train*.tfrecord"),
    ("create_pretraining_data.py", ["--input_file={b}/corpus.txt", "--output_file={tmp}/x.tfrecord",
                                    "--vocab_file={tmp}/vocab.txt"], "--input_file={b}/corpus.txt"),
    ("export_savedmodel.py", ["--model_dir={b}/model", "--export_dir={tmp}/export"], "{b}/model"),
])
@pytest.mark.slow
def test_scripts_given_an_unreachable_bucket_stop_with_one_line_naming_it(tmp_path, script, args, named):
    def fill(text):
        return text.format(b=BUCKET, tmp=tmp_path, repo=REPO)

    _tiny_config(tmp_path)  # a config the gate accepts: the bucket is the only problem
    before = sorted(os.listdir(tmp_path))
    start = time.time()
    result = subprocess.run([sys.executable, str(REPO / script), *map(fill, args)], capture_output=True, text=True,
                            env=_env(), cwd=str(tmp_path), timeout=300)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, result.stderr[-2000:]
    assert errors[0].endswith(")") and f"error: {fill(named)}: cannot reach or read it (" in errors[0]
    assert not any(n in result.stderr for n in NOISE)
    assert sorted(os.listdir(tmp_path)) == before  # nothing written
    print(f"{script}: {time.time() - start:.1f}s")


@pytest.mark.slow
def test_a_bucket_that_does_not_answer_fails_after_the_check_timeout(tmp_path):
    # A refused connection (here: through a proxy on a closed local port) is retried by TensorFlow's
    # GCS client for minutes (196 s measured); the start-up check gives up after its timeout.
    env = _env(https_proxy="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9", BERT_TF_REMOTE_CHECK_TIMEOUT="2")
    _tiny_config(tmp_path)
    start = time.time()
    result = subprocess.run([sys.executable, str(REPO / "run_pretraining.py"), f"--input_file={BUCKET}/train*",
                             f"--output_dir={tmp_path}/out", f"--bert_config_file={tmp_path}/bert_config.json", "--do_train"],
                            capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert errors == [f"error: --input_file={BUCKET}/train*: cannot reach it (no answer within 2 s; "
                      "BERT_TF_REMOTE_CHECK_TIMEOUT sets this wait)"], result.stderr[-2000:]
    assert time.time() - start < 60
