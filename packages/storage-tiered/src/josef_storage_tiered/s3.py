"""The ``s3`` backend: any S3-compatible object store (AWS S3, MinIO, SeaweedFS, Ceph RGW, R2...) through obstore.

Settings (under ``rsm.config.``), named as Aiven's tiered-storage RSM names
them, so an operator's Aiven configuration carries over:

=========================================  ==================================================================
``storage.s3.bucket.name``                 the bucket (required; it must exist: josef never creates one)
``storage.s3.region``                      default ``us-east-1``
``storage.s3.endpoint.url``                for an S3-compatible store; default AWS's endpoint of the region
``storage.s3.path.style.access.enabled``   ``true``: ``endpoint/bucket/key``; ``false``: ``bucket.endpoint/key``;
                                           unset: path style (obstore's default; AWS still serves it)
``storage.aws.access.key.id``              static credentials, both or neither; with neither, the AWS
``storage.aws.secret.access.key``          environment (``AWS_*`` variables, web identity, ECS/EC2 metadata)
``storage.aws.certificate.check.enabled``  default ``true``; ``false`` accepts any TLS certificate (tests only)
``storage.s3.multipart.upload.part.size``  bytes per part of a multipart upload, 5 MiB to 2 GiB (S3's limits)
``chunk.size``                             read as the part size when the key above is unset, raised to 5 MiB
                                           (Aiven's RSM chunks segments by it, commonly 4 MiB; S3 refuses parts
                                           under 5 MiB but the last). Neither set: 8 MiB
``key.prefix``                             prepended to every object key (default none)
``storage.s3.api.call.timeout``            ms a call may take with all its retries (default 120000)
``storage.s3.api.call.attempt.timeout``    ms one HTTP request may take (default 60000); connecting: at most 5 s
=========================================  ==================================================================

Files up to one part are uploaded with one PUT, larger ones as multipart
uploads of up to four parts in flight. Failed requests (connection errors,
5xx, timeouts of reads) are retried with exponential backoff (100 ms doubling
to 15 s, obstore's) until the call timeout; then the call raises
:class:`~josef.remote_storage.RemoteStorageError`, so a store that is down or
cut off fails a copy or fetch within the call timeout plus one attempt,
never hangs it. Errors name the bucket and endpoint, and a refused
credential or a missing bucket names the key to fix.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import attrs
from obstore.exceptions import PermissionDeniedError, UnauthenticatedError
from obstore.store import S3Store

from josef.remote_storage import RemoteStorageError

from josef_storage_tiered.config import Settings, full_key
from josef_storage_tiered.object_store import ObjectStoreRemoteStorage, SegmentLayout, describe

log = logging.getLogger(__name__)

MiB = 1024 * 1024
#: S3's smallest part (all but the last part of a multipart upload), and its largest accepted here (Aiven's bound).
MIN_PART_SIZE = 5 * MiB
MAX_PART_SIZE = 2 * 1024 * MiB
DEFAULT_PART_SIZE = 8 * MiB
DEFAULT_REGION = "us-east-1"
DEFAULT_CALL_TIMEOUT_MS = 120_000
DEFAULT_ATTEMPT_TIMEOUT_MS = 60_000
MAX_CONNECT_TIMEOUT_MS = 5_000

BUCKET = "storage.s3.bucket.name"
REGION = "storage.s3.region"
ENDPOINT = "storage.s3.endpoint.url"
PATH_STYLE = "storage.s3.path.style.access.enabled"
ACCESS_KEY = "storage.aws.access.key.id"
SECRET_KEY = "storage.aws.secret.access.key"
CERTIFICATE_CHECK = "storage.aws.certificate.check.enabled"
PART_SIZE = "storage.s3.multipart.upload.part.size"
CHUNK_SIZE = "chunk.size"
KEY_PREFIX = "key.prefix"
CALL_TIMEOUT = "storage.s3.api.call.timeout"
ATTEMPT_TIMEOUT = "storage.s3.api.call.attempt.timeout"

#: S3 error codes of a request whose credentials were refused.
_CREDENTIAL_CODES = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken",
                     "InvalidToken", "AuthorizationHeaderMalformed")


@attrs.frozen
class S3Settings:
    """The ``s3`` backend's settings, read and checked (see the module's docstring for each)."""

    bucket: str
    region: str = DEFAULT_REGION
    endpoint_url: str | None = None
    path_style: bool | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = attrs.field(default=None, repr=False)
    certificate_check: bool = True
    part_size: int = DEFAULT_PART_SIZE
    key_prefix: str = ""
    call_timeout_ms: int = DEFAULT_CALL_TIMEOUT_MS
    attempt_timeout_ms: int = DEFAULT_ATTEMPT_TIMEOUT_MS

    @classmethod
    def parse(cls, settings: Mapping[str, Any]) -> S3Settings:
        """Read the settings; a missing required key or a bad value is a ValueError naming its full key."""
        read = Settings(settings)
        endpoint = read.string(ENDPOINT)
        if endpoint is not None:
            parts = urlsplit(endpoint)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError(f"{full_key(ENDPOINT)}={endpoint!r} is not an http:// or https:// URL")
        access_key, secret_key = read.string(ACCESS_KEY), read.string(SECRET_KEY)
        if (access_key is None) != (secret_key is None):
            given, missing = (ACCESS_KEY, SECRET_KEY) if secret_key is None else (SECRET_KEY, ACCESS_KEY)
            raise ValueError(f"{full_key(missing)} is required with {full_key(given)}")
        part_size = read.integer(PART_SIZE, minimum=MIN_PART_SIZE, maximum=MAX_PART_SIZE)
        if part_size is None:
            chunk_size = read.integer(CHUNK_SIZE, minimum=1, maximum=MAX_PART_SIZE)
            part_size = DEFAULT_PART_SIZE if chunk_size is None else max(chunk_size, MIN_PART_SIZE)
            if chunk_size is not None and chunk_size < MIN_PART_SIZE:
                log.info("%s=%d is below S3's smallest part: uploading in parts of %d bytes",
                         full_key(CHUNK_SIZE), chunk_size, part_size)
        call_timeout = read.integer(CALL_TIMEOUT, DEFAULT_CALL_TIMEOUT_MS, minimum=1)
        attempt_timeout = read.integer(ATTEMPT_TIMEOUT, DEFAULT_ATTEMPT_TIMEOUT_MS, minimum=1)
        assert call_timeout is not None and attempt_timeout is not None
        return cls(bucket=read.required(BUCKET), region=read.string(REGION, DEFAULT_REGION) or DEFAULT_REGION,
                   endpoint_url=endpoint, path_style=read.boolean(PATH_STYLE), access_key_id=access_key,
                   secret_access_key=secret_key, certificate_check=bool(read.boolean(CERTIFICATE_CHECK, True)),
                   part_size=part_size, key_prefix=read.string(KEY_PREFIX, "") or "",
                   call_timeout_ms=call_timeout, attempt_timeout_ms=attempt_timeout)

    @property
    def endpoint(self) -> str:
        """Where requests go, for messages."""
        return self.endpoint_url or f"https://s3.{self.region}.amazonaws.com"

    def store(self) -> S3Store:
        """The obstore store. Credentials not given here come from the AWS environment, as the AWS SDK's would."""
        config: dict[str, Any] = {"region": self.region}
        if self.endpoint_url is not None:
            config["endpoint"] = self.endpoint_url
        if self.path_style is not None:
            config["virtual_hosted_style_request"] = not self.path_style
        if self.access_key_id is not None:
            config["access_key_id"] = self.access_key_id
            config["secret_access_key"] = self.secret_access_key
        attempt = datetime.timedelta(milliseconds=self.attempt_timeout_ms)
        client = {
            "allow_http": self.endpoint.startswith("http://"),
            "allow_invalid_certificates": not self.certificate_check,
            "timeout": attempt,
            "connect_timeout": min(attempt, datetime.timedelta(milliseconds=MAX_CONNECT_TIMEOUT_MS)),
        }
        retry = {"retry_timeout": datetime.timedelta(milliseconds=self.call_timeout_ms)}
        return S3Store(self.bucket, config=config, client_options=client, retry_config=retry)  # type: ignore[arg-type]


