"""Check the wheels and sdists of every distribution before they are published (the nox session ``build``).

    python tools/check_dists.py DIST_DIR

DIST_DIR holds what ``uv build`` made of each ``packages/*`` directory. For each
distribution of the repository, the wheel's METADATA and entry_points.txt must
show:

- the name and version of its pyproject.toml;
- every dependency on a josef distribution as a range, with a lower and an
  upper bound (never an exact pin nor an open end), that admits the version of
  that distribution built here (the repository's distributions fit together);
- for a plugin (a distribution that requires the core, ``josef``), an entry
  point in the ``josef`` group whose module is in the wheel;
- the keyword ``josef``;
- only official, non-deprecated Trove classifiers (the ``trove-classifiers``
  package);

and the sdist must hold a CHANGELOG.md with an entry for the version. Each
failed check prints one line; the exit status is 1 if any failed.
"""

from __future__ import annotations

import configparser
import re
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

from packaging.metadata import Metadata
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version
from trove_classifiers import classifiers as TROVE, deprecated_classifiers as TROVE_DEPRECATED

ROOT = Path(__file__).resolve().parent.parent
CORE = "josef"
ENTRY_POINT_GROUP = "josef"
LOWER = {">=", ">", "~="}
UPPER = {"<", "<=", "~="}


def is_josef(name: str) -> bool:
    name = canonicalize_name(name)
    return name == CORE or name.startswith(CORE + "-")


def projects(root: Path = ROOT) -> dict[str, tuple[Path, Version]]:
    """Every distribution of the repository: canonical name -> (its directory, its version), from pyproject.toml."""
    found = {}
    for pyproject in sorted(root.glob("packages/*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        found[canonicalize_name(project["name"])] = (pyproject.parent, Version(project["version"]))
    return found


def wheel_metadata(wheel: zipfile.ZipFile) -> tuple[Metadata, dict[str, dict[str, str]]]:
    """A wheel's parsed METADATA, and its entry points as group -> name -> value."""
    dist_info = next(n.split("/")[0] for n in wheel.namelist() if n.split("/")[0].endswith(".dist-info"))
    metadata = Metadata.from_email(wheel.read(f"{dist_info}/METADATA").decode(), validate=True)
    parser = configparser.ConfigParser(delimiters=("=",), interpolation=None)
    parser.optionxform = str  # entry point names are case-sensitive
    if f"{dist_info}/entry_points.txt" in wheel.namelist():
        parser.read_string(wheel.read(f"{dist_info}/entry_points.txt").decode())
    return metadata, {group: dict(parser[group]) for group in parser.sections()}


def range_problem(requirement: Requirement) -> str | None:
    """Why a requirement on a josef distribution is not a bounded range, or None."""
    operators = {spec.operator for spec in requirement.specifier}
    if operators & {"==", "==="}:
        return "is an exact pin"
    if not operators & LOWER:
        return "has no lower bound"
    if not operators & UPPER:
        return "has no upper bound"
    return None


def check_wheel(path: Path, projects: dict[str, tuple[Path, Version]]) -> list[str]:
    problems = []
    with zipfile.ZipFile(path) as wheel:
        metadata, entry_points = wheel_metadata(wheel)
        files = set(wheel.namelist())
    name = canonicalize_name(metadata.name)
    if name not in projects:
        return [f"{path.name}: {metadata.name} is not the name of any packages/*/pyproject.toml"]
    directory, version = projects[name]
    where = f"{metadata.name} {metadata.version}"
    if metadata.version != version:
        problems.append(f"{where}: version {metadata.version} but {directory.name}/pyproject.toml says {version}")
    requires_core = False
    for requirement in metadata.requires_dist or []:
        if not is_josef(requirement.name):
            continue
        dep = canonicalize_name(requirement.name)
        requires_core |= dep == CORE and requirement.marker is None  # an extra's need does not make a plugin
        if (problem := range_problem(requirement)) is not None:
            problems.append(f"{where}: requirement {requirement} {problem} (a range with both bounds is wanted)")
        elif dep in projects and not requirement.specifier.contains(projects[dep][1], prereleases=True):
            problems.append(f"{where}: requirement {requirement} excludes {requirement.name} {projects[dep][1]}, "
                            "the version built here")
    if requires_core:
        plugins = entry_points.get(ENTRY_POINT_GROUP, {})
        if not plugins:
            problems.append(f"{where}: requires {CORE} but has no entry point in the {ENTRY_POINT_GROUP!r} group")
        for ep_name, value in plugins.items():
            module = value.split(":")[0].strip()
            stem = module.replace(".", "/")
            if f"{stem}.py" not in files and f"{stem}/__init__.py" not in files:
                problems.append(f"{where}: entry point {ep_name} = {value}: module {module} is not in the wheel")
    if CORE not in (metadata.keywords or []):
        problems.append(f"{where}: keyword {CORE!r} missing (keywords: {metadata.keywords or []})")
    for classifier in metadata.classifiers or []:
        if classifier in TROVE_DEPRECATED:
            problems.append(f"{where}: deprecated Trove classifier {classifier!r}")
        elif classifier not in TROVE:
            problems.append(f"{where}: {classifier!r} is not a Trove classifier")
    return problems


def check_sdist(path: Path, version: Version) -> list[str]:
    """The sdist's CHANGELOG.md has a heading for ``version`` (Keep a Changelog: ``## [1.2.0] - 2026-01-31``)."""
    with tarfile.open(path) as sdist:
        changelog = next((m for m in sdist.getmembers() if m.name.count("/") == 1 and m.name.endswith("/CHANGELOG.md")),
                         None)
        if changelog is None:
            return [f"{path.name}: no CHANGELOG.md"]
        text = sdist.extractfile(changelog).read().decode()
    heading = re.compile(rf"^##\s+\[?v?{re.escape(str(version))}\]?(\s|$)", re.MULTILINE)
    if not heading.search(text):
        return [f"{path.name}: CHANGELOG.md has no entry for {version} (a '## [{version}] - DATE' heading)"]
    return []


def main(dist_dir: Path) -> int:
    known = projects()
    problems: list[str] = []
    for name, (directory, version) in known.items():
        stem = f"{name.replace('-', '_')}-{version}"
        wheels = sorted(dist_dir.glob(f"{stem}-*.whl"))
        sdists = sorted(dist_dir.glob(f"{stem}.tar.gz"))
        if not wheels:
            problems.append(f"{name} {version}: no wheel {stem}-*.whl in {dist_dir}")
        if not sdists:
            problems.append(f"{name} {version}: no sdist {stem}.tar.gz in {dist_dir}")
        for wheel in wheels:
            problems += check_wheel(wheel, known)
        for sdist in sdists:
            problems += check_sdist(sdist, version)
    for line in problems:
        print(line)
    print(f"{len(known)} distributions checked: "
          + (f"{len(problems)} problem(s)" if problems else "wheel and sdist metadata in order"))
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1])))
