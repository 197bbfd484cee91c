"""TLS on a broker's SSL and SASL_SSL listeners: their contexts, reloads, and who a client certificate names.

Each TLS listener has a :class:`ListenerTls`: its ``ssl.*`` settings (each
``listener.name.<listener>.ssl.*`` value wins over the ``ssl.*`` one, as in
Kafka) and the server SSL context built from them. :meth:`ListenerTls.reload` builds a new
context when the settings or the store files changed (a dynamic broker
config update, Kafka's ``kafka-configs --alter --add-config
listener.name.<l>.ssl.keystore.location=...``): connections accepted later
get the new certificate, open ones keep theirs. A reload that fails keeps
the previous context and says why in the log, as Kafka refuses the update.

On an SSL listener a client certificate names the connection's principal
(the principal builder, :mod:`josef.server.principals`, maps its subject as
RFC 2253 writes it, ``CN=alice,OU=eng,O=acme``, through
``ssl.principal.mapping.rules``, :class:`SslPrincipalMapper`); a client
without one is ``User:ANONYMOUS``. On SASL_SSL the principal is SASL's.
"""

from __future__ import annotations

import logging
import os
import re
import ssl
from typing import Any, Match, Sequence

import attrs

from josef.config import Config, ConfigError, ConfigKey, ConfigType, one_of
from josef.protocol.tls import CLIENT_SSL_KEYS, TlsSettings, server_context

log = logging.getLogger(__name__)

#: A TLS handshake must finish within this long (or ``connections.max.idle.ms``, when shorter). Kafka has no
#: key of its own for it (its idle timeout closes a stalled handshake); a connection that never finishes its
#: handshake holds a socket and a task, so josef closes it sooner.
HANDSHAKE_TIMEOUT_S = 10.0


class PrincipalMappingError(ConfigError):
    """``ssl.principal.mapping.rules`` that Kafka would refuse."""


# Kafka's SslPrincipalMapper -----------------------------------------------------------------------------------

_RULE = r"(DEFAULT)|RULE:((\\.|[^\\/])*)/((\\.|[^\\/])*)/([LU]?).*?|(.*?)"
_RULE_SPLITTER = re.compile(r"\s*(" + _RULE + r")\s*(,\s*|$)")
_RULE_PARSER = re.compile(_RULE)
_BACK_REFERENCE = re.compile(r"\$(\d+)")


@attrs.frozen
class _Rule:
    """One rule: DEFAULT (the distinguished name as it is), or ``RULE:pattern/replacement/[LU]``."""

    pattern: re.Pattern[str] | None = None
    replacement: str | None = None
    lower: bool = False
    upper: bool = False

    def apply(self, name: str) -> str | None:
        if self.pattern is None:
            return name
        match = self.pattern.fullmatch(name)
        if match is None:
            return None
        replacement = _escape_literal_back_references(self.replacement or "", self.pattern.groups)
        result = self.pattern.sub(lambda m: _java_replacement(replacement, m), name)
        if self.lower:
            return result.lower()
        if self.upper:
            return result.upper()
        return result

    def __str__(self) -> str:
        if self.pattern is None:
            return "DEFAULT"
        return f"RULE:{self.pattern.pattern}/{self.replacement}" + ("/L" if self.lower else "/U" if self.upper else "")


def _escape_literal_back_references(text: str, groups: int) -> str:
    """Kafka's (from NiFi's IdentityMappingUtil): ``$n`` naming no group is literal text, ``$123`` with 12 groups is
    group 12 and a ``3``. The positions are those of the unescaped text, as in Kafka."""
    if groups == 0:
        return text
    value = text
    for found in _BACK_REFERENCE.finditer(text):
        number = found.group(1)
        if number.startswith("0"):
            continue
        index = int(number)
        while index > groups and index >= 10:
            index //= 10
        if index > groups:
            start = found.start(1)
            value = value[:start - 1] + "\\" + value[start - 1:]
    return value


