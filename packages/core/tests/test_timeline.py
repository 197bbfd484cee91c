"""The timeline types of josef.coordinator.timeline: reads at a snapshot, rollback, forgetting old snapshots."""

import random

import pytest

from josef.coordinator.timeline import SnapshotRegistry, TimelineDict, TimelineValue


def test_changes_without_a_snapshot_are_not_recorded():
    registry = SnapshotRegistry()
    d = TimelineDict(registry)
    d["a"] = 1
    d["a"] = 2
    assert d._deltas == [] and d == {"a": 2}
    registry.create_snapshot(0)
    assert d.get("a", at=0) == 2


def test_reads_at_a_snapshot_see_the_state_it_was_taken_on():
    registry = SnapshotRegistry()
    d = TimelineDict(registry, {"kept": 0, "changed": 0, "deleted": 0})
    registry.create_snapshot(10)
    d["changed"] = 1
    del d["deleted"]
    d["added"] = 1
    registry.create_snapshot(20)
    d["changed"] = 2
    d["added"] = 2
    d["late"] = 2
    assert d.view(at=10) == {"kept": 0, "changed": 0, "deleted": 0}
    assert d.view(at=20) == {"kept": 0, "changed": 1, "added": 1}
    assert d.view() == {"kept": 0, "changed": 2, "added": 2, "late": 2}
    assert [d.get(k, "-", at=10) for k in ("changed", "deleted", "added")] == [0, 0, "-"]
    assert d.contains("deleted", at=10) and not d.contains("deleted", at=20) and not d.contains("late", at=20)
    assert d.size(at=10) == 3 and d.size(at=20) == 3 and len(d) == 4
    assert sorted(d.keys(at=20)) == ["added", "changed", "kept"]
    with pytest.raises(KeyError):
        d.get("kept", at=15)  # not a snapshot


def test_revert_puts_back_every_change_since_the_snapshot_and_drops_later_snapshots():
    registry = SnapshotRegistry()
    d = TimelineDict(registry, {"a": 0})
    v = TimelineValue(registry, "zero")
    registry.create_snapshot(5)
    d["a"] = 1
    d["b"] = 1
    v.set("one")
    registry.create_snapshot(7)
    d.pop("a")
    d["c"] = 3
    v.set("two")
    registry.revert_to_snapshot(5)
    assert d == {"a": 0} and v.get() == "zero"
    assert registry.epochs() == [5]
    d["x"] = 9  # recording goes on against the snapshot kept
    registry.revert_to_snapshot(5)
    assert d == {"a": 0}


def test_a_revert_keeps_what_earlier_snapshots_hold():
    registry = SnapshotRegistry()
    d = TimelineDict(registry)
    registry.create_snapshot(1)
    d["committed-later"] = 1
    registry.create_snapshot(2)
    d["failed"] = 2
    registry.revert_to_snapshot(2)
    assert d == {"committed-later": 1}
    assert d.view(at=1) == {}


def test_deleting_old_snapshots_keeps_later_reads_and_reverts_right():
    registry = SnapshotRegistry()
    d = TimelineDict(registry)
    v = TimelineValue(registry, 0)
    registry.create_snapshot(1)
    d["a"] = 1
    v.set(1)
    registry.create_snapshot(2)
    d["a"] = 2
    v.set(2)
    registry.create_snapshot(3)
    registry.delete_snapshots_up_to(2)
    assert registry.epochs() == [2, 3]
    assert d.get("a", at=2) == 1 and v.get(at=2) == 1 and v.get(at=3) == 2
    assert all(epoch >= 2 for epoch, _ in d._deltas)
    registry.revert_to_snapshot(2)
    assert d == {"a": 1} and v.get() == 1
    with pytest.raises(KeyError):
        registry.revert_to_snapshot(1)


def test_nested_timeline_dicts_revert_together():
    registry = SnapshotRegistry()
    outer = TimelineDict(registry)
    registry.create_snapshot(0)
    inner = outer["g"] = TimelineDict(registry)
    inner[("t", 0)] = 5
    registry.create_snapshot(1)
    inner[("t", 0)] = 6
    outer["h"] = TimelineDict(registry)
    assert outer.get("g", at=1).get(("t", 0), at=1) == 5
    assert outer.get("g", at=0) is None
    registry.revert_to_snapshot(1)
    assert list(outer) == ["g"] and outer["g"] == {("t", 0): 5}
    registry.revert_to_snapshot(0)
    assert outer == {}


def test_snapshots_only_move_forward():
    registry = SnapshotRegistry()
    registry.create_snapshot(4)
    registry.create_snapshot(4)  # idempotent
    with pytest.raises(ValueError):
        registry.create_snapshot(3)
    assert registry.floor(3) is None and registry.floor(4) == 4 and registry.floor(100) == 4


def test_random_histories_match_copies_taken_at_each_snapshot():
    """Against a model: a full copy of the dict at every snapshot, reverts and deletions in between."""
    rng = random.Random(7)
    for _ in range(50):
        registry = SnapshotRegistry()
        d = TimelineDict(registry)
        copies: dict[int, dict] = {}
        epoch = 0
        for _ in range(200):
            action = rng.random()
            if action < 0.6:
                key = rng.randrange(8)
                if rng.random() < 0.3:
                    d.pop(key, None)
                else:
                    d[key] = rng.randrange(100)
            elif action < 0.75:
                epoch += rng.randrange(1, 4)
                registry.create_snapshot(epoch)
                copies[epoch] = dict(d.view())
            elif action < 0.85 and copies:
                target = rng.choice(sorted(copies))
                registry.revert_to_snapshot(target)
                copies = {e: c for e, c in copies.items() if e <= target}
                assert d.view() == copies[target]
            elif copies:
                upto = rng.choice(sorted(copies))
                registry.delete_snapshots_up_to(upto)
                copies = {e: c for e, c in copies.items() if e >= upto}
            for at, copy in copies.items():
                assert d.view(at=at) == copy
                assert all(d.get(k, "-", at=at) == copy.get(k, "-") for k in range(8))