class S3RemoteStorage(ObjectStoreRemoteStorage):
    """The ``s3`` backend (see the module's docstring)."""

    def __init__(self, settings: S3Settings) -> None:
        self.settings = settings
        self.where = f"bucket {settings.bucket} at {settings.endpoint}"
        super().__init__(settings.store(), layout=SegmentLayout(settings.key_prefix), part_size=settings.part_size)

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> S3RemoteStorage:
        """The factory registered as ``s3``: ``settings`` are the broker's ``rsm.config.*`` keys, prefix removed."""
        return cls(S3Settings.parse(settings))

    def explain(self, exc: BaseException, doing: str, key: str) -> RemoteStorageError:
        """A missing bucket is not a missing object (the caller would take the segment for deleted), and a
        refused credential names the keys that hold it."""
        text = str(exc)
        if "NoSuchBucket" in text:
            return RemoteStorageError(
                f"{doing} {key} failed: bucket {self.settings.bucket!r} does not exist at {self.settings.endpoint} "
                f"(set by {full_key(BUCKET)}): {describe(exc)}")
        if isinstance(exc, (PermissionDeniedError, UnauthenticatedError)) or any(c in text for c in _CREDENTIAL_CODES):
            who = (f"access key {self.settings.access_key_id!r} ({full_key(ACCESS_KEY)}, {full_key(SECRET_KEY)})"
                   if self.settings.access_key_id else
                   f"the AWS environment's credentials (none in {full_key(ACCESS_KEY)})")
            return RemoteStorageError(f"{doing} {key} failed: {self.settings.endpoint} refused {who} for bucket "
                                      f"{self.settings.bucket!r}: {describe(exc)}")
        return super().explain(exc, doing, key)
