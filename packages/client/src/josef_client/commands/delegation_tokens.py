"""``josef delegation-tokens``: create, renew, expire and describe delegation tokens, as Kafka 4.x's
``kafka-delegation-tokens.sh`` (DelegationTokenCommand) does, with its flags, checks and output::

    josef delegation-tokens --bootstrap-server localhost:9092 --command-config client.properties \\
        --create --max-life-time-period -1 --renewer-principal User:bob
    josef delegation-tokens ... --renew --renew-time-period -1 --hmac <HMAC>
    josef delegation-tokens ... --expire --expiry-time-period -1 --hmac <HMAC>
    josef delegation-tokens ... --describe [--owner-principal User:alice]

Tokens are only handed out over an authenticated connection (SASL, or TLS
with a client certificate) that was not itself authenticated with a token,
which is why ``--command-config`` is required, as in Kafka. A client then
authenticates with the token through SCRAM: the token id as ``username``, the
HMAC as ``password`` and ``tokenauth="true"`` in ScramLoginModule's JAAS entry.

One difference from Kafka's tool: ``--describe`` without ``--owner-principal``
asks the broker for every token the principal may see, as the option's help
says; Kafka's tool sends an empty owner list there, which its brokers answer
with no token at all. Renew and expire end their last line with a newline,
which Kafka's do not.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from josef_client.commands.common import Command, admin_client, principals, run

if TYPE_CHECKING:
    from josef_client.admin import DelegationToken

#: Kafka's SimpleDateFormat("yyyy-MM-dd'T'HH:mm"), in the local time zone as the JVM's default.
DATE_FORMAT = "%Y-%m-%dT%H:%M"
#: printToken's row format: "%-15s %-30s %-15s %-15s %-25s %-15s %-15s %-15s".
WIDTHS = (15, 30, 15, 15, 25, 15, 15, 15)
HEADERS = ("TOKENID", "HMAC", "OWNER", "REQUESTER", "RENEWERS", "ISSUEDATE", "EXPIRYDATE", "MAXDATE")


def fail(message: str) -> None:
    raise click.ClickException(message)


def date(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000).strftime(DATE_FORMAT)


def java_list(items: Sequence[str]) -> str:
    """A Java List's toString: ``[User:a, User:b]``."""
    return "[" + ", ".join(items) + "]"


def row(cells: Sequence[str]) -> str:
    return " ".join(cell.ljust(width) for cell, width in zip(cells, WIDTHS))


def token_table(tokens: Sequence[DelegationToken]) -> str:
    """Kafka's printToken: an empty line, the header, then an empty line before each token's line."""
    out = "\n" + row(HEADERS) + "\n"
    for t in tokens:
        out += "\n" + row((t.token_id, t.hmac_base64, t.owner, t.requester, java_list(t.renewers),
                           date(t.issue_timestamp), date(t.expiry_timestamp), date(t.max_timestamp))) + "\n"
    return out


#: Kafka's checkInvalidArgs, per action: the options it may not be given with, in Kafka's order.
INVALID = {
    "create": ("hmac", "renew-time-period", "expiry-time-period"),
    "renew": ("renewer-principal", "max-life-time-period", "expiry-time-period", "owner-principal"),
    "expire": ("renew", "max-life-time-period", "renew-time-period", "owner-principal"),
    "describe": ("renew-time-period", "max-life-time-period", "hmac", "expiry-time-period"),
}
#: Kafka's checkRequiredArgs, per action.
REQUIRED = {"create": ("max-life-time-period",), "renew": ("hmac", "renew-time-period"),
            "expire": ("hmac", "expiry-time-period"), "describe": ()}


@click.command("delegation-tokens", cls=Command)
@click.option("--bootstrap-server", "bootstrap_server", metavar="HOST:PORT[,HOST:PORT]",
              help="REQUIRED: server(s) to use for bootstrapping.")
@click.option("--command-config", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="REQUIRED: A property file containing configs to be passed to Admin Client. Token management "
                   "operations are allowed in secure mode only. This config file is used to pass security related "
                   "configs.")
@click.option("--create", "create_", is_flag=True,
              help="Create a new delegation token. Use --renewer-principal option to pass renewer principals.")
@click.option("--renew", "renew_", is_flag=True,
              help="Renew delegation token. Use --renew-time-period option to set renew time period.")
@click.option("--expire", "expire_", is_flag=True,
              help="Expire delegation token. Use --expiry-time-period option to expire the token.")
