"""SASL/OAUTHBEARER (RFC 7628; Kafka's KIP-255 and KIP-768) on a broker's SASL listeners.

A client sends one message, RFC 7628's GS2 form
``n,[a=authzid],\\x01auth=Bearer <token>\\x01[key=value\\x01]*\\x01``; the
token is a JWT that the listener's validator checks, as Kafka's callback
handlers do:

* unsecured (Kafka's default, for development: no
  ``listener.name.<l>.oauthbearer.sasl.server.callback.handler.class``):
  tokens with ``alg: none`` and no signature, as
  OAuthBearerUnsecuredValidatorCallbackHandler takes them; the JAAS options
  ``unsecuredValidatorPrincipalClaimName`` (``sub``),
  ``unsecuredValidatorScopeClaimName`` (``scope``),
  ``unsecuredValidatorRequiredScope`` and
  ``unsecuredValidatorAllowableClockSkewMs`` (0) are Kafka's;
* JWKS (the handler class set to Kafka's OAuthBearerValidatorCallbackHandler
  and ``sasl.oauthbearer.jwks.endpoint.url`` set): signed tokens (RS*, PS*,
  ES*, EdDSA; never ``none`` or a shared secret) checked against the keys of
  the JWKS with PyJWT, with ``exp`` and ``iat`` required, the expected
  audience and issuer, the ``sasl.oauthbearer.*`` claim names and clock skew.

The JWKS is fetched by :class:`JwksSource` in a worker thread, when the
broker starts (a broker that cannot fetch it does not start, as Kafka's) and
then every ``sasl.oauthbearer.jwks.endpoint.refresh.ms``, so validating a
token is a look-up in memory on the event loop, never an HTTP call. A token
signed with a key id the cache lacks schedules one refresh, at most once a
minute per key id (Kafka's RefreshingHttpsJwks), and is refused meanwhile: a
key rotated in at the identity provider is picked up without a restart.

A refused token is answered as OAuthBearerSaslServer answers it: an error
challenge ``{"status":"invalid_token"}`` (``insufficient_scope`` with the
required scope), which the client acknowledges with ``\\x01``, then
SASL_AUTHENTICATION_FAILED with that JSON as the message. Neither the token
nor its claims reach the client or a log line: the broker's one line names
the check that failed. A malformed first message fails at once with Kafka's
message for a SaslException.

An authenticated exchange carries the token's expiry as ``expires_at_ms`` so
that the session lasts no longer than the token (KIP-368,
:mod:`josef.server.apis.authentication`).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
import re
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from typing import Any, Callable, Mapping, Protocol

import anyio
import anyio.abc
import anyio.to_thread
import attrs
import jwt

from josef.config import Config, ConfigError
from josef.protocol.jaas import parse_jaas
from josef.security import KafkaPrincipal, SaslAuthenticationError
from josef.server.scram import CredentialLookup, invalid_credentials

log = logging.getLogger(__name__)

MECHANISM = "OAUTHBEARER"
LOGIN_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
UNSECURED_VALIDATOR = ("org.apache.kafka.common.security.oauthbearer.internals.unsecured."
                       "OAuthBearerUnsecuredValidatorCallbackHandler")
#: Kafka's JWKS validator, by its current name and by the one it had before Kafka 3.4 (still accepted there).
JWKS_VALIDATORS = ("org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler",
                   "org.apache.kafka.common.security.oauthbearer.secured.OAuthBearerValidatorCallbackHandler")
#: The signature algorithms a JWKS key may verify, by its key type: asymmetric only, so a public key can never be
#: used as an HMAC secret, and never ``none``.
ALGORITHMS_BY_KEY_TYPE = {"RSA": ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512"),
                          "EC": ("ES256", "ES384", "ES512"), "OKP": ("EdDSA",)}
#: RefreshingHttpsJwks: a missing key id schedules a refresh at most this often; this many ids are remembered.
MISSING_KEY_ID_INTERVAL_MS = 60_000
MISSING_KEY_ID_CACHE = 16
MISSING_KEY_ID_MAX_LENGTH = 1000

_SEPARATOR = "\x01"
_KEY = r"[A-Za-z]+"
_VALUE = r"[\x21-\x7E \t\r\n]+"
_CLIENT_FIRST = re.compile(rf"n,(?:a=(?P<authzid>(?:[\x02-\x2B\x2D-\x3C\x3E-\x7F]|=2C|=3D)+))?,{_SEPARATOR}"
                           rf"(?P<kvpairs>(?:{_KEY}={_VALUE}{_SEPARATOR})*){_SEPARATOR}")
_AUTH = re.compile(r"(?P<scheme>\w+) +(?P<token>[-_~+/.a-zA-Z0-9]+=*)")
_EXTENSION_KEY = re.compile(_KEY)
_EXTENSION_VALUE = re.compile(_VALUE)


class TokenRefused(Exception):
    """A token the validator refuses. ``str()`` says which check failed, for the broker's log only: it never holds the
    token or a claim's value. ``scope`` is the required scope the token lacks (``insufficient_scope``)."""

    def __init__(self, reason: str, scope: tuple[str, ...] | None = None) -> None:
        super().__init__(reason)
        self.scope = scope

    def json(self) -> str:
        """The error challenge, as OAuthBearerSaslServer writes it (RFC 7628 section 3.2.2)."""
        if self.scope is None:
            return '{"status":"invalid_token"}'
        return '{"status":"insufficient_scope", "scope":"[%s]"}' % ", ".join(self.scope)


