"""TLS with Kafka's ``ssl.*`` configuration: key stores, trust stores and the SSL contexts built from them.

Shared by the broker's listeners (server side), the broker's own outbound
connections (inter-broker, controller, quorum) and josef's client, so all
three read Kafka's keys the same way. Kafka's stores are Java's; Python's
``ssl`` module reads PEM files only, so:

- ``PEM`` keystores and truststores are read as they are (a file, or the
  inline ``ssl.keystore.certificate.chain`` / ``ssl.keystore.key`` /
  ``ssl.truststore.certificates`` values);
- ``PKCS12`` stores are opened with ``cryptography`` and turned into PEM in
  memory;
- ``JKS`` (Kafka's default type) cannot be read by Python at all: it is
  refused with a :class:`ConfigError` that says how to convert it.

``SSLContext.load_cert_chain`` only takes file names, so a key that is not
already in a PEM file (inline or from PKCS12) is handed to it through an
anonymous in-memory file (``memfd_create``, read through ``/proc/self/fd``)
closed right after; where that does not exist, through a 0600 temporary file
removed right after. Nothing here logs or puts key material or passwords
into an error message.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

import attrs

from josef.config import ConfigError, ConfigKey, ConfigType

S, P, LST = ConfigType.STRING, ConfigType.PASSWORD, ConfigType.LIST

#: Store types josef reads (``JKS`` is refused with advice).
STORE_TYPES = ("JKS", "PKCS12", "PEM")
#: Kafka's names of TLS versions, and Python's.
_VERSIONS = {"TLSv1": ssl.TLSVersion.TLSv1, "TLSv1.1": ssl.TLSVersion.TLSv1_1,
             "TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}


def _store_type(value: Any) -> None:
    if value is not None and value.upper() not in STORE_TYPES:
        raise ConfigError(f"must be one of {', '.join(STORE_TYPES)}")


def _protocols(value: Any) -> None:
    for item in value or ():
        if item not in _VERSIONS:
            raise ConfigError(f"{item} is not a TLS version josef knows ({', '.join(_VERSIONS)})")


def _protocol(value: Any) -> None:
    if value is not None and value not in ("TLS", "TLSv1.2", "TLSv1.3", "TLSv1.1", "TLSv1"):
        raise ConfigError("must be TLS, TLSv1.3, TLSv1.2, TLSv1.1 or TLSv1")


#: The keys of a TLS client, with Kafka's names, types and defaults (client and broker alike).
#: The key and trust store keys are the ones Kafka reconfigures at run time (``SslConfigs.RECONFIGURABLE_CONFIGS``).
CLIENT_SSL_KEYS = (
    ConfigKey("ssl.keystore.type", S, "JKS",
              "The file format of the key store: PKCS12 or PEM (JKS, Kafka's default, cannot be read by josef: "
              "convert it with keytool -importkeystore -deststoretype PKCS12).", _store_type, dynamic=True),
    ConfigKey("ssl.keystore.location", S, None,
              "The key store file: this side's certificate chain and private key (for a client, mutual TLS).",
              dynamic=True),
    ConfigKey("ssl.keystore.password", P, None, "The store password of the key store file (PKCS12).", dynamic=True),
    ConfigKey("ssl.key.password", P, None,
              "The password of the private key in the key store file or of the PEM key in ssl.keystore.key.",
              dynamic=True),
    ConfigKey("ssl.keystore.certificate.chain", P, None,
              "The certificate chain in PEM, inline (ssl.keystore.type=PEM), with the key in ssl.keystore.key.",
              dynamic=True),
    ConfigKey("ssl.keystore.key", P, None,
              "The private key in PEM (PKCS#8, possibly encrypted with ssl.key.password), inline "
              "(ssl.keystore.type=PEM).", dynamic=True),
    ConfigKey("ssl.truststore.type", S, "JKS",
              "The file format of the trust store: PKCS12 or PEM (JKS cannot be read by josef).", _store_type,
              dynamic=True),
    ConfigKey("ssl.truststore.location", S, None,
              "The trust store file: the certificates of the authorities this side trusts (unset: the system's).",
              dynamic=True),
    ConfigKey("ssl.truststore.password", P, None, "The password of the trust store file (PKCS12).", dynamic=True),
    ConfigKey("ssl.truststore.certificates", P, None,
              "Trusted certificates in PEM, inline (ssl.truststore.type=PEM).", dynamic=True),
    ConfigKey("ssl.enabled.protocols", LST, ["TLSv1.2", "TLSv1.3"], "The TLS versions a connection may use.",
              _protocols),
    ConfigKey("ssl.protocol", S, "TLSv1.3",
              "Kafka's SSLContext protocol; josef uses it only when ssl.enabled.protocols is empty (then the newest "
              "version allowed).", _protocol),
    ConfigKey("ssl.cipher.suites", LST, [],
              "TLS 1.2 cipher suites, by OpenSSL's names (ECDHE-RSA-AES128-GCM-SHA256); empty: OpenSSL's defaults. "
              "TLS 1.3 suites are always OpenSSL's defaults."),
    ConfigKey("ssl.endpoint.identification.algorithm", S, "https",
              "https checks that the server's certificate names the host connected to; empty disables the check."),
)


Lookup = Callable[[str], Any]


@attrs.frozen
class TlsSettings:
    """One side's ``ssl.*`` values, as read from a configuration (per-listener values already resolved)."""

    keystore_type: str = "JKS"
    keystore_location: str | None = None
    keystore_password: str | None = attrs.field(default=None, repr=False)
    key_password: str | None = attrs.field(default=None, repr=False)
    keystore_certificate_chain: str | None = attrs.field(default=None, repr=False)
    keystore_key: str | None = attrs.field(default=None, repr=False)
    truststore_type: str = "JKS"
    truststore_location: str | None = None
    truststore_password: str | None = attrs.field(default=None, repr=False)
    truststore_certificates: str | None = attrs.field(default=None, repr=False)
    enabled_protocols: tuple[str, ...] = ("TLSv1.2", "TLSv1.3")
    protocol: str = "TLSv1.3"
    cipher_suites: tuple[str, ...] = ()
    endpoint_identification_algorithm: str | None = "https"
    #: Server side: none, requested or required.
    client_auth: str = "none"

    @classmethod
    def from_lookup(cls, get: Lookup) -> TlsSettings:
        """The settings from ``get(key name)``, which returns a key's typed value (None when unset)."""
        return cls(
            keystore_type=(get("ssl.keystore.type") or "JKS").upper(),
            keystore_location=get("ssl.keystore.location") or None,
            keystore_password=get("ssl.keystore.password"),
            key_password=get("ssl.key.password"),
            keystore_certificate_chain=get("ssl.keystore.certificate.chain") or None,
            keystore_key=get("ssl.keystore.key") or None,
            truststore_type=(get("ssl.truststore.type") or "JKS").upper(),
            truststore_location=get("ssl.truststore.location") or None,
            truststore_password=get("ssl.truststore.password"),
            truststore_certificates=get("ssl.truststore.certificates") or None,
            enabled_protocols=tuple(get("ssl.enabled.protocols") or ()),
            protocol=get("ssl.protocol") or "TLSv1.3",
            cipher_suites=tuple(get("ssl.cipher.suites") or ()),
            endpoint_identification_algorithm=get("ssl.endpoint.identification.algorithm"),
            client_auth=_optional(get, "ssl.client.auth") or "none",
        )

    @property
    def has_keystore(self) -> bool:
        return bool(self.keystore_location or self.keystore_certificate_chain or self.keystore_key)

    @property
    def has_truststore(self) -> bool:
        return bool(self.truststore_location or self.truststore_certificates)

    def files(self) -> tuple[str, ...]:
        """The store files these settings read (a reload compares their modification times)."""
        return tuple(f for f in (self.keystore_location, self.truststore_location) if f)


