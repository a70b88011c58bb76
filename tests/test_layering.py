"""The layering, stated once: which top-level package may import which (ALLOWED), that no two modules
of the project import each other in a circle (the module graph), and that the commands (typer) live
only in the application layer's ``blendsim/cli/``. Every import statement is read with ``ast`` from
every file: module- and function-level, relative, and importlib calls with a literal name (an f-string
name, as a registry uses to load its plugins, stands for every module its literal start can name).

``sim`` is the engine core: it imports none of the others. ``blendsim`` is the application layer on
top of everything, and its ``blendsim.cli`` package holds every typer command: nothing else imports
typer or a command module. The rows in between are the directions as they stand; a new edge is a
design decision, made by editing ALLOWED with its reason. docs/DESIGN.md and the README's Layout
section describe the same layers.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from collections import deque
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sim", "calibrate", "policies", "workloads", "real_backend", "reports", "blendsim")
ABOVE_THE_CORE = ("policies", "workloads", "reports", "calibrate", "real_backend", "blendsim")
ALLOWED = {
    "sim": set(),
    "policies": {"sim"},
    "workloads": {"sim"},
    # `blendsim policies` is listed by reports.terminal
    "reports": {"sim", "policies"},
    # calibrate.forward profiles the real backend's model forward; real_backend.hwmon names the CPU with
    # calibrate.device, and real_backend.sequences uses the trace's segment-id base (workloads.trace)
    "calibrate": {"sim", "real_backend"},
    "real_backend": {"sim", "calibrate", "workloads"},
    "blendsim": set(PACKAGES) - {"blendsim"},
}
IMPORTERS = ("import_module", "__import__")

# Import circles that stand today, each with the branch that removes it; any other circle fails the test,
# and so does an entry here once its circle is gone (delete it then).
ALLOWED_CYCLES: dict[frozenset, str] = {}  # none: a circle allowed here needs its reason and its owner
# Modules whose computed-name imports (a registry loading its plugins) are left out of the module graph.
DISCOVERY: dict[str, str] = {}  # none: policies.registry imports the policy modules, none of which imports it


def module_name(f: Path) -> str:
    """The installed name of a project file: ``sim/cost.py`` -> ``blendsim.sim.cost``, ``blendsim/cli/__init__.py``
    -> ``blendsim.cli`` (the folders install under the ``blendsim`` namespace)."""
    parts = list(f.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts if parts[0] == "blendsim" else ["blendsim", *parts])


def import_names(source: str, module: str, is_package: bool = False) -> list[tuple[str, int, bool]]:
    """``(dotted name, line, computed)`` of every import in ``source`` (the file of ``module``): module- and
    function-level statements (``from a import b`` gives ``a.b``: a submodule or a name in ``a``), relative
    ones resolved, and importlib calls; ``computed`` marks an f-string's literal start
    (``f"blendsim.policies.{name}"`` gives ``blendsim.policies.``)."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno, False) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            out += [(f"{base}.{a.name}" if a.name != "*" else base, node.lineno, False) for a in node.names]
        elif isinstance(node, ast.Call) and node.args and _callee(node.func) in IMPORTERS:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                out.append((arg.value, node.lineno, False))
            elif isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
                out.append((str(arg.values[0].value), node.lineno, True))
    return out


def imported_packages(source: str, module: str, is_package: bool = False) -> list[tuple[str, int]]:
    """(top-level package, line) of every import in ``source``, the file of ``module``."""
    return [(top_package(name), line) for name, line, _ in import_names(source, module, is_package) if name]


def top_package(module: str) -> str:
    """The repository folder a module lives in: ``blendsim.sim.cost`` -> ``sim`` (the folders install under the
    ``blendsim`` namespace), ``blendsim.api`` -> ``blendsim``, ``numpy.linalg`` -> ``numpy``."""
    parts = module.split(".")
    if parts[0] == "blendsim" and len(parts) > 1 and parts[1] in PACKAGES:
        return parts[1]
    return parts[0]


def _callee(func) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def package_files(pkg: str) -> list[Path]:
    return sorted((ROOT / pkg).rglob("*.py"))


def project_modules() -> dict[str, Path]:
    return {module_name(f): f for pkg in PACKAGES for f in package_files(pkg)}


def violations(pkg: str, allowed: set[str]) -> list[str]:
    bad = []
    for f in package_files(pkg):
        for top, line in imported_packages(f.read_text(), module_name(f), f.name == "__init__.py"):
            if top in PACKAGES and top != pkg and top not in allowed:
                bad.append(f"{f.relative_to(ROOT)}:{line} imports {top}")
    return bad


