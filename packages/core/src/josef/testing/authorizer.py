"""The authorizer contract suite: what every :class:`josef.authorizer.Authorizer` plugin must do, as pytest tests.

A plugin runs it against itself with a test module that subclasses
:class:`AuthorizerContract` and gives it an :class:`AuthorizerHarness`::

    from josef.testing.authorizer import AuthorizerContract

    class TestMyAuthorizerContract(AuthorizerContract):
        @pytest.fixture
        def authorizer_harness(self):
            return MyHarness()

The authorizer is found as the broker finds it: by the name its plugin
registers (``register_authorizers``), selected with ``authorizer.class.name``
and built by its factory from the broker's configuration. The suite checks
what the broker relies on when it calls ``authorize`` on its event loop for
every request that touches a resource:

- every Kafka operation on every Kafka resource type (named as in Kafka's
  ACLs: :data:`OPERATIONS`, :data:`RESOURCE_TYPES`), for any principal, host
  and resource name, is answered with a bool, the same one each time;
- a call does not block: once warmed up it does no I/O (no file opened, no
  socket, no subprocess, no sleep: Python's audit events are watched while
  it runs); how fast it answers is a benchmark's question, not a test's;
- calls from several threads at once get the answers one thread gets;
- with :class:`GrantingAuthorizerContract` (for a plugin that can grant,
  :meth:`AuthorizerHarness.grant`), a granted principal may and a principal
  without the grant may not; with :class:`AclAuthorizerContract`, ACLs
  handed again replace the previous ones.

The tests use only the contract in :mod:`josef.authorizer` and the
``register_authorizers`` hook. The class is not named ``Test*``: pytest
collects it only through a plugin's subclass.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import attrs
import pytest

from josef.acls import AclBinding
from josef.authorizer import AclAuthorizer, Action, Authorizer
from josef.security import KafkaPrincipal
from josef.node.server_properties import load_config
from josef.plugins import collect, get_plugin_manager

__all__ = ["OPERATIONS", "RESOURCE_TYPES", "AclAuthorizerContract", "AuthorizerContract", "AuthorizerHarness",
           "BlockingWatch", "Grant", "GrantingAuthorizerContract", "RequestContext", "context", "kafka_actions"]

#: Kafka's ACL operations an authorization is asked for (``AclOperation``), by name, with their codes;
#: ``UNKNOWN``, ``ANY`` and ``ALL`` only appear in ACL bindings and filters.
OPERATIONS: Mapping[str, int] = {
    "READ": 3, "WRITE": 4, "CREATE": 5, "DELETE": 6, "ALTER": 7, "DESCRIBE": 8, "CLUSTER_ACTION": 9,
    "DESCRIBE_CONFIGS": 10, "ALTER_CONFIGS": 11, "IDEMPOTENT_WRITE": 12, "CREATE_TOKENS": 13, "DESCRIBE_TOKENS": 14,
    "TWO_PHASE_COMMIT": 15,
}
#: Kafka's resource types (``ResourceType``), by name, with their codes; ``UNKNOWN`` and ``ANY`` are filters only.
RESOURCE_TYPES: Mapping[str, int] = {
    "TOPIC": 2, "GROUP": 3, "CLUSTER": 4, "TRANSACTIONAL_ID": 5, "DELEGATION_TOKEN": 6, "USER": 7,
}
#: Resource names asked about for each type: ordinary ones, and the edge cases a request may carry.
RESOURCE_NAMES: Mapping[str, tuple[str, ...]] = {
    "TOPIC": ("orders", "__consumer_offsets"),
    "GROUP": ("billing", ""),
    "CLUSTER": ("kafka-cluster",),
    "TRANSACTIONAL_ID": ("tx-1",),
    "DELEGATION_TOKEN": ("token-1",),
    "USER": ("User:alice",),
}
#: Principals as the broker names them (``User:ANONYMOUS`` on a PLAINTEXT listener).
PRINCIPALS = ("User:ANONYMOUS", "User:alice", "User:évelyne")
#: Client hosts: IPv4, IPv6, and "" (a request the broker makes to itself).
HOSTS = ("127.0.0.1", "::1", "")

#: Audit events that mean I/O or waiting (``sys.addaudithook``): files, sockets, processes, sleeps.
_BLOCKING_EVENTS = frozenset({
    "open", "os.listdir", "os.scandir", "os.truncate", "os.remove", "os.rename", "os.mkdir", "os.chmod",
    "shutil.copyfile", "shutil.rmtree", "sqlite3.connect",
    "socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
    "socket.gethostbyname", "socket.gethostbyaddr", "socket.gethostname", "socket.getnameinfo",
    "http.client.connect", "urllib.Request", "ftplib.connect", "smtplib.connect",
    "subprocess.Popen", "os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork", "os.startfile",
    "time.sleep",
})


def kafka_actions() -> Iterator[Action]:
    """Every Kafka operation on every resource type, each with the names of :data:`RESOURCE_NAMES`."""
    for resource_type, names in RESOURCE_NAMES.items():
        for operation in OPERATIONS:
            for name in names:
                yield Action(operation, resource_type, name)


@attrs.frozen
class RequestContext:
    """A request's identity as an authorizer sees it (:class:`josef.authorizer.AuthorizableRequestContext`)."""

    principal: KafkaPrincipal
    client_host: str = "127.0.0.1"
    listener_name: str = "PLAINTEXT"
    security_protocol: str = "PLAINTEXT"
    api_key: int = 0
    api_version: int = 0
    client_id: str | None = "contract"
    correlation_id: int = 0


