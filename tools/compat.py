"""Plugin/core compatibility across releases (the nox session ``compat``): do the version ranges tell the truth?

    python tools/compat.py [--work DIR] [--python PYTHON]

For each plugin distribution (one with an entry point in the ``josef`` group),
two cells:

(a) the plugin's previous release (the newest ``<dist>-vX.Y.Z`` tag below its
    current version), built from the tag, beside the current core: installed
    together into a fresh venv by uv's resolver. If the plugin's ``josef`` range
    excludes the current core the installer must refuse ("excluded by ranges":
    the range doing its job); if the range admits it, they must install and
    pass the smoke test.
(b) the current plugin beside the oldest core its range allows: the core at
    the newest tag matching the range's lower bound (the current tree when the
    lower bound is the current version); they must install and pass the smoke
    test.

A broker needs its other plugins too: each cell takes, for every other plugin,
the current tree's build if its range admits the cell's core, else the newest
tag whose range does. The smoke test starts a single-node broker
(``python -m josef server start`` on a free port, a temporary ``log.dirs``) in
the cell's venv, runs tools/compat_smoke.py there with the cell's josef-client
(topic, idempotent and transactional writes, a consumer group reading them
back), and stops the broker by its PID; the broker must exit 0. Cells that
install the same wheels share one venv and one smoke run, and every wheel is
built once. Prints a table of the cells; exits 1 if any result was not the
expected one.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from check_dists import ENTRY_POINT_GROUP, wheel_metadata

ROOT = Path(__file__).resolve().parent.parent
CORE = "josef"
TREE = "tree"  # the source of a build from the working tree, as opposed to a tag
READY = re.compile(r"ready on PLAINTEXT://[^:,\s]+:(\d+)")
START_TIMEOUT_S = 60
SMOKE_TIMEOUT_S = 180
STOP_TIMEOUT_S = 30
#: Over `josef server start`'s single-node defaults: internal topics of one partition and no initial rebalance
#: delay, so a smoke run takes a second or two.
BROKER_OVERRIDES = {
    "group.initial.rebalance.delay.ms": "0",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.num.partitions": "1",
}
#: What uv prints when requirements exclude each other (as opposed to a network or build failure).
UNSATISFIABLE = re.compile(r"No solution found|unsatisfiable|requirements are unsatisfiable", re.IGNORECASE)


@dataclass(frozen=True)
class Build:
    """One distribution at one version, from the tree or from a tag, as a wheel."""

    name: str
    version: Version
    source: str  # TREE or a tag name
    wheel: Path
    josef_ranges: dict[str, SpecifierSet]  # requirements on josef distributions
    plugin: bool

    def admits(self, name: str, version: Version) -> bool:
        return name not in self.josef_ranges or self.josef_ranges[name].contains(version, prereleases=True)

    @property
    def label(self) -> str:
        return f"{self.name} {self.version} ({'tree' if self.source == TREE else 'tag'})"


@dataclass
class Cell:
    kind: str
    plugin: Build
    core: Build
    companions: list[Build] = field(default_factory=list)
    expect_install: bool = True
    result: str = ""
    ok: bool = False

    @property
    def wheels(self) -> tuple[Path, ...]:
        return tuple(sorted({b.wheel for b in [self.core, self.plugin, *self.companions]}))


def run(args: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, **kwargs)


def uv() -> str:
    found = shutil.which("uv")
    if found is None:
        sys.exit("compat: uv is not on the PATH")
    return found


class Builder:
    """Wheels of every distribution from the working tree and from release tags, each built once."""

    def __init__(self, work: Path):
        self.work = work
        self.builds: dict[tuple[str, str], Build] = {}
        self.trees: dict[str, Path] = {}  # commit -> extracted packages/ of it
        self.tags = self._release_tags()

    def _release_tags(self) -> dict[str, list[tuple[Version, str]]]:
        """Release tags ``<dist>-v<version>``, by canonical distribution name, oldest first."""
        names = set(self._tree_projects())
        tags: dict[str, list[tuple[Version, str]]] = {}
        for tag in run(["git", "-C", str(ROOT), "tag", "--list"], check=True).stdout.split():
            match = re.fullmatch(r"(?P<dist>.+)-v(?P<version>\d[\w.+!-]*)", tag)
            if match and canonicalize_name(match["dist"]) in names:
                try:
                    version = Version(match["version"])
                except InvalidVersion:
                    print(f"  tag {tag}: {match['version']!r} is not a version, ignored")
                    continue
                tags.setdefault(canonicalize_name(match["dist"]), []).append((version, tag))
        return {name: sorted(found) for name, found in tags.items()}

    @staticmethod
    def _projects_under(packages: Path) -> dict[str, Path]:
        found = {}
        for pyproject in sorted(packages.glob("*/pyproject.toml")):
            found[canonicalize_name(tomllib.loads(pyproject.read_text())["project"]["name"])] = pyproject.parent
        return found

    def _tree_projects(self) -> dict[str, Path]:
        return self._projects_under(ROOT / "packages")

    def _tag_projects(self, tag: str) -> dict[str, Path]:
        commit = run(["git", "-C", str(ROOT), "rev-list", "-n1", tag], check=True).stdout.strip()
        if commit not in self.trees:
            target = self.work / "src" / commit[:12]
            target.mkdir(parents=True)
            archive = target / "packages.tar"
            run(["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive), commit, "packages"],
                check=True)
            with tarfile.open(archive) as tar:
                tar.extractall(target, filter="data")
            archive.unlink()
            self.trees[commit] = target / "packages"
        return self._projects_under(self.trees[commit])

    def current(self) -> dict[str, Build]:
        """The tree's core and plugins (distributions with entry points in the ``josef`` group)."""
        builds = {}
        for name, directory in self._tree_projects().items():
            project = tomllib.loads((directory / "pyproject.toml").read_text())["project"]
            if name == CORE or ENTRY_POINT_GROUP in project.get("entry-points", {}):
                builds[name] = self.build(name, TREE)
            else:
                print(f"  {project['name']}: not a plugin (no {ENTRY_POINT_GROUP!r} entry point), no cells")
        return builds

    def build(self, name: str, source: str) -> Build:
        key = (name, source)
        if key in self.builds:
            return self.builds[key]
        projects = self._tree_projects() if source == TREE else self._tag_projects(source)
        if name not in projects:
            raise RuntimeError(f"{name} has no directory under packages/ at {source}")
        out = self.work / "wheels" / f"{name}-{source}"
        started = time.monotonic()
        done = run([uv(), "build", "--wheel", "--no-sources", "--quiet", "--out-dir", str(out), str(projects[name])])
        if done.returncode:
            raise RuntimeError(f"uv build of {name} at {source} failed:\n{done.stderr}")
        [wheel] = out.glob("*.whl")
        with zipfile.ZipFile(wheel) as zf:
            metadata, entry_points = wheel_metadata(zf)
        ranges = {canonicalize_name(r.name): r.specifier for r in map(Requirement, map(str, metadata.requires_dist or []))
                  if canonicalize_name(r.name) == CORE or canonicalize_name(r.name).startswith(CORE + "-")}
        build = Build(name, metadata.version, source, wheel, ranges, bool(entry_points.get(ENTRY_POINT_GROUP)))
        if source != TREE and not source.endswith(f"-v{build.version}"):
            raise RuntimeError(f"tag {source} builds {name} {build.version}")
        print(f"  built {build.label} in {time.monotonic() - started:.1f}s", flush=True)
        self.builds[key] = build
        return build

    def newest_tag(self, name: str, *, below: Version | None = None, within: SpecifierSet | None = None,
                   admitting: tuple[str, Version] | None = None) -> Build | None:
        """The newest release of ``name`` below a version / in a range / whose ranges admit a distribution's version."""
        for version, tag in reversed(self.tags.get(name, [])):
            if below is not None and version >= below:
                continue
            if within is not None and not within.contains(version, prereleases=True):
                continue
            build = self.build(name, tag)
            if admitting is None or build.admits(*admitting):
                return build
        return None


