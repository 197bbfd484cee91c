"""Kafka's DefaultKafkaPrincipalBuilder, the default of ``principal.builder.class``.

SASL names the principal after the user it authenticated (``User:alice``);
on SSL, a client certificate names it through the listener's
``ssl.principal.mapping.rules`` (its RFC 2253 subject by default); anything
else is ``User:ANONYMOUS``. Another builder comes from a plugin
(``register_principal_builders``), selected by the same key.
"""

from __future__ import annotations

from josef.config import Config
from josef.security import ANONYMOUS, AuthenticationContext, KafkaPrincipal
from josef.server.tls import SslPrincipalMapper

#: Kafka's class name, which ``principal.builder.class`` takes as it is.
DEFAULT_PRINCIPAL_BUILDER = "org.apache.kafka.common.security.authenticator.DefaultKafkaPrincipalBuilder"


class DefaultKafkaPrincipalBuilder:
    def __init__(self, config: Config) -> None:
        self._config = config
        self._mappers: dict[str, SslPrincipalMapper] = {}

    def build(self, context: AuthenticationContext) -> KafkaPrincipal:
        if context.sasl_authorization_id is not None:
            return KafkaPrincipal("User", context.sasl_authorization_id)
        if context.peer_subject is not None:
            return KafkaPrincipal("User", self._mapper(context.listener_name).name(context.peer_subject))
        return ANONYMOUS

    def _mapper(self, listener: str) -> SslPrincipalMapper:
        mapper = self._mappers.get(listener)
        if mapper is None:
            rules = self._config.for_listener(listener, "ssl.principal.mapping.rules")
            mapper = self._mappers[listener] = SslPrincipalMapper(rules)
        return mapper