def _java_replacement(replacement: str, match: Match[str]) -> str:
    """``replacement`` expanded as Java's ``Matcher.appendReplacement`` does: ``\\x`` is ``x``, ``$n`` the group
    (as many digits as still name a group), ``${name}`` a named group."""
    out: list[str] = []
    i, groups = 0, match.re.groups
    while i < len(replacement):
        char = replacement[i]
        if char == "\\":
            i += 1
            if i >= len(replacement):
                raise ValueError("character to be escaped is missing")
            out.append(replacement[i])
            i += 1
        elif char == "$":
            i += 1
            if i >= len(replacement):
                raise ValueError("Illegal group reference: group index is missing")
            if replacement[i] == "{":
                end = replacement.find("}", i)
                if end < 0:
                    raise ValueError("named capturing group is missing trailing '}'")
                out.append(match.group(replacement[i + 1:end]) or "")
                i = end + 1
                continue
            if not replacement[i].isdigit():
                raise ValueError("Illegal group reference")
            number = int(replacement[i])
            if number > groups:
                raise ValueError(f"No group {number}")
            i += 1
            while i < len(replacement) and replacement[i].isdigit() and number * 10 + int(replacement[i]) <= groups:
                number = number * 10 + int(replacement[i])
                i += 1
            out.append(match.group(number) or "")
        else:
            out.append(char)
            i += 1
    return "".join(out)


class SslPrincipalMapper:
    """``ssl.principal.mapping.rules`` as Kafka reads and applies them (org.apache.kafka.common.security.ssl).

    Rules are separated by commas; each is ``DEFAULT`` or
    ``RULE:pattern/replacement/`` with an optional ``L`` or ``U`` after the
    last slash (lower or upper case the result). The first rule whose
    pattern matches the whole distinguished name gives the name; none
    matching is an error (the connection is refused). Patterns are Python
    regular expressions, which read Kafka's usual Java ones the same way.
    """

    def __init__(self, rules: str | None) -> None:
        text = "DEFAULT" if rules is None else rules  # "" is no rule at all, as in Kafka
        self.rules = self._parse([m.group(1) for m in _RULE_SPLITTER.finditer(text.strip())])

    @staticmethod
    def _parse(texts: Sequence[str]) -> list[_Rule]:
        rules = []
        for text in texts:
            match = _RULE_PARSER.match(text)
            if match is None:
                raise PrincipalMappingError(f"Invalid rule: {text}")
            if match.end() != len(text):
                raise PrincipalMappingError(f"Invalid rule: `{text}`, unmatched substring: `{text[match.end():]}`")
            if match.group(1) is not None:
                rules.append(_Rule())
            elif match.group(2) is not None:
                try:
                    pattern = re.compile(match.group(2))
                except re.error as exc:
                    raise PrincipalMappingError(f"Invalid rule: `{text}`: {exc}") from None
                rules.append(_Rule(pattern, match.group(4), match.group(6) == "L", match.group(6) == "U"))
        return rules

    def name(self, distinguished_name: str) -> str:
        """The principal name of ``distinguished_name``; :class:`LookupError` when no rule applies."""
        for rule in self.rules:
            found = rule.apply(distinguished_name)
            if found is not None:
                return found
        raise LookupError(f"No rules apply to {distinguished_name}, rules {self}")

    def __str__(self) -> str:
        return "[" + ", ".join(map(str, self.rules)) + "]"


def _mapping_rules(value: Any) -> None:
    SslPrincipalMapper(value)


def subject_rfc2253(certificate_der: bytes) -> str:
    """The subject of a DER certificate in RFC 2253 form (most specific first), as Java's ``X500Principal.getName()``.

    Attribute types outside RFC 2253's short names (CN, L, ST, O, OU, C,
    STREET, DC, UID) show as dotted OIDs with their string value, where Java
    writes the value's DER in hex.
    """
    from cryptography import x509

    return x509.load_der_x509_certificate(certificate_der).subject.rfc4514_string()


# Configuration ---------------------------------------------------------------------------------------------------

