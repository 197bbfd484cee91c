"""zookeeper.max.in.flight.requests: how many requests a node has sent and not had answered (josef_metadata_zk.zk_client)."""

from __future__ import annotations

from josef_metadata_zk.zk_client import pipelined


class Answer:
    """An answer still to come until taken, counting those outstanding as a ZooKeeper session's queue would."""

    outstanding = 0
    most = 0

    def __init__(self, value: int) -> None:
        self.value = value
        Answer.outstanding += 1
        Answer.most = max(Answer.most, Answer.outstanding)

    def get(self) -> int:
        Answer.outstanding -= 1
        return self.value


def test_at_most_the_limit_is_in_flight_and_answers_come_in_order():
    Answer.outstanding = Answer.most = 0
    calls = [lambda i=i: Answer(i) for i in range(25)]
    assert [answer.get() for answer in pipelined(calls, 10)] == list(range(25))
    assert Answer.most == 10 and Answer.outstanding == 0
    Answer.most = 0
    assert [answer.get() for answer in pipelined(calls[:3], 1)] == [0, 1, 2]
    assert Answer.most == 1