def lower_bound(spec: SpecifierSet) -> Version | None:
    bounds = [Version(s.version) for s in spec if s.operator in (">=", ">", "~=")]
    return max(bounds) if bounds else None


def oldest_core(builder: Builder, current: dict[str, Build], plugin: Build) -> Build | None:
    """The core at the newest tag matching the plugin's range's lower bound, or the tree's when that is the tree's."""
    spec = plugin.josef_ranges.get(CORE, SpecifierSet())
    tree_core = current[CORE]
    bound = lower_bound(spec)
    if bound is None:
        return None
    width = len(bound.release)
    matching = [(v, tag) for v, tag in builder.tags.get(CORE, [])
                if spec.contains(v, prereleases=True) and v.release[:width] == bound.release[:width]]
    if matching:
        return builder.build(CORE, max(matching)[1])
    if spec.contains(tree_core.version, prereleases=True) and tree_core.version.release[:width] == bound.release[:width]:
        return tree_core
    # Nothing released on the lower bound's line: the oldest release the range admits, else the tree's core.
    admitted = [(v, tag) for v, tag in builder.tags.get(CORE, []) if spec.contains(v, prereleases=True)]
    if admitted:
        return builder.build(CORE, min(admitted)[1])
    return tree_core if spec.contains(tree_core.version, prereleases=True) else None


