"""Every project name the README and the docs pages cite in backticks exists in the code.

No TensorFlow: the modules are read with `ast`, never imported.

The convention. Outside fenced code blocks, each backticked span of README.md and docs/*.md is read
word by word (a call's arguments dropped: `run_finetuning(task, cfg)` is `run_finetuning`). A word
cites a project name, and is checked, when it has one of these forms:

1. A file, `<path>.py` or `<path>.py::<name>`: the path is the end of a project file's path
   (`loop.py`, `training/loop.py`, `bert_tf/training/loop.py`, `tests/test_export.py`, `setup.py`).
   After `::` (pytest's spelling) comes a function or class defined at top level of that file, or
   `Class::method`.
2. A module-qualified name, `<module>.<name>` or `<module>.<Class>.<member>`: `<module>` is the
   longest leading part that names a project module or package by the end of its dotted path, with
   `.` or `/` between the parts (`model_dir`, `serving/module`, `serving.module`,
   `bert_tf.serving.module`); a module alone (`bert_tf.env`) must just exist. `<name>` is defined at
   top level of that module (def, class, assignment; in a package's `__init__.py` also an import, since
   a package re-exports); `<member>` is defined in that class's body, assigned as `self.<member>` in
   one of its methods, or inherited from a project class. A bare module name that several files share
   (`pretraining` is in data/, training/ and beam/) is right when one of them defines the name.
3. A class-qualified name, `<Class>.<member>`, where `<Class>` is a class defined in the project
   (`BertConfig.named`, `PackedExamples.unpack`): the member, as in 2.

A word whose last part is a file extension other than .py (`vocab.txt`, `bert_tf_info.json`) names a
data file, and a word whose first part is a library of LIBRARIES (`tf.data`, `keras.ops`,
`hub.KerasLayer`) names someone else's API: neither is checked. Any other dotted word (one whose first
part is no project module, project class or library, e.g. a module that was moved away) is an error;
words with `/` that name no project module (TensorBoard tags such as `run/flags`, variable names such
as `cls/squad/output_weights`) are not checked. So a module's name is not
used for anything else in backticks (a variable named `strategy` would read as training/strategy.py).
"""

import ast
import functools
import re

import pytest
from conftest import REPO

PAGES = ["README.md"] + [f"docs/{p.name}" for p in sorted((REPO / "docs").glob("*.md"))]
CODE_DIRS = ("bert_tf", "tests", "benchmarks", "experiments", "scripts")
DATA_EXTENSIONS = {"txt", "json", "jsonl", "tsv", "csv", "md", "ckpt", "index", "safetensors", "tfrecord", "gz",
                   "pb", "keras", "sh", "toml", "cfg", "log", "yaml", "onnx"}
# Other projects' modules a page may cite as `<module>.<name>`. A dotted name whose first part is none of
# these, no project module and no project class is an error: a module that was moved or removed.
LIBRARIES = {"tf", "tensorflow", "tensorflow_text", "text", "keras", "ops", "hub", "np", "numpy", "json", "os",
             "transformers", "torch", "beam", "apache_beam", "onnxruntime", "safetensors", "absl", "flags",
             "bert", "cls"}  # the last two: checkpoint variable names in Hugging Face's dotted spelling
WORD = r"[A-Za-z_][\w-]*"
FILE_REF = re.compile(rf"^((?:{WORD}/)*{WORD})\.py(?:::({WORD})(?:::({WORD}))?)?$")
NAME_REF = re.compile(rf"^{WORD}(?:[./]{WORD})+$")


# ------------------------------------------------------------------------------------------ the code, read once
def project_files() -> list:
    files = sorted(REPO.glob("*.py"))
    for folder in CODE_DIRS:
        files += sorted(p for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts)
    return files


