"""The fetcher's side of a fetch session: what the next request names, and how errors start over."""

from kio.schema.errors import ErrorCode as E

from josef.protocol.fetch_session_handler import FetchSessionHandler


def test_after_a_full_request_only_changes_and_forgotten_partitions_are_sent():
    handler = FetchSessionHandler()
    wanted = {("t", 0): {"fetch_offset": 5}, ("t", 1): {"fetch_offset": 7}}
    assert handler.build(wanted) == ([("t", 0), ("t", 1)], [])
    assert (handler.session_id, handler.epoch) == (0, 0)
    assert handler.handle_response(E.none, 42)
    assert (handler.session_id, handler.epoch) == (42, 1)

    assert handler.build(wanted) == ([], [])  # nothing moved
    assert handler.handle_response(E.none, 42) and handler.epoch == 2
    moved = {("t", 0): {"fetch_offset": 9}, ("t", 2): {"fetch_offset": 0}}
    assert handler.build(moved) == ([("t", 0), ("t", 2)], [("t", 1)])
    assert handler.handle_response(E.none, 42) and handler.epoch == 3
    assert handler.build(moved) == ([], [])


def test_a_session_error_or_a_broker_without_sessions_means_full_requests():
    handler = FetchSessionHandler()
    wanted = {("t", 0): {"fetch_offset": 1}}
    handler.build(wanted)
    handler.handle_response(E.none, 0)  # the broker made no session (its cache is full)
    assert (handler.session_id, handler.epoch) == (0, 0)
    assert handler.build(wanted) == ([("t", 0)], [])
    handler.handle_response(E.none, 7)
    handler.build(wanted)
    for error in (E.fetch_session_id_not_found, E.invalid_fetch_session_epoch, E.fetch_session_topic_id_error):
        assert not handler.handle_response(error, 0)
        assert (handler.session_id, handler.epoch) == (0, 0)
        assert handler.build(wanted) == ([("t", 0)], [])
        handler.handle_response(E.none, 7)
        handler.build(wanted)


def test_the_epoch_wraps_to_1():
    handler = FetchSessionHandler()
    handler.build({})
    handler.handle_response(E.none, 3)
    handler.epoch = 2**31 - 1
    handler.build({})
    handler.handle_response(E.none, 3)
    assert handler.epoch == 1
