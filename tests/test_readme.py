"""The manual's commands cannot rot: every script that README.md or a docs/*.md page runs exists and
takes every flag it passes.

The quickstart (tests/test_quickstart.py) runs the main path for real; this
test checks the rest of the README and the docs pages cheaply, by reading the
scripts' flag definitions instead of importing TensorFlow once per script.
"""

import os
import re

import pytest
from conftest import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")
# README.md, then every docs page: {name: text}. The union of their commands is the manual.
PAGES = {"README.md": README} | {f"docs/{p.name}": p.read_text(encoding="utf-8")
                                  for p in sorted((REPO / "docs").glob("*.md"))}
ABSL_BUILTINS = {"help", "helpfull", "helpshort", "flagfile", "undefok", "v", "verbosity", "logtostderr"}


def bash_blocks():
    """(page, block) for each ```bash block of README.md and the docs pages."""
    return [(page, block) for page, text in PAGES.items() for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def readme_commands():
    """(page, script, [flag names]) for each `python <script>.py ...` command in a bash block of the manual."""
    commands = []
    for page, block in bash_blocks():
        text = re.sub(r"\\\n\s*", " ", block)  # join continuation lines
        for line in text.splitlines():
            line = line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""
            for match in re.finditer(r"python\s+([\w/]+\.py)((?:\s+(?!python\b)\S+)*)", line):
                flags = re.findall(r"(?<!\S)--([A-Za-z_][\w-]*)", match.group(2))
                commands.append((page, match.group(1), flags))
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
    """The README and the docs pages together show every job; the README alone the main ones."""
    scripts = {script for _, script, _ in COMMANDS}
    assert {"create_vocab.py", "create_pretraining_data.py", "run_pretraining.py", "run_classifier.py",
            "run_squad.py", "run_swag.py", "run_ner.py", "export_savedmodel.py", "predict.py",
            "convert_checkpoint.py", "extract_features.py", "evaluate_squad.py"} <= scripts
    in_readme = {script for page, script, _ in COMMANDS if page == "README.md"}
    assert {"create_pretraining_data.py", "run_pretraining.py", "run_classifier.py", "export_savedmodel.py",
            "predict.py", "convert_checkpoint.py"} <= in_readme, in_readme


@pytest.mark.parametrize("page, script, flags", COMMANDS, ids=[f"{p}:{s}:{i}" for i, (p, s, _) in enumerate(COMMANDS)])
def test_readme_command_uses_real_script_and_flags(page, script, flags):
    if script.startswith("benchmarks/"):
        assert (REPO / script).exists(), script
        return
    assert (REPO / script).exists(), f"{page} runs {script}, which does not exist"
    known = defined_flags(script)
    if "runner" in flags:  # Beam's own pipeline options pass through
        beam_options = pytest.importorskip("apache_beam.options.pipeline_options")
        known |= set(beam_options.PipelineOptions([]).get_all_options())
    unknown = [f for f in flags if f.replace("-", "_") not in known and f not in known]
    assert not unknown, f"{page} passes {script} flags it does not define: {unknown}"


def test_readme_test_command_is_what_ci_runs():
    ci = (REPO / ".ci" / "run").read_text()
    assert "bash scripts/test.sh" in ci and "bash scripts/test.sh" in README
    assert "bash scripts/quickstart.sh" in README


def test_readme_is_a_front_door():
    """At most 250 lines, and a link to every docs page (the manual is there, not here)."""
    assert len(README.splitlines()) <= 250, len(README.splitlines())
    unlinked = [page for page in PAGES if page != "README.md" and f"]({page})" not in README]
    assert not unlinked, f"README links no page {unlinked}"


# ------------------------------------------------------------------ commands that must work as a user runs them
def readme_command_lines(script: str):
    """Each `python <script> ...` command of the manual's bash blocks, continuation lines joined, split in words."""
    found = []
    for _, block in bash_blocks():
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            words = line.split("#", 1)[0].split()
            if words[:2] == ["python", script]:
                found.append(words[2:])
    return found


def test_readme_makes_bert_config_without_hand_written_json():
    assert [w for w in readme_command_lines("create_bert_config.py")[0] if w.startswith("--size=")] == ["--size=base"]


def test_readme_evaluates_squad_files_where_run_squad_wrote_them():
    output_dirs = {w.split("=", 1)[1] for words in readme_command_lines("run_squad.py") for w in words
                   if w.startswith("--output_dir=")}
    evaluations = readme_command_lines("evaluate_squad.py")
    assert evaluations
    for words in evaluations:
        files = [w for w in words if w.endswith(".json") and not w.startswith("dev-")]
        assert files and all(os.path.dirname(f) in output_dirs for f in files), words


def test_readme_squad_threshold_rerun_has_what_a_prediction_needs():
    reruns = [words for words in readme_command_lines("run_squad.py")
              if any(w.startswith("--null_score_diff_threshold=") for w in words)]
    assert reruns, "the manual shows no rerun with the recommended null threshold"
    for words in reruns:
        flags = {w.split("=", 1)[0] for w in words}
        assert "--init_checkpoint" in flags or {"--bert_config_file", "--vocab_file"} <= flags, words
        assert {"--do_predict", "--predict_file", "--output_dir", "--version_2_with_negative"} <= flags, words


def test_readme_python_snippets_define_every_name_they_use():
    """Run as written: no name (e.g. train_ds in the TF-Hub snippet) is used before it is imported or assigned."""
    import ast
    import builtins

    blocks = [(page, b) for page, text in PAGES.items() for b in re.findall(r"```python\n(.*?)```", text, flags=re.S)]
    assert len(blocks) >= 2, "the Python snippets of finetuning.md and serving.md are gone"
    for page, block in blocks:
        defined = set(dir(builtins))
        for node in ast.parse(block).body:  # statement by statement, in order
            used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
            targets = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                targets |= {(a.asname or a.name).split(".")[0] for a in node.names}
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                targets.add(node.name)
                used = set()  # a body runs later
            missing = used - defined - targets
            assert not missing, f"{page} snippet uses {sorted(missing)} before defining it:\n{block}"
            defined |= targets
