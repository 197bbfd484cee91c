"""The fuzzer: drawn inputs sent to a live broker, every answer checked, the broker checked after every batch.

Each input is one of:

- a request drawn from the schemas (:mod:`josef.testing.fuzz.requests`),
  valid or broken, sent on a connection kept open between inputs and
  followed by an ApiVersions probe: the input must be answered (in its
  version, with its correlation id, decodable to the last byte) or the
  connection closed, and the probe answered after it; an input that is
  neither answered nor refused within ``answer_timeout`` is a hang;
- a mutation of captured client traffic (:mod:`josef.testing.fuzz.mutations`),
  written to a fresh connection that is then half-closed: the broker must
  answer what it can read and close, within ``answer_timeout``.

Every ``check_every`` inputs (and at the end) the fuzzer closes its
connection and checks the broker: the process is alive; it logged no error
or traceback; it still answers ApiVersions and a produce/fetch round trip;
it holds no connection the fuzzer closed (half-closed, CLOSE_WAIT) and no
more sockets outside every table than before; its RSS is under
``rss_limit``. What goes wrong becomes a :class:`Finding` in the :class:`Report`, with the input that showed it
(hex, and how it was made), rather than stopping the run, except a dead
broker, which ends it.

The inputs are drawn by Hypothesis (generation only: a live broker's state
makes shrinking meaningless), in runs of ``chunk`` inputs, each with its
own seed derived from the run's, so a run is replayed by its seed.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import re
import socket
import struct
import time
from typing import Any, Callable, Sequence

import attrs
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map
from kio.serial._introspect import EntityField, EntityTupleField, classify_field

from josef.protocol.api_keys import ApiKey
from josef.protocol.messages import decode_response, encode_request, is_flexible, parse_header
from josef.testing.fuzz import target as targets
from josef.testing.fuzz.mutations import RawInput, mutated_traffic, split_frames
from josef.testing.fuzz.requests import MAX_WAIT_MS, Input, capped_waits, declared_wait_ms, request_frames

_ERROR_LINE = re.compile(r"\b(ERROR|CRITICAL)\b|Traceback|Task exception|Exception in callback")
_NUMBERS = re.compile(r"\d+")
_CLOSING = re.compile(r"closing connection from [^\s:]+:(\d+): (.*?)(?: \(josef[\w.]*\))?$")
_TIMEOUT = object()
#: Where Kafka 4.x itself answers UNKNOWN_SERVER_ERROR to a valid request: a coordinator write larger than a batch
#: may be (its CoordinatorOperationExceptionHelper maps MESSAGE_TOO_LARGE so), as a huge offset commit is.
_TOO_LARGE_IS_UNKNOWN = frozenset({ApiKey.OFFSET_COMMIT, ApiKey.TXN_OFFSET_COMMIT})


@attrs.define
class ApiStats:
    inputs: int = 0
    #: Answered in the request's version (and the connection went on, or closed after the answer).
    answered: int = 0
    #: Refused: the broker closed the connection without answering.
    closed: int = 0
    #: Neither answered nor refused, with the next request answered (acks=0 produce).
    unanswered: int = 0
    #: Time spent on its inputs, from the first byte sent to the last one read.
    seconds: float = 0.0


@attrs.define
class Finding:
    category: str
    summary: str
    #: The first input that showed it (hex of its first bytes, and how it was made), or the log lines.
    example: str
    count: int = 1


@attrs.define
class Report:
    seed: int
    inputs: int = 0
    started: float = attrs.field(factory=time.monotonic)
    duration_s: float = 0.0
    by_api: dict[str, ApiStats] = attrs.field(factory=dict)
    by_kind: collections.Counter[str] = attrs.field(factory=collections.Counter)
    findings: dict[tuple[str, str], Finding] = attrs.field(factory=dict)
    #: (seconds since the start, inputs sent, broker RSS in bytes), at every check.
    rss: list[tuple[float, int, int]] = attrs.field(factory=list)
    checks: int = 0
    #: Whether the broker died (the run stopped there).
    crashed: bool = False
    #: The slowest inputs: (seconds, what it was).
    slowest: list[tuple[float, str]] = attrs.field(factory=list)

    def api(self, name: str) -> ApiStats:
        found = self.by_api.get(name)
        if found is None:
            found = self.by_api[name] = ApiStats()
        return found

    def merge(self, other: Report) -> None:
        """Add ``other``'s counts, findings and samples to this report (fuzzers run side by side)."""
        self.inputs += other.inputs
        self.duration_s = max(self.duration_s, other.duration_s)
        self.checks += other.checks
        self.crashed = self.crashed or other.crashed
        self.by_kind.update(other.by_kind)
        for name, stats in other.by_api.items():
            mine = self.api(name)
            for field in attrs.fields(ApiStats):
                setattr(mine, field.name, getattr(mine, field.name) + getattr(stats, field.name))
        for key, finding in other.findings.items():
            if key in self.findings:
                self.findings[key].count += finding.count
            else:
                self.findings[key] = finding
        self.rss = sorted(self.rss + other.rss)
        self.slowest = sorted(self.slowest + other.slowest, reverse=True)[:10]

    def add(self, category: str, summary: str, example: str) -> None:
        key = (category, _NUMBERS.sub("N", summary)[:200])
        found = self.findings.get(key)
        if found is None:
            self.findings[key] = Finding(category, summary, example)
        else:
            found.count += 1

    def text(self) -> str:
        """The report, for people: inputs per API, answers and refusals, findings, RSS over time, duration."""
        lines = [f"inputs: {self.inputs} in {self.duration_s:.0f} s ({self.inputs / max(self.duration_s, 1e-9):.0f}/s), "
                 f"seed {self.seed}, {self.checks} broker checks",
                 "by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(self.by_kind.items())),
                 f"{'api':<34}{'inputs':>9}{'answered':>10}{'closed':>9}{'no answer':>11}{'ms/input':>10}"]
        for name, s in sorted(self.by_api.items()):
            lines.append(f"{name:<34}{s.inputs:>9}{s.answered:>10}{s.closed:>9}{s.unanswered:>11}"
                         f"{1000 * s.seconds / max(s.inputs, 1):>10.1f}")
        total = ApiStats(*(sum(getattr(s, f) for s in self.by_api.values())
                           for f in ("inputs", "answered", "closed", "unanswered", "seconds")))
        lines.append(f"{'total':<34}{total.inputs:>9}{total.answered:>10}{total.closed:>9}{total.unanswered:>11}"
                     f"{1000 * total.seconds / max(total.inputs, 1):>10.1f}")
        if self.rss:
            lines.append("broker RSS (MB) at s/inputs: " + ", ".join(
                f"{rss / 2**20:.0f}@{t:.0f}s/{n}" for t, n, rss in _thin(self.rss, 24)))
        lines.append("slowest inputs:")
        lines += [f"  {seconds:.2f} s: {what[:300]}" for seconds, what in sorted(self.slowest, reverse=True)]
        lines.append(f"findings: {len(self.findings)}" + (" (the broker died)" if self.crashed else ""))
        for f in self.findings.values():
            lines.append(f"  [{f.category}] x{f.count}: {f.summary}")
            lines.append("      e.g. " + (f.example if len(f.example) <= 2000 else f"...{f.example[-2000:]}"))
        return "\n".join(lines)


