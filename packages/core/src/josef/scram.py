"""SCRAM credentials (RFC 5802, RFC 7677): the mechanisms, and the keys derived from a password as Kafka derives them.

Kafka never stores a SCRAM password, not even a salted one: a credential is
the salt, the iteration count and two keys derived from the salted password
(Kafka's ScramFormatter). ``StoredKey = H(HMAC(SaltedPassword, "Client Key"))``
lets the broker check a client's proof; ``ServerKey = HMAC(SaltedPassword,
"Server Key")`` lets the broker prove to the client that it knows the
credential. The salted password is ``Hi()`` of RFC 5802, which is PBKDF2 with
HMAC of the mechanism's hash. The broker, the controller, ``josef storage
format --add-scram`` and ``josef configs`` all use these functions, so a
credential written by any of them (or by Kafka's tools) is the same bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

import attrs

#: Kafka's bounds on a credential's iteration count (ScramMechanism, ScramControlManager.MAX_ITERATIONS).
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
#: What Kafka's tools use when no iteration count is given.
DEFAULT_ITERATIONS = 4096


@attrs.frozen
class ScramAlgorithm:
    """One SCRAM mechanism: its SASL name, Kafka's type number (in records and the admin APIs) and its hash."""

    name: str
    type: int
    hash_name: str

    def digest(self, data: bytes) -> bytes:
        return hashlib.new(self.hash_name, data).digest()

    def hmac(self, key: bytes, data: bytes) -> bytes:
        return hmac.new(key, data, self.hash_name).digest()

    @property
    def digest_size(self) -> int:
        return hashlib.new(self.hash_name).digest_size


SCRAM_SHA_256 = ScramAlgorithm("SCRAM-SHA-256", 1, "sha256")
SCRAM_SHA_512 = ScramAlgorithm("SCRAM-SHA-512", 2, "sha512")
BY_NAME = {a.name: a for a in (SCRAM_SHA_256, SCRAM_SHA_512)}
BY_TYPE = {a.type: a for a in (SCRAM_SHA_256, SCRAM_SHA_512)}


@attrs.frozen(repr=False)
class ScramCredential:
    """What the metadata log keeps of one user's password for one mechanism (UserScramCredentialRecord)."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def __repr__(self) -> str:
        # Keys are as good as a password against a server that leaks them: never in a log line.
        return f"ScramCredential(iterations={self.iterations})"


def salted_password(algorithm: ScramAlgorithm, password: str, salt: bytes, iterations: int) -> bytes:
    """RFC 5802's ``Hi(Normalize(password), salt, i)``; Kafka normalizes as UTF-8 bytes only (no SASLprep)."""
    return hashlib.pbkdf2_hmac(algorithm.hash_name, password.encode(), salt, iterations)


def client_key(algorithm: ScramAlgorithm, salted: bytes) -> bytes:
    return algorithm.hmac(salted, b"Client Key")


def credential(algorithm: ScramAlgorithm, salt: bytes, salted: bytes, iterations: int) -> ScramCredential:
    """The stored form of a salted password: Kafka's ScramFormatter.generateCredential."""
    return ScramCredential(salt, algorithm.digest(client_key(algorithm, salted)),
                           algorithm.hmac(salted, b"Server Key"), iterations)


def random_string() -> str:
    """Kafka's ScramFormatter.secureRandomString: 130 random bits in base 36 (nonces, salts)."""
    value = secrets.randbits(130)
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        value, digit = divmod(value, 36)
        out = digits[digit] + out
        if not value:
            return out


def random_salt() -> bytes:
    """A new salt as Kafka's tools make one (the UTF-8 bytes of :func:`random_string`)."""
    return random_string().encode()


def check_iterations(iterations: int) -> str | None:
    """Kafka's ScramControlManager messages for an iteration count out of bounds; None when it is fine."""
    if iterations < MIN_ITERATIONS:
        return "Too few iterations"
    if iterations > MAX_ITERATIONS:
        return "Too many iterations"
    return None