def companions(builder: Builder, current: dict[str, Build], plugin: Build, core: Build) -> list[Build]:
    """The other plugins a broker runs with: the tree's if its range admits ``core``, else the newest tag that does."""
    chosen = []
    for name, build in sorted(current.items()):
        if not build.plugin or name == plugin.name:
            continue
        if not build.admits(CORE, core.version):
            build = builder.newest_tag(name, admitting=(CORE, core.version))
        if build is None:
            raise RuntimeError(f"no release of {name} admits {core.label}")
        chosen.append(build)
    return chosen


def install(venv: Path, wheels: tuple[Path, ...], python: str) -> subprocess.CompletedProcess[str]:
    shutil.rmtree(venv, ignore_errors=True)
    run([uv(), "venv", "--quiet", "--python", python, str(venv)], check=True)
    return run([uv(), "pip", "install", "--python", str(venv / "bin" / "python"), *map(str, wheels)])


def strays(venv: Path, wheels: tuple[Path, ...]) -> str:
    """josef distributions in the venv that are not among the wheels given (the resolver found them elsewhere)."""
    given = {wheel.resolve().as_uri() for wheel in wheels}
    frozen = run([uv(), "pip", "freeze", "--python", str(venv / "bin" / "python")], check=True).stdout.splitlines()
    return ", ".join(line for line in frozen if re.match(rf"{CORE}\b", line, re.IGNORECASE)
                     and line.partition(" @ ")[2] not in given)


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME") and not k.startswith("JOSEF_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def smoke(venv: Path, scratch: Path) -> tuple[bool, str]:
    """A broker from the venv, the smoke client against it, the broker stopped by PID. (passed, what happened)"""
    python = str(venv / "bin" / "python")
    scratch.mkdir(parents=True, exist_ok=True)
    log_path = scratch / "broker.log"
    overrides = {"listeners": "PLAINTEXT://127.0.0.1:0", "log.dirs": str(scratch / "logs"), **BROKER_OVERRIDES}
    command = [python, "-m", CORE, "server", "start"]
    for key, value in overrides.items():
        command += ["--override", f"{key}={value}"]
    with open(log_path, "wb") as log:
        broker = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  env=clean_env(), cwd=scratch)

    def tail() -> str:
        return "\n".join("    " + line for line in log_path.read_text(errors="replace").splitlines()[-15:])

    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        port = None
        while port is None:
            if (match := READY.search(log_path.read_text(errors="replace"))) is not None:
                port = int(match[1])
            elif broker.poll() is not None:
                return False, f"broker exited with code {broker.returncode} before it was ready:\n{tail()}"
            elif time.monotonic() > deadline:
                return False, f"broker not ready within {START_TIMEOUT_S}s:\n{tail()}"
            else:
                time.sleep(0.1)
        try:
            client = run([python, str(ROOT / "tools" / "compat_smoke.py"), f"127.0.0.1:{port}"],
                         env=clean_env(), timeout=SMOKE_TIMEOUT_S, cwd=scratch)
        except subprocess.TimeoutExpired:
            return False, f"smoke client did not finish within {SMOKE_TIMEOUT_S}s"
        if client.returncode:
            return False, f"smoke client failed (exit {client.returncode}):\n{client.stdout}{client.stderr}\n{tail()}"
    finally:
        if broker.poll() is None:
            os.kill(broker.pid, signal.SIGTERM)
            try:
                broker.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.kill(broker.pid, signal.SIGKILL)
                broker.wait()
                return False, f"broker pid {broker.pid} did not stop within {STOP_TIMEOUT_S}s of SIGTERM:\n{tail()}"
    if broker.returncode != 0:
        return False, f"broker exited with code {broker.returncode} after SIGTERM:\n{tail()}"
    return True, client.stdout.strip()


