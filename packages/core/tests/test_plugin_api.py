"""The plugin API: every plugin here stays inside it, ranges are checked at load, deprecations warn once."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from josef import hookimpl, plugin_api
from josef.plugin_api import PLUGIN_API_VERSION, PUBLIC_API, JosefDeprecationWarning
from josef.plugins import PluginError, get_plugin_manager
from josef.testing.public_api import private_uses

REPO = Path(__file__).resolve().parents[3]


def plugin_sources() -> list[Path]:
    """The source folders of every plugin distribution of this repository and of its examples."""
    sources = [p for p in (REPO / "packages").glob("*/src/*") if p.parent.parent.name != "core" and p.is_dir()]
    sources += [p for p in (REPO / "examples" / "plugins").glob("*/src/*") if p.is_dir()]
    return sources


def test_every_plugin_in_this_repository_uses_only_the_public_api():
    sources = plugin_sources()
    assert len(sources) >= 6
    assert private_uses(sources) == []


def test_the_check_names_private_imports_and_reaches_into_the_node(tmp_path):
    plugin = tmp_path / "plugin.py"
    plugin.write_text(
        "from josef.node.broker import Broker\n"            # a private module
        "from josef.plugins import BUILTIN_PLUGINS\n"       # a private name of a public module
        "from josef.metadata import controller\n"           # a private submodule of a public package
        "import josef.replication.partition\n"
        "from josef.log import LogStorage\n"                # public
        "from josef.metadata import quorum\n"               # public submodule
        "def handler(ctx):\n"
        "    return ctx.broker.image, ctx.services.image\n")
    assert [use.split(": ", 1)[1] for use in private_uses([plugin])] == [
        "from josef.node.broker import Broker",
        "from josef.plugins import BUILTIN_PLUGINS",
        "from josef.metadata import controller",
        "import josef.replication.partition",
        ".broker (use the services: ctx.services, context.services)",
    ]


def test_every_public_module_exists_and_every_listed_name_is_in_it():
    import importlib

    for module, names in PUBLIC_API.items():
        loaded = importlib.import_module(module)
        if names != "*":
            assert [n for n in names if not hasattr(loaded, n)] == [], module


def install_plugin(site: Path, distribution: str, module: str, body: str) -> None:
    """What installing a plugin's wheel leaves in site-packages: its module and its dist-info with the entry point."""
    (site / f"{module}.py").write_text(body)
    info = site / f"{distribution.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[josef]\n{distribution} = {module}\n")