@functools.lru_cache(maxsize=None)
def parsed(path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def top_level(path) -> dict:
    """{name: node} of what a module defines at top level (inside `if`/`try` blocks too); a package's
    `__init__.py` also counts its imports."""
    names = {}

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names[node.name] = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for leaf in ast.walk(target):
                        if isinstance(leaf, ast.Name):
                            names[leaf.id] = node
            elif isinstance(node, (ast.Import, ast.ImportFrom)) and path.name == "__init__.py":
                for alias in node.names:
                    names[(alias.asname or alias.name).split(".")[0]] = node
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(node.orelse)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(parsed(path).body)
    return names


@functools.lru_cache(maxsize=None)
def index():
    """(modules {dotted suffix: [paths]}, files [repo-relative paths], classes {name: [(path, ClassDef)]})."""
    modules, classes, files = {}, {}, []
    for path in project_files():
        relative = path.relative_to(REPO)
        files.append(relative.as_posix())
        parts = list(relative.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        for i in range(len(parts)):
            modules.setdefault(".".join(parts[i:]), []).append(path)
        for name, node in top_level(path).items():
            if isinstance(node, ast.ClassDef):
                classes.setdefault(name, []).append((path, node))
    return modules, files, classes


def class_members(path, node, seen=()) -> set:
    """Names defined on a project class: its body, `self.x = ...` in its methods, its project bases' members."""
    names = set()
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(item.name)
            for leaf in ast.walk(item):
                if (isinstance(leaf, ast.Attribute) and isinstance(leaf.ctx, ast.Store)
                        and isinstance(leaf.value, ast.Name) and leaf.value.id == "self"):
                    names.add(leaf.attr)
        elif isinstance(item, (ast.Assign, ast.AnnAssign)):
            targets = item.targets if isinstance(item, ast.Assign) else [item.target]
            names |= {leaf.id for t in targets for leaf in ast.walk(t) if isinstance(leaf, ast.Name)}
    classes = index()[2]
    for base in node.bases:
        base_name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", None)
        for base_path, base_node in classes.get(base_name, []):
            if (base_path, base_name) not in seen:
                names |= class_members(base_path, base_node, (*seen, (path, node.name)))
    return names


# ------------------------------------------------------------------------------------------ the pages, read once
def cited_words(text: str) -> list:
    """(line number, span, word) for each word of each backticked span outside fenced code blocks."""
    found = []
    text = re.sub(r"^```.*?^```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.M | re.S)
    for match in re.finditer(r"`([^`]+)`", text):  # a span may wrap onto the next line
        span = match.group(1)
        line = text.count("\n", 0, match.start()) + 1
        for word in re.sub(r"\(.*$", "", span).split():
            found.append((line, span, word.rstrip(",;:")))
    return found


def check_word(word: str):
    """None if the word cites no project name; else "" when the name exists, or what is wrong."""
    modules, files, classes = index()
    if match := FILE_REF.match(word):
        path, name, member = match.groups()
        hits = [f for f in files if f == f"{path}.py" or f.endswith(f"/{path}.py")]
        if not hits:
            return f"no project file {path}.py"
        if name is None:
            return ""
        return resolve_name([REPO / f for f in hits], [name] + ([member] if member else []), word)
    if not NAME_REF.match(word):
        return None
    parts = re.split(r"[./]", word)
    if parts[-1] in DATA_EXTENSIONS or parts[-1] == "py":
        return None
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in modules:
            rest = parts[k:]
            if not rest:
                return ""
            if len(rest) > 2:
                return f"{'.'.join(rest)} is deeper than <name>.<member>"
            return resolve_name(modules[".".join(parts[:k])], rest, word)
    if parts[0] in classes and len(parts) == 2:
        if any(parts[1] in class_members(path, node) for path, node in classes[parts[0]]):
            return ""
        return f"no project class {parts[0]} defines {parts[1]}"
    if "/" not in word and parts[0] not in LIBRARIES:  # `finetuning.resolve_pretrained` after finetuning.py went
        return f"{parts[0]} is neither a project module or class nor a library in LIBRARIES"
    return None


def resolve_name(paths, names, word):
    """"" if one of the module files defines names[0] at top level (and, for a class, names[1])."""
    for path in paths:
        node = top_level(path).get(names[0])
        if node is None:
            continue
        if len(names) == 1:
            return ""
        if isinstance(node, ast.ClassDef) and names[1] in class_members(path, node):
            return ""
    where = " or ".join(str(p.relative_to(REPO)) for p in paths)
    return f"{where} defines no {'.'.join(names)}" if len(names) == 1 else f"{where} has no class {names[0]} " \
        f"with a member {names[1]}"


# ------------------------------------------------------------------------------------------ the tests
@pytest.mark.parametrize("page", PAGES)
def test_every_cited_project_name_exists(page):
    problems, checked = [], 0
    for line, span, word in cited_words((REPO / page).read_text(encoding="utf-8")):
        problem = check_word(word)
        if problem is None:
            continue
        checked += 1
        if problem:
            problems.append(f"{page}:{line}: `{span}`: {problem}")
    assert not problems, "names the docs cite that the code does not have:\n" + "\n".join(problems)
    if page in ("README.md", "docs/design.md"):
        assert checked >= 10, f"{page}: only {checked} project names found; is the reading broken?"


@pytest.mark.parametrize("word", [
    "model_dir.TASK_MODELS", "serving/module.our_names", "bert_tf.serving.module.used_length", "training/loop.py",
    "loop.py", "bert_tf.env", "runners/task.FinetuneTask", "pretraining_job.BlockWorker", "BertConfig.named",
    "test_resume.py::test_restore_errors_name_their_kind", "bert_flags.fail",
])
def test_names_that_exist_pass(word):
    assert check_word(word) == ""


@pytest.mark.parametrize("word, expected", [
    ("export._our_names", "bert_tf/export.py defines no _our_names"),
    ("serving/module.no_such_name", "defines no no_such_name"),
    ("training/no_such_module.py", "no project file training/no_such_module.py"),
    ("test_resume.py::test_that_was_renamed", "defines no test_that_was_renamed"),
    ("BertConfig.no_such_method", "no project class BertConfig defines no_such_method"),
    ("model_dir.TASK_MODELS.x.y", "deeper than"),
    ("pretraining.no_such_step", "defines no no_such_step"),
])
def test_stale_names_are_caught(word, expected):
    assert expected in (check_word(word) or ""), check_word(word)


@pytest.mark.parametrize("word", ["vocab.txt", "tf.data", "keras.ops", "hub.KerasLayer", "bert_tf_info.json",
                                  "run/flags", "speed/seconds_per_step", "gs://bucket/name"])
def test_other_words_are_not_project_names(word):
    assert check_word(word) is None


def test_design_layout_lists_every_library_module():
    """docs/design.md's package layout names each module and package of bert_tf/, and nothing that is gone."""
    design = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    block = re.search(r"^## Package layout\n\n```\n(.*?)^```", design, flags=re.M | re.S).group(1)
    listed = set(re.findall(r"^  (\w+(?:\.py|/))", block, flags=re.M))
    actual = {p.name + "/" if p.is_dir() else p.name for p in (REPO / "bert_tf").iterdir()
              if p.name != "__pycache__" and (p.is_dir() or p.suffix == ".py")}
    assert listed == actual, f"missing from the table: {sorted(actual - listed)}; gone: {sorted(listed - actual)}"


def _anchors(path) -> set:
    """GitHub's anchors of a markdown file's headings: lower case, punctuation dropped, spaces as '-'."""
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("page", PAGES)
def test_links_between_pages_resolve(page):
    """Every relative link of a page names a file of the checkout, and its #anchor a heading there."""
    path = REPO / page
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"\w+://", target):
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            broken.append(f"{target}: no file {linked}")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.name}")
    assert not broken, f"{page}: " + "; ".join(broken)
