"""The docs name only files, modules and config keys that exist (light: no service is started).

Checked in README.md, examples/cua_agent/README.md and docs/*.md:

- every repository path they name, in a code span, a code block or a link (`cua_rl/...`, `tests/...`,
  `bench/...`, `scripts/...`, `examples/...`, `docs/...`; links relative to the page), exists; a pytest node
  id (`tests/x.py::test_y`) names a test that exists in that file;
- every dotted name in the package (`cua_rl.x.y`) is a module of the repository, optionally followed by a
  name that module defines;
- every `--flag` given to one of our commands (`train.sh`, `cua-gym`, `cua-agent`, `cua-monitor`, `cua-model`,
  `python -m cua_rl.sft|evaluate`, `bench/*.py`) is one that command defines;
- every config key written in Hydra override form (`a.b=value`, `+a.b=value`) in a code span or a shell
  code block is a key of the config the launcher loads from examples/cua_agent/config.yaml, written without
  `+` (config.yaml starts from CUAConfig's schema, so Hydra knows every field), except a new entry of a mapping;
  and every field, with every documented key, loads written that way;
- docs/layout.md's package block lists exactly the modules and packages of `cua_rl/`;
- no file of the repository cites a document the repository does not ship, every `docs/protocols.md §N`
  citation names a section of that page, and every `page.md, "Section"` citation and `page.md#anchor` link one of
  its page's;
- docs/local_gym.md counts the built-in tasks (in all, per category, per difficulty) as they are.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

from cua_rl.trainer.health import BY_NAME as HEALTH_CHECKS
from doc_snippets import NOT_SHELL, REPO, Snippet, all_snippets

CONFIG = REPO / "examples/cua_agent/config.yaml"
TOP = ("cua_rl", "tests", "bench", "scripts", "examples", "docs")

# What looks like a key=value or a path but is none, and why.
NOT_KEYS = {
    "key=value",        # the placeholder of "any other key=value argument" sentences and usage lines
}
NOT_PATHS = {
    "examples/cua_agent/.env",   # the user's own settings (git-ignored); .env.example is its shipped template
    "envs/miniwob_envs.py",      # a file of the installed miniwob package, read where pip put it
    "recover_info/COMMIT.json",  # written by a run into its checkpoint directory
    "recover_info/stream.json",
    "docs/bench/external_yardstick.json",   # issue 85's result: written by its seed runs, which have not run yet
}
# Unshipped documents that earlier code and docs cited.
UNSHIPPED = re.compile(r"DESIGN\.md|external-protocols|areal-notes|desktop-env-measurements|measurements §|"
                       r"field-survey")


# ---- paths ----------------------------------------------------------------------------------------------
PATH = re.compile(r"(?<![\w./~<${-])(?:\./)?((?:%s)/[\w./*@+-]*(?:::[\w\[\]-]+)?)" % "|".join(TOP))


def path_problem(raw: str) -> str | None:
    path, _, node = raw.partition("::")
    path = path.rstrip(".,:;")
    if path in NOT_PATHS:
        return None
    matches = list(REPO.glob(path)) if "*" in path else ([REPO / path] if (REPO / path).exists() else [])
    if not matches:
        return f"{path} does not exist"
    if node:
        name = node.split("[")[0]
        if not re.search(rf"^\s*(async\s+)?def {re.escape(name)}\b", matches[0].read_text(), re.M):
            return f"{path} has no test {name}"
    return None


# A file named relative to its package (`local_gym/miniwob.py`, `ui/app.js`): some file of the repository
# must end with it.
SHORT_PATH = re.compile(r"(?<![\w./~<${:-])((?:[\w.-]+/)+[\w.-]*\.(?:py|md|yaml|yml|json|sh|png|js|css|html|tcl|txt|"
                        r"jinja|toml))(?![\w/])")


def named_paths() -> list[tuple[Snippet, str]]:
    found = []
    for s in all_snippets():
        if s.kind == "link":
            target = s.text.split("#")[0]
            if target and not re.match(r"^[a-z]+:", target):
                found.append((s, str((s.doc.parent / target).resolve().relative_to(REPO))))
        else:
            found += [(s, m.group(1)) for m in PATH.finditer(s.text)]
    return found


def short_paths() -> list[tuple[Snippet, str]]:
    return [(s, m.group(1)) for s in all_snippets() if s.kind != "link" for m in SHORT_PATH.finditer(s.text)
            if m.group(1).lstrip("./").split("/")[0] not in TOP]


def test_every_repository_path_the_docs_name_exists():
    pairs = named_paths()
    assert len(pairs) > 100, "the extraction found too few paths: is the pattern broken?"
    problems = {f"{s.where()}: {p}" for s, raw in pairs if (p := path_problem(raw))}
    files = tracked_files()
    problems |= {f"{s.where()}: no file of the repository is {path}" for s, path in short_paths()
                 if path not in NOT_PATHS and not (s.doc.parent / path).exists()
                 and not any(f.endswith("/" + path) for f in files)}
    assert not problems, "\n".join(sorted(problems))


# ---- dotted module names --------------------------------------------------------------------------------
DOTTED = re.compile(r"(?<![\w./-])cua_rl(?:\.\w+)+")


@lru_cache(maxsize=None)
def defined_names(module: Path) -> frozenset[str]:
    tree = ast.parse(module.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


def dotted_problem(name: str) -> str | None:
    parts = name.split(".")
    path = REPO
    for i, part in enumerate(parts):
        if (path / part).is_dir() and (path / part / "__init__.py").exists():
            path = path / part
            continue
        if (path / f"{part}.py").exists():
            module, rest = path / f"{part}.py", parts[i + 1:]
        else:
            module, rest = path / "__init__.py", parts[i:]
        if rest and rest[0] not in defined_names(module):
            return f"{module.relative_to(REPO)} defines no {rest[0]}"
        return None
    return None


def test_every_cua_rl_module_the_docs_name_exists():
    found = [(s, m.group(0).rstrip(".")) for s in all_snippets() if s.kind != "link"
             for m in DOTTED.finditer(s.text)]
    assert len(found) > 30, "the extraction found too few module names: is the pattern broken?"
    problems = sorted({f"{s.where()}: {name}: {p}" for s, name in found if (p := dotted_problem(name))})
    assert not problems, "\n".join(problems)


# ---- command-line flags ---------------------------------------------------------------------------------
# Our commands, and the file whose argument parser (or flag table) defines their flags.
COMMANDS = [
    (r"(?:cua-gym|cua_rl\.local_gym)\b(?!\.)", "cua_rl/local_gym/__main__.py"),
    (r"(?:cua-agent|cua_rl\.local_agent)\b(?!\.)", "cua_rl/local_agent/__main__.py"),
    (r"(?:cua-monitor|cua_rl\.monitor)\b(?!\.)", "cua_rl/monitor/__main__.py"),
    (r"(?:cua-model|cua_rl\.local_model)\b(?!\.)", "cua_rl/local_model/__main__.py"),
    (r"(?:train\.sh|cua_rl\.run\.launch)\b", "cua_rl/run/cli.py"),
    (r"cua_rl\.sft\b(?!\.)", "cua_rl/sft/__main__.py"),
    (r"cua_rl\.evaluate\b", "cua_rl/evaluate.py"),
    (r"(?<![\w/])bench[/.](\w+)(?:\.py)?\b(?!\.json)", "bench/{}.py"),
]


def flags_of(source: Path) -> set[str]:
    text = source.read_text()
    flags = set(re.findall(r"[\"'](--[a-z][\w-]*)[\"']", text)) | {"--help"}
    if "load_expr_config" in text:   # AReaL's loader takes the config file
        flags.add("--config")
    return flags


def test_every_flag_the_docs_give_our_commands_exists():
    checked, problems = 0, []
    for s in all_snippets():
        if s.kind == "link":
            continue
        for pattern, source in COMMANDS:
            for m in re.finditer(pattern, s.text):
                path = REPO / source.format(*m.groups())
                if not path.exists():
                    problems.append(f"{s.where()}: {path.relative_to(REPO)} does not exist")
                    continue
                rest = re.split(r"[|;#`]|&&", s.text[m.end():])[0]
                used = {w.strip("[],").split("=")[0] for w in rest.split() if w.strip("[").startswith("--")}
                checked += len(used)
                problems += [f"{s.where()}: {path.relative_to(REPO)} has no flag {flag}"
                             for flag in sorted(used - flags_of(path))]
    assert checked > 30, "the extraction found too few flags: is the pattern broken?"
    assert not problems, "\n".join(sorted(set(problems)))


# ---- config keys ----------------------------------------------------------------------------------------
# key=value; not a version pin (`torch==2.10.0`) and not an option list (QEMU's `file=x.qcow2,if=virtio`).
OVERRIDE = re.compile(r"^(\+{0,2})([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*)=(?!=)([^=]*)$")


def overrides_in(snippet: Snippet) -> list[str]:
    """The words of a code span or a shell line that have the form of a Hydra override."""
    if snippet.kind == "link" or (snippet.kind == "block" and snippet.lang in NOT_SHELL):
        return []
    text = snippet.text
    if snippet.kind == "span" and "(" in text:   # a Python call: its name=value are keyword arguments
        return []
    words = [w.strip("[]'\",;") for w in text.split()]
    return [w for w in words if OVERRIDE.match(w) and w not in NOT_KEYS]


@pytest.fixture(scope="module")
def loaded_config(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("CUA_RL_FILEROOT", str(tmp_path_factory.mktemp("fileroot")))
    try:
        from cua_rl.run.launch import load_config

        yield load_config(str(CONFIG), [])
    finally:
        mp.undo()


def _open_mapping(config, keys: list[str]) -> bool:
    """Whether the loaded config has a mapping (not a section of fields) at ``keys``: Hydra adds its new
    entries with '+'."""
    obj = config
    for key in keys:
        if dataclasses.is_dataclass(obj) and key in {f.name for f in dataclasses.fields(obj)}:
            obj = getattr(obj, key)
        elif isinstance(obj, dict) and key in obj:
            obj = obj[key]
        else:
            return False
    return isinstance(obj, dict)


def has_path(obj, keys: list[str]) -> bool:
    for key in keys:
        if dataclasses.is_dataclass(obj):
            if key not in {f.name for f in dataclasses.fields(obj)}:
                return False
            obj = getattr(obj, key)
        elif isinstance(obj, dict):
            if key not in obj:
                return False
            obj = obj[key]
        else:
            return False
    return True


def documented_overrides() -> list[tuple[Snippet, str, str, str]]:
    """(where, the word, its '+' prefix, its key) of every override the docs write."""
    return [(s, w, *OVERRIDE.match(w).groups()[:2]) for s in all_snippets() for w in overrides_in(s)]


def test_every_config_key_the_docs_set_exists_and_has_the_right_prefix(loaded_config):
    """Every field of the config is a plain ``key=value`` (config.yaml starts from the schema of CUAConfig,
    cua_rl.config.SCHEMA); only a new entry of a mapping takes '+' (health.thresholds: the names it accepts)."""
    found = documented_overrides()
    assert len(found) > 20, "the extraction found too few overrides: is the pattern broken?"
    problems = []
    for s, word, plus, key in found:
        parts = key.split(".")
        if has_path(loaded_config, parts):
            if plus:
                problems.append(f"{s.where()}: {word}: {key} is a config field: set it without '{plus}'")
        elif plus and _open_mapping(loaded_config, parts[:-1]):
            if parts[:-1] == ["health", "thresholds"] and parts[-1] not in HEALTH_CHECKS:
                problems.append(f"{s.where()}: {word}: {parts[-1]} is not a health check")
        elif _open_mapping(loaded_config, parts[:-1]):
            problems.append(f"{s.where()}: {word}: {parts[-1]} is a new entry of the mapping {'.'.join(parts[:-1])}: "
                            f"Hydra needs '+{key}=...'")
        else:
            problems.append(f"{s.where()}: {word}: {key} is not a config key")
    assert not problems, "\n".join(sorted(set(problems)))


def _value(value) -> str:
    """A loaded config value written back as a Hydra override value."""
    from cua_rl.run.cli import hydra_str

    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return repr(value)
    return hydra_str(str(value))


def _composed_has_section(key: str) -> bool:
    """Whether Hydra's composition of config.yaml has the section holding ``key``: a section left null there,
    such as ``eval_gconfig`` (AReaL copies it from ``gconfig`` after loading), is given whole or not at all."""
    from omegaconf import OmegaConf

    parent = key.rpartition(".")[0]
    return not parent or OmegaConf.select(_composed(), parent) is not None


@lru_cache(maxsize=None)
def _composed():
    from areal.api.cli_args import parse_cli_args

    import cua_rl.config  # noqa: F401  registers the schema config.yaml starts from

    return parse_cli_args(["--config", str(CONFIG)])[0]


def _leaves(obj, prefix: str = ""):
    for f in dataclasses.fields(obj):
        value, key = getattr(obj, f.name), prefix + f.name
        if dataclasses.is_dataclass(value):
            yield from _leaves(value, key + ".")
        elif value is None or isinstance(value, (bool, int, float, str)):
            yield key, value


def test_every_config_field_and_every_documented_key_is_set_without_a_plus(loaded_config):
    """One load of config.yaml with every scalar field of the loaded CUAConfig (AReaL's included) and every key
    the docs set, each written as a plain ``key=value`` (its loaded value, so the values stay consistent).
    Hydra refused a key config.yaml lacked unless written '+key' (embedded.start_monitor=false,
    stats_logger.wandb.project=... in the docs failed)."""
    from cua_rl.run.launch import load_config

    fields = {key: value for key, value in _leaves(loaded_config) if _composed_has_section(key)}
    assert len(fields) > 300 and "embedded.start_monitor" in fields and "stats_logger.wandb.project" in fields
    scalars = dict(_leaves(loaded_config))
    documented = {key for _, _, plus, key in documented_overrides() if not plus and key in scalars}
    assert len(documented) > 20 and documented <= set(fields), sorted(documented - set(fields))
    overrides = [f"{key}={_value(value)}" for key, value in fields.items()]
    config = load_config(str(CONFIG), overrides)
    assert config.embedded.start_monitor == loaded_config.embedded.start_monitor
    again = load_config(str(CONFIG), ["embedded.start_monitor=false", "stats_logger.wandb.project=cua",
                                      "policy.max_images_per_request=16", "+health.thresholds.infra_lost_share=0.8"])
    assert (again.embedded.start_monitor, again.stats_logger.wandb.project, again.policy.max_images_per_request,
            again.health.thresholds) == (False, "cua", 16, {"infra_lost_share": 0.8})
    # commands written when such keys needed '+' still work: the loaders make a single '+' Hydra's '++'
    old = load_config(str(CONFIG), ["+embedded.start_monitor=false", "+policy.max_images_per_request=16"])
    assert (old.embedded.start_monitor, old.policy.max_images_per_request) == (False, 16)


# ---- the layout page ------------------------------------------------------------------------------------
def test_the_layout_page_lists_every_module_of_the_package():
    text = (REPO / "docs/layout.md").read_text()
    block = text.split("## The package", 1)[1].split("```", 2)[1]
    listed: set[str] = set()
    for line in block.splitlines():
        m = re.match(r"^  (\S.*?)(?:\s{2,}|$)", line)   # "  name[, name]   what it is" under cua_rl/
        if m and not line.startswith("   "):
            listed.update(n.strip() for n in m.group(1).split(","))
    package = REPO / "cua_rl"
    actual = {p.stem for p in package.glob("*.py") if p.stem != "__init__"} | {
        p.name for p in package.iterdir() if (p / "__init__.py").exists()}
    assert listed == actual, f"missing from the layout: {sorted(actual - listed)}; gone: {sorted(listed - actual)}"


# ---- citations ------------------------------------------------------------------------------------------
def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [f for f in out.splitlines() if (REPO / f).is_file()]


def test_no_file_cites_a_document_the_repository_does_not_ship():
    problems = []
    for rel in tracked_files():
        if rel == "tests/docs/test_docs_match_code.py":
            continue
        try:
            text = (REPO / rel).read_text()
        except UnicodeDecodeError:
            continue
        problems += [f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}" for m in UNSHIPPED.finditer(text)]
    assert not problems, "\n".join(problems)


def test_protocol_citations_name_sections_of_docs_protocols():
    page = (REPO / "docs/protocols.md").read_text()
    sections = set(re.findall(r"^#+ (\d+(?:\.\d+)?)\.? ", page, re.M))
    assert {"1.1", "1.6", "2.2", "2.3", "4.1"} <= sections
    cited = re.compile(r"protocols\.md\)?((?:[ ,]+§\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?(?:/§?\d+(?:\.\d+)?)*)+)")
    problems = []
    for rel in tracked_files():
        try:
            text = (REPO / rel).read_text()
        except UnicodeDecodeError:
            continue
        for m in cited.finditer(text):
            for number in re.findall(r"\d+(?:\.\d+)?", m.group(1)):
                if number not in sections:
                    problems.append(f"{rel}: cites protocols.md §{number}, which it does not have")
    assert not problems, "\n".join(problems)


# A page and a quoted section of it: `docs/learning.md, "The yardstick"`, `[notes/x.md](notes/x.md), "Flakes"`.
SECTION_CITATION = re.compile(r'((?:docs/)?(?:notes/)?[\w.-]+\.md)\)?,?\s+"([^"\n]{3,80})"')


def section_titles(page: Path) -> list[str]:
    """A page's headings and the bold leads of its paragraphs (`**The fourth task's calibration (...).**`)."""
    text = page.read_text()
    return re.findall(r"^#+ (.+)$", text, re.M) + re.findall(r"^\*\*(.+?)\*\*", text, re.M)


def cited_page(rel: str, name: str) -> Path | None:
    """The page a citation in file ``rel`` names: relative to the citing page for a doc, else to the repository."""
    for base in ([(REPO / rel).parent] if rel.endswith(".md") else []) + [REPO, REPO / "docs"]:
        if (base / name).is_file():
            return base / name
    return None


def test_every_cited_section_of_a_page_is_a_section_of_that_page():
    """Text moved between pages (docs/notes/ took the dated notes of learning.md and testing.md) must take its
    citations along: every `page.md, "Section"` in a tracked file names a heading or a bold paragraph lead of that
    page, and every `page.md#anchor` link an anchor of it."""
    checked, problems = 0, []
    for rel in tracked_files():
        if rel == "tests/docs/test_docs_match_code.py":
            continue
        try:
            text = (REPO / rel).read_text()
        except UnicodeDecodeError:
            continue
        for m in SECTION_CITATION.finditer(text):
            page = cited_page(rel, m.group(1))
            if page is None:
                continue   # another project's page, or one the path test already reports
            checked += 1
            if not any(title.startswith(m.group(2)) for title in section_titles(page)):
                line = text.count(chr(10), 0, m.start()) + 1
                problems.append(f'{rel}:{line}: {m.group(1)} has no section "{m.group(2)}"')
        for m in re.finditer(r"\]\(([\w./-]+\.md)#([\w-]+)\)", text):
            page = cited_page(rel, m.group(1))
            anchors = {re.sub(r"[^\w\- ]", "", t.lower()).replace(" ", "-") for t in section_titles(page or REPO)} \
                if page else set()
            checked += 1
            if m.group(2) not in anchors:
                problems.append(f"{rel}: {m.group(1)} has no anchor #{m.group(2)}")
    assert checked > 40, "the extraction found too few citations: is the pattern broken?"
    assert not problems, "\n".join(problems)


# ---- counts the docs state ------------------------------------------------------------------------------
def test_the_gym_page_counts_the_built_in_tasks_as_they_are():
    from collections import Counter

    from cua_rl.local_gym import load_tasks

    tasks = load_tasks().tasks
    text = " ".join((REPO / "docs/local_gym.md").read_text().split())
    m = re.search(r"YAML files in `cua_rl/local_gym/tasks/` \((\d+): (.*?); easy (\d+), normal (\d+), hard (\d+)\)",
                  text)
    assert m, "docs/local_gym.md no longer states the task counts in the form this test reads"
    stated = {name: int(n) for name, n in re.findall(r"\b([a-z_]+) (\d+)\b(?!-)", m.group(2))}
    assert int(m.group(1)) == len(tasks)
    assert stated == dict(Counter(t.category for t in tasks))
    assert [int(m.group(i)) for i in (3, 4, 5)] == [sum(t.difficulty == d for t in tasks)
                                                    for d in ("easy", "normal", "hard")]