@functools.cache
def _error_plan(cls: type) -> tuple[tuple[str, str], ...]:
    """Where a response type holds error codes: (field, "code" | "entity" | "entities"), only fields that may."""
    plan = []
    for field in dataclasses.fields(cls):
        kind = classify_field(field)
        if field.metadata.get("kafka_type") == "error_code":
            plan.append((field.name, "code"))
        elif isinstance(kind, (EntityField, EntityTupleField)) and _error_plan(kind.type_):
            plan.append((field.name, "entities" if isinstance(kind, EntityTupleField) else "entity"))
    return tuple(plan)


def _reports(entity: Any, code: ErrorCode) -> bool:
    """Whether ``code`` is in any error code of a kio entity (nested entries included)."""
    for name, kind in _error_plan(type(entity)):
        value = getattr(entity, name)
        if kind == "code":
            if value == code:
                return True
        elif kind == "entity":
            if value is not None and _reports(value, code):
                return True
        elif value and any(_reports(item, code) for item in value):
            return True
    return False


def _alters_quotas(item: Input | RawInput) -> bool:
    if isinstance(item, Input):
        return item.api_key == ApiKey.ALTER_CLIENT_QUOTAS
    return any(frame[4:6] == b"\x00\x31" for frame in split_frames(item.data)[0])  # (api key 49)


