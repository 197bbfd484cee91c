"""The layering of the monorepo, checked from the sources and each package's pyproject.

- The core imports no other package (not the client, not a plugin).
- A package imports another josef package only when its pyproject depends on
  it, directly or, for a package that is not a plugin, through an extra (an
  optional feature that imports it when used, as josef-spark's ``tiered``).
- A plugin (a package with ``josef`` entry points) depends on no josef
  distribution but the core: plugins never import each other.
- Only the core imports the core's private modules.
"""

import ast
import re
import tomllib
from pathlib import Path

PACKAGES = Path(__file__).resolve().parents[2]


def imported_modules(source_dir: Path):
    for path in source_dir.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield path, alias.name
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                yield path, node.module


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0]


def load_packages() -> dict[str, dict]:
    """Each package folder's distribution name, import names, josef dependencies and entry points."""
    packages = {}
    for folder in PACKAGES.iterdir():
        if not (folder / "pyproject.toml").exists():
            continue
        project = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
        requires = {_name(dep) for dep in project.get("dependencies", [])}
        extras = {_name(dep) for deps in project.get("optional-dependencies", {}).values() for dep in deps}
        packages[folder.name] = {
            "dist": project["name"],
            "src": folder / "src",
            "imports": {d.name for d in (folder / "src").iterdir() if d.is_dir() and not d.name.startswith((".", "_"))},
            "requires": {r for r in requires if r == "josef" or r.startswith("josef-")},
            "extras": {r for r in extras if r == "josef" or r.startswith("josef-")},
            "plugin": "josef" in project.get("entry-points", {}),
        }
    return packages


def test_layering():
    packages = load_packages()
    assert {"core", "client", "storage-local", "metadata-kraft", "coordinator-group"} <= set(packages)
    dist_of = {name: p["dist"] for p in packages.values() for name in p["imports"]}
    violations = []
    for folder, package in packages.items():
        if package["plugin"] and package["requires"] - {"josef"}:
            violations.append(f"plugin {package['dist']} depends on {sorted(package['requires'] - {'josef'})}")
        for path, module in imported_modules(package["src"]):
            top = module.split(".")[0]
            dist = dist_of.get(top)
            if folder == "core" and dist is not None and dist != "josef":
                violations.append(f"{path}: the core imports {module} ({dist})")
            elif (dist is not None and top not in package["imports"] and dist not in package["requires"]
                  and (package["plugin"] or dist not in package["extras"])):
                violations.append(f"{path}: imports {module} but {package['dist']} does not depend on {dist}")
            if folder != "core" and (module.startswith("josef._") or "._internal" in module):
                violations.append(f"{path}: imports a private core module, {module}")
    assert not violations, "\n".join(violations)


def test_the_core_depends_on_no_other_josef_package():
    assert load_packages()["core"]["requires"] == set()