def _optional(get: Lookup, name: str) -> Any:
    try:
        return get(name)
    except KeyError:
        return None


def server_context(settings: TlsSettings, where: str) -> ssl.SSLContext:
    """The SSL context of a TLS listener; ``where`` (``listener SSL``) names it in errors.

    The key store is required (a server has to show a certificate);
    ``ssl.client.auth`` decides whether clients must (required), may
    (requested) or need not (none) show theirs, checked against the trust
    store (the system's authorities when none is configured, as the JVM's
    default trust store is Kafka's).
    """
    if not settings.has_keystore:
        raise ConfigError(f"{where}: a TLS listener needs a key store (ssl.keystore.location, or "
                          "ssl.keystore.certificate.chain and ssl.keystore.key with ssl.keystore.type=PEM)")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _common(context, settings, where)
    _load_keystore(context, settings, where)
    auth = settings.client_auth.lower()
    context.verify_mode = {"required": ssl.CERT_REQUIRED, "requested": ssl.CERT_OPTIONAL}.get(auth, ssl.CERT_NONE)
    if context.verify_mode != ssl.CERT_NONE:
        _load_truststore(context, settings, where, ssl.Purpose.CLIENT_AUTH)
    return context


def client_context(settings: TlsSettings, where: str) -> ssl.SSLContext:
    """The SSL context of a TLS client (josef's client, or a broker calling another node).

    The server's certificate is always checked against the trust store;
    its host name too unless ``ssl.endpoint.identification.algorithm`` is
    empty (Kafka's way of turning that off). A key store, when there is
    one, is this side's certificate for servers that ask (mutual TLS).
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _common(context, settings, where)
    algorithm = (settings.endpoint_identification_algorithm or "").strip().lower()
    if algorithm not in ("", "https"):
        raise ConfigError(f"{where}: ssl.endpoint.identification.algorithm must be https or empty, not {algorithm}")
    context.check_hostname = algorithm == "https"
    context.verify_mode = ssl.CERT_REQUIRED
    _load_truststore(context, settings, where, ssl.Purpose.SERVER_AUTH)
    if settings.has_keystore:
        _load_keystore(context, settings, where)
    return context


def listener_security_protocol(config: Any, listener: str) -> str | None:
    """The security protocol ``listener.security.protocol.map`` gives ``listener`` (None when it names none): what a
    node connecting to that listener of other nodes must speak."""
    for entry in config["listener.security.protocol.map"]:
        name, _, protocol = entry.partition(":")
        if name.strip().upper() == listener.upper():
            return protocol.strip().upper()
    return None


def outbound_context(config: Any, listener: str) -> ssl.SSLContext | None:
    """What a broker or controller connects to ``listener`` of other nodes with: None when that listener is not
    TLS (``listener.security.protocol.map``), else a client context from the node's own ``ssl.*`` settings with
    ``listener.name.<listener>.ssl.*`` over them, as Kafka's inter-broker and controller clients take theirs.

    ``config`` is the node's :class:`josef.config.Config`.
    """
    if listener_security_protocol(config, listener) not in ("SSL", "SASL_SSL"):
        return None
    settings = TlsSettings.from_lookup(lambda name: config.for_listener(listener, name))
    return client_context(settings, f"listener {listener} (as a client of other nodes)")


def _common(context: ssl.SSLContext, settings: TlsSettings, where: str) -> None:
    enabled = [_VERSIONS[p] for p in settings.enabled_protocols if p in _VERSIONS] or \
              [_VERSIONS.get(settings.protocol, ssl.TLSVersion.TLSv1_3)]
    try:
        context.minimum_version, context.maximum_version = min(enabled), max(enabled)
    except ValueError as exc:
        raise ConfigError(f"{where}: ssl.enabled.protocols: {exc}") from None
    if settings.cipher_suites:
        try:
            context.set_ciphers(":".join(settings.cipher_suites))
        except ssl.SSLError:
            raise ConfigError(f"{where}: ssl.cipher.suites names no cipher suite this OpenSSL offers (give OpenSSL's "
                              f"names, such as ECDHE-RSA-AES128-GCM-SHA256)") from None


# Key stores and trust stores ---------------------------------------------------------------------------------


def _refuse_jks(kind: str, where: str) -> ConfigError:
    return ConfigError(f"{where}: ssl.{kind}.type is JKS (Kafka's default), which josef cannot read; convert the "
                       f"store to PKCS12 (keytool -importkeystore -srckeystore <file>.jks -destkeystore <file>.p12 "
                       f"-deststoretype PKCS12) and set ssl.{kind}.type=PKCS12, or use PEM")


def _read(path: str, key: str, where: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {key} {path}: {exc.strerror or exc}") from None


def keystore_pem(settings: TlsSettings, where: str) -> tuple[bytes, bytes | None]:
    """The key store as PEM: (certificate chain and key, or chain alone, key password or None)."""
    kind = settings.keystore_type
    if kind == "PEM":
        if settings.keystore_location:
            return _read(settings.keystore_location, "ssl.keystore.location", where), _password(settings.key_password)
        if not (settings.keystore_certificate_chain and settings.keystore_key):
            raise ConfigError(f"{where}: a PEM key store needs both ssl.keystore.certificate.chain and "
                              "ssl.keystore.key (or a file in ssl.keystore.location)")
        chain, key = settings.keystore_certificate_chain.strip(), settings.keystore_key.strip()
        return f"{chain}\n{key}\n".encode(), _password(settings.key_password)
    if kind == "JKS":
        raise _refuse_jks("keystore", where)
    if not settings.keystore_location:
        raise ConfigError(f"{where}: ssl.keystore.type {kind} needs ssl.keystore.location")
    if settings.keystore_certificate_chain or settings.keystore_key:
        raise ConfigError(f"{where}: inline PEM keys (ssl.keystore.certificate.chain, ssl.keystore.key) need "
                          "ssl.keystore.type=PEM")
    return _pkcs12_to_pem(_read(settings.keystore_location, "ssl.keystore.location", where),
                          settings.keystore_password, settings.key_password, where), None


def _password(text: str | None) -> bytes | None:
    return text.encode() if text else None


def _pkcs12_to_pem(data: bytes, store_password: str | None, key_password: str | None, where: str) -> bytes:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.serialization import pkcs12

    loaded = None
    for password in dict.fromkeys([store_password, key_password, None]):
        try:
            loaded = pkcs12.load_key_and_certificates(data, _password(password))
            break
        except ValueError:
            continue
    if loaded is None:
        raise ConfigError(f"{where}: cannot open the PKCS12 key store in ssl.keystore.location: not PKCS12, or "
                          "ssl.keystore.password is wrong")
    key, certificate, chain = loaded
    if key is None or certificate is None:
        raise ConfigError(f"{where}: the PKCS12 key store in ssl.keystore.location holds no private key entry")
    parts = [c.public_bytes(serialization.Encoding.PEM) for c in [certificate, *chain]]
    parts.append(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()))
    return b"".join(parts)


def truststore_pem(settings: TlsSettings, where: str) -> bytes | None:
    """The trusted certificates as PEM; None when no trust store is configured."""
    kind = settings.truststore_type
    if settings.truststore_certificates:
        if kind != "PEM":
            raise ConfigError(f"{where}: ssl.truststore.certificates needs ssl.truststore.type=PEM")
        return settings.truststore_certificates.encode()
    if not settings.truststore_location:
        return None
    if kind == "JKS":
        raise _refuse_jks("truststore", where)
    data = _read(settings.truststore_location, "ssl.truststore.location", where)
    if kind == "PEM":
        return data
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.serialization import pkcs12

    try:
        _, certificate, others = pkcs12.load_key_and_certificates(data, _password(settings.truststore_password))
    except ValueError:
        raise ConfigError(f"{where}: cannot open the PKCS12 trust store in ssl.truststore.location: not PKCS12, or "
                          "ssl.truststore.password is wrong") from None
    certificates = [c for c in [certificate, *others] if c is not None]
    if not certificates:
        raise ConfigError(f"{where}: the PKCS12 trust store in ssl.truststore.location holds no certificate")
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certificates)


def _load_truststore(context: ssl.SSLContext, settings: TlsSettings, where: str, purpose: ssl.Purpose) -> None:
    pem = truststore_pem(settings, where)
    if pem is None:
        context.load_default_certs(purpose)
        return
    try:
        context.load_verify_locations(cadata=pem.decode("ascii", "replace"))
    except (ssl.SSLError, ValueError):
        raise ConfigError(f"{where}: the trust store holds no PEM certificate josef can read") from None


def _load_keystore(context: ssl.SSLContext, settings: TlsSettings, where: str) -> None:
    pem, password = keystore_pem(settings, where)
    try:
        if settings.keystore_type == "PEM" and settings.keystore_location:
            context.load_cert_chain(settings.keystore_location, password=password)
        else:
            with private_file(pem) as path:
                context.load_cert_chain(path, password=password)
    except ssl.SSLError:
        raise ConfigError(f"{where}: the key store holds no certificate and matching private key josef can read "
                          "(or ssl.key.password is wrong)") from None


@contextlib.contextmanager
def private_file(data: bytes) -> Iterator[str]:
    """A file name that reads ``data``, for APIs that take only names; gone when the block ends.

    An anonymous in-memory file where Linux has them (nothing reaches a
    disk, no other process can open it by name); else a 0600 temporary
    file, removed at once after use.
    """
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is not None and os.path.isdir("/proc/self/fd"):
        fd = memfd_create("josef-tls", getattr(os, "MFD_CLOEXEC", 0))
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    fd, path = tempfile.mkstemp(prefix="josef-tls-")  # created 0600
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        yield path
    finally:
        os.unlink(path)


del S, P, LST
