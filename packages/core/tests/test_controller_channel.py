"""A request to the active controller follows the quorum: when another node is elected before the answer came, the
request is given up at once and sent to the new controller, rather than waiting for the silent old one's timeout."""

from types import SimpleNamespace

import anyio
import pytest

from josef.node import controller_channel
from josef.node.controller_channel import ControllerChannel
from josef.protocol.errors import KafkaConnectionError


def channel(controller_id: int) -> tuple[ControllerChannel, SimpleNamespace]:
    quorum = SimpleNamespace(controller_id=controller_id)
    return ControllerChannel(SimpleNamespace(quorum=quorum)), quorum


def test_a_request_to_a_controller_that_lost_the_quorum_is_given_up_as_soon_as_another_leads():
    chan, quorum = channel(1)
    sent = []

    async def silent() -> None:
        sent.append(1)
        await anyio.sleep_forever()  # a frozen controller: the connection stays open, nothing comes back

    async def main():
        async with anyio.create_task_group() as tg:
            async def elect_another():
                await anyio.sleep(0.2)
                quorum.controller_id = 2
            tg.start_soon(elect_another)
            with anyio.fail_after(5):
                return await chan._while_active(1, silent)

    assert anyio.run(main) is controller_channel._MOVED
    assert sent == [1]


def test_an_answer_and_a_failure_come_back_as_they_are():
    chan, _ = channel(1)

    async def answer():
        return "answer"

    async def fail():
        raise KafkaConnectionError("the controller closed the connection")

    assert anyio.run(chan._while_active, 1, answer) == "answer"
    with pytest.raises(KafkaConnectionError, match="closed the connection"):
        anyio.run(chan._while_active, 1, fail)


def test_a_request_sent_while_another_controller_already_leads_is_not_waited_for():
    chan, _ = channel(2)

    async def silent():
        await anyio.sleep_forever()

    async def main():
        with anyio.fail_after(5):
            return await chan._while_active(1, silent)

    assert anyio.run(main) is controller_channel._MOVED


def test_an_in_process_controller_answering_not_controller_is_asked_again_until_it_leads():
    """A node whose quorum is taking the controllership back (a ZooKeeper session replaced) answers NOT_CONTROLLER
    for a moment; the request waits for it as it would for a remote controller, instead of failing the client."""
    from kio.schema.create_topics.v7.response import CreatableTopicResult, CreateTopicsResponse
    from kio.schema.errors import ErrorCode

    def answer(code: ErrorCode) -> CreateTopicsResponse:
        return CreateTopicsResponse(throttle_time=0, topics=(CreatableTopicResult(
            name="t", topic_id=None, error_code=code, error_message=None, topic_config_error_code=ErrorCode.none,
            num_partitions=1, replication_factor=1, configs=()),))

    answers = [answer(ErrorCode.not_controller), answer(ErrorCode.not_controller), answer(ErrorCode.none)]
    calls = []

    async def call(api_key, request, ctx=None):
        calls.append(api_key)
        return answers[len(calls) - 1]

    quorum = SimpleNamespace(controller_id=1, controller_endpoint=lambda node_id: None)
    chan = ControllerChannel(SimpleNamespace(quorum=quorum, controller_dispatcher=SimpleNamespace(call=call)))
    response = anyio.run(chan.call, 19, {})
    assert response.topics[0].error_code == ErrorCode.none and len(calls) == 3
