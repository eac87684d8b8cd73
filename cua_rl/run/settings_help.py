"""Each setting's help and choices, read from the field that defines it (``field(metadata={"help", "choices"})``,
as AReaL's own config classes write them), with ``ast``: nothing is imported, so ``train.sh --help`` answers in a
blink without loading AReaL, and still shows the text the field carries (one definition of a setting's help).

A dotted key (``train_dataset.batch_size``, ``health.on_anomaly``) is walked from ``CUAConfig`` through the
annotated types of its fields and the classes' bases, across this project's config modules and AReaL's
``areal/api/cli_args.py`` (found on disk, not imported). ``choices`` may be a literal list or ``list(NAME)`` of a
module-level tuple of strings.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]   # cua_rl
# The modules that define CUAConfig and its sections (scripts and tests read the same list).
CONFIG_MODULES = ("config.py", "trajectory/config.py", "trainer/health.py", "areal_ext/vllm_config.py",
                  "policy/endpoint.py", "genv/fleet_config.py")
ROOT_CLASS = "CUAConfig"
# Modules whose module-level constants a field's ``choices`` may name besides its own module's (an imported name).
CONSTANT_MODULES = ("trajectory/groups.py",)


@dataclass(frozen=True)
class Setting:
    """One field: where it is defined, its help (``""`` when the field carries none) and its choices."""

    key: str
    owner: str          # the class that defines the field
    help: str
    choices: tuple[str, ...] = ()


def _areal_cli_args() -> Path | None:
    spec = importlib.util.find_spec("areal")   # the package's location only; areal/__init__ is not run
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "api" / "cli_args.py"
    return path if path.is_file() else None


def _sources() -> list[Path]:
    paths = [PACKAGE / m for m in CONFIG_MODULES]
    areal = _areal_cli_args()
    return paths + ([areal] if areal else [])


@lru_cache(maxsize=1)
def _index() -> tuple[dict[str, ast.ClassDef], dict[str, dict[str, ast.expr]]]:
    """(class name -> its definition, class name -> the module-level constants beside it)."""
    classes: dict[str, ast.ClassDef] = {}
    constants: dict[str, dict[str, ast.expr]] = {}
    for path in _sources():
        tree = ast.parse(path.read_text(), filename=str(path))
        names = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
                 for t in node.targets if isinstance(t, ast.Name)}
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name not in classes:
                classes[node.name] = node
                constants[node.name] = names
    return classes, constants


@lru_cache(maxsize=1)
def _shared_constants() -> dict[str, ast.expr]:
    return {t.id: node.value for path in CONSTANT_MODULES for node in ast.parse((PACKAGE / path).read_text()).body
            if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)}


def fields(class_name: str) -> dict[str, ast.AnnAssign]:
    """The annotated fields of ``class_name`` and of its bases (a subclass's own win)."""
    classes, _ = _index()
    node = classes.get(class_name)
    if node is None:
        return {}
    out: dict[str, ast.AnnAssign] = {}
    for base in node.bases:
        if isinstance(base, ast.Name):
            out.update(fields(base.id))
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            out[item.target.id] = item
    return out


def own_fields(class_name: str) -> dict[str, ast.AnnAssign]:
    """The fields ``class_name`` itself defines (not its bases')."""
    node = _index()[0].get(class_name)
    return {item.target.id: item for item in (node.body if node else [])
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)}


def _owner(class_name: str, name: str) -> str:
    node = _index()[0][class_name]
    if name in own_fields(class_name):
        return class_name
    for base in node.bases:
        if isinstance(base, ast.Name) and name in fields(base.id):
            return _owner(base.id, name)
    return class_name


def _type_of(annotation: ast.expr) -> str | None:
    """The config class an annotation names (``X``, ``X | None``, ``Optional[X]``), if any."""
    classes, _ = _index()
    for node in ast.walk(annotation):
        if isinstance(node, ast.Name) and node.id in classes:
            return node.id
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in classes:
            return node.value
    return None


def _metadata(item: ast.AnnAssign) -> dict[str, ast.expr]:
    call = item.value
    if not (isinstance(call, ast.Call) and getattr(call.func, "id", getattr(call.func, "attr", "")) == "field"):
        return {}
    for kw in call.keywords:
        if kw.arg == "metadata" and isinstance(kw.value, ast.Dict):
            return {k.value: v for k, v in zip(kw.value.keys, kw.value.values) if isinstance(k, ast.Constant)}
    return {}