def plan(builder: Builder) -> list[Cell]:
    current = builder.current()
    core = current[CORE]
    cells = []
    for name, plugin in sorted(current.items()):
        if not plugin.plugin:
            continue
        previous = builder.newest_tag(name, below=plugin.version)
        if previous is None:
            print(f"  {plugin.label}: no earlier release, no cell (a)")
        else:
            cells.append(Cell("previous plugin, current core", previous, core,
                              companions(builder, current, previous, core),
                              expect_install=previous.admits(CORE, core.version)))
        oldest = oldest_core(builder, current, plugin)
        if oldest is None:
            cells.append(Cell("current plugin, oldest core in range", plugin, core, [], True,
                              f"UNEXPECTED: no josef core (tag or tree) in {CORE}{plugin.josef_ranges.get(CORE, '')}"))
        else:
            cells.append(Cell("current plugin, oldest core in range", plugin, oldest,
                              companions(builder, current, plugin, oldest)))
    return cells


def execute(cells: list[Cell], work: Path, python: str) -> None:
    runs: dict[tuple[Path, ...], tuple[bool, str, str]] = {}  # wheels -> (installed, installer output, smoke result)
    for cell in cells:
        if cell.result:  # decided while planning
            continue
        key = cell.wheels
        if key not in runs:
            digest = hashlib.sha1("\n".join(map(str, key)).encode()).hexdigest()[:10]
            started = time.monotonic()
            installed = install(work / "venvs" / digest, key, python)
            if installed.returncode == 0 and (stray := strays(work / "venvs" / digest, key)):
                runs[key] = (True, installed.stderr, f"SMOKE NOT RUN: the installer took {stray} from an index")
            elif installed.returncode == 0:
                passed, what = smoke(work / "venvs" / digest, work / "runs" / digest)
                outcome = ("smoke ok" if passed else "SMOKE FAILED") + f" ({time.monotonic() - started:.0f}s)"
                if not passed:
                    print(f"  {outcome}: {what}", flush=True)
                runs[key] = (True, installed.stderr, outcome)
            else:
                runs[key] = (False, installed.stderr, "")
        installed, output, outcome = runs[key]
        if installed:
            cell.ok = cell.expect_install and outcome.startswith("smoke ok")
            cell.result = outcome if cell.expect_install else f"UNEXPECTED: installed although ranges exclude; {outcome}"
        elif cell.expect_install:
            cell.result = "UNEXPECTED: installer refused: " + " ".join(output.split())[:400]
        elif UNSATISFIABLE.search(output):
            cell.ok = True
            cell.result = (f"excluded by ranges ({cell.plugin.name} needs {CORE}{cell.plugin.josef_ranges[CORE]}; "
                           "uv refused)")
        else:
            cell.result = "UNEXPECTED: install failed for another reason: " + " ".join(output.split())[:400]


def table(cells: list[Cell]) -> str:
    rows = [("cell", "plugin", "core", "other plugins", "result")]
    for cell in cells:
        others = ", ".join(f"{b.name.removeprefix(CORE + '-')} {b.version}" + ("" if b.source == TREE else "*")
                           for b in cell.companions)
        rows.append((cell.kind, cell.plugin.label, cell.core.label, others or "-", cell.result))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = []
    for n, row in enumerate(rows):
        lines.append("  ".join(value.ljust(widths[i]) for i, value in enumerate(row[:4])) + "  " + row[4])
        if n == 0:
            lines.append("-" * len(lines[0]))
    return "\n".join(lines) + "\n(tree: built from the working tree; tag: from its release tag; other plugins: * from a tag)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, help="keep wheels, venvs and broker logs here (default: a temp dir)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter of the cells' venvs")
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="josef-compat-") as scratch:
        work = args.work or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        print("building wheels:", flush=True)
        builder = Builder(work)
        try:
            cells = plan(builder)
        except RuntimeError as exc:
            print(f"compat: {exc}")
            return 1
        print(f"running {len({c.wheels for c in cells if not c.result})} distinct installs for {len(cells)} cells:",
              flush=True)
        execute(cells, work, args.python)
    print()
    print(table(cells))
    failed = [c for c in cells if not c.ok]
    print(f"\n{len(cells) - len(failed)} of {len(cells)} cells as expected in {time.monotonic() - started:.0f}s"
          + (f"; {len(failed)} UNEXPECTED" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
