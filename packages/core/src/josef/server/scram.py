"""The server side of SASL/SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677), as Kafka's ScramSaslServer answers.

One :class:`ScramServer` per connection walks the exchange:

1. client-first ``n,,n=<user>,r=<client nonce>`` -> server-first
   ``r=<client nonce><server nonce>,s=<salt>,i=<iterations>`` (salt and
   iterations of the user's credential in the metadata image, read at that
   moment, so a user created a moment ago on any broker can log in);
2. client-final ``c=biws,r=<nonce>,p=<proof>`` -> server-final
   ``v=<ServerSignature>``, once the proof matches the StoredKey (compared in
   constant time).

Every failure answers Kafka's one sentence ("Authentication failed during
authentication due to invalid credentials with SASL mechanism ...") and
ends the exchange: wrong password, unknown user, a replayed or altered
client-final, a wrong nonce, messages out of order or malformed. The only
exception is one that reveals nothing about credentials: an authorization
id that is not the user (Kafka's own message). An unknown user is
not refused at client-first, as Kafka does, but walked through the exchange
with a salt derived from its name and refused at client-final exactly like a
wrong password (RFC 5802 section 5.1), so the server-first answer does not
tell which users exist. The reason kept for the log names no user and no
secret.

With the ``tokenauth=true`` extension (Kafka's ScramLoginModule option) the
user name is a delegation token id and the password the token's HMAC: the
credential is the token's (:func:`josef.delegation_tokens.token_credential`,
on listeners where tokens are enabled), the principal the token's owner, and
the session ends when the token expires (``expires_at_ms``, KIP-368). An
unknown, expired or disabled token fails exactly like a wrong password.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hmac
import re
import secrets
from typing import Callable

from josef.delegation_tokens import TokenLookup
from josef.scram import MIN_ITERATIONS, ScramAlgorithm, ScramCredential, random_string
from josef.security import KafkaPrincipal, SaslAuthenticationError

#: The credential of a user for a mechanism in the current metadata image; None when there is none.
CredentialLookup = Callable[[str, ScramAlgorithm], "ScramCredential | None"]

_SASLNAME = r"(?:[^\x00,=]|=2C|=3D)+"
_PRINTABLE = r"[\x21-\x2b\x2d-\x7e]+"
_EXTENSIONS = r"(?:,[A-Za-z]+=[^\x00,]+)*"
_BASE64 = r"[A-Za-z0-9+/]*={0,2}"
_CLIENT_FIRST = re.compile(
    rf"(?P<gs2>(?P<cbind>n|y|p=[A-Za-z0-9.\-]+),(?:a=(?P<authzid>{_SASLNAME}))?,)"
    rf"(?P<bare>(?:m=[^\x00,]+,)?n=(?P<user>{_SASLNAME}),r=(?P<nonce>{_PRINTABLE})(?P<extensions>{_EXTENSIONS}))")
_CLIENT_FINAL = re.compile(
    rf"(?P<without_proof>c=(?P<cbind>{_BASE64}),r=(?P<nonce>{_PRINTABLE}){_EXTENSIONS}),p=(?P<proof>{_BASE64})")
#: The one extension Kafka's ScramLoginModule knows: a delegation token instead of a password.
TOKEN_AUTH = "tokenauth"
#: A secret of this process: the fake salts of unknown users are stable (a retry sees the same) but unguessable.
_FAKE_SALT_KEY = secrets.token_bytes(32)


def invalid_credentials(mechanism: str) -> str:
    """Kafka's answer to every failed SCRAM exchange (SaslServerAuthenticator): it tells nothing of what was wrong."""
    return f"Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}"


class ScramFailure(Exception):
    """Why an exchange failed, for the log only (never sent; names no user or secret)."""


class _State(enum.Enum):
    CLIENT_FIRST = "client-first"
    CLIENT_FINAL = "client-final"
    COMPLETE = "complete"
    FAILED = "failed"


def _username(saslname: str) -> str:
    """RFC 5802's saslname: ``=2C`` is a comma and ``=3D`` an equals sign (the pattern admits no other ``=``)."""
    return saslname.replace("=2C", ",").replace("=3D", "=")


