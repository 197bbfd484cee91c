"""State that can be read as it was at an earlier offset, or rolled back to it: Kafka's ``org.apache.kafka.timeline``.

A coordinator applies its records to memory as soon as it writes them, before
they are committed (:mod:`josef.coordinator.runtime`). Two things then need
the state as it was at an earlier log offset: a read (OffsetFetch,
DescribeGroups...) must see only what is committed, and a write whose append
fails must leave no trace. Both are served by keeping, for each *snapshot*
(one per offset the coordinator has written up to), the values that changed
since, instead of copying the state.

A :class:`SnapshotRegistry` holds the snapshots of one shard, by epoch (a log
offset). Timeline types registered with it (:class:`TimelineDict`,
:class:`TimelineValue`) record, the first time a key or value changes after
the latest snapshot, the value it had then. So:

- a read ``at=epoch`` returns, for each key, the value saved by the earliest
  snapshot at or after ``epoch`` that saved one, or the current value when
  none did (it has not changed since);
- :meth:`SnapshotRegistry.revert_to_snapshot` puts every saved value back and
  forgets the snapshots after it;
- :meth:`SnapshotRegistry.delete_snapshots_up_to` forgets what no read can ask
  for any more (the epochs below the committed offset).

Without any snapshot (while a shard loads its committed records) changes are
not recorded at all. Values are stored as they are: a mutable value changed in
place is not tracked, so keep immutable values (or timeline types) inside.
Reading at an epoch that is not a snapshot is a bug and raises.
"""

from __future__ import annotations

import bisect
from typing import Any, Generic, Iterator, TypeVar

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")

#: A key that did not exist at a snapshot.
_ABSENT: Any = object()
_MISSING: Any = object()


class SnapshotRegistry:
    """The snapshots of one shard's timeline state, and which objects changed after each."""

    __slots__ = ("_epochs", "_touched")

    def __init__(self) -> None:
        #: Snapshot epochs, ascending.
        self._epochs: list[int] = []
        #: Epoch -> the objects that saved a value at that snapshot.
        self._touched: dict[int, list[_Timeline]] = {}

    @property
    def latest_epoch(self) -> int | None:
        return self._epochs[-1] if self._epochs else None

    def epochs(self) -> list[int]:
        return list(self._epochs)

    def has_snapshot(self, epoch: int) -> bool:
        return epoch in self._touched

    def floor(self, epoch: int) -> int | None:
        """The latest snapshot at or before ``epoch`` (None when there is none)."""
        index = bisect.bisect_right(self._epochs, epoch)
        return self._epochs[index - 1] if index else None

    def create_snapshot(self, epoch: int) -> None:
        """A snapshot of the state as it is now, at ``epoch``; nothing happens if the latest one is ``epoch``."""
        latest = self.latest_epoch
        if latest is not None and epoch <= latest:
            if epoch == latest:
                return
            raise ValueError(f"cannot create a snapshot at {epoch}: the latest is {latest}")
        self._epochs.append(epoch)
        self._touched[epoch] = []

    def revert_to_snapshot(self, epoch: int) -> None:
        """Put the state back as it was at snapshot ``epoch``; the snapshots after it are gone, it stays."""
        self._check(epoch)
        index = self._epochs.index(epoch)
        objects: dict[int, _Timeline] = {}
        for later in self._epochs[index:]:
            for obj in self._touched[later]:
                objects[id(obj)] = obj
        for obj in objects.values():
            obj._revert(epoch)
        for later in self._epochs[index + 1:]:
            del self._touched[later]
        del self._epochs[index + 1:]
        self._touched[epoch] = []

    def delete_snapshots_up_to(self, epoch: int) -> None:
        """Forget the snapshots before ``epoch`` (reads at them are no longer possible)."""
        index = bisect.bisect_left(self._epochs, epoch)
        if not index:
            return
        for earlier in self._epochs[:index]:
            for obj in self._touched.pop(earlier):
                obj._erase_before(epoch)
        del self._epochs[:index]

    def reset(self) -> None:
        """Forget every snapshot (the current state stays)."""
        self.delete_snapshots_up_to(self._epochs[-1] + 1 if self._epochs else 0)

    def _check(self, epoch: int) -> None:
        if epoch not in self._touched:
            raise KeyError(f"no snapshot at {epoch}; snapshots are at {self._epochs}")

    def _saved(self, obj: _Timeline) -> int | None:
        """The latest epoch, noting that ``obj`` saves a value there (the caller checks it did not already)."""
        if not self._epochs:
            return None
        epoch = self._epochs[-1]
        self._touched[epoch].append(obj)
        return epoch


class _Timeline:
    """What the registry asks of a timeline object: undo its changes since a snapshot, forget old saved values."""

    __slots__ = ("_registry", "_deltas")

    def __init__(self, registry: SnapshotRegistry) -> None:
        self._registry = registry
        #: ``[epoch, saved]`` per snapshot after which this object changed, ascending epochs.
        self._deltas: list[list[Any]] = []

    def _delta(self, empty: Any) -> Any:
        """What this object saved at the latest snapshot (``empty`` made current if nothing yet); None: no snapshot."""
        epochs = self._registry._epochs
        if not epochs:
            return None
        deltas = self._deltas
        if deltas and deltas[-1][0] == epochs[-1]:
            return deltas[-1]
        self._registry._saved(self)
        entry = [epochs[-1], empty]
        deltas.append(entry)
        return entry

    def _at(self, epoch: int) -> Iterator[Any]:
        """What was saved at the snapshots at or after ``epoch``, earliest first."""
        self._registry._check(epoch)
        for saved_epoch, saved in self._deltas:
            if saved_epoch >= epoch:
                yield saved

    def _revert(self, epoch: int) -> None:
        raise NotImplementedError

    def _erase_before(self, epoch: int) -> None:
        self._deltas = [d for d in self._deltas if d[0] >= epoch]


