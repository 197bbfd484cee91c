"""The console's configuration keys (``server.properties``, or AlterConfigs on a broker for the dynamic ones)."""

from __future__ import annotations

from josef.config import ConfigKey, ConfigType, at_least

ACTIONS_ENABLE = "console.actions.enable"
REFRESH_MS = "console.refresh.ms"
SAMPLE_MS = "console.throughput.sample.ms"
WINDOW_MS = "console.throughput.window.ms"

CONFIG_KEYS = (
    ConfigKey(ACTIONS_ENABLE, ConfigType.BOOLEAN, False,
              "Whether the console offers actions that change the cluster (create a topic, reset a group's offsets). "
              "Off, it is read-only. On, each action still needs the HTTP user to be authorized for it by the "
              "cluster's authorizer (CREATE on the topic or cluster; READ on the group and its topics).",
              dynamic=True),
    ConfigKey(REFRESH_MS, ConfigType.INT, 5000,
              "How often an open console page refreshes its main section in place, in ms (0: never).",
              at_least(0), dynamic=True),
    ConfigKey(SAMPLE_MS, ConfigType.INT, 5000,
              "How often the console samples every topic's end offsets for its throughput charts, in ms.",
              at_least(500), dynamic=True),
    ConfigKey(WINDOW_MS, ConfigType.INT, 300_000,
              "How far back the console's throughput charts reach, in ms (read when the node starts).",
              at_least(10_000)),
)