def resolve(name: str, computed: bool, modules) -> list[str]:
    """The project modules an import names: the longest prefix of ``name`` that is one; for a computed
    name, every module its literal start can name (``pkg.`` + anything: the package's direct children)."""
    if computed:
        pkg, _, stem = name.rpartition(".")
        return [m for m in modules if m.rpartition(".")[0] == pkg and m.rpartition(".")[2].startswith(stem)]
    parts = name.split(".")
    while parts:
        if ".".join(parts) in modules:
            return [".".join(parts)]
        parts.pop()
    return []


def import_graph(modules: dict[str, str], packages=frozenset(), discovery=DISCOVERY) -> dict[str, dict[str, int]]:
    """module -> {imported project module: line} over ``modules`` (name -> source; ``packages``: the names
    whose file is an ``__init__.py``); computed-name imports of the ``discovery`` modules are left out."""
    graph = {}
    for mod, source in modules.items():
        edges: dict[str, int] = {}
        for name, line, computed in import_names(source, mod, mod in packages):
            if computed and mod in discovery:
                continue
            for target in resolve(name, computed, modules):
                if target != mod:
                    edges.setdefault(target, line)
        graph[mod] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[tuple[frozenset, list[str]]]:
    """Each strongly connected group of two or more modules (Tarjan's algorithm), with one circle
    ``[a, b, ..., a]`` through it, in a stable order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [(frozenset(g), _circle(graph, g)) for g in sorted(groups, key=min)]


def _circle(graph: dict[str, dict[str, int]], group: set[str]) -> list[str]:
    """The shortest circle from the group's first module back to it, inside the group (breadth first)."""
    start = min(group)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(graph[v]):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [start, *reversed(path[:-1]), start] if v != start else [start, start]
            if w in group and w not in came_from:
                came_from[w] = v
                queue.append(w)
    raise AssertionError(f"no circle in {sorted(group)}")


def describe(graph: dict[str, dict[str, int]], circle: list[str], files: dict[str, Path] | None = None) -> str:
    """``a -> b (a's file:line) -> ... -> a``."""
    steps = []
    for a, b in zip(circle, circle[1:]):
        where = f"{files[a].relative_to(ROOT)}:{graph[a][b]}" if files else f"line {graph[a][b]}"
        steps.append(f"{b} ({where})")
    return circle[0] + " -> " + " -> ".join(steps)


def test_the_scanner_sees_function_level_relative_and_dynamic_imports():
    src = textwrap.dedent("""
        import numpy as np
        from . import sibling
        def f():
            from blendsim.policies.registry import get_policy
            import blendsim.workloads.trace
        def g(name):
            import importlib
            importlib.import_module(f"blendsim.reports.{name}")
            return __import__("blendsim.calibrate.fit")
    """)
    found = {top for top, _ in imported_packages(src, "blendsim.sim.x")}
    assert found == {"numpy", "sim", "policies", "workloads", "importlib", "reports", "calibrate"}
    assert violations("policies", set())  # policies imports sim: flagged when its row allowed nothing


def test_the_module_graph_resolves_each_kind_of_import_and_finds_circles():
    mods = {
        "blendsim.a": "from blendsim.b import thing\nimport numpy",
        "blendsim.b": "def f():\n    from . import c",  # function-level, relative
        "blendsim.c": "import importlib\nimportlib.import_module('blendsim.a')",  # a literal importlib call
        "blendsim.d": "from blendsim import a",  # `from package import module`
        "blendsim.reg": "import importlib\ndef get(n):\n    return importlib.import_module(f'blendsim.reg.{n}')",
        "blendsim.reg.one": "from blendsim.reg import helper",  # a plugin importing its registry
        "blendsim.e": "import blendsim.e.sub",
        "blendsim.e.sub": "x = 1",
    }
    graph = import_graph(mods, discovery={})
    assert graph["blendsim.a"] == {"blendsim.b": 1} and graph["blendsim.b"] == {"blendsim.c": 2}
    assert graph["blendsim.c"] == {"blendsim.a": 2} and graph["blendsim.d"] == {"blendsim.a": 1}
    assert graph["blendsim.reg"] == {"blendsim.reg.one": 3} and graph["blendsim.e"] == {"blendsim.e.sub": 1}
    found = [circle for _, circle in cycles(graph)]
    assert found == [["blendsim.a", "blendsim.b", "blendsim.c", "blendsim.a"], ["blendsim.reg", "blendsim.reg.one",
                                                                                  "blendsim.reg"]]
    assert describe(graph, found[0]) == ("blendsim.a -> blendsim.b (line 1) -> blendsim.c (line 2) -> "
                                         "blendsim.a (line 2)")
    assert [c for _, c in cycles(import_graph(mods, discovery={"blendsim.reg": "a registry"}))] == [found[0]]
    assert cycles({"x": {"y": 1}, "y": {}}) == []
    # the group is every module on some circle, not only those of the circle shown
    group, circle = cycles({"p": {"q": 1}, "q": {"p": 1, "r": 2}, "r": {"q": 1}})[0]
    assert group == {"p", "q", "r"} and circle == ["p", "q", "p"]