class TimelineValue(_Timeline, Generic[T]):
    """One value with a history: :meth:`get` now or ``at`` a snapshot, :meth:`set`."""

    __slots__ = ("_value",)

    def __init__(self, registry: SnapshotRegistry, value: T) -> None:
        super().__init__(registry)
        self._value = value

    def get(self, at: int | None = None) -> T:
        if at is not None:
            for saved in self._at(at):
                return saved  # type: ignore[no-any-return]
        return self._value

    def set(self, value: T) -> None:
        entry = self._delta(_MISSING)
        if entry is not None and entry[1] is _MISSING:
            entry[1] = self._value
        self._value = value

    def _revert(self, epoch: int) -> None:
        for saved_epoch, saved in reversed(self._deltas):
            if saved_epoch >= epoch and saved is not _MISSING:
                self._value = saved
        self._deltas = [d for d in self._deltas if d[0] < epoch]

    def __repr__(self) -> str:
        return f"TimelineValue({self._value!r})"


class TimelineDict(_Timeline, Generic[K, V]):
    """A dict with a history: plain dict operations change it now; reads take ``at=`` a snapshot epoch.

    ``get``, ``contains``, ``items``, ``keys``, ``values``, ``size`` and
    :meth:`view` accept ``at``; the dunder methods (``d[k]``, ``k in d``,
    ``len(d)``, iteration) read the current state.
    """

    __slots__ = ("_data",)

    def __init__(self, registry: SnapshotRegistry, initial: dict[K, V] | None = None) -> None:
        super().__init__(registry)
        self._data: dict[K, V] = dict(initial) if initial else {}

    # Writes ---------------------------------------------------------------------------------------------------

    def _save(self, key: K) -> None:
        entry = self._delta(None)
        if entry is None:
            return
        saved = entry[1]
        if saved is None:
            saved = entry[1] = {}
        if key not in saved:
            saved[key] = self._data.get(key, _ABSENT)

    def __setitem__(self, key: K, value: V) -> None:
        self._save(key)
        self._data[key] = value

    def __delitem__(self, key: K) -> None:
        if key not in self._data:
            raise KeyError(key)
        self._save(key)
        del self._data[key]

    def pop(self, key: K, default: Any = _MISSING) -> Any:
        if key not in self._data:
            if default is _MISSING:
                raise KeyError(key)
            return default
        self._save(key)
        return self._data.pop(key)

    def setdefault(self, key: K, default: V) -> V:
        if key not in self._data:
            self[key] = default
        return self._data[key]

    def clear(self) -> None:
        for key in list(self._data):
            del self[key]

    # Reads ----------------------------------------------------------------------------------------------------

    def get(self, key: K, default: Any = None, at: int | None = None) -> Any:
        if at is not None:
            for saved in self._at(at):
                if saved is not None and key in saved:
                    value = saved[key]
                    return default if value is _ABSENT else value
        return self._data.get(key, default)

    def contains(self, key: K, at: int | None = None) -> bool:
        return self.get(key, _MISSING, at) is not _MISSING

    def view(self, at: int | None = None) -> dict[K, V]:
        """A plain dict of the state ``at`` a snapshot (now when None): a copy, safe to keep."""
        if at is None:
            return dict(self._data)
        result = dict(self._data)
        for saved in reversed(list(self._at(at))):  # the earliest saved value of a key wins
            if saved is None:
                continue
            for key, value in saved.items():
                if value is _ABSENT:
                    result.pop(key, None)
                else:
                    result[key] = value
        return result

    def items(self, at: int | None = None) -> Any:
        return self._data.items() if at is None else self.view(at).items()

    def keys(self, at: int | None = None) -> Any:
        return self._data.keys() if at is None else self.view(at).keys()

    def values(self, at: int | None = None) -> Any:
        return self._data.values() if at is None else self.view(at).values()

    def size(self, at: int | None = None) -> int:
        return len(self._data) if at is None else len(self.view(at))

    def __getitem__(self, key: K) -> V:
        return self._data[key]

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def __bool__(self) -> bool:
        return bool(self._data)

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TimelineDict):
            return self._data == other._data
        if isinstance(other, dict):
            return self._data == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"TimelineDict({self._data!r})"

    # Snapshots ------------------------------------------------------------------------------------------------

    def _revert(self, epoch: int) -> None:
        for saved_epoch, saved in reversed(self._deltas):
            if saved_epoch < epoch or saved is None:
                continue
            for key, value in saved.items():
                if value is _ABSENT:
                    self._data.pop(key, None)
                else:
                    self._data[key] = value
        self._deltas = [d for d in self._deltas if d[0] < epoch]
