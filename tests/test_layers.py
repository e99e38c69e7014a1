"""The architecture as a test (ARCHITECTURE.md): which package may import which, and who may print or exit.

Every import counts, also the lazy ones inside functions: a layer that imports upwards only at run time still
depends on what it imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "gitlease"

BELOW_SERVICE = {"core", "identity", "service"}
# package -> the packages it may import (besides itself and ``gitlease.__version__``)
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "identity": {"core"},
    "service": {"core", "identity"},
    "liveness": BELOW_SERVICE,
    "enforce": BELOW_SERVICE,
    "plan": BELOW_SERVICE,
    "worktree": BELOW_SERVICE,
    "ops": BELOW_SERVICE | {"enforce"},  # init installs the hooks
    "work": BELOW_SERVICE | {"liveness", "enforce", "plan", "worktree", "ops"},
    "mcp": BELOW_SERVICE | {"liveness", "enforce", "plan", "worktree", "ops", "work"},
    "cli": BELOW_SERVICE | {"liveness", "enforce", "plan", "worktree", "ops", "work", "mcp", "(top)"},
    "(top)": BELOW_SERVICE | {"liveness", "enforce", "cli", "work"},  # the Python API, re-exported lazily
}
# modules that may write to stdout/stderr or end the process: the CLI, the hooks' entry, the demo
MAY_PRINT = ("gitlease.cli", "gitlease.enforce.entry", "gitlease.demo")
# and where a process ends on its own terms: the forked child of ``git lease run`` before it execs the command
MAY_EXIT_ONLY = {"gitlease.liveness.supervise": {"os._exit"}}


def modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out.append((".".join(parts), path))
    return out


def package_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) < 2:
        return "(top)"
    if len(parts) == 2 and not (PKG / parts[1]).is_dir():
        return "(top)"  # gitlease/demo.py, gitlease/hook_entry.py, gitlease/__main__.py
    return parts[1]


def imported(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "gitlease":
                names.update(f"gitlease.{a.name}" for a in node.names)
            else:
                names.add(target)
    return {n for n in names if n == "gitlease" or n.startswith("gitlease.")}


def test_no_relative_imports():
    bad = [
        f"{m}:{n.lineno}"
        for m, p in modules()
        for n in ast.walk(ast.parse(p.read_text()))
        if isinstance(n, ast.ImportFrom) and n.level
    ]
    assert not bad, f"use absolute imports (gitlease.<package>.<module>): {bad}"


@pytest.mark.parametrize("module,path", modules(), ids=[m for m, _ in modules()])
def test_imports_follow_the_layers(module, path):
    own = package_of(module)
    assert own in ALLOWED, f"{module}: package {own} has no entry in ALLOWED (tests/test_layers.py, ARCHITECTURE.md)"
    bad = []
    for target in imported(ast.parse(path.read_text()), module, path.name == "__init__.py"):
        if target in ("gitlease", "gitlease.__version__"):
            continue
        if target == "gitlease.open_service" or target == "gitlease.hold":
            other = "(top)"
        else:
            other = package_of(target)
        if other != own and other not in ALLOWED[own]:
            bad.append(f"{target} ({other})")
    assert not bad, f"{module} ({own}) imports from a layer above it or beside it: {', '.join(sorted(bad))}"


def _prints(tree: ast.AST, allowed: set[str] = frozenset()) -> list[int]:
    """Lines that print, write to the standard streams or end the process, outside ``if __name__ == ...``."""
    main_blocks = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.If) and isinstance(n.test, ast.Compare) and ast.unparse(n.test.left) == "__name__"
    ]
    inside_main = {id(x) for b in main_blocks for x in ast.walk(b)}
    hits = []
    for node in ast.walk(tree):
        if id(node) in inside_main:
            continue
        if isinstance(node, ast.Call):
            fn = ast.unparse(node.func)
            if fn in allowed:
                continue
            if fn in ("print", "sys.exit", "os._exit", "exit", "quit") or fn.startswith(("sys.stdout.", "sys.stderr.")):
                hits.append(node.lineno)
        elif isinstance(node, ast.Raise) and node.exc is not None and "SystemExit" in ast.unparse(node.exc):
            hits.append(node.lineno)
    return hits


@pytest.mark.parametrize("module,path", modules(), ids=[m for m, _ in modules()])
def test_only_the_cli_and_the_hook_entry_print_or_exit(module, path):
    if module.startswith(MAY_PRINT):
        return
    hits = _prints(ast.parse(path.read_text()), MAY_EXIT_ONLY.get(module, set()))
    assert not hits, f"{module} prints or exits at lines {hits}: only the CLI and the hooks' entry may"


# Who runs git (ARCHITECTURE.md, "One git boundary"): everything else asks core/gitq.py's named questions.
RUNS_GIT = {
    "gitlease.core.gitcmd": "the one runner",
    "gitlease.core.gitq": "the git questions, named once",
    "gitlease.core.store": "the store's transport: the atomic push with leases, ls-remote, fetch by oid",
    "gitlease.core.repo": "finding the repository and its config (under everything else)",
    "gitlease.core.hookgit": "the hooks' lean runner: posix_spawn, no subprocess",
    "gitlease.enforce.entry": "hook fast path: posix_spawn, no subprocess",
    "gitlease.enforce.quickpush": "the pre-push hook's lean path (gitq's import alone is most of its budget)",
    "gitlease.enforce.guard": "hook fast path (an agent's every edit)",
    "gitlease.enforce.shell": "hook fast path (an agent's every shell command)",
    "gitlease.enforce.hookmain": "hook fast path",
    "gitlease.demo": "a script that shows git lease at work, run as a user would",
}
RUNNERS = ("gitcmd", "hookgit")
_SPAWNS = {"subprocess.run", "subprocess.Popen", "subprocess.check_output", "subprocess.call", "os.posix_spawnp"}


def _runs_git(tree: ast.AST) -> list[int]:
    """Lines that run git: ``gitcmd.run`` or ``hookgit.run`` (called or handed on), ``run`` imported from
    either, or a process spawned with ``git`` as its program."""
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "run" and ast.unparse(node.value).endswith(RUNNERS):
            hits.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").endswith(RUNNERS):
            if any(a.name == "run" for a in node.names):
                hits.append(node.lineno)
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in _SPAWNS and node.args:
            first = node.args[0]
            program = first.elts[0] if isinstance(first, ast.List | ast.Tuple) and first.elts else first
            if isinstance(program, ast.Constant) and program.value == "git":
                hits.append(node.lineno)
    return hits


@pytest.mark.parametrize("module,path", modules(), ids=[m for m, _ in modules()])
def test_only_the_git_boundary_runs_git(module, path):
    hits = _runs_git(ast.parse(path.read_text()))
    if module in RUNS_GIT:
        return
    assert not hits, (
        f"{module} runs git at lines {hits}: ask (or add) a named question in gitlease/core/gitq.py instead of "
        "building git argv"
    )


LONGEST_FUNCTION = 80  # lines, decorators excluded (issue 29: none longer, outside tests)


def test_no_function_is_longer_than_80_lines():
    long = []
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > LONGEST_FUNCTION:
                    long.append(f"{path.relative_to(PKG.parent)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long
