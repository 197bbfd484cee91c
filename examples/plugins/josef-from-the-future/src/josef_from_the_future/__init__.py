"""A plugin that declares a plugin API range this josef does not offer.

The ``example_plugin`` nox session installs its wheel and checks that
``josef server start`` stops at once with one line naming the distribution,
its range and the core's plugin API version.
"""

JOSEF_PLUGIN_API = ">=2.0,<3"