def _strings(node: ast.expr | None, constants: dict[str, ast.expr]) -> tuple[str, ...]:
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("list", "tuple") and node.args:
        node = node.args[0]
    if isinstance(node, ast.Name):
        node = constants.get(node.id, _shared_constants().get(node.id))
    if isinstance(node, (ast.List, ast.Tuple)):
        return tuple(str(e.value) for e in node.elts if isinstance(e, ast.Constant))
    return ()


def setting(key: str, root: str = ROOT_CLASS) -> Setting | None:
    """The field behind a dotted config key, or None when no class defines it."""
    class_name = root
    parts = key.split(".")
    for i, name in enumerate(parts):
        item = fields(class_name).get(name)
        if item is None:
            return None
        if i == len(parts) - 1:
            owner = _owner(class_name, name)
            meta = _metadata(item)
            text = meta.get("help")
            help_text = text.value if isinstance(text, ast.Constant) and isinstance(text.value, str) else ""
            return Setting(key, owner, " ".join(help_text.split()),
                           _strings(meta.get("choices"), _index()[1].get(owner, {})))
        class_name = _type_of(item.annotation)
        if class_name is None:
            return None
    return None


def help_of(key: str) -> str:
    """The help a flag setting ``key`` shows: the field's, with its choices."""
    s = setting(key)
    if s is None:
        return ""
    choices = [c if c else '""' for c in s.choices]
    return s.help + (f" (one of: {', '.join(choices)})" if choices and "one of" not in s.help else "")


def own_classes() -> list[str]:
    """CUAConfig and every section class of ours below it, in the order the fields name them (AReaL's classes and
    their fields are AReaL's to document)."""
    ours = {node.name for path in CONFIG_MODULES for node in ast.parse((PACKAGE / path).read_text()).body
            if isinstance(node, ast.ClassDef)}
    order: list[str] = []

    def visit(name: str) -> None:
        if name in order or name not in ours:
            return
        order.append(name)
        for item in fields(name).values():
            sub = _type_of(item.annotation)
            if sub:
                visit(sub)
    visit(ROOT_CLASS)
    return order


def _sections() -> list[tuple[str, str]]:
    """(key prefix, class) for CUAConfig ("") and each section of ours reachable from it by plain fields."""
    out, queue, seen = [], [("", ROOT_CLASS)], set()
    ours = set(own_classes())
    while queue:
        prefix, name = queue.pop(0)
        if name in seen:
            continue
        seen.add(name)
        out.append((prefix, name))
        for field_name, item in own_fields(name).items():
            sub = _type_of(item.annotation)
            if sub in ours and "list[" not in ast.unparse(item.annotation):
                queue.append((f"{prefix}{field_name}.", sub))
    return out


def _default(item: ast.AnnAssign) -> str:
    call = item.value
    if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "field":
        for kw in call.keywords:
            if kw.arg == "default":
                return ast.unparse(kw.value)
            if kw.arg == "default_factory":
                factory = ast.unparse(kw.value)
                return {"list": "[]", "dict": "{}"}.get(factory, factory.removeprefix("lambda: "))
        return ""
    return ast.unparse(call) if call is not None else ""


def markdown() -> str:
    """docs/settings.md: every setting of ours, section by section, written from the fields (a test keeps the
    page equal to this)."""
    lines = ["# Settings", "",
             "Every setting this project adds to AReaL's `GRPOConfig`, as its field defines it (default, help, "
             "choices). Generated from the source by `python -m cua_rl.run.settings_help > docs/settings.md`; "
             "tests/run/test_settings_help.py keeps this page equal to the fields. AReaL's own settings "
             "(`actor.*`, `rollout.*`, `gconfig.*`, ...) are documented by AReaL; `train.sh --help` shows both for "
             "the flags.", ""]
    for prefix, name in _sections():
        lines += [f"## `{prefix.rstrip('.') or 'top level'}` ({name})", "", "| key | default | help |", "|---|---|---|"]
        for field_name, item in own_fields(name).items():
            s = setting(field_name, name)
            if s is None:
                continue
            sub = _type_of(item.annotation)
            text = s.help.replace("|", "\\|")
            if sub in own_classes() and sub != name:
                lines.append(f"| `{prefix}{field_name}` | a section | {text} ({sub}, its table below) |")
                continue
            if s.choices:
                text += " Choices: " + ", ".join(f"`{c}`" if c else '`""`' for c in s.choices) + "."
            default = _default(item).replace("|", "\\|")
            lines.append(f"| `{prefix}{field_name}` | `{default}` | {text} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(), end="")
