"""Configuration with Kafka's key names: definitions, parsing and validation.

Keys are declared (by the core and by plugins, through the ``register_configs``
hook) as :class:`ConfigKey` objects. A :class:`Config` is the typed view of a
``server.properties`` file plus ``--override`` values; it is validated as a
whole when it is built, so a bad value stops start-up with a message naming
the key rather than failing later in the middle of a request.

Topic-level keys (``retention.ms``) are the same :class:`ConfigKey` objects
with a ``topic_name``; their broker-level name (``log.retention.ms``) gives
the default that a topic override replaces, as in Kafka.
"""

from __future__ import annotations

import enum
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import attrs
import pluggy


class ConfigError(ValueError):
    """A configuration value is missing, malformed or out of range."""


class ConfigType(enum.IntEnum):
    """Kafka's config types, numbered as in DescribeConfigs v3+."""

    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7
    CLASS = 8
    PASSWORD = 9


class ConfigSource(enum.IntEnum):
    """Where a value came from, numbered as in DescribeConfigs (clients may meet every one of them)."""

    UNKNOWN = 0
    DYNAMIC_TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5
    DYNAMIC_BROKER_LOGGER_CONFIG = 6
    CLIENT_METRICS_CONFIG = 7
    GROUP_CONFIG = 8

    @classmethod
    def of(cls, value: int) -> ConfigSource:
        """The source numbered ``value``; UNKNOWN for numbers newer brokers may add."""
        try:
            return cls(value)
        except ValueError:
            return cls.UNKNOWN


