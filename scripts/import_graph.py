"""The import graph of cua_rl, read from the source with ``ast`` (nothing is imported), counting what Python
really runs: every ``import``, those inside functions included (each edge tagged with how it is reached);
imports under ``TYPE_CHECKING`` never run and are left out; importing ``a.b.c`` (``from a.b import c``
too) also runs the ``__init__`` of every package above it (``a``, ``a.b``), except the importer's own
packages, which Python has already initialised.

Modules are grouped by their first two name parts (``cua_rl.local_gym.vm.qmp`` -> ``cua_rl.local_gym``;
root modules such as ``cua_rl.train`` are their own group). The report lists, per group, the groups it
imports; then the cycles among modules (strongly connected components, with the edges that close them), the
cycles between groups, and the imports that run back up ``LAYERS``. It exits 1 when any of the three is
found (CI runs it in the quick tier: tests/docs/test_import_graph.py), 0 otherwise. Standard library only.
Run from the repository root:

    python scripts/import_graph.py            # the report
    python scripts/import_graph.py --edges    # also every module edge, with kind and line
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

PACKAGE = "cua_rl"

# The floors of the house, top to bottom: a group imports only groups on its own floor or below. The entry
# points only compose; the launcher stands above what it starts; the workflow and the config above the
# trainer's own logic (the config holds the health checks' section, ``trainer.health.HealthConfig``, and applies
# AReaL's deployment rules, ``deploy``; the trainer imports neither); what runs inside AReaL's workers; the
# monitor; the agent and the rows; the clients and servers; and on the ground what every room shares (among it the
# wire contracts, which a client and its server both import). A new group must be placed here.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("cua_rl.train", "cua_rl.evaluate", "cua_rl.verdict"),
    ("cua_rl.run",),
    ("cua_rl.sft",),
    ("cua_rl.dataset", "cua_rl.workflow", "cua_rl.local_model"),
    ("cua_rl.config", "cua_rl.deploy"),
    ("cua_rl.trainer",),
    ("cua_rl.areal_ext",),
    ("cua_rl.monitor",),
    ("cua_rl.local_agent", "cua_rl.trajectory"),
    ("cua_rl.genv", "cua_rl.local_gym", "cua_rl.mini_agent", "cua_rl.policy"),
    ("cua_rl.http", "cua_rl.logs", "cua_rl.progress", "cua_rl.runs", "cua_rl.recipes", "cua_rl.stats", "cua_rl.wire",
     "cua_rl"),
)


def module_names(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the package (packages named by their __init__)."""
    names = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _Imports(ast.NodeVisitor):
    """Collects (target, kind, line); kind is "top", "function" (inside a def) or "type" (TYPE_CHECKING)."""

    def __init__(self, module: str, is_package: bool):
        self.module, self.is_package = module, is_package
        self.found: list[tuple[str, str, int]] = []
        self._depth = 0
        self._typing = 0

    def _kind(self) -> str:
        return "type" if self._typing else ("function" if self._depth else "top")

    def visit_FunctionDef(self, node):  # noqa: N802
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef  # noqa: N815

    def visit_If(self, node):  # noqa: N802
        if _is_type_checking(node.test):
            self._typing += 1
            for child in node.body:
                self.visit(child)
            self._typing -= 1
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node):  # noqa: N802
        for alias in node.names:
            self.found.append((alias.name, self._kind(), node.lineno))

    def visit_ImportFrom(self, node):  # noqa: N802
        if node.level:
            base = self.module.split(".")
            if not self.is_package:
                base = base[:-1]
            base = base[: len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        for alias in node.names:
            # "from pkg import mod" names a module when pkg.mod exists; resolved against the module list later.
            self.found.append((f"{target}.{alias.name}|{target}", self._kind(), node.lineno))


def resolve(target: str, modules: dict[str, Path]) -> str | None:
    """The longest known module that ``target`` names (``a.b.c|a.b``: try a.b.c, then a.b)."""
    for candidate in target.split("|"):
        parts = candidate.split(".")
        while parts:
            name = ".".join(parts)
            if name in modules:
                return name
            parts.pop()
    return None


def ancestors(module: str) -> list[str]:
    """The packages above ``module`` (``a.b.c`` -> ``a``, ``a.b``)."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def edges(root: Path) -> tuple[dict[str, Path], list[tuple[str, str, str, int]]]:
    """Every module and the imports that run: (importer, imported, kind, line), kind "top" or "function"."""
    modules = module_names(root)
    out = []
    for name, path in modules.items():
        visitor = _Imports(name, path.name == "__init__.py")
        visitor.visit(ast.parse(path.read_text(), str(path)))
        own = set(ancestors(name))
        for target, kind, line in visitor.found:
            if kind == "type" or not target.split("|")[0].startswith(PACKAGE):
                continue
            dest = resolve(target, modules)
            if dest is None:
                continue
            for reached in [*ancestors(dest), dest]:
                if reached != name and reached in modules and reached not in own:
                    out.append((name, reached, kind, line))
    return modules, sorted(set(out))


def group(module: str) -> str:
    return ".".join(module.split(".")[:2])


def floor(group_name: str) -> int | None:
    """The group's floor in ``LAYERS`` (0 at the top), or None when it is not placed."""
    for level, names in enumerate(LAYERS):
        if group_name in names:
            return level
    return None


def back_up(found: list[tuple[str, str, str, int]]) -> list[tuple[str, str, str, int]]:
    """The imports from a group to a group on a higher floor."""
    return [(a, b, kind, line) for a, b, kind, line in found
            if group(a) != group(b) and None not in (floor(group(a)), floor(group(b)))
            and floor(group(b)) < floor(group(a))]


def sccs(nodes: list[str], adj: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one member (iterative)."""
    index, low, on, stack, result, counter = {}, {}, set(), [], [], [0]
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(adj.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(adj.get(child, ())))))
                    break
                if child in on:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        member = stack.pop()
                        on.discard(member)
                        comp.append(member)
                        if member == node:
                            break
                    if len(comp) > 1:
                        result.append(sorted(comp))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument("--edges", action="store_true", help="also list every module edge")
    args = parser.parse_args(argv)
    modules, found = edges(Path(args.root))

    kinds = [kind for *_, kind, _ in found]
    print(f"{len(modules)} modules, {len({(a, b) for a, b, _, _ in found})} module edges from {len(found)} imports "
          f"({kinds.count('top')} top-level, {kinds.count('function')} in functions; those under TYPE_CHECKING "
          f"never run and are left out)")

    groups: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for a, b, kind, _ in found:
        if group(a) != group(b):
            groups[group(a)][group(b)].add(kind)
    print("\n# groups and the groups they import (kinds other than top-level in brackets)")
    for g in sorted({group(m) for m in modules}):
        targets = groups.get(g, {})
        shown = [t + ("" if "top" in kinds else f" [{'/'.join(sorted(kinds))}]") for t, kinds in sorted(targets.items())]
        print(f"{g}: {', '.join(shown) if shown else '-'}")

    adj: dict[str, set[str]] = defaultdict(set)
    for a, b, _, _ in found:
        adj[a].add(b)
    print("\n# cycles among modules (every import counted)")
    module_cycles = sccs(sorted(modules), adj)
    for comp in module_cycles:
        print("cycle: " + ", ".join(comp))
        for a, b, kind, line in sorted(found):
            if a in comp and b in comp:
                print(f"    {a}:{line} -> {b} ({kind})")
    if not module_cycles:
        print("none")

    gadj: dict[str, set[str]] = defaultdict(set)
    for a, b, _, _ in found:
        if group(a) != group(b):
            gadj[group(a)].add(group(b))
    print("\n# cycles between groups")
    group_cycles = sccs(sorted({group(m) for m in modules}), gadj)
    for comp in group_cycles:
        print("cycle: " + ", ".join(comp))
        for a, b, kind, line in sorted(found):
            if group(a) in comp and group(b) in comp and group(a) != group(b):
                print(f"    {a}:{line} -> {b} ({kind})")
    if not group_cycles:
        print("none")

    print("\n# imports that run back up the floors (LAYERS)")
    unplaced = sorted({group(m) for m in modules} - {g for names in LAYERS for g in names})
    for g in unplaced:
        print(f"group {g} is not placed on a floor: add it to LAYERS in scripts/import_graph.py")
    upward = back_up(found)
    for a, b, kind, line in upward:
        print(f"    {a}:{line} -> {b} ({kind}): floor {floor(group(a))} imports floor {floor(group(b))}")
    if not upward and not unplaced:
        print("none")

    if args.edges:
        print("\n# module edges")
        for a, b, kind, line in sorted(found):
            print(f"{a}:{line} -> {b} ({kind})")
    clean = not (module_cycles or group_cycles or upward or unplaced)
    print("\nno import circle, every import points down" if clean else
          "\nimport circles or imports back up remain")
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
