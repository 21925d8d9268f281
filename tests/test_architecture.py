"""Imports point down: a module of the library imports only modules of its own layer or of a
lower one (docs/architecture.md draws these layers). Every import counts, also the ones inside a
function: importing lazily makes an import cheap, not a dependency go away."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SRC = Path(__file__).resolve().parents[1] / "src" / "pinpoint"

# Lowest first. A name is a top-level module or package of pinpoint.
LAYERS = [
    ("foundation", {"__init__", "errors", "quiet", "hooks", "runfolder", "signals", "userlog",
                    "versions"}),
    ("config", {"device_names", "config", "config_scope", "config_reference", "layer_keys", "sizes"}),
    ("machine", {"devices", "kernels", "usercode", "tfcompat"}),
    ("analysis", {"placement", "provision", "plan"}),
    ("tracking", {"tracking"}),
    ("runtime", {"distribute", "outcome"}),
    ("capture", {"trace"}),
    ("execution", {"training", "k8s", "compare", "steps"}),
    ("entry", {"cli"}),
]
LAYER_OF = {name: i for i, (_, names) in enumerate(LAYERS) for name in names}


def _unit(module: str) -> str:
    """pinpoint.training.loop.engine -> training; pinpoint -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports() -> list[tuple[str, str, int]]:
    """(importing module, imported pinpoint module, line) for every import in src/pinpoint."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        module = "pinpoint." + ".".join(path.relative_to(SRC).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module]
            else:
                continue
            found += [(module.removesuffix(".__init__"), t, node.lineno) for t in targets
                      if t == "pinpoint" or t.startswith("pinpoint.")]
    return found


def test_every_module_belongs_to_a_layer():
    units = {_unit("pinpoint." + ".".join(p.relative_to(SRC).with_suffix("").parts)) for p in SRC.rglob("*.py")}
    assert sorted(units - set(LAYER_OF)) == [], "add the new module to LAYERS (and docs/architecture.md)"


def test_imports_point_down():
    upward = [f"{src} (line {line}) imports {dst}: layer {LAYERS[LAYER_OF[_unit(dst)]][0]} is above "
              f"{LAYERS[LAYER_OF[_unit(src)]][0]}"
              for src, dst, line in _imports() if LAYER_OF[_unit(dst)] > LAYER_OF[_unit(src)]]
    assert upward == []


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch):
    """Negative control: a foundation module importing the trainer is reported."""
    fake = tmp_path / "pinpoint"
    fake.mkdir()
    (fake / "errors.py").write_text("def f():\n    from pinpoint.training import controller\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", fake)
    assert [(s, d) for s, d, _ in _imports()] == [("pinpoint.errors", "pinpoint.training")]
    assert LAYER_OF[_unit("pinpoint.training")] > LAYER_OF[_unit("pinpoint.errors")]


def _upward(imports) -> list[tuple[str, str]]:
    return [(src, dst) for src, dst, _ in imports if LAYER_OF[_unit(dst)] > LAYER_OF[_unit(src)]]


def test_trace_sits_below_training(tmp_path, monkeypatch):
    """Negative control: trace (what `pinpoint trace` and train.entrypoint's capture share) is a
    layer below training, so a trace module reaching up into the trainer fails the check, while
    training using trace does not."""
    fake = tmp_path / "pinpoint"
    (fake / "trace").mkdir(parents=True)
    (fake / "training").mkdir()
    (fake / "trace" / "session.py").write_text("def f():\n    from pinpoint.training.setup import TaskContext\n")
    (fake / "training" / "run.py").write_text("from pinpoint.trace.session import Capture\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", fake)
    assert _upward(_imports()) == [("pinpoint.trace.session", "pinpoint.training.setup")]


def test_the_run_skeleton_sits_below_trace(tmp_path, monkeypatch):
    """Negative control: distribute and outcome (used by trace and training alike) importing
    either of them is an upward arrow."""
    fake = tmp_path / "pinpoint"
    (fake / "distribute").mkdir(parents=True)
    (fake / "distribute" / "emulation.py").write_text("import pinpoint.trace.gpus\n")
    (fake / "outcome.py").write_text("from pinpoint.training import run\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", fake)
    assert sorted(_upward(_imports())) == [("pinpoint.distribute.emulation", "pinpoint.trace.gpus"),
                                           ("pinpoint.outcome", "pinpoint.training")]


def _circles(modules: set[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """The circles (strongly connected groups of two or more) of the import graph."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(m: str) -> None:
        index[m] = low[m] = len(index)
        stack.append(m)
        for n in edges.get(m, ()):
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            group = []
            while not group or group[-1] != m:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for m in sorted(modules):
        if m not in index:
            visit(m)
    return found


def _file_graph(units: tuple[str, ...]) -> tuple[set[str], dict[str, set[str]]]:
    """The modules of `units` and who imports whom among them (`from pkg import mod` counts as
    importing mod)."""
    modules = {"pinpoint." + ".".join(p.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
               for p in SRC.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        module = ("pinpoint." + ".".join(path.relative_to(SRC).with_suffix("").parts)).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            edges.setdefault(module, set()).update(t for t in targets if t in modules and t != module)
    mine = {m for m in modules if _unit(m) in units}
    return mine, {m: edges.get(m, set()) & mine for m in mine}


ACYCLIC = ("training", "trace", "distribute", "outcome")


def test_no_circle_of_files_in_the_execution_rooms():
    """No two files of training/, trace/, distribute/ import each other, directly or round a
    circle: each room reads top to bottom."""
    assert _circles(*_file_graph(ACYCLIC)) == []


MAX_FUNCTION_LINES = 80


def _long_functions(root: Path) -> list[tuple[str, str, int]]:
    """(module, function, lines) for every function of `root`'s files over MAX_FUNCTION_LINES."""
    return sorted((str(p.relative_to(root)), node.name, node.end_lineno - node.lineno + 1)
                  for p in root.rglob("*.py") for node in ast.walk(ast.parse(p.read_text()))
                  if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES)


def test_no_function_in_src_is_over_80_lines():
    """Issue 32: a function reads in a screen or two; a longer one is split where it changes subject."""
    assert _long_functions(SRC) == []


def test_the_length_check_sees_a_long_function(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "long.py").write_text(f"def long():\n{body}")
    assert _long_functions(tmp_path) == [("long.py", "long", MAX_FUNCTION_LINES + 1)]


def test_no_circle_of_files_anywhere_in_src():
    """Issue 32: no two files of the library import each other, directly or round a circle."""
    assert _circles(*_file_graph(tuple(LAYER_OF))) == []


# The rooms of training/, top first (docs/architecture.md); one rank may hold several rooms.
TRAINING_ROOMS = [{"command"}, {"cluster"}, {"run"}, {"loop", "entrypoint"}, {"input"}, {"skeleton"},
                  {"setup", "objectives", "checkpoints", "peers"}]


def test_training_rooms_import_only_rooms_below_them():
    rank = {room: i for i, rooms in enumerate(TRAINING_ROOMS) for room in rooms}
    modules, edges = _file_graph(("training",))
    room = {m: m.split(".")[2] for m in modules if m.count(".") >= 2}
    assert sorted(set(room.values()) - set(rank)) == [], "add the new room to TRAINING_ROOMS and the docs"
    upward = sorted((a, b) for a, bs in edges.items() for b in bs
                    if a in room and b in room and rank[room[b]] < rank[room[a]])
    assert upward == []


def test_the_room_check_sees_an_arrow_up(tmp_path, monkeypatch):
    """Negative control: the skeleton reaching up to the run that uses it is reported."""
    fake = tmp_path / "pinpoint" / "training"
    fake.mkdir(parents=True)
    (fake / "skeleton.py").write_text("def f():\n    from pinpoint.training.run import run_training\n")
    (fake / "run.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path / "pinpoint")
    with pytest.raises(AssertionError, match=r"pinpoint\.training\.skeleton', 'pinpoint\.training\.run"):
        test_training_rooms_import_only_rooms_below_them()


def test_the_circle_check_sees_a_circle(tmp_path, monkeypatch):
    """Negative control: the data <-> streams circle the input room once had is reported."""
    fake = tmp_path / "pinpoint" / "training" / "input"
    fake.mkdir(parents=True)
    (fake / "data.py").write_text("def f():\n    from pinpoint.training.input.streams import probe\n")
    (fake / "streams.py").write_text("from pinpoint.training.input import data\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path / "pinpoint")
    assert _circles(*_file_graph(ACYCLIC)) == [["pinpoint.training.input.data", "pinpoint.training.input.streams"]]


# The rooms of placement/, top first (docs/architecture.md): capture runs TensorFlow and report
# renders; both read the analyses, which read memory, which reads the typed model, the profile and
# the graphs.
PLACEMENT_ROOMS = [{"capture", "report"}, {"analysis"}, {"memory"}, {"model", "profile"}, {"graphs"}]


def _room_arrows_up(modules, edges) -> list[tuple[str, str]]:
    rank = {room: i for i, rooms in enumerate(PLACEMENT_ROOMS) for room in rooms}
    room = {m: m.split(".")[2] for m in modules if m.count(".") >= 3}
    assert sorted(set(room.values()) - set(rank)) == [], "add the new room to PLACEMENT_ROOMS and the docs"
    return sorted((a, b) for a, bs in edges.items() for b in bs
                  if a in room and b in room and rank[room[b]] < rank[room[a]])


def test_placement_rooms_import_only_rooms_below_them():
    assert _room_arrows_up(*_file_graph(("placement",))) == []


def test_the_placement_room_check_sees_an_arrow_up(tmp_path, monkeypatch):
    """Negative control: the graphs room reaching up to the capture that fills it is reported."""
    fake = tmp_path / "pinpoint" / "placement"
    (fake / "graphs").mkdir(parents=True)
    (fake / "capture").mkdir()
    (fake / "graphs" / "steps.py").write_text("def f():\n    from pinpoint.placement.capture.graphs import collecting\n")
    (fake / "capture" / "graphs.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path / "pinpoint")
    assert _room_arrows_up(*_file_graph(("placement",))) == [("pinpoint.placement.graphs.steps",
                                                              "pinpoint.placement.capture.graphs")]


def test_no_placement_room_holds_more_than_a_third_of_its_lines():
    lines = {}
    for path in (SRC / "placement").rglob("*.py"):
        room = path.relative_to(SRC / "placement").parts
        if len(room) > 1:
            lines[room[0]] = lines.get(room[0], 0) + len(path.read_text().splitlines())
    total = sum(lines.values())
    assert {r: n for r, n in lines.items() if 3 * n > total} == {}


def _placement_imports_from_outside(root: Path) -> list[str]:
    """Imports of a placement room's module by a module outside placement/ (the face is the way in)."""
    return sorted(f"{src} (line {line}) imports {dst}" for src, dst, line in _imports_under(root)
                  if dst.startswith("pinpoint.placement.") and not src.startswith("pinpoint.placement"))


def _imports_under(root: Path) -> list[tuple[str, str, int]]:
    monkey = sys.modules[__name__]
    saved, monkey.SRC = monkey.SRC, root
    try:
        return _imports()
    finally:
        monkey.SRC = saved


def test_the_rest_of_pinpoint_enters_placement_through_its_face():
    assert _placement_imports_from_outside(SRC) == []


def test_the_face_check_sees_a_room_imported_from_outside(tmp_path):
    fake = tmp_path / "pinpoint"
    (fake / "plan").mkdir(parents=True)
    (fake / "plan" / "build.py").write_text("from pinpoint.placement.model.files import load_placement\n")
    assert _placement_imports_from_outside(fake) == [
        "pinpoint.plan.build (line 1) imports pinpoint.placement.model.files"]


def test_every_name_of_the_face_is_defined_where_it_says():
    """The face's lazy table, read without importing a room: each name is a top-level definition
    of the module it names (a moved name fails here, not on a user's first call)."""
    face = ast.parse((SRC / "placement" / "__init__.py").read_text())
    table = next(n.value for n in face.body if isinstance(n, ast.Assign) and n.targets[0].id == "_WHERE")
    where = {k.value: v.value for k, v in zip(table.keys, table.values, strict=True)}
    missing = []
    for name, module in where.items():
        tree = ast.parse((SRC / "placement" / (module.replace(".", "/") + ".py")).read_text())
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        defined |= {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
        if name not in defined:
            missing.append(f"{name} in {module}")
    assert missing == []


def _private_imports(root: Path) -> list[str]:
    """`from pinpoint.x import _name`: a private name crossing a module boundary."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pinpoint"):
                found += [f"{path.relative_to(root)}:{node.lineno} {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_no_private_name_crosses_a_module_in_src():
    assert _private_imports(SRC) == []


def test_the_private_name_check_sees_one(tmp_path):
    (tmp_path / "a.py").write_text("def f():\n    from pinpoint.placement.memory.replay import _other_task\n")
    assert _private_imports(tmp_path) == ["a.py:2 _other_task"]


def test_the_library_never_imports_the_repositorys_kfp_side():
    others = sorted({(src, t) for path in SRC.rglob("*.py")
                     for src in ["pinpoint." + ".".join(path.relative_to(SRC).with_suffix("").parts)]
                     for node in ast.walk(ast.parse(path.read_text()))
                     if isinstance(node, (ast.Import, ast.ImportFrom))
                     for t in ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""])
                     if t.split(".")[0] in ("pipelines", "components", "kfp")})
    assert others == []


def _string_constants(path: Path) -> list[tuple[int, str]]:
    """(line, value) of every string constant in the file except docstrings."""
    tree = ast.parse(path.read_text())
    docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]


def test_the_collective_timeout_variable_is_spelled_once():
    """PINPOINT_COLLECTIVE_TIMEOUT is podenv.COLLECTIVE_TIMEOUT_ENV in the library, the kfp side
    and the tests: the launcher, the manifests and the task that reads it cannot drift apart."""
    repo = SRC.parents[1]
    podenv = SRC / "provision" / "podenv.py"
    name = "PINPOINT_" + "COLLECTIVE_TIMEOUT"  # not spelled here either
    spelled = [f"{path.relative_to(repo)}:{line}"
               for folder in ("src", "components", "pipelines", "tests", "benchmarks")
               for path in sorted((repo / folder).rglob("*.py")) if path != podenv
               for line, value in _string_constants(path) if name in value]
    assert spelled == []


def test_docs_architecture_names_every_layer_unit_and_training_room():
    """docs/architecture.md draws every unit of LAYERS and lists every room of training/."""
    docs = (SRC.parents[1] / "docs" / "architecture.md").read_text()
    units = {name for _, names in LAYERS for name in names} - {"__init__"}
    assert sorted(u for u in units if not re.search(rf"\b{u}\b", docs)) == []
    rooms = {f"training/{p.name}/" if p.is_dir() else f"training/{p.name}"
             for p in (SRC / "training").iterdir() if p.name not in ("__init__.py", "__pycache__")}
    # A top-level file may share a line with another: named by its file name.
    assert sorted(r for r in rooms if r not in docs and r.removeprefix("training/") not in docs) == []


def test_docs_architecture_names_every_placement_room():
    docs = (SRC.parents[1] / "docs" / "architecture.md").read_text()
    section = docs.split("## The rooms of `placement/`", 1)[1].split("\n## ", 1)[0]
    rooms = {r for rs in PLACEMENT_ROOMS for r in rs}
    on_disk = {p.name for p in (SRC / "placement").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert on_disk == rooms
    assert sorted(r for r in rooms if not re.search(rf"^  .*\b{r}\b", section, re.M)) == []
