import anyio
import pytest

from josef_console.sampler import Throughput, run_sampler


def test_rates_are_records_per_second_between_samples():
    sampled = Throughput(window_s=60, interval_s=5)
    sampled.record(0.0, {"orders": 100})
    assert sampled.rates("orders") == [] and sampled.rate("orders") is None
    sampled.record(5.0, {"orders": 150})
    sampled.record(10.0, {"orders": 150})
    sampled.record(20.0, {"orders": 350})  # a late sample: the rate is over the time that really passed
    assert sampled.rates("orders") == [10.0, 0.0, 20.0]
    assert sampled.rate("orders") == 20.0 and sampled.total("orders") == 350


def test_the_ring_is_bounded_by_the_window():
    sampled = Throughput(window_s=20, interval_s=5)
    for i in range(100):
        sampled.record(i * 5.0, {"t": i * 10})
    ring = sampled.rings["t"]
    assert len(ring) <= sampled.capacity
    assert ring[-1][0] - ring[1][0] <= 20  # one sample before the window start, for the first rate
    assert sampled.rates("t") == [2.0] * (len(ring) - 1)


def test_a_topic_that_did_not_fully_answer_keeps_its_samples_and_a_deleted_one_goes():
    sampled = Throughput()
    sampled.record(0.0, {"a": 10, "b": 5}, {"a", "b"})
    sampled.record(5.0, {"a": None, "b": 10}, {"a", "b"})
    assert len(sampled.rings["a"]) == 1 and len(sampled.rings["b"]) == 2
    sampled.record(10.0, {"a": 20}, {"a"})
    assert "b" not in sampled.rings and sampled.rates("a") == [1.0]


def test_a_topic_created_again_starts_over_rather_than_showing_a_negative_rate():
    sampled = Throughput()
    sampled.record(0.0, {"t": 1000})
    sampled.record(5.0, {"t": 3})
    sampled.record(10.0, {"t": 13})
    assert sampled.rates("t") == [2.0]


@pytest.mark.anyio
async def test_the_sampler_loop_survives_a_failed_sample():
    sampled = Throughput(window_s=60, interval_s=0.01)
    calls = []

    async def sample():
        calls.append(len(calls))
        if len(calls) == 2:
            raise ConnectionError("a broker went away")
        return {"t": 10 * len(calls)}, {"t"}

    with anyio.move_on_after(5):
        async def stop_when_sampled_enough():
            while len(calls) < 4:
                await anyio.sleep(0.01)
            tg.cancel_scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(stop_when_sampled_enough)
            tg.start_soon(run_sampler, sampled, sample, lambda: 0.0)
    assert len(calls) >= 4
    assert [total for _, total in sampled.rings["t"]][:3] == [10, 30, 40]