def test_no_import_circle_between_the_project_modules():
    """Module- and function-level imports and importlib calls included, across every package; the circles
    in ALLOWED_CYCLES are the only ones standing, each until the branch named there removes it."""
    files = project_modules()
    sources = {m: f.read_text() for m, f in files.items()}
    packages = {m for m, f in files.items() if f.name == "__init__.py"}
    graph = import_graph(sources, packages)
    found = cycles(graph)
    bad = [describe(graph, circle, files) + (f"  (the group: {', '.join(sorted(g))})" if len(g) > len(circle) - 1
                                             else "") for g, circle in found if g not in ALLOWED_CYCLES]
    assert not bad, "import circles (break each: move what both need to a module below them):\n" + "\n".join(bad)
    gone = [f"{sorted(g)} ({who})" for g, who in ALLOWED_CYCLES.items() if g not in {g for g, _ in found}]
    assert not gone, "these circles are gone: delete their entries from ALLOWED_CYCLES: " + "; ".join(gone)
    unfiltered = cycles(import_graph(sources, packages, discovery={}))
    for mod in DISCOVERY:  # an entry still stands for a circle through its computed imports
        assert any(mod in g for g, _ in unfiltered), f"{mod} no longer closes a circle: delete it from DISCOVERY"


def test_the_core_imports_nothing_above_it():
    assert package_files("sim"), "sim/ has no files?"
    bad = violations("sim", set())
    assert not bad, "sim/ must not import " + ", ".join(ABOVE_THE_CORE) + ":\n" + "\n".join(bad)


@pytest.mark.parametrize("pkg", PACKAGES)
def test_each_package_imports_only_the_packages_below_it(pkg):
    bad = violations(pkg, ALLOWED[pkg])
    assert not bad, f"{pkg} may import only {sorted(ALLOWED[pkg]) or 'none of the others'}:\n" + "\n".join(bad)


def test_every_top_level_package_has_a_row():
    found = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "benchmarks", "docs"}
    assert found == set(PACKAGES), f"add the new package's allowed imports to ALLOWED: {found ^ set(PACKAGES)}"
    text = (ROOT / "pyproject.toml").read_text()
    assert all(f'"blendsim.{p}"' in text for p in PACKAGES if p != "blendsim")  # all of them installed


