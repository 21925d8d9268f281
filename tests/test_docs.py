"""What README.md, docs/ and the Makefile say about the code, checked against the code."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]


def _make(*args: str, cwd: Path = REPO) -> str:
    proc = subprocess.run(["make", "-s", "--no-print-directory", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _make_var(name: str, *args: str) -> str:
    """A Makefile variable's value as make computes it (nothing runs)."""
    return _make("--eval", "print-%: ; @echo $($*)", f"print-{name}", *args).strip()


def test_the_development_page_lists_the_targets_make_help_prints():
    page = (REPO / "docs" / "development.md").read_text()
    block = re.search(r"## Make targets \(`make help`\)\n\n```\n(.*?)```\n", page, re.S)
    assert block, "docs/development.md has no '## Make targets (`make help`)' block"
    assert block.group(1) == _make("help")


@pytest.mark.parametrize("line", ["name: demo-x", 'name: "demo-x"', "name: 'demo-x'  # quoted", "name:   demo-x # c"])
def test_make_run_dir_is_runs_slash_the_configs_name_bare_or_quoted(line, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"{line}\ntrain: {{steps: 3}}\n")
    assert _make_var("RUN_DIR", f"CONFIG={cfg}") == "runs/demo-x"


def test_one_python_version_in_pyproject_readme_ruff_and_the_image():
    """tracking/uri.py imports tomllib (3.11+): pyproject may not promise 3.10."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    lowest = re.match(r">=(\d+\.\d+)", pyproject["project"]["requires-python"]).group(1)
    assert lowest == "3.11"
    assert f"Python {lowest}" in (REPO / "README.md").read_text()
    assert pyproject["tool"]["ruff"]["target-version"] == "py" + lowest.replace(".", "")
    assert f"ARG BASE_IMAGE=python:{lowest}." in (REPO / "docker" / "Dockerfile.cpu").read_text()


def test_kubernetes_docs_count_the_api_attempts_as_the_client_makes_them():
    from pinpoint.k8s.launch import LaunchOptions

    attempts = LaunchOptions().retry_attempts  # what the launch step's KubeApi is given
    docs = (REPO / "docs" / "kubernetes.md").read_text()
    assert f"get {attempts} attempts in all (the\n  first and {attempts - 1} retries)" in docs


def test_make_images_builds_the_gpu_image_only_when_asked():
    build = (REPO / "docker" / "build.sh").read_text()
    assert 'IMAGES=${IMAGES:-cpu${GPU:+ gpu}}' in build  # cpu, plus gpu when GPU is set
    recipe = _make("-n", "images", "GPU=1")
    assert recipe.startswith('GPU="1" ') and recipe.rstrip().endswith("bash docker/build.sh")
    assert not _make("-n", "images").startswith("GPU")
    page = (REPO / "docs" / "install.md").read_text()
    assert "builds the CPU and GPU" not in page and "`make images GPU=1` also builds the GPU image" in page


def _tier_expressions() -> list[str]:
    """The marker expressions `make test` runs, as the TIER function composes them."""
    make = (REPO / "Makefile").read_text()
    (template,) = re.findall(r'^TIER = .*-m "([^"]*)"', make, re.M)
    tiers = re.findall(r'^\t@\$\(TIER\) (?:[a-z]+|\$\(\w+\)) "([^"]+)"', make, re.M)
    assert {"unit", "integration and not slow", "slow"} <= set(tiers)
    return [template.replace("$$m", t) for t in set(tiers)]


@pytest.mark.parametrize("marks", [{"gpu", "integration"}, {"gpu", "unit"}, {"gpu", "slow"}, {"gpu", "integration", "slow"}])
def test_every_tier_deselects_the_gpu_tests_by_marker(marks):
    for expr in _tier_expressions():
        assert not Expression.compile(expr).evaluate(lambda m: m in marks), (expr, marks)
    # ... and keeps the rest of its tier.
    kept = [e for e in _tier_expressions() if Expression.compile(e).evaluate(lambda m: m in marks - {"gpu"})]
    assert kept, marks


def test_make_test_gpu_selects_the_gpu_marker():
    assert ' -m gpu tests' in _make("-n", "test-gpu")


def test_the_gpu_tests_have_no_skip_of_their_own():
    """Deselected by marker, not skipped after importing TensorFlow once per case."""
    text = (REPO / "tests" / "test_fidelity.py").read_text()
    assert "pytest.skip(" not in text


# ---- issue 51: the README as a front door, docs/ pages a newcomer can read ------------------------------
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINKED = [*PAGES, REPO / "benchmarks" / "HISTORY.md"]
NEEDS_A_CLUSTER = "# needs a cluster"


def _prose(text: str) -> str:
    """The text without fenced code blocks and HTML comments."""
    return re.sub(r"<!--.*?-->", "", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M), flags=re.S)


def sentences(text: str) -> list[str]:
    """The sentences of a Markdown page: each paragraph and each list item split at '.', '!' or '?'
    followed by a capital, a quote or code; headings, tables and code blocks are not prose (an
    inline code span or a link counts as one word)."""
    blocks, cur = [], []
    for line in _prose(text).splitlines() + [""]:
        s = line.strip()
        item = re.match(r"([-*+]|\d+\.)\s+", s)
        if not s or s.startswith(("#", "|", "![")) or item:
            if cur:
                blocks.append(" ".join(cur))
            cur = [s[item.end():]] if item else []
        else:
            cur.append(s)
    out = []
    for b in blocks:
        b = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", re.sub(r"`[^`]*`", "X", b))
        out += [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z`*(\"'\[])", b) if re.search(r"\w", s)]
    return out


def test_sentences_average_under_25_words_across_the_readme_and_docs():
    said = [s for p in PAGES for s in sentences(p.read_text())]
    words = sum(len(s.split()) for s in said)
    assert words / len(said) < 25, f"{words / len(said):.1f} words a sentence over {len(said)} sentences"


def test_the_sentence_count_splits_where_a_reader_stops():
    text = "# Title\n\nOne two three. Four `a b c` five.\n\n- An item. [A link](x.md) here\n\n```\nnot. Prose.\n```\n"
    assert sentences(text) == ["One two three.", "Four X five.", "An item.", "A link here"]


def test_the_readme_is_a_front_door_with_a_picture_of_the_report():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    (image,) = re.findall(r"!\[[^\]]*\]\((docs/images/[^)]+\.png)\)", readme)
    assert (REPO / image).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for way in ("### 1. The demo", "### 2. Your config", "### 3. Your own program, under `pinpoint trace`",
                "### 4. Kubernetes and Kubeflow"):
        assert way in readme
    # Every docs page is linked from the front door.
    assert {p.name for p in PAGES[1:]} <= set(re.findall(r"\(docs/([a-z-]+\.md)\)", readme))


@pytest.mark.parametrize("page", [p for p in LINKED if p.parent.name != REPO.name or p.name != "README.md"],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_every_docs_page_starts_with_five_lines_in_short(page):
    lines = page.read_text().splitlines()
    assert lines[0].startswith("# ") and lines[1:3] == ["", "## In short"], page
    items = lines[3:lines.index("", 3)]
    assert len(items) == 5 and all(i.startswith("- ") for i in items), items


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces as '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_anchor(h) for h in re.findall(r"^#{1,6} (.+)$", _prose(page.read_text()), re.M)}


@pytest.mark.parametrize("page", LINKED, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    text = re.sub(r"`[^`\n]*`", "", _prose(page.read_text()))
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in _anchors(dest)):
            broken.append(target)
    assert broken == []


# Each shell command of the README and the CI test that runs it: (test file, what the test runs).
# `make X` runs its recipe, so the test runs the recipe's command.
RUN_IN_CI = {
    "make test": (".ci/run", "make test"),  # CI's own command
    "make run": ("tests/test_mlflow_run_page.py", '"run", str(REPO / "configs" / "demo.yaml")'),
    "make mlflow-ui": ("tests/test_mlflow_run_page.py", "with mlflow_ui(repo, free_port()) as base"),
    "make example-data": ("tests/test_example.py", '"-m", "digits_cnn.data"'),
    "make run CONFIG=examples/digits_cnn/config.yaml": ("tests/test_example.py", '"run", str(config)'),
    "cd examples/keras_fit && pinpoint trace --gpus 2 -m fit_example.train --epochs 3":
        ("tests/test_trace.py", '["--gpus", "2", "--experiment", "trace-fit"'),
    "make images": ("tests/conftest.py", '"build.sh"'),
    "make compile": ("tests/test_pipelines_compile.py", '"pinpoint.cli", "compile"'),
}


def _readme_commands() -> list[tuple[str, bool]]:
    """(command, marked as needing a cluster) for every line of the README's bash blocks."""
    out = []
    for block in re.findall(r"^```bash\n(.*?)^```", (REPO / "README.md").read_text(), re.S | re.M):
        for line in block.splitlines():
            command, _, comment = line.partition("#")
            if command.strip():
                out.append((command.strip(), comment.strip().startswith(NEEDS_A_CLUSTER[2:])))
    return out


def test_every_readme_command_runs_in_ci_or_is_marked_as_needing_a_cluster():
    commands = _readme_commands()
    unaccounted = [c for c, cluster in commands if not cluster and c not in RUN_IN_CI]
    assert unaccounted == [], f"run them in a CI test (and add them to RUN_IN_CI) or mark them '{NEEDS_A_CLUSTER}'"
    for command, (where, runs) in RUN_IN_CI.items():
        assert command in [c for c, _ in commands], f"RUN_IN_CI names '{command}', which the README no longer has"
        assert runs in (REPO / where).read_text(), (command, where)
    assert [c for c, cluster in commands if cluster] == ["make submit KFP_HOST=https://..."]


def test_every_rule_docs_memory_names_is_a_function_of_the_replay():
    """docs/memory.md's rule tables name each rule by the function or method that implements it
    (a label with a hyphen names a rule inside one, said in its row)."""
    import ast

    doc = (REPO / "docs" / "memory.md").read_text()
    names = set(re.findall(r"^\| `([\w.]+)`", doc, re.M))
    defined = set()
    for path in (REPO / "src" / "pinpoint" / "placement").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defined.add(node.name)
    assert len(names) >= 20
    assert sorted(n for n in names if n.split(".")[-1] not in defined) == []