def _b64decode(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ScramFailure("invalid base64") from None


class ScramServer:
    """One connection's SCRAM exchange; :meth:`evaluate` takes each client message and returns the answer."""

    def __init__(self, algorithm: ScramAlgorithm, credentials: CredentialLookup,
                 nonce: Callable[[], str] = random_string, tokens: TokenLookup | None = None) -> None:
        self.algorithm = algorithm
        self._credentials = credentials
        self._nonce = nonce
        #: Delegation tokens' credentials by token id; None where tokens are disabled (``tokenauth`` then fails).
        #: Set by SaslHandshake on brokers with ``delegation.token.secret.key``.
        self.tokens = tokens
        self._state = _State.CLIENT_FIRST
        self.principal: KafkaPrincipal | None = None
        #: Whether the client authenticated with a delegation token; its expiry (ms) ends the session.
        self.token_authenticated = False
        self.expires_at_ms: int | None = None
        self._owner: KafkaPrincipal | None = None
        # Kept between the two steps, dropped as soon as the exchange ends.
        self._credential: ScramCredential | None = None
        self._known = False
        self._gs2 = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce_full = ""
        self._user = ""

    @property
    def complete(self) -> bool:
        return self._state is _State.COMPLETE

    def evaluate(self, token: bytes) -> bytes:
        """The answer to the client's next message; :class:`SaslAuthenticationError` ends the exchange."""
        state = self._state
        self._state = _State.FAILED  # until this step succeeds
        try:
            if state is _State.CLIENT_FIRST:
                answer = self._client_first(token)
                self._state = _State.CLIENT_FINAL
            elif state is _State.CLIENT_FINAL:
                answer = self._client_final(token)
                self._state = _State.COMPLETE
            else:
                raise ScramFailure(f"a SCRAM message after the exchange {state.value}")
            return answer
        except ScramFailure as exc:
            self._forget()
            raise SaslAuthenticationError(invalid_credentials(self.algorithm.name), str(exc)) from None
        except SaslAuthenticationError:
            self._forget()
            raise
        finally:
            if self._state is _State.COMPLETE:
                self._forget()

    def _forget(self) -> None:
        self._credential = None
        self._client_first_bare = self._server_first = self._gs2 = ""

    def _client_first(self, token: bytes) -> bytes:
        try:
            text = token.decode()
        except UnicodeDecodeError:
            raise ScramFailure("client-first is not UTF-8") from None
        match = _CLIENT_FIRST.fullmatch(text)
        if match is None:
            raise ScramFailure("malformed client-first message")
        if match["cbind"].startswith("p="):
            raise ScramFailure("the client asked for channel binding, which this mechanism does not offer")
        extensions = dict(item.split("=", 1) for item in match["extensions"].split(",")[1:])
        user = _username(match["user"])
        authzid = match["authzid"]
        if authzid is not None and _username(authzid) != user:
            raise SaslAuthenticationError("Authentication failed: Client requested an authorization id that is "
                                          "different from username", "authorization id is not the user")
        credential: ScramCredential | None
        if extensions.get(TOKEN_AUTH, "false").lower() == "true":
            token = self.tokens(user, self.algorithm) if self.tokens is not None else None
            credential = token.credential if token is not None else None
            self._owner = token.owner if token is not None else None
            self.expires_at_ms = token.expiry_timestamp if token is not None else None
            self.token_authenticated = True
        else:
            credential = self._credentials(user, self.algorithm)
        self._known = credential is not None and credential.iterations >= MIN_ITERATIONS
        if not self._known:
            # Walk on with a credential no proof matches, so the answer looks like a real user's.
            salt = hmac.new(_FAKE_SALT_KEY, f"{self.algorithm.name}:{user}".encode(), "sha256").digest()[:16]
            credential = ScramCredential(salt, secrets.token_bytes(self.algorithm.digest_size),
                                         secrets.token_bytes(self.algorithm.digest_size), MIN_ITERATIONS)
        assert credential is not None
        self._credential = credential
        self._user = user
        self._gs2 = match["gs2"]
        self._client_first_bare = match["bare"]
        self._nonce_full = match["nonce"] + self._nonce()
        self._server_first = (f"r={self._nonce_full},s={base64.b64encode(credential.salt).decode()},"
                              f"i={credential.iterations}")
        return self._server_first.encode()

    def _client_final(self, token: bytes) -> bytes:
        try:
            text = token.decode()
        except UnicodeDecodeError:
            raise ScramFailure("client-final is not UTF-8") from None
        match = _CLIENT_FINAL.fullmatch(text)
        if match is None:
            raise ScramFailure("malformed client-final message")
        if _b64decode(match["cbind"]) != self._gs2.encode():
            raise ScramFailure("channel binding does not repeat the gs2 header")
        if not hmac.compare_digest(match["nonce"].encode(), self._nonce_full.encode()):
            raise ScramFailure("invalid nonce in client-final")
        proof = _b64decode(match["proof"])
        credential = self._credential
        assert credential is not None
        auth_message = f"{self._client_first_bare},{self._server_first},{match['without_proof']}".encode()
        signature = self.algorithm.hmac(credential.stored_key, auth_message)
        if len(proof) != len(signature):
            raise ScramFailure("client proof has the wrong length")
        client_key = bytes(a ^ b for a, b in zip(proof, signature))
        if not hmac.compare_digest(self.algorithm.digest(client_key), credential.stored_key) or not self._known:
            raise ScramFailure("invalid client proof")
        # A token's owner, named as Kafka's DefaultKafkaPrincipalBuilder names it: a User with the owner's name.
        self.principal = KafkaPrincipal("User", self._owner.name if self._owner is not None else self._user)
        server_signature = self.algorithm.hmac(credential.server_key, auth_message)
        return b"v=" + base64.b64encode(server_signature)