def test_importing_every_core_module_loads_no_package_above_it():
    code = textwrap.dedent(f"""
        import importlib, pkgutil, sys
        from blendsim import sim
        for m in pkgutil.walk_packages(sim.__path__, "blendsim.sim."):
            importlib.import_module(m.name)
        tops = {{n.split(".")[1] if n.split(".")[1] in {PACKAGES!r} else "blendsim"
                for n in sys.modules if n.startswith("blendsim.")}}
        loaded = sorted(tops & set({ABOVE_THE_CORE!r}))
        print(",".join(loaded))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "", f"importing sim/ loaded {r.stdout.strip()}"


def test_policies_implement_the_contract_the_core_defines():
    from blendsim.policies.base import Policy, RoundRobin
    from blendsim.policies.registry import get_policy, policy_names
    from blendsim.sim.policy import PolicyContext, PolicyLike, RouterLike

    ctx = PolicyContext(trace=None, tree=None, deployment=None, cost_model=None, engine=None)
    assert isinstance(Policy(ctx), PolicyLike)
    assert isinstance(RoundRobin(ctx, [0, 1]), RouterLike)
    assert not isinstance(object(), PolicyLike)
    hooks = ("prepare", "rank", "make_router", "make_scheduler", "summary_extra")
    for name in policy_names():
        cls = get_policy(name)
        assert issubclass(cls, Policy) and all(callable(getattr(cls, h, None)) for h in hooks), name


def test_every_package_folder_is_installed():
    """pyproject's explicit package list (the folders map into the blendsim namespace) names every folder."""
    text = (ROOT / "pyproject.toml").read_text()
    for init in (i for pkg in PACKAGES for i in (ROOT / pkg).rglob("__init__.py")):
        rel = init.parent.relative_to(ROOT)
        name = ".".join(rel.parts) if rel.parts[0] == "blendsim" else "blendsim." + ".".join(rel.parts)
        assert f'"{name}"' in text, f"{name} ({rel}) is missing from [tool.setuptools] packages in pyproject.toml"


def _project_files() -> list[Path]:
    return [f for pkg in PACKAGES for f in package_files(pkg)]


def _imported_modules(source: str) -> list[tuple[str, int]]:
    """(module, line) of every absolute import, function-level included (``from a import b``: ``a.b``)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out += [(node.module, node.lineno)] + [(f"{node.module}.{a.name}", node.lineno) for a in node.names]
        elif isinstance(node, ast.Call) and node.args and _callee(node.func) in IMPORTERS:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                out.append((arg.value, node.lineno))
    return out


def test_typer_and_the_commands_live_only_in_blendsim_cli():
    """The application layer owns the commands: no typer outside blendsim/cli/ (so none under sim/), and
    no module outside it (the API included) imports a command module."""
    cli = ROOT / "blendsim" / "cli"
    assert (cli / "__init__.py").exists()
    bad = []
    for f in _project_files():
        if cli in f.parents:
            continue
        for mod, line in _imported_modules(f.read_text()):
            if mod.split(".")[0] == "typer" or mod == "blendsim.cli" or mod.startswith("blendsim.cli."):
                bad.append(f"{f.relative_to(ROOT)}:{line} imports {mod}")
    assert not bad, "only blendsim/cli/ may import typer or a command module:\n" + "\n".join(bad)


# ---- a namespace the package owns: a user's own modules cannot shadow blendsim's ------------------------
USER_MODULES = ("sim", "policies", "reports", "workloads", "calibrate")
NOTEBOOK = '''
import sys

import blendsim
cell = """
class ShortestFirst(blendsim.Policy):
    name = "shortest-first"
    def rank(self):
        return self.ctx.trace.input_len
"""
ns = {"blendsim": blendsim}
exec(cell, ns)  # a notebook cell: the class has no file
trace = blendsim.synthesize("blendserve", density=1.1, sharing=0.2, requests=100)
r = blendsim.simulate(trace, policy=ns["ShortestFirst"], model="llama-3-8b", hardware="a100-80gb")
print(r.summary["policy"], r.summary["n_requests"], "typer" in sys.modules)  # the API loads no command
'''


def _in(folder: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, cwd=folder, timeout=300, env=env)


def test_a_users_own_modules_do_not_shadow_blendsim(tmp_path):
    """In a folder holding a user's own sim.py, policies.py, reports.py, workloads.py and calibrate.py (each
    fails if imported), the API, ``import blendsim.sim``, ``blendsim demo`` and a notebook's policy work."""
    for m in USER_MODULES:
        (tmp_path / f"{m}.py").write_text(f"raise ImportError('the user\\'s own {m}.py was imported')\n")
    py = sys.executable
    for m in USER_MODULES:  # the folder does shadow these names (a top-level `import sim` would get the user's)
        r = _in(tmp_path, py, "-c", f"import {m}")
        assert r.returncode == 1 and f"the user's own {m}.py was imported" in r.stderr, r.stderr
    # python -c puts the working folder first on sys.path, as a notebook or script there does
    r = _in(tmp_path, py, "-c", "import blendsim; t = blendsim.synthesize('blendserve', density=1.1, sharing=0.2, "
                                "requests=100); print(t.n)")
    assert r.returncode == 0 and r.stdout.split() == ["100"], r.stderr
    r = _in(tmp_path, py, "-c", "import blendsim.sim, blendsim.sim.cost, blendsim.policies.base, blendsim.reports."
                                "render, blendsim.workloads.trace, blendsim.calibrate.fit; print('ok')")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    r = _in(tmp_path, py, "-c", NOTEBOOK)
    assert r.returncode == 0 and r.stdout.split() == ["shortest-first", "100", "False"], r.stderr
    # the console script, with the folder on PYTHONPATH so the user's modules are importable by those names
    script = Path(py).parent / "blendsim"
    cmd = [str(script)] if script.exists() else [py, "-c", "from blendsim.cli import main; main()"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    r = _in(tmp_path, *cmd, "demo", "--requests", "200", "-o", "demo", env=env)
    assert r.returncode == 0, r.stderr
    assert "policies side by side" in r.stdout and (tmp_path / "demo" / "report" / "index.html").exists()
