"""The plugin stays inside josef's public plugin API (josef.plugin_api.PUBLIC_API)."""

from pathlib import Path

from josef.testing.public_api import private_uses

import josef_topic_policy


def test_the_plugin_uses_only_the_public_plugin_api():
    # The installed package's sources: what the wheel delivers, wherever the tests run from.
    assert private_uses([Path(josef_topic_policy.__file__).parent]) == []
