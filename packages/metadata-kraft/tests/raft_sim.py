"""Test-only pieces for the Raft core: an in-memory RaftLog with crash semantics, and a simulated cluster.

:class:`MemoryRaftLog` keeps batches in a list; :meth:`MemoryRaftLog.crash`
drops whatever was appended since the last flush, as a power cut would.
:class:`Simulation` runs voters and observers of :class:`RaftNode` over an
event-driven scheduler with simulated time and a network that delays, drops,
duplicates, reorders and partitions messages, crashes and restarts nodes,
and checks Raft's safety properties after every step.
"""

from __future__ import annotations

import bisect
import heapq
import random
from typing import Any

import attrs

from josef.protocol.records import (
    BatchHeader,
    batch_is_valid,
    decode_batch,
    iter_batches,
)
from josef_metadata_kraft.raft import (
    AppendResult,
    CommittedBatch,
    ElectionState,
    LeaderChanged,
    NotLeaderError,
    OffsetAndEpoch,
    RaftConfig,
    RaftLogError,
    RaftNode,
    Role,
    SnapshotLoaded,
    end_offset_for_epoch,
    epoch_cache_end_offset,
)

# ------------------------------------------------------------------ storage


@attrs.frozen
class Batch:
    base: int
    last: int
    epoch: int
    data: bytes

    @property
    def crc(self) -> int:
        return BatchHeader.parse(self.data).crc