@click.option("--describe", "describe_", is_flag=True,
              help="Describe delegation tokens for the given principals. Use --owner-principal to pass owner/renewer "
                   "principals. If --owner-principal option is not supplied, all the user-owned tokens and tokens "
                   "where the user has Describe permissions will be returned.")
@click.option("--owner-principal", multiple=True, metavar="PRINCIPAL",
              help="owner is a Kafka principal. They should be in principalType:name format.")
@click.option("--renewer-principal", multiple=True, metavar="PRINCIPAL",
              help="renewer is a Kafka principal. They should be in principalType:name format.")
@click.option("--max-life-time-period", type=int, metavar="MS",
              help="Max life period for the token in milliseconds. If the value is -1, then token max life time will "
                   "default to the server side config value of (delegation.token.max.lifetime.ms).")
@click.option("--renew-time-period", type=int, metavar="MS",
              help="Renew time period in milliseconds. If the value is -1, then the renew time period will default to "
                   "the server side config value of (delegation.token.expiry.time.ms).")
@click.option("--expiry-time-period", type=int, metavar="MS",
              help="Expiry time period in milliseconds. If the value is -1, then the token will get invalidated "
                   "immediately.")
@click.option("--hmac", metavar="HMAC", help="HMAC of the delegation token")
def delegation_tokens(bootstrap_server: str | None, command_config: Path | None, create_: bool, renew_: bool,
                      expire_: bool, describe_: bool, owner_principal: Sequence[str],
                      renewer_principal: Sequence[str], max_life_time_period: int | None,
                      renew_time_period: int | None, expiry_time_period: int | None, hmac: str | None) -> None:
    """This tool helps to create, renew, expire, or describe delegation tokens (kafka-delegation-tokens.sh)."""
    actions = [name for name, given in (("create", create_), ("renew", renew_), ("expire", expire_),
                                        ("describe", describe_)) if given]
    if len(actions) != 1:
        fail("Command must include exactly one action: --create, --renew, --expire or --describe")
    action = actions[0]
    given = {"bootstrap-server": bootstrap_server, "command-config": command_config, "hmac": hmac,
             "max-life-time-period": max_life_time_period, "renew-time-period": renew_time_period,
             "expiry-time-period": expiry_time_period, "owner-principal": owner_principal,
             "renewer-principal": renewer_principal, "renew": renew_}
    for name in ("bootstrap-server", "command-config", *REQUIRED[action]):
        if given[name] is None:
            fail(f'Missing required argument "[{name}]"')
    for name in INVALID[action]:
        if given[name]:
            fail(f'Option "[{action}]" can\'t be used with option "[{name}]"')
    owners, renewers = principals(owner_principal), principals(renewer_principal)
    assert bootstrap_server is not None
    token_hmac = b""
    if hmac is not None:
        import base64
        import binascii

        try:
            token_hmac = base64.b64decode(hmac, validate=True)
        except (binascii.Error, ValueError):
            fail(f"--hmac {hmac!r} is not base64 (the HMAC as --create and --describe print it)")

    async def go() -> None:
        async with admin_client(bootstrap_server, command_config) as admin:
            if action == "create":
                click.echo(f"Calling create token operation with renewers :{java_list(renewers)} , "
                           f"max-life-time-period :{max_life_time_period}")
                token = await admin.create_delegation_token(owner=owners[0] if owners else None, renewers=renewers,
                                                            max_lifetime_ms=max_life_time_period or -1)
                click.echo(f"Created delegation token with tokenId : {token.token_id}")
                click.echo(token_table([token]), nl=False)
            elif action == "renew":
                click.echo(f"Calling renew token operation with hmac :{hmac} , renew-time-period :{renew_time_period}")
                expiry = await admin.renew_delegation_token(token_hmac, renew_time_period_ms=renew_time_period or -1)
                click.echo(f"Completed renew operation. New expiry date : {date(expiry)}")
            elif action == "expire":
                click.echo(f"Calling expire token operation with hmac :{hmac} , "
                           f"expire-time-period :{expiry_time_period}")
                expiry = await admin.expire_delegation_token(token_hmac, expiry_time_period_ms=(
                    -1 if expiry_time_period is None else expiry_time_period))
                click.echo(f"Completed expire operation. New expiry date : {date(expiry)}")
            else:
                if owners:
                    click.echo(f"Calling describe token operation for owners: {java_list(owners)}")
                else:
                    click.echo("Calling describe token operation for current user.")
                tokens = await admin.describe_delegation_tokens(owners or None)
                click.echo(f"Total number of tokens : {len(tokens)}", nl=False)
                click.echo(token_table(tokens), nl=False)

    run(go())
