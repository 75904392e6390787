"""retain_freed_memory: the step's buffers come from memory the process holds (no page faults)."""

import subprocess
import sys

import pytest

SCRIPT = """
import sys
import numpy as np
from bert_tf.training.memory import retain_freed_memory
if sys.argv[1] == "retain":
    assert retain_freed_memory() and retain_freed_memory()
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


def fault_counts(mode):
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True)
    return [int(n) for n in out.stdout.strip().strip("[]").split(",")]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
def test_freed_buffers_are_reused_without_page_faults():
    default, retained = fault_counts("default"), fault_counts("retain")
    assert default[0] > 100 and retained[0] > 100  # the first 24 MiB buffer is fresh memory either way
    assert default[1] > default[0] / 2  # by default the freed mmap is returned, and the next buffer faults again
    assert sum(retained[1:]) < retained[0] / 10, retained  # retained: later buffers reuse the same pages
