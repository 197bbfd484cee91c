"""A stand-in for the node: the console's tests need its services, not a broker.

:class:`FakeServices` has what the console uses of
:class:`josef.services.BrokerServices`: a metadata image built by hand, a
config, an authorizer, and ``call_peer`` answering from canned responses
(attribute objects shaped as kio's), so pages and actions can be checked
without a cluster; the integration test (integration-tests/test_console.py)
runs the real thing.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable

from josef.metadata.image import BrokerImage, MetadataImage, PartitionImage, TopicImage
from josef.metadata.records import Endpoint
from josef_console.configs import CONFIG_KEYS


def ns(**fields: Any) -> SimpleNamespace:
    return SimpleNamespace(**fields)


def image() -> MetadataImage:
    """Three brokers (3 fenced), topic ``orders`` (partition 1 under-replicated, 2 offline) and a reassignment."""
    brokers = {n: BrokerImage(n, (Endpoint("PLAINTEXT", "127.0.0.1", 9090 + n),), "rack-a" if n < 3 else None,
                              fenced=n == 3, epoch=10 + n, features={"metadata.version": (1, 26)})
               for n in (1, 2, 3)}
    orders = TopicImage("orders", "AAAAAAAAAAAAAAAAAAAAAQ", {
        0: PartitionImage((1, 2, 3), (1, 2, 3), 1, 4, 9, elr=(), last_known_elr=()),
        1: PartitionImage((2, 3, 1), (2, 1), 2, 2, 3),
        2: PartitionImage((3, 1, 2), (), -1, 7, 8, elr=(1, 2)),
    })
    moving = TopicImage("moving", "AAAAAAAAAAAAAAAAAAAAAg", {
        0: PartitionImage((1, 2, 3), (1, 2), 1, 1, 2, removing_replicas=(3,), adding_replicas=(2,)),
    })
    return MetadataImage(offset=42, brokers=brokers, topics={"orders": orders, "moving": moving},
                         topic_names={"AAAAAAAAAAAAAAAAAAAAAQ": "orders", "AAAAAAAAAAAAAAAAAAAAAg": "moving"},
                         configs={(2, "orders"): {"min.insync.replicas": "2"}},
                         features={"metadata.version": 26, "group.version": 1})


class AllowAll:
    def __init__(self) -> None:
        self.asked: list[Any] = []

    def authorize(self, context: Any, actions: list[Any]) -> list[bool]:
        self.asked += actions
        return [True] * len(actions)


class FakeServices:
    """What the console uses of BrokerServices. ``answers[api_key]`` is a function (node, body) -> response."""

    def __init__(self) -> None:
        self.node_id = 1
        self.is_broker = True
        self.config: dict[str, Any] = {key.name: key.default for key in CONFIG_KEYS}
        self.config["min.insync.replicas"] = 1
        self.image = image()
        self.authorizer = AllowAll()
        self.answers: dict[int, Callable[[int, Any], Any]] = {}
        self.calls: list[tuple[int, int, Any]] = []
        self.spawned: list[Any] = []
        self.coordinators = ns(by_key_type=lambda key_type: "group-coordinator",
                               leader_of=lambda coordinator, key: 2)

    async def call_peer(self, node_id: int, api_key: int, body: Any, *, version: int | None = None) -> Any:
        self.calls.append((node_id, api_key, body))
        answer = self.answers.get(api_key)
        if answer is None:
            raise KeyError(api_key)
        return answer(node_id, body)

    def spawn(self, function: Any) -> None:
        self.spawned.append(function)
