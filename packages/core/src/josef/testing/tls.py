"""Certificates for TLS tests: a test CA, broker key stores (PEM, PKCS12, inline) and client certificates.

    from josef.testing.tls import TlsFiles

    files = TlsFiles.create(tmp_path)
    broker = BrokerThread({"listeners": "SSL://127.0.0.1:0", **files.broker_properties(), ...})
    context = files.client_context(files.client("alice"))

Made with ``trustme`` (a test dependency: install ``trustme``), so nothing
here is fit for anything but tests. The broker certificate names
``127.0.0.1`` and ``localhost``, so clients may check host names. A client
certificate's subject is ``CN=<name>,OU=<unit>,O=<organization>`` (RFC 2253
order, as brokers see it).
"""

from __future__ import annotations

import ssl
import struct
from pathlib import Path
from typing import Any

import attrs
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12

from josef.protocol.messages import decode_response
from josef.testing import RawClient

#: The password of the PKCS12 stores (never a real one: these are test files).
PASSWORD = "test-password"


@attrs.frozen
class ClientCert:
    """A client certificate's files: ``certificate`` (chain, PEM), ``key`` (PEM), ``combined`` (both)."""

    subject: str
    certificate: Path
    key: Path
    combined: Path


@attrs.define
class TlsFiles:
    """A test CA and certificates signed by it, as files under ``directory``."""

    directory: Path
    ca: trustme.CA
    #: The CA certificate (PEM): the trust store of brokers and clients.
    ca_pem: Path
    #: The broker's certificate chain and key in one PEM file (a PEM key store).
    broker_pem: Path
    #: The same in a PKCS12 store (password :data:`PASSWORD`).
    broker_p12: Path
    #: The broker certificate chain and key as text, for inline PEM (ssl.keystore.certificate.chain, ssl.keystore.key).
    broker_chain_text: str
    broker_key_text: str

    @classmethod
    def create(cls, directory: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> TlsFiles:
        directory.mkdir(parents=True, exist_ok=True)
        ca = trustme.CA(organization_name="josef tests", organization_unit_name="CA")
        ca_pem = directory / "ca.pem"
        ca.cert_pem.write_to_path(str(ca_pem))
        files = cls(directory, ca, ca_pem, directory / "broker.pem", directory / "broker.p12", "", "")
        files.broker_chain_text, files.broker_key_text = files.write_broker_stores(
            files.broker_pem, files.broker_p12, hosts)
        return files

    def write_broker_stores(self, pem: Path, p12: Path | None = None, hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
                            common_name: str = "broker") -> tuple[str, str]:
        """Issue a new broker certificate and write it (chain and key) to ``pem`` and ``p12``; (chain, key) as text.

        Each call issues a certificate with a new serial number: a reload
        test tells the certificates apart by it.
        """
        leaf = self.ca.issue_cert(*hosts, common_name=common_name, organization_name="josef tests",
                                  organization_unit_name="brokers")
        chain = b"".join(blob.bytes() for blob in leaf.cert_chain_pems).decode()
        key = leaf.private_key_pem.bytes().decode()
        _write_private(pem, (chain + key).encode())
        if p12 is not None:
            _write_private(p12, _pkcs12(chain.encode(), key.encode()))
        return chain, key

    def client(self, name: str, unit: str = "eng", organization: str = "acme") -> ClientCert:
        """A client certificate for ``CN=<name>,OU=<unit>,O=<organization>``, written once per subject."""
        leaf = self.ca.issue_cert(f"{name.lower().replace(' ', '-')}.clients.test", common_name=name,
                                  organization_name=organization, organization_unit_name=unit)
        stem = self.directory / f"client-{name}-{unit}-{organization}".replace(" ", "_")
        certificate, key, combined = (Path(f"{stem}{suffix}") for suffix in (".crt", ".key", ".pem"))
        chain = b"".join(blob.bytes() for blob in leaf.cert_chain_pems)
        certificate.write_bytes(chain)
        _write_private(key, leaf.private_key_pem.bytes())
        _write_private(combined, chain + leaf.private_key_pem.bytes())
        subject = x509.load_pem_x509_certificate(chain).subject.rfc4514_string()
        return ClientCert(subject, certificate, key, combined)

    def broker_properties(self, listener: str | None = None, store: str = "PEM") -> dict[str, str]:
        """``ssl.*`` properties of a broker key store (``store``: PEM, PKCS12 or INLINE) and the CA as trust store;
        with ``listener``, as ``listener.name.<listener>.ssl.*``."""
        if store == "PKCS12":
            props = {"ssl.keystore.type": "PKCS12", "ssl.keystore.location": str(self.broker_p12),
                     "ssl.keystore.password": PASSWORD, "ssl.key.password": PASSWORD}
        elif store == "INLINE":
            props = {"ssl.keystore.type": "PEM", "ssl.keystore.certificate.chain": self.broker_chain_text,
                     "ssl.keystore.key": self.broker_key_text}
        else:
            props = {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(self.broker_pem)}
        props.update({"ssl.truststore.type": "PEM", "ssl.truststore.location": str(self.ca_pem)})
        prefix = f"listener.name.{listener.lower()}." if listener else ""
        return {prefix + key: value for key, value in props.items()}

    def client_properties(self, client: ClientCert | None = None) -> dict[str, str]:
        """Kafka client properties (josef's client, Java's) for SSL with the CA, and ``client`` for mutual TLS."""
        props = {"security.protocol": "SSL", "ssl.truststore.type": "PEM", "ssl.truststore.location": str(self.ca_pem)}
        if client is not None:
            props.update({"ssl.keystore.type": "PEM", "ssl.keystore.location": str(client.combined)})
        return props

    def client_context(self, client: ClientCert | None = None, check_hostname: bool = True) -> ssl.SSLContext:
        """A Python client context trusting the CA, presenting ``client`` when given."""
        context = ssl.create_default_context(cafile=str(self.ca_pem))
        context.check_hostname = check_hostname
        if client is not None:
            context.load_cert_chain(str(client.certificate), str(client.key))
        return context


def _pkcs12(chain: bytes, key: bytes) -> bytes:
    certificates = x509.load_pem_x509_certificates(chain)
    private_key = serialization.load_pem_private_key(key, None)
    return pkcs12.serialize_key_and_certificates(
        b"broker", private_key, certificates[0], certificates[1:] or None,  # type: ignore[arg-type]
        serialization.BestAvailableEncryption(PASSWORD.encode()))


def _write_private(path: Path, data: bytes) -> None:
    """Write a file only its owner reads (key material), replacing it whole (a reload never sees half a file)."""
    partial = path.with_name(path.name + ".partial")
    partial.touch(mode=0o600)
    partial.write_bytes(data)
    partial.replace(path)


class TlsRawClient(RawClient):
    """:class:`josef.testing.RawClient` over TLS: any Kafka API at any version, through ``context``."""

    def __init__(self, port: int, context: ssl.SSLContext, host: str = "127.0.0.1", timeout: float = 30) -> None:
        super().__init__(port, host, timeout)
        self.sock = context.wrap_socket(self.sock, server_hostname=host)

    def receive(self) -> Any:
        key, version, correlation = self._pending.pop(0)
        size = struct.unpack(">i", self._exactly(4))[0]
        answered, response = decode_response(key, version, self._exactly(size))
        assert answered == correlation, "responses came out of order"
        return response

    def _exactly(self, size: int) -> bytes:
        parts, left = [], size
        while left:
            chunk = self.sock.recv(min(left, 1 << 20))
            if not chunk:
                raise ConnectionError(f"the broker closed the connection {left} bytes before the end of a response")
            parts.append(chunk)
            left -= len(chunk)
        return b"".join(parts)
