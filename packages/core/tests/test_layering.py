"""Plugins import only the core's public modules, never each other; the core imports no plugin."""

import ast
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


def test_layering():
    packages = {p.name: p / "src" for p in PACKAGES.iterdir() if (p / "pyproject.toml").exists()}
    assert {"core", "storage-local", "metadata-kraft"} <= set(packages)
    violations = []
    for name, src in packages.items():
        own = {d.name for d in src.iterdir() if d.is_dir() and not d.name.startswith((".", "_"))}
        for path, module in imported_modules(src):
            top = module.split(".")[0]
            if name == "core" and top.startswith("josef_"):
                violations.append(f"{path}: the core imports plugin module {module}")
            if name != "core" and top.startswith("josef_") and top not in own:
                violations.append(f"{path}: imports another plugin, {module}")
            if name != "core" and (module.startswith("josef._") or "._internal" in module):
                violations.append(f"{path}: imports a private core module, {module}")
    assert not violations, "\n".join(violations)
