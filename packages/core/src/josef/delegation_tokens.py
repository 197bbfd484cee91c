"""Delegation tokens (KIP-48, KIP-373): what a token is, its HMAC, and the SCRAM credential a client proves it with.

A delegation token lets a client that holds no long-lived secret (a job
launched by a user who did authenticate) connect as that user: it
authenticates with SCRAM, naming the token id as user name (with the
``tokenauth=true`` extension) and the token's HMAC, base64, as password; the
connection's principal is the token's owner. Tokens live in the metadata log
(DelegationTokenRecord), so every broker knows them the moment the
controller commits one and a restart keeps them; the HMAC is never stored:
every node computes it from the token id with ``delegation.token.secret.key``
(HMAC-SHA512, as Kafka's DelegationTokenManager does), which must therefore
be the same on every node. Kafka's DelegationTokenCache keeps a SCRAM
credential per token and mechanism derived from that HMAC with a random salt
at the mechanism's minimum iteration count; :func:`scram_credential` does the
same, once per token, mechanism and secret.
"""

from __future__ import annotations

import base64
import functools
import hmac
from typing import Callable, Iterable, Mapping

import attrs

from josef import scram
from josef.metadata.records import DelegationTokenRecord
from josef.security import ANONYMOUS, KafkaPrincipal, Session

#: Kafka's broker and controller configs (the secret key enables tokens; unset, the APIs answer
#: DELEGATION_TOKEN_AUTH_DISABLED).
SECRET_KEY = "delegation.token.secret.key"
MAX_LIFETIME_MS = "delegation.token.max.lifetime.ms"
EXPIRY_TIME_MS = "delegation.token.expiry.time.ms"
EXPIRY_CHECK_INTERVAL_MS = "delegation.token.expiry.check.interval.ms"
#: What Kafka answers in the timestamps of a refused Renew or Expire (DelegationTokenManager.ErrorTimestamp).
ERROR_TIMESTAMP = -1
INT64_MAX = 2**63 - 1


@attrs.frozen
class TokenInformation:
    """One token as the image keeps it (Kafka's TokenInformation): never its HMAC."""

    token_id: str
    owner: KafkaPrincipal
    requester: KafkaPrincipal
    renewers: tuple[KafkaPrincipal, ...]
    issue_timestamp: int
    max_timestamp: int
    expiry_timestamp: int

    def owner_or_renewer(self, principal: KafkaPrincipal) -> bool:
        """Whether ``principal`` may renew, expire and describe the token without any ACL (Kafka's ownerOrRenewer)."""
        return principal == self.owner or principal in self.renewers

    def expired(self, now_ms: int) -> bool:
        """Past its expiry or its maximum lifetime: Kafka refuses to renew it, and the controller removes it."""
        return self.max_timestamp < now_ms or self.expiry_timestamp < now_ms

    @classmethod
    def from_record(cls, record: DelegationTokenRecord) -> TokenInformation:
        return cls(record.token_id, KafkaPrincipal.parse(record.owner), KafkaPrincipal.parse(record.requester),
                   tuple(KafkaPrincipal.parse(r) for r in record.renewers), record.issue_timestamp,
                   record.max_timestamp, record.expiration_timestamp)

    def to_record(self) -> DelegationTokenRecord:
        return DelegationTokenRecord(owner=str(self.owner), requester=str(self.requester),
                                     renewers=tuple(str(r) for r in self.renewers),
                                     issue_timestamp=self.issue_timestamp, max_timestamp=self.max_timestamp,
                                     expiration_timestamp=self.expiry_timestamp, token_id=self.token_id)


def create_hmac(token_id: str, secret_key: str) -> bytes:
    """Kafka's DelegationTokenManager.createHmac: HMAC-SHA512 of the token id's UTF-8 bytes, keyed by the secret's."""
    return hmac.new(secret_key.encode(), token_id.encode(), "sha512").digest()


def hmac_text(token_hmac: bytes) -> str:
    """The HMAC as clients use it for a password, and as Kafka's tool prints it: standard base64."""
    return base64.b64encode(token_hmac).decode()


def token_for_hmac(tokens: Mapping[str, TokenInformation], token_hmac: bytes,
                   secret_key: str) -> TokenInformation | None:
    """The token whose HMAC is ``token_hmac`` (Renew and Expire name tokens so), compared in constant time."""
    for token in tokens.values():
        if hmac.compare_digest(create_hmac(token.token_id, secret_key), token_hmac):
            return token
    return None


@functools.lru_cache(maxsize=4096)
def scram_credential(secret_key: str, token_id: str, algorithm: scram.ScramAlgorithm) -> scram.ScramCredential:
    """The SCRAM credential of a token for one mechanism, as Kafka's DelegationTokenCache derives it.

    The password is the HMAC in base64; the salt is random and the iteration
    count the mechanism's minimum, as in Kafka. Cached (PBKDF2 is costly),
    keyed by the secret too so a changed secret derives anew; whether the
    token still exists is the caller's question, asked of the image each time.
    """
    password = hmac_text(create_hmac(token_id, secret_key))
    salt = scram.random_salt()
    salted = scram.salted_password(algorithm, password, salt, scram.MIN_ITERATIONS)
    return scram.credential(algorithm, salt, salted, scram.MIN_ITERATIONS)


@attrs.frozen(repr=False)
class TokenCredential:
    """What a SCRAM exchange with ``tokenauth=true`` needs of a token: the credential, the owner, the expiry."""

    credential: scram.ScramCredential
    owner: KafkaPrincipal
    expiry_timestamp: int

    def __repr__(self) -> str:
        return f"TokenCredential(owner={self.owner}, expiry_timestamp={self.expiry_timestamp})"


#: A token's credential for a mechanism, by token id; None for a token that does not exist (or has expired).
TokenLookup = Callable[[str, scram.ScramAlgorithm], "TokenCredential | None"]


def token_credential(tokens: Mapping[str, TokenInformation], secret_key: str | None, token_id: str,
                     algorithm: scram.ScramAlgorithm, now_ms: int) -> TokenCredential | None:
    """The credential a client authenticating with token ``token_id`` must prove; None when tokens are disabled,
    the token is unknown or already past its expiry (the controller removes such tokens only at its next sweep)."""
    token = tokens.get(token_id)
    if secret_key is None or token is None or token.expired(now_ms):
        return None
    return TokenCredential(scram_credential(secret_key, token_id, algorithm), token.owner, token.expiry_timestamp)


def allow_token_requests(session: Session) -> bool:
    """Kafka's allowTokenRequests: no token API over a connection authenticated with a token (a token cannot beget
    tokens or outlive itself), over PLAINTEXT, or over SSL without a client certificate (nobody authenticated).

    A request a broker forwarded was checked there, on the client's own connection: only the token question stays.
    """
    if session.token_authenticated:
        return False
    if session.forwarded:
        return True
    protocol = session.security_protocol
    return not (protocol == "PLAINTEXT" or (protocol == "SSL" and session.principal == ANONYMOUS))


def eligible(token: TokenInformation, owners: Iterable[KafkaPrincipal] | None) -> bool:
    """Whether DescribeDelegationToken's owners filter keeps ``token`` (None: every token), before authorization."""
    return owners is None or any(token.owner_or_renewer(owner) for owner in owners)