def context(principal: str, host: str = "127.0.0.1") -> RequestContext:
    return RequestContext(KafkaPrincipal.parse(principal), host)


@attrs.frozen
class Grant:
    """How a plugin lets one principal do one action: broker configuration, and ACLs it is handed (``load_acls``)."""

    config: Mapping[str, str] = attrs.field(factory=dict)
    acls: Mapping[Any, AclBinding] = attrs.field(factory=dict)


# Watching for I/O ---------------------------------------------------------------------------------


class _AuditWatch:
    """One process-wide audit hook (hooks cannot be removed), reporting only on threads that are being watched.

    ``time.sleep`` raises its audit event from Python 3.13 on; before, it is
    wrapped while a watch is entered (a call through ``from time import
    sleep`` bound earlier goes unseen there).
    """

    installed = False
    lock = threading.Lock()
    watching: dict[int, list[str]] = {}
    sleep: Any = None

    @classmethod
    def enter(cls, events: list[str]) -> None:
        with cls.lock:
            if not cls.installed:
                sys.addaudithook(cls.hook)
                cls.installed = True
            if not cls.watching and sys.version_info < (3, 13):
                cls.sleep = time.sleep
                time.sleep = cls.watched_sleep
            cls.watching[threading.get_ident()] = events

    @classmethod
    def exit(cls) -> None:
        with cls.lock:
            cls.watching.pop(threading.get_ident(), None)
            if not cls.watching and cls.sleep is not None:
                time.sleep, cls.sleep = cls.sleep, None

    @classmethod
    def hook(cls, event: str, args: tuple[Any, ...]) -> None:
        seen = cls.watching.get(threading.get_ident())
        if seen is not None and event in _BLOCKING_EVENTS:
            seen.append(f"{event}{_brief(args)}")

    @staticmethod
    def watched_sleep(seconds: float) -> None:
        _AuditWatch.hook("time.sleep", (seconds,))
        (_AuditWatch.sleep or _SLEEP)(seconds)


_SLEEP = time.sleep


def _brief(args: tuple[Any, ...]) -> str:
    text = repr(args)
    return text if len(text) <= 120 else text[:117] + "..."