#: The server-side keys, beside the client's (:data:`josef.protocol.tls.CLIENT_SSL_KEYS`); all per listener.
SERVER_SSL_KEYS = (
    ConfigKey("ssl.client.auth", ConfigType.STRING, "none",
              "Whether clients of TLS listeners must show a certificate: required (refused at the handshake "
              "without one), requested (may: with one, it names their principal) or none.",
              one_of("required", "requested", "none")),
    ConfigKey("ssl.principal.mapping.rules", ConfigType.STRING, "DEFAULT",
              "Rules that turn a client certificate's subject (RFC 2253: CN=alice,OU=eng,O=acme) into its principal "
              "name, in order, the first that matches: RULE:pattern/replacement/ with L or U after the last slash "
              "to change case, and DEFAULT (the subject as it is). Kafka's syntax.", _mapping_rules),
)

#: Every ``ssl.*`` key a broker reads, each also settable as ``listener.name.<listener>.ssl.*``.
BROKER_SSL_KEYS = tuple(attrs.evolve(k, per_listener=True) for k in CLIENT_SSL_KEYS + SERVER_SSL_KEYS)


def listener_settings(config: Config, listener: str) -> TlsSettings:
    """The TLS settings of ``listener``: ``listener.name.<listener>.ssl.*`` over ``ssl.*``."""
    return TlsSettings.from_lookup(lambda name: config.for_listener(listener, name))


@attrs.define
class ListenerTls:
    """A TLS listener's current server context; replaced whole on reload."""

    listener: str
    security_protocol: str
    context: ssl.SSLContext
    settings: TlsSettings
    #: The store files' (mtime_ns, size) when the context was built: a reload with equal settings looks at them.
    stamps: tuple[tuple[int, int], ...]
    handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S

    @classmethod
    def from_config(cls, config: Config, listener: str, security_protocol: str) -> ListenerTls:
        """The listener's TLS; :class:`ConfigError` (naming keys, never values) for what cannot work."""
        settings = listener_settings(config, listener)
        where = f"listener {listener}"
        idle = config["connections.max.idle.ms"]
        timeout = min(HANDSHAKE_TIMEOUT_S, idle / 1000) if idle is not None and idle > 0 else HANDSHAKE_TIMEOUT_S
        return cls(listener, security_protocol, server_context(settings, where), settings, _stamps(settings), timeout)

    def reload(self, config: Config) -> bool:
        """Take new settings or changed store files: True when the context was rebuilt.

        Called whenever the dynamic broker configuration changes. Kafka's
        controller writes a broker config record even when the value is
        unchanged, so setting the same ``ssl.keystore.location`` again
        reloads a store file rewritten in place, as with Kafka; here a
        changed modification time or size of a store file counts too. A
        context that cannot be built leaves the current one in place.
        """
        settings = listener_settings(config, self.listener)
        if settings == self.settings and _stamps(settings) == self.stamps:
            return False
        try:
            fresh = ListenerTls.from_config(config, self.listener, self.security_protocol)
        except ConfigError as exc:
            log.error("listener %s: keeping its TLS certificate: the new one cannot be used: %s", self.listener, exc)
            return False
        self.context, self.settings, self.stamps = fresh.context, fresh.settings, fresh.stamps
        log.info("listener %s: TLS key and trust stores reloaded; new connections use them", self.listener)
        return True

    @staticmethod
    def peer_subject(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> str | None:
        """The subject of the client's certificate (RFC 2253), or None when it presented none."""
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        return subject_rfc2253(der) if der else None


def _stamps(settings: TlsSettings) -> tuple[tuple[int, int], ...]:
    stamps = []
    for path in settings.files():
        try:
            stat = os.stat(path)
            stamps.append((stat.st_mtime_ns, stat.st_size))
        except OSError:
            stamps.append((-1, -1))
    return tuple(stamps)


def tls_listeners(config: Config, listeners: Sequence[tuple[str, str]]) -> dict[str, ListenerTls]:
    """``ListenerTls`` of each SSL and SASL_SSL listener of ``(name, security protocol)`` pairs, by name."""
    return {name: ListenerTls.from_config(config, name, protocol)
            for name, protocol in listeners if protocol in ("SSL", "SASL_SSL")}


__all__ = ["BROKER_SSL_KEYS", "HANDSHAKE_TIMEOUT_S", "ListenerTls", "PrincipalMappingError", "SERVER_SSL_KEYS",
           "SslPrincipalMapper", "listener_settings", "subject_rfc2253", "tls_listeners"]