@attrs.frozen
class ValidatedToken:
    """What a valid token says: who the client is, until when, with which scope."""

    principal_name: str
    #: Epoch milliseconds.
    expires_at_ms: int
    scope: frozenset[str]


class TokenValidator(Protocol):
    def validate(self, token: str) -> ValidatedToken:
        """The token's principal and lifetime; :class:`TokenRefused` when it must not authenticate anyone."""


def _now_ms() -> int:
    return int(time.time() * 1000)


def _b64url_json(part: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    except (binascii.Error, ValueError):
        raise TokenRefused(f"malformed {what}: not Base64URL-encoded JSON") from None
    if not isinstance(value, dict):
        raise TokenRefused(f"malformed {what}: not a JSON object")
    return value


def _scope(claims: Mapping[str, Any], name: str) -> frozenset[str]:
    """Kafka's reading of the scope claim: a string is one scope element, a list its elements."""
    raw = claims.get(name)
    if isinstance(raw, str):
        return frozenset([raw.strip()]) if raw.strip() else frozenset()
    if isinstance(raw, list):
        return frozenset(s.strip() for s in raw if isinstance(s, str) and s.strip())
    return frozenset()


def _numeric(claims: Mapping[str, Any], name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TokenRefused(f"the {name} claim is not a number")
    return float(value)


@attrs.frozen
class UnsecuredValidator:
    """Kafka's OAuthBearerUnsecuredValidatorCallbackHandler: ``alg: none`` tokens, for development only."""

    principal_claim: str = "sub"
    scope_claim: str = "scope"
    required_scope: tuple[str, ...] = ()
    clock_skew_ms: int = 0
    now_ms: Callable[[], int] = _now_ms

    @classmethod
    def from_options(cls, options: Mapping[str, str], key: str) -> UnsecuredValidator:
        skew = options.get("unsecuredValidatorAllowableClockSkewMs", "").strip() or "0"
        try:
            clock_skew_ms = int(skew)
        except ValueError:
            raise ConfigError(f"{key}: unsecuredValidatorAllowableClockSkewMs must be an integer") from None
        if clock_skew_ms < 0:
            raise ConfigError(f"{key}: unsecuredValidatorAllowableClockSkewMs must not be negative")
        return cls(options.get("unsecuredValidatorPrincipalClaimName", "").strip() or "sub",
                   options.get("unsecuredValidatorScopeClaimName", "").strip() or "scope",
                   tuple(options.get("unsecuredValidatorRequiredScope", "").split()), clock_skew_ms)

    def validate(self, token: str) -> ValidatedToken:
        if ".." in token:
            raise TokenRefused("malformed compact serialization contains '..'")
        parts = token.split(".")
        if len(parts) != 3:
            raise TokenRefused("unsecured JWS compact serializations must have 3 dot-separated Base64URL-encoded "
                               "values")
        header, claims = _b64url_json(parts[0], "JWS header"), _b64url_json(parts[1], "JWT claims")
        if header.get("alg") != "none":
            raise TokenRefused("unsecured JWS must have 'none' for an algorithm")
        if parts[2]:
            raise TokenRefused("unsecured JWS must not contain a digital signature")
        scope = _scope(claims, self.scope_claim)
        expires = _numeric(claims, "exp")
        if expires is None:
            raise TokenRefused("no expiration time (exp) in the JWT")
        principal = claims.get(self.principal_claim)
        if not isinstance(principal, str) or not principal.strip():
            raise TokenRefused(f"no principal name in the JWT claim {self.principal_claim}")
        now = self.now_ms()
        issued = _numeric(claims, "iat")
        if issued is not None and issued * 1000 > now + self.clock_skew_ms:
            raise TokenRefused("the issued-at time (iat) is after now plus the allowable clock skew")
        if now - self.clock_skew_ms >= expires * 1000:
            raise TokenRefused("the token has expired (exp)")
        if issued is not None and expires <= issued:
            raise TokenRefused("the expiration time (exp) is not after the issued-at time (iat)")
        missing = [s for s in self.required_scope if s not in scope]
        if missing:
            raise TokenRefused(f"the token's scope lacks a required element ({len(missing)} missing)",
                               scope=self.required_scope)
        return ValidatedToken(principal, int(expires * 1000), scope)


def _fetch_jwks(url: str, timeout_s: float) -> dict[str, jwt.PyJWK]:
    """GET the JWKS (in a worker thread): its usable signing keys, by key id ("" for a key without one)."""
    with urllib.request.urlopen(url, timeout=timeout_s) as answer:  # noqa: S310 (http, https or file, as Kafka)
        document = json.loads(answer.read())
    keys = jwt.PyJWKSet.from_dict(document).keys
    return {key.key_id or "": key for key in keys
            if key.key_type in ALGORITHMS_BY_KEY_TYPE and getattr(key, "public_key_use", None) in (None, "sig")}


@attrs.define
class JwksSource:
    """The keys of a JWKS URL, fetched off the event loop and refreshed in the background (RefreshingHttpsJwks)."""

    url: str
    refresh_ms: int = 3_600_000
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 10_000
    timeout_s: float = 10.0
    now_ms: Callable[[], int] = _now_ms
    #: The last fetched keys by key id; replaced whole by each refresh, read by validations on the loop.
    keys: Mapping[str, jwt.PyJWK] = attrs.field(factory=dict)
    #: How many times the JWKS was fetched successfully (tests and operators: it is not fetched per token).
    fetches: int = 0
    _missing: OrderedDict[str, int] = attrs.field(factory=OrderedDict)
    _wake: anyio.Event | None = None

    async def fetch(self) -> None:
        """One fetch in a worker thread; the keys are replaced only if it succeeds."""
        keys = await anyio.to_thread.run_sync(_fetch_jwks, self.url, self.timeout_s)
        self.keys = keys
        self.fetches += 1
        for kid in keys:
            self._missing.pop(kid, None)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Fetch, report started, then refresh every ``refresh_ms`` or sooner when a token names an unknown key id.

        The first fetch failing stops the broker from starting, as Kafka's
        does: every token would be refused. A later failure keeps the keys
        it has, retried with exponential backoff up to ``retry_backoff_max_ms``.
        """
        try:
            await self.fetch()
        except (OSError, ValueError, jwt.PyJWTError) as exc:
            raise ConfigError(f"sasl.oauthbearer.jwks.endpoint.url: cannot fetch the JWKS from {self.url}: "
                              f"{exc}") from None
        log.info("fetched the JWKS of %s (%d keys); refreshing every %d ms", self.url, len(self.keys),
                 self.refresh_ms)
        task_status.started()
        while True:
            self._wake = anyio.Event()
            with anyio.move_on_after(self.refresh_ms / 1000):
                await self._wake.wait()
            backoff_ms = self.retry_backoff_ms
            while True:
                try:
                    await self.fetch()
                    log.info("refreshed the JWKS of %s (%d keys)", self.url, len(self.keys))
                    break
                except (OSError, ValueError, jwt.PyJWTError) as exc:
                    if backoff_ms > self.retry_backoff_max_ms:
                        log.warning("refreshing the JWKS of %s failed; keeping its %d keys: %s", self.url,
                                    len(self.keys), exc)
                        break
                    await anyio.sleep(backoff_ms / 1000)
                    backoff_ms *= 2

    def expedite(self, kid: str) -> bool:
        """A token names a key id the cache lacks: refresh now, unless done for that id less than a minute ago.
        Called on the event loop; returns whether a refresh was scheduled."""
        if len(kid) > MISSING_KEY_ID_MAX_LENGTH or self._wake is None:
            return False
        now = self.now_ms()
        if self._missing.get(kid, 0) > now:
            return False
        self._missing[kid] = now + MISSING_KEY_ID_INTERVAL_MS
        self._missing.move_to_end(kid)
        while len(self._missing) > MISSING_KEY_ID_CACHE:
            self._missing.popitem(last=False)
        self._wake.set()
        return True


@attrs.frozen
class JwksValidator:
    """Kafka's OAuthBearerValidatorCallbackHandler: signed JWTs checked against the keys of a JWKS."""

    source: JwksSource
    audiences: tuple[str, ...] = ()
    issuer: str | None = None
    sub_claim: str = "sub"
    scope_claim: str = "scope"
    clock_skew_s: int = 30

    def validate(self, token: str) -> ValidatedToken:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise TokenRefused("malformed JWT header") from None
        alg, kid = header.get("alg"), header.get("kid")
        if not isinstance(alg, str) or not any(alg in algs for algs in ALGORITHMS_BY_KEY_TYPE.values()):
            raise TokenRefused("the JWT's algorithm is not an asymmetric signature algorithm")
        if kid is not None and not isinstance(kid, str):
            raise TokenRefused("the JWT's key id is not a string")
        keys = self.source.keys
        if kid is not None:
            key = keys.get(kid)
            if key is None:
                scheduled = self.source.expedite(kid)
                raise TokenRefused("no key in the JWKS has the JWT's key id" +
                                   ("; a refresh of the JWKS is scheduled" if scheduled else ""))
            candidates = [key]
        else:
            candidates = list(keys.values())
        candidates = [k for k in candidates if alg in ALGORITHMS_BY_KEY_TYPE[k.key_type]]
        if not candidates:
            raise TokenRefused("no key in the JWKS verifies the JWT's algorithm")
        options: dict[str, Any] = {"require": ["exp", "iat"], "verify_aud": bool(self.audiences)}
        claims: dict[str, Any] | None = None
        failure: jwt.PyJWTError | None = None
        for candidate in candidates:
            try:
                claims = jwt.decode(token, candidate.key, algorithms=[alg], options=options,  # type: ignore[arg-type]
                                    audience=list(self.audiences) or None, issuer=self.issuer,
                                    leeway=self.clock_skew_s)
                break
            except jwt.InvalidSignatureError as exc:
                failure = exc
            except jwt.PyJWTError as exc:  # expired, audience, issuer, missing claims: the signature was good
                failure = exc
                break
        if claims is None:
            raise TokenRefused(f"could not validate the JWT: {type(failure).__name__}: {failure}")
        subject = claims.get(self.sub_claim)
        if not isinstance(subject, str) or not subject.strip():
            raise TokenRefused(f"the JWT has no {self.sub_claim} claim (sasl.oauthbearer.sub.claim.name)")
        return ValidatedToken(subject.strip(), int(_numeric(claims, "exp") * 1000),  # type: ignore[operator]
                              _scope(claims, self.scope_claim))


class OAuthBearerServer:
    """One connection's OAUTHBEARER exchange, as Kafka's OAuthBearerSaslServer."""

    def __init__(self, validator: TokenValidator) -> None:
        self._validator = validator
        self.principal: KafkaPrincipal | None = None
        #: When the token expires (epoch ms): the session must not outlive it (KIP-368). None before success.
        self.expires_at_ms: int | None = None
        #: The client's SASL extensions (``sasl.extensions``), accepted as Kafka's validators accept them.
        self.extensions: dict[str, str] = {}
        self._refused: TokenRefused | None = None

    @property
    def complete(self) -> bool:
        return self.principal is not None

    def evaluate(self, token: bytes) -> bytes:
        if self.complete:
            raise SaslAuthenticationError(invalid_credentials(MECHANISM), "a token after a completed exchange")
        refused, self._refused = self._refused, None
        if token == b"\x01" and refused is not None:
            # The client acknowledged the error challenge: now the exchange fails, with the challenge as the message.
            raise SaslAuthenticationError(refused.json(), str(refused))
        authzid, bearer, extensions = parse_client_first(token)
        try:
            valid = self._validator.validate(bearer)
        except TokenRefused as exc:
            self._refused = exc
            return exc.json().encode()
        if authzid and authzid != valid.principal_name:
            raise SaslAuthenticationError("Authentication failed: Client requested an authorization id that is "
                                          "different from the token's principal name", "authzid is not the principal")
        self.extensions = extensions
        self.expires_at_ms = valid.expires_at_ms
        self.principal = KafkaPrincipal("User", valid.principal_name)
        return b""


def parse_client_first(message: bytes) -> tuple[str, str, dict[str, str]]:
    """RFC 7628's client first message, as OAuthBearerClientInitialResponse reads it: the authorization id ("" for
    none), the bearer token and the extensions; :class:`SaslAuthenticationError` with Kafka's message otherwise."""
    def malformed(reason: str) -> SaslAuthenticationError:
        return SaslAuthenticationError(invalid_credentials(MECHANISM), f"invalid OAUTHBEARER client first message: "
                                                                       f"{reason}")
    try:
        text = message.decode()
    except UnicodeDecodeError:
        raise malformed("not UTF-8") from None
    match = _CLIENT_FIRST.fullmatch(text)
    if match is None:
        raise malformed("not n,[a=authzid],^Aauth=Bearer <token>^A[key=value^A]*^A")
    pairs = dict(p.partition("=")[::2] for p in match["kvpairs"].split(_SEPARATOR) if p)
    auth = pairs.pop("auth", None)
    if auth is None:
        raise malformed("'auth' not specified")
    bearer = _AUTH.fullmatch(auth)
    if bearer is None or bearer["scheme"].lower() != "bearer":
        raise malformed("invalid 'auth' format or scheme")
    for key, value in pairs.items():
        if not _EXTENSION_KEY.fullmatch(key) or not _EXTENSION_VALUE.fullmatch(value):
            raise malformed("an invalid extension")
    authzid = (match["authzid"] or "").replace("=2C", ",").replace("=3D", "=")
    return authzid, bearer["token"], pairs


@attrs.frozen
class OAuthBearerMechanism:
    """OAUTHBEARER as a listener is configured with it: its validator, and the JWKS it keeps fresh (if any)."""

    validator: TokenValidator
    jwks: JwksSource | None = None

    @classmethod
    def from_config(cls, config: Config, listener: str, jaas: str, key: str) -> OAuthBearerMechanism:
        """Kafka's choice of validator: ``listener.name.<l>.oauthbearer.sasl.server.callback.handler.class`` set to
        OAuthBearerValidatorCallbackHandler validates against ``sasl.oauthbearer.jwks.endpoint.url``; unset, the
        unsecured validator takes the JAAS entry's ``unsecuredValidator*`` options.

        Unlike Kafka, a JWKS URL without that handler class is refused rather than ignored (set for this listener,
        or set for all while no listener has the handler): an operator who set it means tokens to be verified, and
        the unsecured validator would accept anyone's ``alg: none`` token."""
        module, options = parse_jaas(jaas, key)
        if module != LOGIN_MODULE:
            raise ConfigError(f"{key}: OAUTHBEARER needs {LOGIN_MODULE}, not {module}")
        prefix = f"listener.name.{listener.lower()}."
        handler_key = f"{prefix}oauthbearer.sasl.server.callback.handler.class"
        handler = (config.unknown.get(handler_key) or "").strip()
        url = config.for_listener(listener, "sasl.oauthbearer.jwks.endpoint.url")
        if not handler or handler == UNSECURED_VALIDATOR:
            own_url = config.is_set(f"{prefix}sasl.oauthbearer.jwks.endpoint.url")
            jwks_elsewhere = any(k.endswith(".oauthbearer.sasl.server.callback.handler.class") and
                                 v.strip() in JWKS_VALIDATORS for k, v in config.unknown.items())
            if url and (own_url or not jwks_elsewhere):
                raise ConfigError(f"listener {listener}: sasl.oauthbearer.jwks.endpoint.url is set but tokens would "
                                  f"not be verified with it: set {handler_key}={JWKS_VALIDATORS[0]} (unset, Kafka's "
                                  f"unsecured validator accepts unsigned tokens)")
            return cls(UnsecuredValidator.from_options(options, key))
        if handler not in JWKS_VALIDATORS:
            raise ConfigError(f"{handler_key}: josef offers {JWKS_VALIDATORS[0]} and the unsecured validator "
                              f"({UNSECURED_VALIDATOR}), not {handler}")
        if not url:
            raise ConfigError(f"listener {listener}: {handler_key} validates tokens against a JWKS: set "
                              f"sasl.oauthbearer.jwks.endpoint.url (a file: URL is read the same way)")

        def setting(name: str) -> Any:
            return config.for_listener(listener, name)
        source = JwksSource(url, setting("sasl.oauthbearer.jwks.endpoint.refresh.ms"),
                            setting("sasl.oauthbearer.jwks.endpoint.retry.backoff.ms"),
                            setting("sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms"))
        audiences = tuple(setting("sasl.oauthbearer.expected.audience") or ())
        return cls(JwksValidator(source, audiences, setting("sasl.oauthbearer.expected.issuer") or None,
                                 setting("sasl.oauthbearer.sub.claim.name"), setting("sasl.oauthbearer.scope.claim.name"),
                                 setting("sasl.oauthbearer.clock.skew.seconds")), source)

    def server(self, credentials: CredentialLookup) -> OAuthBearerServer:
        return OAuthBearerServer(self.validator)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Keep the JWKS fresh while the broker runs (started once it is first fetched); nothing to do unsecured."""
        if self.jwks is None:
            task_status.started()
            return
        await self.jwks.run(task_status=task_status)

