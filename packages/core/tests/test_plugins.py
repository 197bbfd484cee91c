import inspect

import pytest

from josef import hookimpl, hookspecs
from josef.config import ConfigDef, ConfigError, ConfigKey, ConfigType
from josef.plugins import PluginError, Registry, collect, get_plugin_manager

HOOKS = sorted(name for name, f in inspect.getmembers(hookspecs, inspect.isfunction) if name.startswith("register_"))


def test_every_hook_is_documented():
    for name in HOOKS:
        doc = inspect.getdoc(getattr(hookspecs, name)) or ""
        assert "Called" in doc and "Returns" in doc, f"{name} must say when it is called and what it returns"


def test_design_hooks_exist():
    assert set(HOOKS) >= {
        "register_log_storage", "register_metadata_quorum", "register_coordinators", "register_authorizers",
        "register_partitioners", "register_assignors", "register_interceptors", "register_remote_storage",
        "register_configs", "register_commands",
    }


@pytest.mark.parametrize("hook", [h for h in HOOKS if h not in ("register_configs", "register_commands")])
def test_each_registration_hook_reaches_a_registry(hook):
    class Plugin:
        pass

    marker = object()
    setattr(Plugin, hook, staticmethod(hookimpl(lambda register: register("mine", marker))))
    pm = get_plugin_manager(autoload=False, plugins=[Plugin()])
    registry = collect(pm, hook, hook)
    assert registry.get("mine") is marker


def test_register_configs_hook_adds_keys():
    class Plugin:
        @staticmethod
        @hookimpl
        def register_configs(register):
            register(ConfigKey("my.plugin.size", ConfigType.INT, 5, "A size."))

    pm = get_plugin_manager(autoload=False, plugins=[Plugin()])
    definition = ConfigDef.from_plugins(pm)
    assert definition["my.plugin.size"].default == 5
    assert "log.segment.bytes" in definition


def test_config_key_declared_twice_is_an_error():
    class Plugin:
        @staticmethod
        @hookimpl
        def register_configs(register):
            register(ConfigKey("num.partitions", ConfigType.INT, 5, "Again."))

    with pytest.raises(ConfigError, match="num.partitions"):
        ConfigDef.from_plugins(get_plugin_manager(autoload=False, plugins=[Plugin()]))


def test_register_commands_hook_adds_a_command():
    import click
    from click.testing import CliRunner

    class Plugin:
        @staticmethod
        @hookimpl
        def register_commands(cli):
            @cli.command("hello")
            def hello():
                click.echo("hi from a plugin")

    group = click.Group("josef")
    get_plugin_manager(autoload=False, plugins=[Plugin()]).hook.register_commands(cli=group)
    assert CliRunner().invoke(group, ["hello"]).output == "hi from a plugin\n"


def test_duplicate_names_name_both():
    registry: Registry[str] = Registry("log storage")
    registry.register("local", "A", owner="one")
    with pytest.raises(PluginError) as info:
        registry.register("local", "B", owner="two")
    assert "'A'" in str(info.value) and "'B'" in str(info.value) and "one" in str(info.value) and "two" in str(info.value)


def test_unknown_name_lists_installed():
    registry: Registry[str] = Registry("log storage")
    registry.register("local", "A")
    registry.register("tiered", "B")
    with pytest.raises(PluginError, match="installed: local, tiered"):
        registry.get("lokal")


def test_builtin_authorizer_registered_through_the_hook():
    registry = collect(get_plugin_manager(autoload=False), "register_authorizers", "authorizer")
    assert registry.names() == ["acl", "allow-all", "org.apache.kafka.metadata.authorizer.StandardAuthorizer"]


def test_unknown_hook_implementation_is_rejected():
    class Plugin:
        @staticmethod
        @hookimpl
        def register_nonsense(register):
            pass

    with pytest.raises(Exception, match="register_nonsense"):
        get_plugin_manager(autoload=False, plugins=[Plugin()])


def test_installed_plugins_load_through_entry_points():
    pm = get_plugin_manager()
    assert {"storage-local", "metadata-kraft"} <= {name for name, _ in pm.list_name_plugin()}
    blocked = get_plugin_manager(block=["metadata-kraft"])
    assert "metadata-kraft" not in {name for name, _ in blocked.list_name_plugin()}


def test_autoload_can_be_disabled_by_environment(monkeypatch):
    monkeypatch.setenv("JOSEF_DISABLE_PLUGIN_AUTOLOAD", "1")
    names = {name for name, _ in get_plugin_manager().list_name_plugin()}
    assert names == {"josef.node.builtins"}


def test_plugin_that_fails_to_import_names_its_distribution(monkeypatch):
    import importlib.metadata

    class Dist:
        name = "josef-broken"

    class BrokenEntryPoint:
        name = "broken"
        dist = Dist()

        def load(self):
            raise ImportError("No module named 'josef_broken'")

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [BrokenEntryPoint()])
    with pytest.raises(PluginError, match="'broken' from distribution 'josef-broken' failed to import"):
        get_plugin_manager()
    assert get_plugin_manager(block=["josef-broken"]) is not None