class BlockingWatch:
    """While entered, note each blocking audit event (file, socket, process, sleep) raised on this thread in :attr:`events`."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def __enter__(self) -> BlockingWatch:
        _AuditWatch.enter(self.events)
        return self

    def __exit__(self, *exc: object) -> None:
        _AuditWatch.exit()


# The harness a plugin provides ----------------------------------------------------------------------


class AuthorizerHarness(Protocol):
    """What the suite needs from an authorizer plugin that it cannot learn through the contract."""

    #: The name the plugin registers its authorizer under (``register_authorizers``): ``authorizer.class.name``.
    name: str

    def config_keys(self) -> Mapping[str, str]:
        """Broker configuration the authorizer needs besides ``authorizer.class.name`` (may be empty)."""

    def grant(self, principal: str, action: Action) -> Grant | None:
        """How ``principal`` may perform ``action`` while a principal without a grant may not; None when the
        authorizer has no grants (it allows or denies by other rules)."""


# The suite -----------------------------------------------------------------------------------------------


class AuthorizerContract:
    """The contract of :class:`josef.authorizer.Authorizer`; subclass it and provide ``authorizer_harness``."""

    #: What every test asks about when granting: writing to a topic, the first ACL anyone sets.
    GRANTED = Action("WRITE", "TOPIC", "orders")

    @pytest.fixture
    def authorizer_harness(self) -> AuthorizerHarness:
        raise NotImplementedError("a subclass of AuthorizerContract provides the authorizer_harness fixture")

    def build(self, harness: AuthorizerHarness, grant: Grant | None = None) -> Authorizer:
        """The authorizer as the broker builds it: the registered factory, called with the broker's configuration,
        handed the grant's ACLs (and an empty set of ACLs without one, as a broker does at start-up)."""
        pm = get_plugin_manager()
        grant = grant or Grant()
        config = load_config(None, {"authorizer.class.name": harness.name, **harness.config_keys(), **grant.config},
                             pm)
        factory = collect(pm, "register_authorizers", "authorizer").get(config["authorizer.class.name"])
        authorizer = factory(config)
        if isinstance(authorizer, AclAuthorizer):
            authorizer.load_acls(grant.acls)
        elif grant.acls:
            pytest.fail(f"the harness grants with ACLs, but {type(authorizer).__name__} has no load_acls")
        return authorizer

    def answers(self, authorizer: Authorizer) -> dict[tuple[str, str, Action], Any]:
        """Every principal's answer, from every host, to every action: one batch per principal and host."""
        actions = list(kafka_actions())
        found: dict[tuple[str, str, Action], Any] = {}
        for principal, host in itertools.product(PRINCIPALS, HOSTS):
            answer = authorizer.authorize(context(principal, host), actions)
            assert isinstance(answer, list) and len(answer) == len(actions), (
                f"authorize must answer a list with one bool per action ({len(actions)}), got {answer!r:.200}")
            found.update(((principal, host, action), ok) for action, ok in zip(actions, answer))
        return found

    # Building -----------------------------------------------------------------------------------------------

    def test_it_is_registered_under_its_name_and_built_from_a_config(self, authorizer_harness):
        registered = collect(get_plugin_manager(), "register_authorizers", "authorizer").names()
        assert authorizer_harness.name in registered, (
            f"no authorizer {authorizer_harness.name!r} is registered (register_authorizers); registered: {registered}")
        assert callable(getattr(self.build(authorizer_harness), "authorize", None))

    # Answers -------------------------------------------------------------------------------------------------

    def test_every_kafka_operation_on_every_resource_type_is_answered_with_a_bool(self, authorizer_harness):
        answers = self.answers(self.build(authorizer_harness))
        assert len(answers) == len(PRINCIPALS) * len(HOSTS) * len(list(kafka_actions()))
        wrong = {key: value for key, value in answers.items() if type(value) is not bool}
        assert wrong == {}, f"authorize must return True or False, got {next(iter(wrong.values()), None)!r}"

    def test_a_batch_is_answered_as_its_actions_one_by_one(self, authorizer_harness):
        authorizer = self.build(authorizer_harness, authorizer_harness.grant("User:alice", self.GRANTED))
        actions = [self.GRANTED, *kafka_actions(), self.GRANTED]
        for principal in PRINCIPALS:
            ctx = context(principal)
            assert authorizer.authorize(ctx, actions) == [authorizer.authorize(ctx, [a])[0] for a in actions]
            assert authorizer.authorize(ctx, []) == []

    def test_the_same_question_gets_the_same_answer(self, authorizer_harness):
        authorizer = self.build(authorizer_harness)
        assert self.answers(authorizer) == self.answers(authorizer)
        assert self.answers(self.build(authorizer_harness)) == self.answers(authorizer), (
            "two authorizers built from one configuration answer differently")

    def test_authorize_by_resource_type_answers_a_bool(self, authorizer_harness):
        authorizer = self.build(authorizer_harness)
        for principal, resource_type, operation in itertools.product(PRINCIPALS, RESOURCE_TYPES, OPERATIONS):
            answer = authorizer.authorize_by_resource_type(context(principal), operation, resource_type)
            assert type(answer) is bool

    # Not blocking -------------------------------------------------------------------------------------------

    def test_a_call_does_no_io(self, authorizer_harness):
        authorizer = self.build(authorizer_harness)
        self.answers(authorizer)  # warm up: whatever is loaded once (modules, caches) is loaded now
        with BlockingWatch() as watch:
            self.answers(authorizer)
        assert watch.events == [], f"authorize did I/O or waited on the event loop: {watch.events[:5]}"

    def test_the_io_watch_sees_what_a_blocking_authorizer_would_do(self, tmp_path):
        """The check above can fail: a file read, a socket and a sleep made inside the watch are all seen."""
        path = tmp_path / "acls"
        path.write_text("User:alice")
        with BlockingWatch() as watch:
            path.read_text()
            time.sleep(0)
            import socket

            socket.socket().close()
        assert [event.split("(")[0] for event in watch.events] == ["open", "time.sleep", "socket.__new__"]

    # Concurrency ----------------------------------------------------------------------------------------------

    def test_calls_from_several_threads_at_once_get_the_answers_of_one(self, authorizer_harness):
        authorizer = self.build(authorizer_harness)
        expected = self.answers(authorizer)
        threads = 8
        start = threading.Barrier(threads)
        results: list[dict[tuple[str, str, Action], Any] | BaseException] = [{}] * threads

        def ask(index: int) -> None:
            try:
                start.wait(10)
                for _ in range(3):
                    results[index] = self.answers(authorizer)
            except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
                results[index] = exc

        workers = [threading.Thread(target=ask, args=(i,)) for i in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
        assert not any(worker.is_alive() for worker in workers), "authorize calls from several threads did not return"
        failures = [r for r in results if isinstance(r, BaseException)]
        assert failures == [], f"authorize failed when called from several threads: {failures[0]!r}"
        assert all(result == expected for result in results)



class GrantingAuthorizerContract(AuthorizerContract):
    """The contract, and what an authorizer that grants (its harness's ``grant`` never returns None) must do."""

    def test_a_granted_principal_may_and_one_without_the_grant_may_not(self, authorizer_harness):
        grant = authorizer_harness.grant("User:alice", self.GRANTED)
        assert grant is not None, f"the harness of {authorizer_harness.name!r} grants nothing"
        authorizer = self.build(authorizer_harness, grant)
        for host in HOSTS:
            assert authorizer.authorize(context("User:alice", host), [self.GRANTED]) == [True]
            assert authorizer.authorize(context("User:mallory", host), [self.GRANTED]) == [False]
            assert authorizer.authorize(context("User:ANONYMOUS", host), [self.GRANTED]) == [False]
        assert authorizer.authorize_by_resource_type(context("User:alice"), self.GRANTED.operation, "TOPIC") is True
        assert authorizer.authorize_by_resource_type(context("User:mallory"), self.GRANTED.operation, "TOPIC") is False
        other = authorizer_harness.grant("User:mallory", self.GRANTED)
        assert other is not None
        swapped = self.build(authorizer_harness, other)
        assert swapped.authorize(context("User:mallory"), [self.GRANTED]) == [True]
        assert swapped.authorize(context("User:alice"), [self.GRANTED]) == [False]



class AclAuthorizerContract(GrantingAuthorizerContract):
    """The contract of an authorizer deciding on Kafka's ACLs (:class:`josef.authorizer.AclAuthorizer`), which its
    harness grants with."""

    def test_acls_handed_again_replace_the_previous_ones(self, authorizer_harness):
        grant = authorizer_harness.grant("User:alice", self.GRANTED)
        assert grant is not None and grant.acls, f"the harness of {authorizer_harness.name!r} grants with no ACLs"
        authorizer = self.build(authorizer_harness, grant)
        assert isinstance(authorizer, AclAuthorizer)
        authorizer.load_acls(authorizer_harness.grant("User:mallory", self.GRANTED).acls)
        assert authorizer.authorize(context("User:alice"), [self.GRANTED]) == [False]
        assert authorizer.authorize(context("User:mallory"), [self.GRANTED]) == [True]
