"""The README's commands cannot rot: every script it runs exists and takes every flag it passes.

The quickstart (tests/test_quickstart.py) runs the main path for real; this
test checks the rest of the README cheaply, by reading the scripts' flag
definitions instead of importing TensorFlow once per script.
"""

import re

import pytest
from conftest import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")
ABSL_BUILTINS = {"help", "helpfull", "helpshort", "flagfile", "undefok", "v", "verbosity", "logtostderr"}


def readme_commands():
    """(script, [flag names]) for each `python <script>.py ...` command in a bash block of the README."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S):
        text = re.sub(r"\\\n\s*", " ", block)  # join continuation lines
        for line in text.splitlines():
            line = line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""
            for match in re.finditer(r"python\s+([\w/]+\.py)((?:\s+(?!python\b)\S+)*)", line):
                flags = re.findall(r"(?<!\S)--([A-Za-z_][\w-]*)", match.group(2))
                commands.append((match.group(1), flags))
    return commands


def defined_flags(script: str) -> set:
    source = (REPO / script).read_text(encoding="utf-8")
    names = set(re.findall(r"DEFINE_\w+\(\s*\"(\w+)\"", source))
    names |= set(re.findall(r"add_argument\(\s*\"--([\w-]+)\"", source))
    if "import bert_flags" in source:
        names |= set(re.findall(r"DEFINE_\w+\(\s*\"(\w+)\"", (REPO / "bert_flags.py").read_text(encoding="utf-8")))
    return names | ABSL_BUILTINS


COMMANDS = readme_commands()


def test_readme_has_commands_for_every_job():
    scripts = {script for script, _ in COMMANDS}
    assert {"create_vocab.py", "create_pretraining_data.py", "run_pretraining.py", "run_classifier.py",
            "run_squad.py", "run_swag.py", "run_ner.py", "export_savedmodel.py", "predict.py",
            "convert_checkpoint.py", "extract_features.py", "evaluate_squad.py"} <= scripts


@pytest.mark.parametrize("script, flags", COMMANDS, ids=[f"{s}:{i}" for i, (s, _) in enumerate(COMMANDS)])
def test_readme_command_uses_real_script_and_flags(script, flags):
    if script.startswith("benchmarks/"):
        assert (REPO / script).exists(), script
        return
    assert (REPO / script).exists(), f"README runs {script}, which does not exist"
    known = defined_flags(script)
    if "runner" in flags:  # Beam's own pipeline options pass through
        beam_options = pytest.importorskip("apache_beam.options.pipeline_options")
        known |= set(beam_options.PipelineOptions([]).get_all_options())
    unknown = [f for f in flags if f.replace("-", "_") not in known and f not in known]
    assert not unknown, f"README passes {script} flags it does not define: {unknown}"


def test_readme_test_command_is_what_ci_runs():
    ci = (REPO / ".ci" / "run").read_text()
    assert "bash scripts/test.sh" in ci and "bash scripts/test.sh" in README
    assert "bash scripts/quickstart.sh" in README