def _records(lines: list[str]) -> list[list[str]]:
    """Log lines grouped into records: a line that starts with ``[`` (a timestamp) and the lines that follow it
    (a traceback)."""
    records: list[list[str]] = []
    for line in lines:
        if line.startswith("[") or not records:
            records.append([line])
        else:
            records[-1].append(line)
    return records


def _thin(samples: list[Any], n: int) -> list[Any]:
    if len(samples) <= n:
        return samples
    step = (len(samples) - 1) / (n - 1)
    return [samples[round(i * step)] for i in range(n)]


def _example(data: bytes, how: str) -> str:
    shown = data[:600].hex()
    return f"{how}; {len(data)} bytes: {shown}{'...' if len(data) > 600 else ''}"


def _api_name(key: int) -> str:
    return api_key_map.get(key, "(unknown api key)")


class _Abort(Exception):
    """The broker died: stop the run."""


class Fuzzer:
    """Sends drawn inputs to ``target`` and checks its answers and its health; see the module's docstring.

    ``versions`` are the APIs to draw (api key -> lowest, highest version;
    by default what the broker's ApiVersions says); ``corpus`` the captured
    request frames to mutate (none: only drawn requests). ``raw_share`` of
    the inputs are mutations of the corpus. With ``reset``, the state fuzzed
    admin requests leave is undone at every check
    (:func:`josef.testing.fuzz.target.reset_state`), through ``admin``, a
    client listener (by default ``target``; another for a controller
    listener, which answers no client API). Several fuzzers may
    run side by side on one broker (each its own process, seed and
    connections; :meth:`Report.merge` adds their reports up); all but one
    then leave the broker's errors to that one (``log_errors=False``).
    """

    def __init__(self, target: targets.Target, *, versions: dict[int, tuple[int, int]] | None = None,
                 corpus: Sequence[bytes] = (), raw_share: float = 0.4, answer_timeout: float = 30.0,
                 check_every: int = 2000, rss_limit: int = 1 << 30, reset: bool = True, node_id: int = 1,
                 batch: int = 10, chunk: int = 5000, settle_timeout: float = 30.0, log_errors: bool = True,
                 healthy: Callable[[], str | None] | None = None, admin: targets.Listener | None = None,
                 progress: Callable[[Report], None] | None = None) -> None:
        self.target = target
        self.versions = versions if versions is not None else targets.api_versions(target)
        self.corpus = [capped_waits(frame) for frame in corpus]
        self.raw_share = raw_share if self.corpus else 0.0
        self.answer_timeout = answer_timeout
        self.check_every = check_every
        self.rss_limit = rss_limit
        self.reset = reset
        self.node_id = node_id
        self.batch = batch
        self.chunk = chunk
        self.settle_timeout = settle_timeout
        self.log_errors = log_errors
        self.admin = admin or target
        self.healthy = healthy or (lambda: targets.health_problem(self.admin))
        self.progress = progress
        self._sock: socket.socket | None = None
        self._last_example = ""
        self._throttled = False
        #: Valid requests the broker refused, by the port of their connection, until its log says why.
        self._refused: dict[int, tuple[str, str]] = {}
        self._last_check = 0
        self._baseline = 0
        self._limit = 0
        self.report = Report(seed=0)

    # ------------------------------------------------------------------ the run

    def run(self, inputs: int, seed: int = 0) -> Report:
        self.report = report = Report(seed=seed)
        self._limit = inputs
        self._baseline = targets.sockets(self.target).orphans
        self._check()
        chunk = 0
        try:
            while report.inputs < inputs:
                self._run_chunk(min(self.chunk, inputs - report.inputs), seed * 1_000_003 + chunk)
                chunk += 1
            self._check()
        except _Abort:
            pass
        finally:
            self._disconnect()
            report.duration_s = time.monotonic() - report.started
        return report

    def _strategy(self) -> st.SearchStrategy[Input | RawInput]:
        requests = request_frames(self.versions)
        if not self.raw_share:
            return requests
        raw = mutated_traffic(self.corpus)
        parts = 10
        raw_parts = max(1, round(self.raw_share * parts))
        return st.one_of(*[requests] * (parts - raw_parts), *[raw] * raw_parts)

    def _run_chunk(self, count: int, chunk_seed: int) -> None:
        target_inputs = self.report.inputs + count

        @settings(max_examples=math.ceil(count / self.batch), database=None, deadline=None,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet,
                  print_blob=False)
        @hypothesis_seed(chunk_seed)
        @given(st.lists(self._strategy(), min_size=self.batch, max_size=self.batch))
        def batch(items: list[Input | RawInput]) -> None:
            if self.report.crashed:  # the rest of Hypothesis's examples: nothing to send them to
                return
            for item in items:
                if self.report.inputs >= min(target_inputs, self._limit):
                    return
                self.exchange(item)
            if self.report.inputs - self._last_check >= self.check_every:
                try:
                    self._check()
                except _Abort:  # not raised through Hypothesis, which would try the example again
                    return

        before = self.report.inputs
        batch()
        if self.report.crashed or self.report.inputs == before:  # (nothing drawn: never seen, but never loop)
            raise _Abort

    # ------------------------------------------------------------------ one input

    def exchange(self, item: Input | RawInput) -> None:
        """Send one input and check what comes back."""
        self.report.inputs += 1
        started = time.monotonic()
        if isinstance(item, RawInput):
            self.report.by_kind["raw"] += 1
            stats = self._raw(item)
        else:
            self.report.by_kind[item.kind] += 1
            stats = self._structured(item)
        if self._throttled or _alters_quotas(item):
            # A fuzzed quota may throttle this connection (or the next ones) for days: start afresh.
            self._throttled = False
            self._disconnect()
            if _alters_quotas(item):
                try:
                    targets.reset_quotas(self.admin)
                except Exception as exc:
                    self.report.add("unhealthy", f"removing fuzzed quotas failed: {exc!r}", self._last_example)
        took = time.monotonic() - started
        stats.seconds += took
        slowest = self.report.slowest
        if len(slowest) < 10 or took > slowest[-1][0]:
            slowest.append((took, self._last_example))
            slowest.sort(reverse=True)
            del slowest[10:]

    def _connection(self) -> socket.socket:
        if self._sock is None:
            self._sock = socket.create_connection((self.target.host, self.target.port), timeout=self.answer_timeout)
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._buffer = b""
        return self._sock

    def _disconnect(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _structured(self, item: Input) -> ApiStats:
        stats = self.report.api(_api_name(item.api_key))
        stats.inputs += 1
        probe_id = item.correlation_id + 1 if item.correlation_id < 2**31 - 1 else 0
        probe = encode_request(ApiKey.API_VERSIONS, 0, probe_id, b"fuzz-probe", {})
        example = self._last_example = _example(
            item.data, f"{item.kind} {_api_name(item.api_key)} v{item.api_version}"
            + (f" ({item.corruption})" if item.corruption else ""))
        try:
            sock = self._connection()
            sock.sendall(item.data + probe)
        except OSError:
            self._disconnect()
            stats.closed += 1  # refused while it was still being written (a frame too large, say)
            return stats
        answered = False
        deadline = time.monotonic() + self.answer_timeout
        while True:
            frame = self._read_frame(deadline)
            if frame is _TIMEOUT:
                self.report.add("hang", f"{_api_name(item.api_key)} v{item.api_version}: neither answered nor "
                                        f"refused within {self.answer_timeout:g} s", example)
                self._disconnect()
                return stats
            if frame is None:
                if answered:
                    stats.answered += 1
                else:
                    stats.closed += 1
                    if item.kind == "valid":  # why is in the broker's log, under this connection's port
                        self._refused[sock.getsockname()[1]] = (f"{_api_name(item.api_key)} v{item.api_version}",
                                                                 example)
                self._disconnect()
                return stats
            (correlation,) = struct.unpack_from(">i", frame, 0)
            if correlation == item.correlation_id and not answered:
                answered = True
                self._check_answer(item.api_key, item.api_version, frame, example)
            elif correlation == probe_id:
                if answered:
                    stats.answered += 1
                else:
                    stats.unanswered += 1
                    if item.api_key != ApiKey.PRODUCE:
                        self.report.add("no answer", f"{_api_name(item.api_key)} v{item.api_version} got no "
                                                     "answer, and the next request did", example)
                return stats
            else:
                self.report.add("wrong answer", f"{_api_name(item.api_key)} v{item.api_version}: an answer with "
                                                f"correlation id {correlation}, not {item.correlation_id}", example)
                self._disconnect()
                return stats

    def _read_frame(self, deadline: float) -> bytes | None | object:
        """The next response frame on the kept connection (without its size); None when it closed; _TIMEOUT."""
        sock = self._sock
        assert sock is not None
        while True:
            if len(self._buffer) >= 4:
                (size,) = struct.unpack_from(">i", self._buffer, 0)
                if size < 4:  # not even a correlation id
                    self.report.add("wrong answer", f"a response frame of {size} bytes", self._last_example)
                    return None
                if len(self._buffer) >= 4 + size:
                    frame, self._buffer = self._buffer[4:4 + size], self._buffer[4 + size:]
                    return frame
            left = deadline - time.monotonic()
            if left <= 0:
                return _TIMEOUT
            sock.settimeout(left)
            try:
                chunk = sock.recv(1 << 20)
            except TimeoutError:
                return _TIMEOUT
            except OSError:
                return None
            if not chunk:
                return None
            self._buffer += chunk

    def _check_answer(self, api_key: int, version: int, frame: bytes, example: str) -> None:
        """An answer must decode, whole, in the request's version (ApiVersions at one the broker lacks: v0),
        and report no UNKNOWN_SERVER_ERROR (an exception in the broker)."""
        low, high = self.versions.get(api_key, (0, -1))
        if api_key == ApiKey.API_VERSIONS and not low <= version <= high:
            version = 0
        name = f"{_api_name(api_key)} v{version}"
        try:
            _, response = decode_response(api_key, version, frame, whole=True)
        except Exception as exc:
            self.report.add("wrong answer", f"{name}: the answer does not decode: {exc!r}"[:300],
                            example + f"; answer: {frame[:200].hex()}")
            return
        if api_key not in _TOO_LARGE_IS_UNKNOWN and _reports(response, ErrorCode.unknown_server_error):
            self.report.add("unknown server error", f"{name} answered UNKNOWN_SERVER_ERROR", example)
        throttle = getattr(response, "throttle_time", None)
        if throttle:  # the broker now reads nothing more on this connection for that long (KIP-219)
            self._throttled = True

    def _raw(self, item: RawInput) -> ApiStats:
        requests, _ = split_frames(item.data)
        if any(declared_wait_ms(frame) > MAX_WAIT_MS for frame in requests):
            # A mutation made a request ask for a long wait (a rebalance of minutes), which the broker may
            # rightly take in full: not sent, as the drawn requests never ask for one.
            self.report.by_kind["raw, not sent: asks for a long wait"] += 1
            return self.report.api("raw (not sent)")
        asked: dict[int, list[tuple[int, int]]] = collections.defaultdict(list)
        first = "raw"
        for frame in requests:
            try:
                header = parse_header(frame[4:], is_flexible)
            except Exception:
                break  # the broker stops at the first frame it cannot read
            asked[header.correlation_id].append((header.api_key, header.api_version))
            if first == "raw":
                first = f"raw {_api_name(header.api_key)}"
        stats = self.report.api(first)
        stats.inputs += 1
        example = self._last_example = _example(item.data, item.how)
        buffer = b""
        try:
            with socket.create_connection((self.target.host, self.target.port), timeout=self.answer_timeout) as sock:
                try:
                    sock.sendall(item.data)
                    sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass  # refused before it was all written
                deadline = time.monotonic() + self.answer_timeout
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self.report.add("hang", f"{first}: not closed within {self.answer_timeout:g} s of the "
                                                "client's end of stream", example)
                        return stats
                    sock.settimeout(left)
                    try:
                        chunk = sock.recv(1 << 20)
                    except TimeoutError:
                        continue
                    except OSError:
                        break
                    if not chunk:
                        break
                    buffer += chunk
        except OSError as exc:
            self.report.add("refused connection", f"cannot connect: {exc!r}", example)
            return stats
        answers, rest = split_frames(buffer)
        if rest:
            self.report.add("wrong answer", f"{first}: {len(rest)} bytes after the last whole answer", example)
        for answer in answers:
            if len(answer) < 8:
                self.report.add("wrong answer", f"{first}: a response frame of {len(answer) - 4} bytes", example)
                continue
            (correlation,) = struct.unpack_from(">i", answer, 4)
            if not asked.get(correlation):
                self.report.add("wrong answer", f"{first}: an answer with correlation id {correlation}, "
                                                "which no request had", example)
                continue
            key, version = asked[correlation].pop(0)
            self._check_answer(key, version, answer[4:], example)
        if answers:
            stats.answered += 1
        else:
            stats.closed += 1
        return stats

    # ------------------------------------------------------------------ the broker between batches

    def _check(self) -> None:
        self._disconnect()
        report = self.report
        report.checks += 1
        self._last_check = report.inputs
        self._scan_log()
        if not targets.alive(self.target):
            report.crashed = True
            report.add("crash", f"the broker process {self.target.pid} is gone", self._recent_log())
            raise _Abort
        problem = self.healthy()
        if problem is not None:
            report.add("unhealthy", problem, f"after {report.inputs} inputs")
        if self.reset:
            try:
                targets.reset_state(self.admin, self.node_id)
            except Exception as exc:
                report.add("unhealthy", f"resetting the fuzzed state failed: {exc!r}", f"after {report.inputs} inputs")
        held = self._connections_settled()
        if held is not None:
            report.add("leak", f"{len(held.closed_by_peer())} connections closed by their client still open on the "
                               f"listener; {held.orphans} sockets in no table (before fuzzing: {self._baseline})",
                       f"after {report.inputs} inputs: {held.listener[:20]}")
        rss = targets.rss(self.target)
        report.rss.append((time.monotonic() - report.started, report.inputs, rss))
        if rss > self.rss_limit:
            report.add("memory", f"broker RSS {rss / 2**20:.0f} MB over the limit of {self.rss_limit / 2**20:.0f} MB",
                       f"after {report.inputs} inputs")
        self._scan_log()
        if self.progress is not None:
            report.duration_s = time.monotonic() - report.started
            self.progress(report)

    def _connections_settled(self) -> targets.Sockets | None:
        """None once the broker holds no connection its client closed and no more sockets outside every table
        than before fuzzing (within ``settle_timeout``); else what it still holds."""
        deadline = time.monotonic() + self.settle_timeout
        while True:
            held = targets.sockets(self.target)
            if not held.closed_by_peer() and held.orphans <= self._baseline:
                return None
            if time.monotonic() > deadline:
                return held
            time.sleep(0.05)  # the broker closes its side when it notices: no event reaches this process

    def _scan_log(self) -> None:
        lines = self.target.new_log_lines()
        for record in _records(lines):
            first = record[0]
            if self.log_errors and (_ERROR_LINE.search(first)
                                    or any(line.startswith("Traceback") for line in record[1:])):
                summary = re.sub(r"^\[[^\]]*\]\s*", "", first)[:300]
                if len(record) > 1:  # the exception itself, where a traceback ends
                    summary += f" | {record[-1].strip()[:200]}"
                self.report.add("broker logged an error", summary, "\n".join(record)[-4000:])
            elif self._refused and (closing := _CLOSING.search(first)):
                refused = self._refused.pop(int(closing.group(1)), None)
                if refused is not None:
                    self.report.add("valid request refused", f"{refused[0]}: {closing.group(2)}", refused[1])
        self._refused.clear()
        self._log_tail = lines[-40:] or getattr(self, "_log_tail", [])

    def _recent_log(self) -> str:
        return "\n".join(getattr(self, "_log_tail", []))