@pytest.mark.parametrize("declared", [">=2.0,<3", "<1.0"], ids=["newer", "older"])
def test_a_plugin_whose_range_excludes_this_core_is_refused_in_one_line(tmp_path, monkeypatch, declared, request):
    module = f"plugin_{request.node.callspec.id}"
    install_plugin(tmp_path, "josef-from-the-future", module, f'JOSEF_PLUGIN_API = "{declared}"\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError) as refused:
        get_plugin_manager(autoload=True)
    assert str(refused.value) == (f"plugin distribution josef-from-the-future 1.0 supports plugin API {declared}, "
                                  f"but this josef offers plugin API {PLUGIN_API_VERSION}")


def test_start_up_stops_on_an_incompatible_plugin(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    install_plugin(site, "josef-from-the-future", "future_plugin", 'JOSEF_PLUGIN_API = ">=2.0,<3"\n')
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    started = subprocess.run(
        [sys.executable, "-m", "josef", "server", "start", "--override", "listeners=PLAINTEXT://127.0.0.1:0",
         "--override", "http.listeners=http://127.0.0.1:0",
         "--override", f"log.dirs={tmp_path / 'data'}"], env=env, capture_output=True, text=True, timeout=60)
    assert started.returncode == 1
    assert started.stderr.strip() == (
        "Error: plugin distribution josef-from-the-future 1.0 supports plugin API >=2.0,<3, "
        f"but this josef offers plugin API {PLUGIN_API_VERSION}")
    assert not (tmp_path / "data").exists()


def test_a_plugin_without_a_range_loads_with_a_warning(tmp_path, monkeypatch, caplog):
    install_plugin(tmp_path, "josef-unversioned", "unversioned_plugin",
                   "from josef import hookimpl\n\n@hookimpl\ndef register_authorizers(register):\n"
                   "    register('unversioned', object)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    pm = get_plugin_manager(autoload=True)
    assert pm.get_plugin("josef-unversioned") is not None
    assert "plugin distribution josef-unversioned 1.0 declares no plugin API range" in caplog.text


def test_an_unreadable_range_is_refused(tmp_path, monkeypatch):
    install_plugin(tmp_path, "josef-garbled", "garbled_plugin", 'JOSEF_PLUGIN_API = "one point oh"\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError, match="declares an unreadable plugin API range 'one point oh'"):
        get_plugin_manager(autoload=True)


class UsesADeprecatedHook:
    @hookimpl
    def register_record_decoders(self, register):
        register("old", lambda key, value: (key, value))


def test_a_plugin_implementing_a_deprecated_hook_is_warned_once(monkeypatch):
    monkeypatch.setattr(plugin_api, "DEPRECATED_HOOKS", {"register_record_decoders": ("register_decoders", "2.0")})
    monkeypatch.setattr(plugin_api, "_warned", set())
    plugin = UsesADeprecatedHook()
    with pytest.warns(JosefDeprecationWarning) as warned:
        get_plugin_manager(autoload=False, plugins=[plugin])
        get_plugin_manager(autoload=False, plugins=[plugin])
    assert [str(w.message) for w in warned] == [
        f"hook register_record_decoders (implemented by plugin {get_plugin_manager(autoload=False, plugins=[plugin]).get_name(plugin)}) "
        "is deprecated and goes in plugin API 2.0: use register_decoders"]


def test_deprecated_contract_members_still_work_and_warn_once(josef_broker, monkeypatch):
    monkeypatch.setattr(plugin_api, "_warned", set())
    services = josef_broker.broker.services
    with pytest.warns(JosefDeprecationWarning, match=r"BrokerServices.pm is deprecated .* use BrokerServices.plugins"):
        assert services.pm is services.plugins
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert services.pm is services.plugins  # the second use is silent
    with pytest.warns(JosefDeprecationWarning, match="use BrokerServices.call_peer"):
        assert services.peers is not None


def test_josef_plugins_lists_each_distribution_what_it_registers_and_what_is_selected(tmp_path, monkeypatch):
    import json

    from click.testing import CliRunner

    from josef.cli import build_cli

    install_plugin(tmp_path, "josef-acme", "acme_plugin",
                   'from josef import hookimpl\nJOSEF_PLUGIN_API = ">=1.0,<2"\n\n'
                   "@hookimpl\ndef register_authorizers(register):\n    register('acme', object)\n\n"
                   "@hookimpl\ndef register_partitioners(register):\n    register('acme-hash', object)\n\n"
                   "@hookimpl\ndef register_policies(register):\n    register('acme-policy', object)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    runner = CliRunner()
    listed = runner.invoke(build_cli(), ["plugins", "--override", "authorizer.class.name=acme",
                                         "--override", "alter.config.policy.class.name=acme-policy"])
    assert listed.exit_code == 0, listed.output
    assert listed.output.startswith(f"josef {josef_version()}, plugin API {PLUGIN_API_VERSION}\n")
    assert ("\njosef-acme (josef-acme 1.0, plugin API >=1.0,<2)\n  authorizers: acme [selected]\n"
            "  policies: acme-policy [selected]\n  partitioners: acme-hash\n") in listed.output
    assert "  authorizers: allow-all,\n      org.apache.kafka.metadata.authorizer.StandardAuthorizer, acl\n" in listed.output  # the core's, none selected
    as_json = json.loads(runner.invoke(build_cli(), ["plugins", "--json"]).output)
    [acme] = [p for p in as_json["plugins"] if p["name"] == "josef-acme"]
    assert acme == {"name": "josef-acme", "distribution": "josef-acme", "version": "1.0", "plugin_api": ">=1.0,<2",
                    "registers": {"authorizers": ["acme"], "policies": ["acme-policy"], "partitioners": ["acme-hash"]},
                    "apis": {}, "selected": {}}
    [core] = [p for p in as_json["plugins"] if p["distribution"] == "josef"]
    assert core["selected"] == {"authorizers": ["allow-all"]} and "log.dirs" in core["registers"]["configs"]
    for plugin in as_json["plugins"]:  # coordinators installed in this environment name the APIs they answer
        assert set(plugin["apis"]) == set(plugin["registers"].get("coordinators", []))
    refused = runner.invoke(build_cli(), ["plugins", "--override", "authorizer.class.name=nobody"])
    assert refused.exit_code == 1
    assert "authorizer.class.name=nobody: no authorizers of that name is installed; installed: acl, acme, allow-all, org.apache.kafka.metadata.authorizer.StandardAuthorizer" \
        in refused.output
    refused = runner.invoke(build_cli(), ["plugins", "--override", "create.topic.policy.class.name=nobody"])
    assert refused.exit_code == 1 and "create.topic.policy.class.name=nobody: no policies of that name" in refused.output


def josef_version() -> str:
    import josef

    return josef.__version__


def test_the_guide_s_first_plugin_works_as_written(tmp_path, monkeypatch):
    """docs/plugins.md's five-minute plugin, installed as its pyproject says, does what the guide says."""
    import re

    from josef.authorizer import Action
    from josef.node.server_properties import load_config
    from josef.testing.authorizer import context
    from josef.plugins import collect

    guide = (REPO / "docs" / "plugins.md").read_text()
    [code] = re.findall(r"```python\n# src/josef_acme/plugin.py\n(.*?)```", guide, re.S)
    install_plugin(tmp_path, "josef-acme", "acme_guide_plugin", code)
    monkeypatch.syspath_prepend(str(tmp_path))
    pm = get_plugin_manager(autoload=True)
    config = load_config(None, {"authorizer.class.name": "acme", "acme.writers": "User:alice"}, pm)
    authorizer = collect(pm, "register_authorizers", "authorizer").get(config["authorizer.class.name"])(config)
    write, read = Action("WRITE", "TOPIC", "orders"), Action("READ", "TOPIC", "orders")
    assert authorizer.authorize(context("User:alice"), [write, read]) == [True, True]
    assert authorizer.authorize(context("User:eve"), [write, read]) == [False, True]
