from pathlib import Path

from josef.testing.public_api import private_uses


def test_uses_only_the_public_plugin_api():
    assert private_uses([Path(__file__).parent.parent / "src" / "josef_console"]) == []