class MemoryRaftLog:
    """The RaftLog contract in memory. Appends are volatile until flush; truncation and snapshots are durable."""

    def __init__(self) -> None:
        self._batches: list[Batch] = []
        self._bases: list[int] = []
        self._flushed = 0
        self._start = 0
        self._head: tuple[int, int] | None = None  # epoch-cache entry kept at the start after trimming
        self._snapshots: dict[OffsetAndEpoch, bytes] = {}
        self._entries: list[tuple[int, int]] | None = None
        self.flushes = 0

    # -- positions
    @property
    def start_offset(self) -> int:
        return self._start

    @property
    def end_offset(self) -> int:
        return self._batches[-1].last + 1 if self._batches else self._start

    def epoch_entries(self) -> list[tuple[int, int]]:
        if self._entries is None:
            entries: list[tuple[int, int]] = [self._head] if self._head is not None else []
            for b in self._batches:
                if not entries or b.epoch > entries[-1][0]:
                    entries.append((b.epoch, b.base))
            self._entries = entries
        return self._entries

    @property
    def last_fetched_epoch(self) -> int:
        entries = self.epoch_entries()
        if entries:
            return entries[-1][0]
        latest = self.latest_snapshot_id()
        return latest.epoch if latest is not None else 0

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch:
        found = epoch_cache_end_offset(self.epoch_entries(), epoch, self.end_offset)
        return end_offset_for_epoch(found, self.earliest_snapshot_id(), self.end_offset, self.last_fetched_epoch)

    # -- writes
    def _push(self, batch: Batch) -> None:
        self._batches.append(batch)
        self._bases.append(batch.base)
        self._entries = None

    def append_as_leader(self, batch: bytes, epoch: int) -> AppendResult:
        header = BatchHeader.parse(batch)
        if header.base_offset != self.end_offset or header.partition_leader_epoch != epoch:
            raise RaftLogError(f"leader batch at {header.base_offset}/{header.partition_leader_epoch}, "
                               f"log end {self.end_offset}, epoch {epoch}")
        if epoch < self.last_fetched_epoch:
            raise RaftLogError(f"epoch {epoch} below the log's last epoch {self.last_fetched_epoch}")
        self._push(Batch(header.base_offset, header.last_offset, epoch, bytes(batch)))
        return AppendResult(header.base_offset, header.last_offset)

    def append_as_follower(self, batches: bytes, epoch: int) -> AppendResult:
        parsed = []
        expected = self.end_offset
        last_epoch = self.last_fetched_epoch
        consumed = 0
        for pos, header in iter_batches(batches):
            if not batch_is_valid(batches, pos, header):
                raise RaftLogError(f"corrupt batch at {header.base_offset}")
            if header.base_offset != expected:
                raise RaftLogError(f"batch at {header.base_offset}, log end {expected}")
            if header.partition_leader_epoch < last_epoch or header.partition_leader_epoch > epoch:
                raise RaftLogError(f"batch epoch {header.partition_leader_epoch} outside [{last_epoch}, {epoch}]")
            parsed.append(Batch(header.base_offset, header.last_offset, header.partition_leader_epoch,
                                bytes(batches[pos:pos + header.size])))
            expected = header.last_offset + 1
            last_epoch = header.partition_leader_epoch
            consumed = pos + header.size
        if not parsed or consumed != len(batches):
            raise RaftLogError("fetched data holds no whole batch or a partial tail")
        for b in parsed:
            self._push(b)
        return AppendResult(parsed[0].base, parsed[-1].last)

    def read(self, offset: int, max_bytes: int) -> bytes:
        if offset < self._start or offset > self.end_offset:
            raise RaftLogError(f"read at {offset} outside [{self._start}, {self.end_offset}]")
        i = bisect.bisect_right(self._bases, offset) - 1
        if i < 0 or offset == self.end_offset:
            return b""
        out = [self._batches[i].data]
        size = len(out[0])
        for b in self._batches[i + 1:]:
            if size + len(b.data) > max_bytes:
                break
            out.append(b.data)
            size += len(b.data)
        return b"".join(out)

    def truncate_to(self, offset: int) -> None:
        i = bisect.bisect_left(self._bases, offset)
        if i < len(self._batches) and self._bases[i] != offset and i > 0:
            raise RaftLogError(f"truncation at {offset} inside a batch")
        if i > 0 and self._batches[i - 1].last >= offset:
            raise RaftLogError(f"truncation at {offset} inside a batch")
        del self._batches[i:]
        del self._bases[i:]
        self._flushed = min(self._flushed, i)
        if self._head is not None and self._head[1] >= offset:
            self._head = None
        self._entries = None

    def flush(self) -> None:
        self._flushed = len(self._batches)
        self.flushes += 1

    def crash(self) -> None:
        """A power cut: what was not flushed is gone."""
        del self._batches[self._flushed:]
        del self._bases[self._flushed:]
        self._entries = None

    # -- snapshots
    def latest_snapshot_id(self) -> OffsetAndEpoch | None:
        return max(self._snapshots, key=lambda s: (s.offset, s.epoch)) if self._snapshots else None

    def earliest_snapshot_id(self) -> OffsetAndEpoch | None:
        return min(self._snapshots, key=lambda s: (s.offset, s.epoch)) if self._snapshots else None

    def snapshot_size(self, snapshot_id: OffsetAndEpoch) -> int | None:
        data = self._snapshots.get(snapshot_id)
        return None if data is None else len(data)

    def read_snapshot(self, snapshot_id: OffsetAndEpoch, position: int, max_bytes: int) -> bytes | None:
        data = self._snapshots.get(snapshot_id)
        return None if data is None else data[position:position + max_bytes]

    def create_snapshot(self, snapshot_id: OffsetAndEpoch, data: bytes) -> None:
        self._snapshots[snapshot_id] = data

    def delete_before_snapshot(self, snapshot_id: OffsetAndEpoch) -> None:
        start = snapshot_id.offset
        if start <= self._start:
            return
        entries = self.epoch_entries()
        removed = [e for e in entries if e[1] <= start]
        i = bisect.bisect_left(self._bases, start)
        del self._batches[:i]
        del self._bases[:i]
        self._flushed = max(0, self._flushed - i)
        self._start = start
        self._head = (removed[-1][0], start) if removed else None
        self._entries = None
        for sid in [s for s in self._snapshots if s.offset < start]:
            del self._snapshots[sid]

    def install_snapshot(self, snapshot_id: OffsetAndEpoch, data: bytes) -> None:
        self._snapshots[snapshot_id] = data
        self._batches.clear()
        self._bases.clear()
        self._flushed = 0
        self._start = snapshot_id.offset
        self._head = None
        self._entries = None
        for sid in [s for s in self._snapshots if s.offset < snapshot_id.offset]:
            del self._snapshots[sid]

    # -- for checks
    def batches(self) -> list[Batch]:
        return list(self._batches)


