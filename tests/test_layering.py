"""The package layering: which top-level package may import which (every import statement, module- or
function-level, and importlib calls with a literal name), read with ``ast`` from every file.

``sim`` is the engine core: it imports none of the others. ``blendsim`` is the application layer on
top of everything, and its ``blendsim.cli`` package holds every typer command: nothing else imports typer
or a command module. The rows in between are the directions as they stand; a new edge is a design
decision, made by editing ALLOWED with its reason.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
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


def imported_packages(source: str, own: str) -> list[tuple[str, int]]:
    """(top-level package, line) of every import in ``source``; relative imports are ``own``'s."""
    out = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [own] if node.level else [node.module or ""]
            if node.module == "blendsim":  # from blendsim import sim, api: the names are modules of blendsim
                names = [f"blendsim.{a.name}" for a in node.names]
        elif isinstance(node, ast.Call) and node.args and _callee(node.func) in IMPORTERS:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                names = [arg.value]
            elif isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
                names = [str(arg.values[0].value)]  # f"blendsim.policies.{name}": its literal start
        out.extend((top_package(n), node.lineno) for n in names if n)
    return out


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


def violations(pkg: str, allowed: set[str]) -> list[str]:
    bad = []
    for f in package_files(pkg):
        for top, line in imported_packages(f.read_text(), pkg):
            if top in PACKAGES and top != pkg and top not in allowed:
                bad.append(f"{f.relative_to(ROOT)}:{line} imports {top}")
    return bad


def test_the_scanner_sees_function_level_relative_and_dynamic_imports():
    src = textwrap.dedent("""
        import numpy as np
        from . import sibling
        def f():
            from blendsim.policies.base import get_policy
            import blendsim.workloads.trace
        def g(name):
            import importlib
            importlib.import_module(f"blendsim.reports.{name}")
            return __import__("blendsim.calibrate.fit")
    """)
    found = {top for top, _ in imported_packages(src, "sim")}
    assert found == {"numpy", "sim", "policies", "workloads", "importlib", "reports", "calibrate"}
    assert violations("policies", set())  # policies imports sim: flagged when its row allowed nothing


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
    from blendsim.policies.base import Policy, RoundRobin, get_policy, policy_names
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
