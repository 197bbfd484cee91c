"""SASL authentication on a broker's SASL_PLAINTEXT listeners: the mechanisms and their configuration.

A listener's mechanisms are Kafka's: ``sasl.enabled.mechanisms`` (or
``listener.name.<listener>.sasl.enabled.mechanisms``), each configured by
``listener.name.<listener>.<mechanism>.sasl.jaas.config`` in Kafka's JAAS
syntax. PLAIN checks the ``user_<name>="<password>"`` options of
``PlainLoginModule``, as Kafka's PlainServerCallbackHandler does.

Nothing here may put a password into a log line or an error message: a
failed authentication is answered with Kafka's fixed message and logged
with the client's address alone.
"""

from __future__ import annotations

import hmac
import re
from typing import Mapping, Protocol

import attrs

from josef.config import Config, ConfigError
from josef.security import KafkaPrincipal

PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
#: The mechanisms josef's brokers answer.
SUPPORTED_MECHANISMS = ("PLAIN",)
#: Kafka's answer to any failed PLAIN authentication: it says nothing about which part was wrong.
INVALID_CREDENTIALS = "Authentication failed: Invalid username or password"

_JAAS = re.compile(r"\s*(?P<module>[\w.$]+)\s+(?P<flag>required|requisite|sufficient|optional)(?P<options>.*?);\s*$", re.S)
_OPTION = re.compile(r'\s*(?P<key>[\w.\-]+)\s*=\s*(?:"(?P<quoted>(?:[^"\\]|\\.)*)"|(?P<bare>[^\s;]+))')


class SaslAuthenticationError(Exception):
    """Credentials refused; the message is what the client is told (it names no secret)."""


def parse_jaas(text: str, key: str) -> tuple[str, dict[str, str]]:
    """The login module and options of one JAAS entry (``Module required a="b" c="d";``).

    ``key`` names the configuration key in errors, never the value (it holds passwords).
    """
    match = _JAAS.fullmatch(text)
    if match is None:
        raise ConfigError(f"{key}: not a JAAS login module entry (expected: LoginModule required key=\"value\" ...;)")
    options: dict[str, str] = {}
    rest = match["options"]
    pos = 0
    while rest[pos:].strip():
        option = _OPTION.match(rest, pos)
        if option is None:
            raise ConfigError(f"{key}: cannot read the options of {match['module']} (expected key=\"value\" pairs)")
        quoted = option["quoted"]
        options[option["key"]] = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else option["bare"]
        pos = option.end()
    return match["module"], options


class Mechanism(Protocol):
    def authenticate(self, token: bytes) -> KafkaPrincipal:
        """The principal a client's single SASL token proves; :class:`SaslAuthenticationError` otherwise."""


class PlainMechanism:
    """SASL/PLAIN (RFC 4616) against the users of a PlainLoginModule JAAS entry."""

    def __init__(self, users: Mapping[str, str]) -> None:
        self._users = dict(users)

    @classmethod
    def from_jaas(cls, text: str, key: str) -> PlainMechanism:
        module, options = parse_jaas(text, key)
        if module != PLAIN_LOGIN_MODULE:
            raise ConfigError(f"{key}: PLAIN needs {PLAIN_LOGIN_MODULE}, not {module}")
        users = {name.removeprefix("user_"): password for name, password in options.items() if name.startswith("user_")}
        if not users:
            raise ConfigError(f"{key}: {PLAIN_LOGIN_MODULE} lists no user_<name>=\"<password>\" option")
        return cls(users)

    def authenticate(self, token: bytes) -> KafkaPrincipal:
        parts = token.split(b"\x00")
        if len(parts) != 3:
            raise SaslAuthenticationError("Invalid SASL/PLAIN response: expected 3 tokens")
        try:
            authzid, username, password = (part.decode() for part in parts)
        except UnicodeDecodeError:
            raise SaslAuthenticationError("Invalid SASL/PLAIN response: not UTF-8") from None
        if not username:
            raise SaslAuthenticationError("Authentication failed: username not specified")
        if not password:
            raise SaslAuthenticationError("Authentication failed: password not specified")
        # Compared in constant time, against "" for an unknown user, so timing tells little.
        if not hmac.compare_digest(self._users.get(username, "").encode(), password.encode()):
            raise SaslAuthenticationError(INVALID_CREDENTIALS)
        if authzid and authzid != username:
            raise SaslAuthenticationError("Authentication failed: Client requested an authorization id that is "
                                          "different from username")
        return KafkaPrincipal("User", username)


@attrs.frozen
class ListenerSasl:
    """The SASL mechanisms one listener offers, in configured order."""

    listener: str
    mechanisms: Mapping[str, Mechanism]

    @classmethod
    def from_config(cls, config: Config, listener: str) -> ListenerSasl:
        """The listener's mechanisms; :class:`ConfigError` for one josef does not offer or a missing JAAS entry."""
        prefix = f"listener.name.{listener.lower()}."
        override = config.unknown.get(prefix + "sasl.enabled.mechanisms")
        enabled = [m.strip() for m in override.split(",") if m.strip()] if override is not None \
            else list(config["sasl.enabled.mechanisms"])
        if not enabled:
            raise ConfigError(f"listener {listener}: no SASL mechanism is enabled (sasl.enabled.mechanisms)")
        mechanisms: dict[str, Mechanism] = {}
        for name in enabled:
            if name not in SUPPORTED_MECHANISMS:
                raise ConfigError(f"listener {listener}: SASL mechanism {name} is not supported yet; josef offers "
                                  f"{', '.join(SUPPORTED_MECHANISMS)} (sasl.enabled.mechanisms)")
            key = f"{prefix}{name.lower()}.sasl.jaas.config"
            jaas = config.unknown.get(key)
            if jaas is None:
                raise ConfigError(f"listener {listener}: {name} needs {key}")
            mechanisms[name] = PlainMechanism.from_jaas(jaas, key)
        return cls(listener, mechanisms)