class MemoryQuorumStateStore:
    """A quorum-state store that survives crashes (it is durable when write returns) and keeps a history."""

    def __init__(self) -> None:
        self.state: ElectionState | None = None
        self.history: list[ElectionState] = []

    def read(self) -> ElectionState | None:
        return self.state

    def write(self, state: ElectionState) -> None:
        self.state = state
        self.history.append(state)


def data_payloads(data: bytes) -> list[bytes]:
    """The values of the non-control records in ``data`` (whole batches)."""
    out = []
    for pos, header in iter_batches(data):
        if not header.is_control:
            out.extend(r.value for r in decode_batch(data, pos, "", 0, check_crc=False))
    return out


# ------------------------------------------------------------------ simulation

SIM_CONFIG = RaftConfig(election_timeout_ms=100, election_backoff_max_ms=100, fetch_timeout_ms=200,
                        request_timeout_ms=150, retry_backoff_ms=10, fetch_max_wait_ms=50, fetch_max_bytes=1500)


class SafetyViolation(AssertionError):
    pass


@attrs.define
class SimStats:
    leaders: int = 0
    commits: int = 0
    appends: int = 0
    crashes: int = 0
    snapshots_installed: int = 0
    messages: int = 0
    liveness_ms: int = -1


class Simulation:
    """A cluster of RaftNodes on a simulated network, checked for Raft's safety properties as it runs.

    Everything random comes from ``seed``, so a failing seed replays exactly.
    """

    def __init__(self, seed: int, voters: int = 3, observers: int = 1, config: RaftConfig = SIM_CONFIG,
                 *, node_factory: Any = RaftNode) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.config = config
        self.node_factory = node_factory
        self.voter_ids = list(range(1, voters + 1))
        self.observer_ids = list(range(voters + 1, voters + 1 + observers))
        self.ids = self.voter_ids + self.observer_ids
        self.endpoints = {v: (f"c{v}", 9093) for v in self.voter_ids}
        self.now = 0
        self._seq = 0
        self._heap: list[tuple[int, int, str, Any]] = []
        self.logs = {n: MemoryRaftLog() for n in self.ids}
        self.stores = {n: MemoryQuorumStateStore() for n in self.ids}
        self.nodes: dict[int, RaftNode | None] = {}
        self._gen = {n: 0 for n in self.ids}
        self._restarts = {n: 0 for n in self.ids}
        # network faults
        self.p_drop = 0.0
        self.p_dup = 0.0
        self.min_delay, self.max_delay = 1, 5
        self.blocked: set[tuple[int, int]] = set()
        # checker state
        self.leader_of_epoch: dict[int, int] = {}
        self.committed: dict[int, Batch] = {}  # base offset -> batch
        self.committed_end = 0
        self.data_values: list[bytes] = []
        self.data_before: dict[int, int] = {0: 0}
        self.checked_hw: dict[int, int] = {}
        self.seen_hw: dict[int, int | None] = {}
        self.applied: dict[int, list[bytes]] = {}
        self.applied_next: dict[int, int] = {}
        self.appended: dict[bytes, tuple[int, int]] = {}
        self.stats = SimStats()
        #: Called as ``on_new_leader(sim, node_id)`` when a leader of a new epoch appears.
        self.on_new_leader: Any = None
        for n in self.ids:
            self._start_node(n)

    # -- scheduling
    def _push(self, at: int, kind: str, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, kind, payload))

    def at(self, time: int, action: Any) -> None:
        """Run ``action(sim)`` at simulated ``time``."""
        self._push(time, "call", action)

    def run_until(self, time: int, stop: Any = None) -> bool:
        """Process events up to ``time``; with ``stop``, return True as soon as ``stop(sim)`` holds."""
        while self._heap and self._heap[0][0] <= time:
            at, _, kind, payload = heapq.heappop(self._heap)
            self.now = max(self.now, at)
            if kind == "poll":
                node_id, gen = payload
                if self._gen[node_id] == gen and self.nodes[node_id] is not None:
                    self._step(node_id)
            elif kind == "msg":
                self._deliver(*payload)
            else:
                payload(self)
            if stop is not None and stop(self):
                return True
        self.now = max(self.now, time)
        return stop is not None and stop(self)

    # -- nodes
    def _start_node(self, node_id: int) -> None:
        self._restarts[node_id] += 1
        rng = random.Random(self.seed * 7919 + node_id * 104729 + self._restarts[node_id])
        self.nodes[node_id] = self.node_factory(node_id, self.endpoints, self.logs[node_id], self.stores[node_id],
                                                cluster_id="sim-cluster", config=self.config, rng=rng,
                                                now_ms=self.now)
        self.seen_hw[node_id] = None
        self.applied[node_id] = []
        self.applied_next[node_id] = 0
        self._gen[node_id] += 1
        self._step(node_id)

    def crash(self, node_id: int) -> None:
        if self.nodes[node_id] is None:
            return
        self.nodes[node_id] = None
        self._gen[node_id] += 1
        self.logs[node_id].crash()
        self.stats.crashes += 1

    def restart(self, node_id: int) -> None:
        if self.nodes[node_id] is None:
            self._start_node(node_id)

    def up(self) -> list[int]:
        return [n for n in self.ids if self.nodes[n] is not None]

    def _step(self, node_id: int) -> None:
        node = self.nodes[node_id]
        assert node is not None
        for out in node.poll(self.now):
            self._send(node_id, out.destination, out.message, out.request)
        self._check(node_id, node)
        self._drain(node_id, node)
        self._gen[node_id] += 1
        self._push(node.next_poll_ms, "poll", (node_id, self._gen[node_id]))

    # -- network
    def _send(self, src: int, dst: int, message: Any, reply_to: Any) -> None:
        if src in self.observer_ids and type(message).__api_key__ == 52 and reply_to is not None:
            p = message.topics[0].partitions[0] if message.topics else None
            if p is not None and p.vote_granted:
                raise SafetyViolation(f"seed {self.seed}: observer {src} granted a vote")
        copies = 1
        if self.p_drop and self.rng.random() < self.p_drop:
            copies = 0
        elif self.p_dup and self.rng.random() < self.p_dup:
            copies = 2
        for _ in range(copies):
            delay = self.rng.randint(self.min_delay, self.max_delay)
            self._push(self.now + delay, "msg", (src, dst, message, reply_to))

    def _deliver(self, src: int, dst: int, message: Any, reply_to: Any) -> None:
        node = self.nodes[dst]
        if node is None or (src, dst) in self.blocked:
            return
        self.stats.messages += 1
        if reply_to is None:
            response = node.handle_request(src, message, self.now)
            if response is not None:
                self._send(dst, src, response, message)
        else:
            node.handle_response(src, reply_to, message, self.now)
        self._step(dst)

    def partition(self, group: set[int]) -> None:
        """Cut every link between ``group`` and the rest, both ways."""
        for a in self.ids:
            for b in self.ids:
                if (a in group) != (b in group):
                    self.blocked.add((a, b))

    def heal(self) -> None:
        self.blocked.clear()

    # -- clients
    def client_append(self) -> None:
        for node_id in self.up():
            node = self.nodes[node_id]
            assert node is not None
            if node.role is Role.LEADER:
                payload = f"{self.seed}:{self.stats.appends}".encode()
                try:
                    offset = node.append([payload], self.now)
                except NotLeaderError:
                    continue
                self.stats.appends += 1
                self.appended[payload] = (node_id, offset)
                self._step(node_id)

    def resign_leaders(self) -> None:
        """Graceful shutdown of whoever leads: Resigned, EndQuorumEpoch to the voters."""
        for node_id in self.up():
            node = self.nodes[node_id]
            if node is not None and node.role is Role.LEADER:
                node.resign(self.now)
                self._step(node_id)

    def snapshot(self, node_id: int, trim: bool) -> None:
        node = self.nodes[node_id]
        if node is None or node.high_watermark is None:
            return
        end = self.applied_next[node_id]
        if end <= node.log.start_offset or end > node.high_watermark:
            return
        node.create_snapshot(end, list(self.applied[node_id]), self.now, trim=trim)
        self._step(node_id)

    # -- checks
    def _fail(self, message: str) -> None:
        raise SafetyViolation(f"seed {self.seed} at {self.now} ms: {message}")

    def _drain(self, node_id: int, node: RaftNode) -> None:
        for event in node.drain_events():
            if isinstance(event, CommittedBatch):
                if event.base_offset != self.applied_next[node_id]:
                    self._fail(f"node {node_id} delivered {event.base_offset}, expected {self.applied_next[node_id]}")
                known = self.committed.get(event.base_offset)
                if known is None or known.data != event.data:
                    self._fail(f"node {node_id} applied batch {event.base_offset}, not the committed one")
                if not event.is_control:
                    self.applied[node_id].extend(data_payloads(event.data))
                self.applied_next[node_id] = event.last_offset + 1
            elif isinstance(event, SnapshotLoaded):
                sid = event.snapshot_id
                if sid.offset > self.committed_end or sid.offset not in self.data_before:
                    self._fail(f"node {node_id} loaded snapshot {sid} beyond the committed log {self.committed_end}")
                expected = self.data_values[:self.data_before[sid.offset]]
                if data_payloads(event.data) != expected:
                    self._fail(f"node {node_id} loaded snapshot {sid} whose content is not the committed prefix")
                self.applied[node_id] = expected
                self.applied_next[node_id] = sid.offset
                self.stats.snapshots_installed += 1
            else:
                assert isinstance(event, LeaderChanged)

    def _record_committed(self, node_id: int, batch: Batch) -> None:
        known = self.committed.get(batch.base)
        if known is not None:
            if known.data != batch.data:
                self._fail(f"node {node_id} has batch {batch.base} (epoch {batch.epoch}) below its high watermark, "
                           f"but batch {known.base} (epoch {known.epoch}) was committed there")
            return
        if batch.base != self.committed_end:
            self._fail(f"node {node_id} commits batch {batch.base} past the committed end {self.committed_end}")
        self.committed[batch.base] = batch
        for pos, header in iter_batches(batch.data):
            if not header.is_control:
                self.data_values.extend(r.value for r in decode_batch(batch.data, pos, "", 0, check_crc=False))
        self.committed_end = batch.last + 1
        self.data_before[self.committed_end] = len(self.data_values)
        self.stats.commits += 1

    def _check(self, node_id: int, node: RaftNode) -> None:
        if node_id in self.observer_ids and node.role not in (Role.UNATTACHED, Role.FOLLOWER):
            self._fail(f"observer {node_id} is {node.role.value}")
        if node.role is Role.LEADER:
            holder = self.leader_of_epoch.get(node.epoch)
            if holder is None:
                self.leader_of_epoch[node.epoch] = node_id
                self.stats.leaders += 1
                self._check_leader_completeness(node_id)
                if self.on_new_leader is not None:
                    self.on_new_leader(self, node_id)
            elif holder != node_id:
                self._fail(f"two leaders in epoch {node.epoch}: {holder} and {node_id}")
        hw = node.high_watermark
        previous = self.seen_hw[node_id]
        if previous is not None and (hw is None or hw < previous):
            self._fail(f"node {node_id} high watermark went from {previous} to {hw}")
        self.seen_hw[node_id] = hw
        if hw is not None and hw > self.checked_hw.get(node_id, -1):
            log = self.logs[node_id]
            frm = max(self.checked_hw.get(node_id, 0), log.start_offset)
            for batch in log.batches():
                if batch.last < frm:
                    continue
                if batch.last >= hw:
                    break
                self._record_committed(node_id, batch)
            self.checked_hw[node_id] = hw

    def _check_leader_completeness(self, node_id: int) -> None:
        log = self.logs[node_id]
        if log.start_offset > self.committed_end:
            self._fail(f"new leader {node_id} starts its log at {log.start_offset}, past the committed end")
        mine = {b.base: b for b in log.batches()}
        for base, batch in self.committed.items():
            if base >= log.start_offset and (base not in mine or mine[base].data != batch.data):
                self._fail(f"new leader {node_id} lacks committed batch {base} (epoch {batch.epoch})")

    def check_log_matching(self) -> None:
        """Two logs holding a batch of the same offset and epoch agree on everything before it."""
        logs = {n: {b.base: b for b in self.logs[n].batches()} for n in self.ids}
        for i, a in enumerate(self.ids):
            for b in self.ids[i + 1:]:
                la, lb = logs[a], logs[b]
                start = max(self.logs[a].start_offset, self.logs[b].start_offset)
                common = [o for o in la if o >= start and o in lb and la[o].epoch == lb[o].epoch]
                if not common:
                    continue
                top = max(common)
                for o in sorted(la):
                    if start <= o <= top and (o not in lb or lb[o].data != la[o].data):
                        self._fail(f"logs of {a} and {b} share (offset {top}, epoch {la[top].epoch}) "
                                   f"but differ at {o}")

    # -- liveness
    def stable_leader(self) -> int | None:
        """The leader every live node follows, if there is one."""
        leaders = [n for n in self.up() if self.nodes[n].role is Role.LEADER]  # type: ignore[union-attr]
        if len(leaders) != 1:
            return None
        leader = self.nodes[leaders[0]]
        assert leader is not None
        for n in self.up():
            node = self.nodes[n]
            assert node is not None
            if node.epoch != leader.epoch or node.leader_id != leaders[0]:
                return None
            if n != leaders[0] and node.role is not Role.FOLLOWER:
                return None
        return leaders[0]


