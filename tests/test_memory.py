"""retain_freed_memory: the step's buffers come from memory the process holds (no page faults)."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = """
import sys
import numpy as np
from bert_tf.training.memory import retain_freed_memory
if sys.argv[1] == "retain":
    assert retain_freed_memory() and retain_freed_memory()
if sys.argv[1] == "trainer":  # a program that trains with the library
    import keras, tensorflow as tf
    from bert_tf.training import loop, optimizer, strategy
    from bert_tf.training.settings import TrainSettings
    trainer = loop.Trainer(strategy.get_strategy("one_device"), TrainSettings(iterations_per_loop=1),
                           lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]),
                           lambda model, x, training: (tf.reduce_mean(model(x) ** 2), {}),
                           lambda v: optimizer.create_optimizer("adamw", v, 0.01, 2, 0),
                           model_dir=sys.argv[2], train_steps=2, global_batch_size=4)
    trainer.train(lambda ctx, batch: tf.data.Dataset.from_tensors(tf.ones((batch, 4))).repeat())
if sys.argv[1] == "script":  # a training script (run_*.py)
    import bert_flags
    bert_flags.define_tpu_and_strategy_flags()
    bert_flags.FLAGS(["script"])
    import bert_setup
    bert_setup.make_strategy()
def faults():
    return int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[7])
counts = []
for _ in range(5):
    before = faults()
    a = np.ones(24 << 17)  # 24 MiB, touched
    del a
    counts.append(faults() - before)
print(counts)
"""


def fault_counts(mode, *args):
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode, *args], capture_output=True, text=True, check=True,
                         cwd=REPO)
    return [int(n) for n in out.stdout.strip().strip("[]").split(",")]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
def test_freed_buffers_are_reused_without_page_faults():
    default, retained = fault_counts("default"), fault_counts("retain")
    assert default[0] > 100 and retained[0] > 100  # the first 24 MiB buffer is fresh memory either way
    assert default[1] > default[0] / 2  # by default the freed mmap is returned, and the next buffer faults again
    assert sum(retained[1:]) < retained[0] / 10, retained  # retained: later buffers reuse the same pages


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
def test_only_the_scripts_change_malloc(tmp_path):
    """The library's Trainer leaves a program's malloc as it was; the training scripts set it."""
    trained, scripted = fault_counts("trainer", str(tmp_path)), fault_counts("script")
    assert sum(trained[1:]) > 100, trained  # the default: a freed buffer went back to the OS and faults again
    assert sum(scripted[1:]) < scripted[0] / 10, scripted