class AlterOp(enum.IntEnum):
    """IncrementalAlterConfigs operations: SET a value, DELETE an override, APPEND to or SUBTRACT from a list."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


#: Where Kafka's per-listener keys start: ``listener.name.<listener>.<key>``.
LISTENER_PREFIX = "listener.name."

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

Validator = Callable[[Any], None]


def at_least(minimum: int | float) -> Validator:
    def check(value: Any) -> None:
        if value is not None and value < minimum:
            raise ConfigError(f"must be at least {minimum}")

    return check


def between(low: int | float, high: int | float) -> Validator:
    def check(value: Any) -> None:
        if value is not None and not low <= value <= high:
            raise ConfigError(f"must be between {low} and {high}")

    return check


def one_of(*choices: str) -> Validator:
    def check(value: Any) -> None:
        values = value if isinstance(value, list) else [value]
        for v in values:
            if v is not None and v not in choices:
                raise ConfigError(f"must be one of {', '.join(choices)}")

    return check


@attrs.frozen
class ConfigKey:
    """One configuration key.

    ``topic_name`` is set for keys a topic can override: ``name`` is then the
    broker-level default (``log.retention.ms``) and ``topic_name`` the
    topic-level key (``retention.ms``). A ``topic_only`` key has no broker
    level at all (Kafka's throttled-replica lists): ``name`` and
    ``topic_name`` are the same, brokers neither accept nor describe it, and
    its default is the declared one. ``dynamic`` keys may be changed at run
    time through AlterConfigs on a broker resource. A ``per_listener`` key
    may also be given for one listener, as Kafka's
    ``listener.name.<listener name in lower case>.<key>`` (the ``ssl.*``
    keys): the definition knows those names as the same key. A ``prefix``
    key's value is the prefix of settings its plugin reads itself (Kafka's
    ``remote.log.storage.manager.impl.prefix``, ``rsm.config.``): the broker
    does not warn about keys under it.

    ``group_name`` is set, likewise, for keys a group can override through a
    GROUP config resource (plugin API 1.5, Kafka's GroupConfig):
    ``group.share.record.lock.duration.ms`` is the broker's default of a share
    group's ``share.record.lock.duration.ms``. A ``group_only`` key
    (``share.auto.offset.reset``) has no broker level: ``name`` and
    ``group_name`` are the same and its default is the declared one.
    """

    name: str
    type: ConfigType
    default: Any
    doc: str
    validator: Validator | None = None
    topic_name: str | None = None
    dynamic: bool = False
    sensitive: bool = False
    topic_only: bool = False
    per_listener: bool = False
    prefix: bool = False
    group_name: str | None = None
    group_only: bool = False

    def parse(self, raw: Any) -> Any:
        """Turn a string (or an already typed value) into this key's type, validated."""
        try:
            value = _parse(self.type, raw)
            if self.validator is not None:
                self.validator(value)
        except (ConfigError, ValueError) as exc:
            raise ConfigError(f"invalid value {raw!r} for configuration {self.name}: {exc}") from None
        return value

    def render(self, value: Any) -> str | None:
        """The string form DescribeConfigs shows (None for a null value)."""
        if value is None:
            return None
        if self.type is ConfigType.BOOLEAN:
            return "true" if value else "false"
        if self.type is ConfigType.LIST:
            return ",".join(value)
        return str(value)


def _parse(kind: ConfigType, raw: Any) -> Any:
    if raw is None:
        return None
    if not isinstance(raw, str):
        return _check_typed(kind, raw)
    text = raw.strip()
    if kind is ConfigType.BOOLEAN:
        if text.lower() not in ("true", "false"):
            raise ConfigError("expected true or false")
        return text.lower() == "true"
    if kind in (ConfigType.INT, ConfigType.SHORT, ConfigType.LONG):
        return _check_typed(kind, int(text))
    if kind is ConfigType.DOUBLE:
        return float(text)
    if kind is ConfigType.LIST:
        return [item.strip() for item in text.split(",") if item.strip()]
    return raw


def _check_typed(kind: ConfigType, value: Any) -> Any:
    """Values given as Python objects (client keyword arguments) must already have the key's type."""
    if kind is ConfigType.BOOLEAN and not isinstance(value, bool):
        raise ConfigError("expected a boolean")
    if kind in (ConfigType.INT, ConfigType.SHORT, ConfigType.LONG):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError("expected an integer")
        limit = {ConfigType.INT: INT32_MAX, ConfigType.SHORT: 2**15 - 1, ConfigType.LONG: INT64_MAX}[kind]
        if not -limit - 1 <= value <= limit:
            raise ConfigError("out of range")
    if kind is ConfigType.DOUBLE and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ConfigError("expected a number")
    if kind is ConfigType.LIST:
        if isinstance(value, (list, tuple)):
            return [str(v) for v in value]
        raise ConfigError("expected a list")
    if kind in (ConfigType.STRING, ConfigType.PASSWORD) and not isinstance(value, str):
        raise ConfigError("expected a string")
    return value


class ConfigDef:
    """The set of known keys, gathered from the core and every plugin."""

    def __init__(self, keys: Iterable[ConfigKey] = ()) -> None:
        self._keys: dict[str, ConfigKey] = {}
        self._topic_keys: dict[str, ConfigKey] = {}
        self._group_keys: dict[str, ConfigKey] = {}
        for key in keys:
            self.add(key)

    @classmethod
    def from_plugins(cls, pm: pluggy.PluginManager) -> ConfigDef:
        definition = cls()
        for impl in pm.hook.register_configs.get_hookimpls():
            owner = pm.get_name(impl.plugin)
            impl.function(register=lambda key, _owner=owner: definition.add(key, _owner))
        return definition

    def add(self, key: ConfigKey, owner: str = "?") -> None:
        if key.name in self._keys or (key.topic_name and key.topic_name in self._topic_keys) or (
                key.group_name and key.group_name in self._group_keys):
            raise ConfigError(f"configuration key {key.name} is declared twice (again by {owner})")
        if key.topic_only and key.topic_name != key.name:
            raise ConfigError(f"topic-only configuration key {key.name} must have the same topic_name")
        if key.group_only and key.group_name != key.name:
            raise ConfigError(f"group-only configuration key {key.name} must have the same group_name")
        if not key.topic_only and not key.group_only:
            self._keys[key.name] = key
        if key.topic_name:
            self._topic_keys[key.topic_name] = key
        if key.group_name:
            self._group_keys[key.group_name] = key

    def __getitem__(self, name: str) -> ConfigKey:
        try:
            return self._keys[name]
        except KeyError:
            key = self._listener_key(name)
            if key is None:
                raise
            return key

    def __contains__(self, name: str) -> bool:
        return name in self._keys or self._listener_key(name) is not None

    def _listener_key(self, name: str) -> ConfigKey | None:
        """``listener.name.<listener>.<key>`` of a ``per_listener`` key, as a key of that name; None otherwise."""
        if not name.startswith(LISTENER_PREFIX):
            return None
        listener, _, base = name[len(LISTENER_PREFIX):].partition(".")
        key = self._keys.get(base)
        if not listener or key is None or not key.per_listener:
            return None
        return attrs.evolve(key, name=name)

    def keys(self) -> list[ConfigKey]:
        return list(self._keys.values())

    def topic_key(self, topic_name: str) -> ConfigKey:
        """The key behind a topic-level name; :class:`ConfigError` when there is none."""
        try:
            return self._topic_keys[topic_name]
        except KeyError:
            raise ConfigError(f"unknown topic configuration {topic_name}") from None

    def topic_keys(self) -> list[ConfigKey]:
        return list(self._topic_keys.values())

    def group_key(self, group_name: str) -> ConfigKey:
        """The key behind a group-level name; :class:`ConfigError` when there is none."""
        try:
            return self._group_keys[group_name]
        except KeyError:
            raise ConfigError(f"unknown group configuration {group_name}") from None

    def group_keys(self) -> list[ConfigKey]:
        return list(self._group_keys.values())

    def parse_topic_configs(self, raw: Mapping[str, str | None]) -> dict[str, Any]:
        """Validate topic-level overrides, keyed by topic-level name."""
        return {name: self.topic_key(name).parse(value) for name, value in raw.items()}


@attrs.frozen
class Config:
    """A validated, typed broker configuration.

    ``static`` holds what server.properties and ``--override`` said;
    ``dynamic`` what AlterConfigs set for this broker at run time and
    ``cluster_default`` what it set for all brokers (both kept in the metadata
    log). Lookups take the first of: dynamic, cluster default, static, default.
    """

    definition: ConfigDef
    static: Mapping[str, Any]
    dynamic: Mapping[str, Any] = attrs.field(factory=dict)
    #: Keys in the input that no plugin declared; kept and shown, as Kafka does.
    unknown: Mapping[str, str] = attrs.field(factory=dict)
    cluster_default: Mapping[str, Any] = attrs.field(factory=dict)

    @classmethod
    def build(cls, definition: ConfigDef, raw: Mapping[str, str]) -> Config:
        static: dict[str, Any] = {}
        unknown: dict[str, str] = {}
        for name, value in raw.items():
            if name in definition:
                static[name] = definition[name].parse(value)
            else:
                unknown[name] = value
        return cls(definition, static, {}, unknown)

    def __getitem__(self, name: str) -> Any:
        for layer in (self.dynamic, self.cluster_default, self.static):
            if name in layer:
                return layer[name]
        return self.definition[name].default

    def is_set(self, name: str) -> bool:
        """Whether anything but the declared default gives ``name`` its value."""
        return name in self.dynamic or name in self.cluster_default or name in self.static

    def source(self, name: str) -> ConfigSource:
        if name in self.dynamic:
            return ConfigSource.DYNAMIC_BROKER_CONFIG
        if name in self.cluster_default:
            return ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG
        if name in self.static:
            return ConfigSource.STATIC_BROKER_CONFIG
        return ConfigSource.DEFAULT_CONFIG

    def for_listener(self, listener: str, name: str) -> Any:
        """A ``per_listener`` key's value on ``listener``: its ``listener.name.<listener>.<key>`` value when set (in
        any layer), else the key's own, as Kafka resolves listener overrides."""
        specific = f"{LISTENER_PREFIX}{listener.lower()}.{name}"
        return self[specific] if self.is_set(specific) else self[name]

    def with_dynamic(self, dynamic: Mapping[str, Any], cluster_default: Mapping[str, Any] | None = None) -> Config:
        return attrs.evolve(self, dynamic=dict(dynamic), cluster_default=dict(cluster_default or {}))

    def topic_default(self, key: ConfigKey) -> Any:
        """The broker-wide default of a topic-level key, with Kafka's unit synonyms."""
        if key.topic_only:
            return key.default
        chain = _SYNONYMS.get(key.name, ((key.name, 1),))
        explicit = [(n, s) for n, s in chain if self.is_set(n)]
        for synonym, scale in explicit + [(n, s) for n, s in chain if self[n] is not None]:
            value = self[synonym]
            return value * scale if scale != 1 and value >= 0 else value
        return None

    def group_default(self, key: ConfigKey) -> Any:
        """The broker-wide default of a group-level key (its broker key's value; a group-only key's default)."""
        return key.default if key.group_only else self[key.name]

    def group_config(self, overrides: Mapping[str, str]) -> dict[str, Any]:
        """Every group-level key's effective value for a group with these overrides (``DescribeConfigs`` of a
        GROUP resource; what share and consumer groups run with), keyed by group-level name."""
        values = {}
        for key in self.definition.group_keys():
            name = key.group_name or key.name
            values[name] = key.parse(overrides[name]) if name in overrides else self.group_default(key)
        return values

    def topic_config(self, overrides: Mapping[str, Any]) -> dict[str, Any]:
        """Every topic-level key's effective value for a topic with these overrides."""
        return {
            key.topic_name: overrides[key.topic_name] if key.topic_name in overrides else self.topic_default(key)
            for key in self.definition.topic_keys()
            if key.topic_name
        }


#: Broker keys that stand for a topic key's default in another unit, most specific first.
_SYNONYMS: dict[str, tuple[tuple[str, int], ...]] = {
    "log.retention.ms": (("log.retention.ms", 1), ("log.retention.minutes", 60_000), ("log.retention.hours", 3_600_000)),
    "log.roll.ms": (("log.roll.ms", 1), ("log.roll.hours", 3_600_000)),
    "log.roll.jitter.ms": (("log.roll.jitter.ms", 1), ("log.roll.jitter.hours", 3_600_000)),
}


def synonyms(key: ConfigKey) -> tuple[str, ...]:
    """Broker-level names that set a topic key's default, most specific first."""
    return tuple(name for name, _ in _SYNONYMS.get(key.name, ((key.name, 1),)))


_PROPERTY_LINE = re.compile(r"^\s*([^=:\s]+)\s*[=:\s]\s*(.*)$")


def read_properties(path: Path) -> dict[str, str]:
    """Read a Java ``.properties`` file: ``key=value``, ``key: value``, ``#``/``!`` comments, ``\\`` continuations."""
    result: dict[str, str] = {}
    pending = ""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = pending + line.lstrip() if pending else line
        pending = ""
        stripped = line.strip()
        if not stripped or stripped[0] in "#!":
            continue
        if stripped.endswith("\\") and not stripped.endswith("\\\\"):
            pending = stripped[:-1]
            continue
        match = _PROPERTY_LINE.match(stripped)
        if match:
            result[match.group(1)] = match.group(2).strip()
        elif "=" not in stripped and ":" not in stripped:
            result[stripped] = ""
        else:
            raise ConfigError(f"{path}:{number}: cannot read line {line!r}")
    return result


def parse_overrides(overrides: Iterable[str]) -> dict[str, str]:
    """``key=value`` strings from ``--override`` into a dict, rejecting anything else."""
    result: dict[str, str] = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--override expects key=value, got {item!r}")
        result[key.strip()] = value.strip()
    return result