def run_schedule(seed: int, voters: int, observers: int = 1, *, node_factory: Any = RaftNode,
                 chaos_ms: int | None = None) -> SimStats:
    """One random schedule: a chaos phase (faults, crashes, partitions, appends, snapshots), then a healed phase
    in which a leader must be elected and a new append committed everywhere within a bound."""
    rng = random.Random(seed ^ 0x5EED)
    # Each schedule draws its own weather: how lossy, slow and crash-prone the cluster is, and whether a
    # fetch carries one batch or many (one batch per fetch opens the windows the HW rule must close).
    config = attrs.evolve(SIM_CONFIG, fetch_max_bytes=rng.choice([100, 1500]))
    sim = Simulation(seed, voters, observers, config, node_factory=node_factory)
    chaos = chaos_ms if chaos_ms is not None else rng.randint(600, 1500)
    sim.p_drop = rng.choice([0.0, 0.02, 0.1, 0.2])
    sim.p_dup = rng.choice([0.0, 0.05, 0.1])
    sim.max_delay = rng.choice([3, 10, 30])
    weights = {"append": 1.0, "crash": rng.choice([0.1, 0.3, 0.6]), "partition": rng.choice([0.1, 0.2, 0.4]),
               "snapshot": 0.2, "resign": 0.05}
    longest_down = rng.choice([100, 400])
    # Sometimes cut a new leader off (crash or isolate) just after it wins, before its first records
    # spread: the histories this leaves (Raft's "figure 8") are what the high-watermark rule is for.
    depose = rng.choice([0.0, 0.0, 0.3, 0.6])
    if depose:
        def on_new_leader(s: Simulation, node_id: int) -> None:
            when = s.now + rng.randint(0, 20)
            if when < chaos and rng.random() < depose:
                if rng.random() < 0.5:
                    s.at(when, lambda s2: s2.crash(node_id))
                    s.at(min(chaos, when + rng.randint(10, longest_down)), lambda s2: s2.restart(node_id))
                else:
                    s.at(when, lambda s2: s2.partition({node_id}))
                    s.at(min(chaos, when + rng.randint(50, 400)), Simulation.heal)
        sim.on_new_leader = on_new_leader
    kinds, cumulative = list(weights), []
    total = 0.0
    for kind in kinds:
        total += weights[kind]
        cumulative.append(total)
    t = 0
    while True:
        t += rng.randint(10, 60)
        if t >= chaos:
            break
        kind = kinds[bisect.bisect_left(cumulative, rng.random() * total)]
        if kind == "append":
            sim.at(t, Simulation.client_append)
        elif kind == "crash":
            node = rng.choice(sim.ids)
            down = rng.randint(10, longest_down)
            sim.at(t, lambda s, n=node: s.crash(n))
            sim.at(min(t + down, chaos), lambda s, n=node: s.restart(n))
        elif kind == "partition":
            group = set(rng.sample(sim.ids, rng.randint(1, len(sim.ids) // 2)))
            sim.at(t, lambda s, g=group: s.partition(g))
            sim.at(min(t + rng.randint(50, 500), chaos), Simulation.heal)
        elif kind == "snapshot":
            node, trim = rng.choice(sim.ids), rng.random() < 0.7
            sim.at(t, lambda s, n=node, tr=trim: s.snapshot(n, tr))
        else:
            sim.at(t, Simulation.resign_leaders)
    sim.run_until(chaos)
    # Heal: every node up, a clean network.
    sim.heal()
    sim.p_drop = sim.p_dup = 0.0
    sim.max_delay = 5
    for n in sim.ids:
        sim.restart(n)
    # Liveness: within the bound a leader is elected and an append commits and reaches every node. An
    # append may be lost to a legitimate leader change (it was not committed): the client then retries.
    bound = chaos + 30 * sim.config.election_timeout_ms
    marker = b""
    while True:
        if not sim.run_until(bound, lambda s: s.stable_leader() is not None):
            raise SafetyViolation(f"seed {seed}: no stable leader within {bound - chaos} ms of healing; roles "
                                  f"{[(n, s.role.value, s.epoch, s.leader_id) for n, s in sim.nodes.items() if s]}")
        leader_id = sim.stable_leader()
        assert leader_id is not None
        leader = sim.nodes[leader_id]
        assert leader is not None
        epoch = leader.epoch
        marker = f"{seed}:final:{epoch}".encode()
        offset = leader.append([marker], sim.now)
        sim._step(leader_id)

        def settled(s: Simulation) -> bool:
            node = s.nodes[leader_id]
            return (all(s.applied_next[n] > offset for n in s.ids)
                    or node is None or node.role is not Role.LEADER or node.epoch != epoch)

        sim.run_until(bound, settled)
        if all(sim.applied_next[n] > offset for n in sim.ids):
            break
        if sim.now >= bound:
            raise SafetyViolation(f"seed {seed}: append at {offset} not applied everywhere within "
                                  f"{bound - chaos} ms of healing: { {n: sim.applied_next[n] for n in sim.ids} }")
    sim.stats.liveness_ms = sim.now - chaos
    for n in sim.ids:
        if marker not in sim.applied[n]:
            sim._fail(f"node {n} applied offset {offset} without the appended record")
    sim.check_log_matching()
    return sim.stats


__all__ = ["MemoryRaftLog", "MemoryQuorumStateStore", "Simulation", "SafetyViolation", "run_schedule",
           "SIM_CONFIG", "data_payloads", "Net"]


# ------------------------------------------------------------------ a synchronous network for focused tests


class Net:
    """Zero-latency delivery between RaftNodes for focused tests, with links that can be cut.

    :meth:`tick` polls every node at the current time and delivers what
    they send (and the answers) until nothing moves; :meth:`run` advances
    time in steps. Every message is recorded in :attr:`log` as
    ``(time, source, destination, message)``.
    """

    def __init__(self, nodes: dict[int, RaftNode], now: int = 0) -> None:
        self.nodes = nodes
        self.now = now
        self.cut: set[tuple[int, int]] = set()
        self.log: list[tuple[int, int, int, Any]] = []
        #: ``drop(source, destination, message)`` -> True loses that one message.
        self.drop: Any = None

    def isolate(self, node_id: int) -> None:
        for other in self.nodes:
            if other != node_id:
                self.cut |= {(node_id, other), (other, node_id)}

    def tick(self) -> None:
        queue: list[tuple[int, int, Any, Any]] = []
        for node_id, node in self.nodes.items():
            queue.extend((node_id, o.destination, o.message, o.request) for o in node.poll(self.now))
        steps = 0
        while queue:
            steps += 1
            assert steps < 100_000, "message storm"
            src, dst, message, reply_to = queue.pop(0)
            self.log.append((self.now, src, dst, message))
            node = self.nodes.get(dst)
            if node is None or (src, dst) in self.cut or (self.drop is not None and self.drop(src, dst, message)):
                continue
            if reply_to is None:
                response = node.handle_request(src, message, self.now)
                if response is not None:
                    queue.append((dst, src, response, message))
            else:
                node.handle_response(src, reply_to, message, self.now)
            queue.extend((dst, o.destination, o.message, o.request) for o in node.poll(self.now))

    def run(self, ms: int, step: int = 5, until: Any = None) -> bool:
        """Advance ``ms`` in steps of ``step``; stop early (returning True) once ``until(net)`` holds."""
        end = self.now + ms
        while True:
            self.tick()
            if until is not None and until(self):
                return True
            if self.now >= end:
                return False
            self.now = min(end, self.now + step)

    def leader(self) -> int | None:
        leaders = [n for n, node in self.nodes.items() if node.role is Role.LEADER]
        return leaders[0] if len(leaders) == 1 else None
