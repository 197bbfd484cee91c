"""The controller: validates admin requests against the image and turns them into metadata records.

Both metadata backends use this class; they only differ in how the records
it emits are made durable (:class:`josef.metadata.quorum.MetadataQuorum`).
Operations are serialised so that each decision sees the image left by the
previous one.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
import uuid
from typing import Any, AsyncIterator, Callable, Mapping, Sequence

import anyio
import attrs
from kio.schema.errors import ErrorCode

from josef import delegation_tokens, scram
from josef.acls import AclBinding, AclBindingFilter, InvalidAcl
from josef.config import AlterOp, Config, ConfigError
from josef.log import remote_storage_enabled
from josef.metadata import client_metrics, client_quotas, partition_changes
from josef.metadata.broker_heartbeats import BrokerHeartbeats
from josef.metadata.image import (
    MIGRATING_DIR,
    RECOVERED,
    RECOVERING,
    UNASSIGNED_DIR,
    MetadataImage,
    acl_record,
    PartitionImage,
    TopicImage,
)
from josef.metadata.placement import assign_replicas
from josef.metadata.quorum import MetadataQuorum, NotControllerError
from josef.metadata.features import (
    ELIGIBLE_LEADER_REPLICAS_VERSION,
    FeatureError,
    SupportedFeature,
    UpgradeType,
    check_update,
)
from josef.metadata.image import BrokerImage
from josef.metadata.records import (
    BROKER_RESOURCE,
    CLIENT_METRICS_RESOURCE,
    PRODUCER_ID_BLOCK_SIZE,
    GROUP_RESOURCE,
    TOPIC_RESOURCE,
    ClearElrRecord,
    ClientQuotaRecord,
    ConfigRecord,
    BrokerRegistrationChangeRecord,
    EntityData,
    Endpoint,
    FeatureLevelRecord,
    FenceBrokerRecord,
    UnfenceBrokerRecord,
    NO_LEADER_CHANGE,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RemoveAccessControlEntryRecord,
    RemoveDelegationTokenRecord,
    RemoveTopicRecord,
    RemoveUserScramCredentialRecord,
    TopicRecord,
    UserScramCredentialRecord,
    random_uuid,
    uuid_from_text,
)
from josef.security import KafkaPrincipal
from josef.policy import (
    AlterConfigPolicy,
    AlterConfigRequest,
    ConfigResource,
    CreateTopicPolicy,
    CreateTopicRequest,
    PolicyViolation,
)

log = logging.getLogger(__name__)

_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME = 249

SET, DELETE, APPEND, SUBTRACT = AlterOp.SET, AlterOp.DELETE, AlterOp.APPEND, AlterOp.SUBTRACT
INT64_MAX = 2**63 - 1
#: How often the active controller looks for leaderless partitions it may elect uncleanly (Kafka's 5 minutes).
UNCLEAN_ELECTION_CHECK_S = 300.0
UNCLEAN_LEADER_ELECTION = "unclean.leader.election.enable"
MIN_INSYNC_REPLICAS = "min.insync.replicas"
#: Kafka's default messages of the election errors.
ELECTION_NOT_NEEDED = "Leader election not needed for topic partition."
PREFERRED_LEADER_NOT_AVAILABLE = "The preferred leader was not available."
ELIGIBLE_LEADERS_NOT_AVAILABLE = "Eligible topic partition leaders are not available."


class ControllerError(Exception):
    """A request the controller refuses, with the Kafka error code clients expect."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@attrs.frozen
class ProducerIdBlock:
    """Producer ids ``first_id`` .. ``first_id + size - 1``, given to one broker."""

    broker_id: int
    first_id: int
    size: int


@attrs.frozen
class IsrChange:
    """One partition of an AlterPartition request: the ISR its leader wants, at the epochs it knows.

    ``new_isr`` holds ``(broker id, broker epoch)``; an epoch of -1 is not
    checked (AlterPartition v2 sends none).
    """

    topic_id: str
    partition: int
    leader_epoch: int
    partition_epoch: int
    new_isr: tuple[tuple[int, int], ...]
    leader_recovery_state: int = RECOVERED


@attrs.frozen
class IsrChangeResult:
    """The answer to one :class:`IsrChange`: an error, or the partition as it now is."""

    error: ErrorCode
    partition: PartitionImage | None = None


@attrs.frozen
class ElectionResult:
    """The outcome of one partition's election, with Kafka's error code and message."""

    topic: str
    partition: int
    error: ErrorCode
    message: str | None


@attrs.frozen
class ReassignmentResult:
    """The outcome of one partition of an AlterPartitionReassignments request."""

    topic: str
    partition: int
    error: ErrorCode
    message: str | None


@attrs.frozen
class CreatedTopic:
    topic: TopicImage
    replication_factor: int
    configs: Mapping[str, str]


def _default_dir(image: MetadataImage, broker_id: int) -> str:
    """Where a new replica is until its broker says (Kafka's defaultDir): the broker's only directory, if it has one."""
    broker = image.brokers.get(broker_id)
    if broker is None:
        return UNASSIGNED_DIR
    if not broker.log_dirs:
        return MIGRATING_DIR
    return broker.log_dirs[0] if len(broker.log_dirs) == 1 else UNASSIGNED_DIR


def _new_partition(image: MetadataImage, topic_id: uuid.UUID, partition: int, replicas: Sequence[int]) -> PartitionRecord:
    """A new partition: every replica in sync, the first one leading, epochs at 0 as Kafka starts them."""
    return PartitionRecord(partition_id=partition, topic_id=topic_id, replicas=tuple(replicas), isr=tuple(replicas),
                           leader=replicas[0], leader_epoch=0, partition_epoch=0,
                           directories=tuple(uuid_from_text(_default_dir(image, b)) for b in replicas))


def _check_policy(validate: Callable[[Any], None], request: CreateTopicRequest | AlterConfigRequest) -> None:
    """Ask a policy (:mod:`josef.policy`): a violation refuses with POLICY_VIOLATION and its message.

    Any other exception is the policy's bug: logged, and answered
    UNKNOWN_SERVER_ERROR without its message (as Kafka's ApiError does).
    """
    try:
        validate(request)
    except PolicyViolation as exc:
        raise ControllerError(ErrorCode.policy_violation, str(exc)) from None
    except Exception:
        log.exception("policy %r failed on %s", validate, request)
        raise ControllerError(ErrorCode.unknown_server_error, "the policy failed; see the controller's log") from None


def validate_topic_name(name: str) -> None:
    if not name or name in (".", ".."):
        raise ControllerError(ErrorCode.invalid_topic_exception, f"topic name {name!r} is illegal")
    if len(name) > MAX_TOPIC_NAME:
        raise ControllerError(ErrorCode.invalid_topic_exception, f"topic name is longer than {MAX_TOPIC_NAME} characters")
    if not _LEGAL_TOPIC.match(name):
        raise ControllerError(ErrorCode.invalid_topic_exception,
                              f"topic name {name!r} may only contain ASCII letters, digits, '.', '_' and '-'")


@attrs.frozen(repr=False)
class ScramUpsertion:
    """One AlterUserScramCredentials upsertion: the salted password, never the password."""

    name: str
    mechanism: int
    iterations: int
    salt: bytes
    salted_password: bytes

    def __repr__(self) -> str:
        return f"ScramUpsertion(name={self.name!r}, mechanism={self.mechanism}, iterations={self.iterations})"


def _check_scram_user(name: str, mechanism: int) -> tuple[ErrorCode, str] | None:
    """Kafka's validateScramUsernameAndMechanism."""
    if not name:
        return ErrorCode.unacceptable_credential, "Username must not be empty"
    if mechanism not in scram.BY_TYPE:
        return ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism"
    return None


@attrs.frozen(repr=False)
class CreatedToken:
    """A delegation token the controller created (CreateDelegationToken's answer), with its HMAC."""

    token: delegation_tokens.TokenInformation
    hmac: bytes

    def __repr__(self) -> str:
        return f"CreatedToken({self.token.token_id!r}, owner={self.token.owner})"


def _sum_ms(now: int, duration: int) -> int:
    """``now + duration``, capped at Long.MAX_VALUE as Kafka caps it."""
    return min(now + duration, delegation_tokens.INT64_MAX)


class Controller:
    def __init__(self, quorum: MetadataQuorum, config: Config, image: Callable[[], MetadataImage]) -> None:
        self._quorum = quorum
        self._config = config
        self._image = image
        self._lock = anyio.Lock()
        self._node_id: int = config["node.id"]
        self._was_active = False
        self.heartbeats = BrokerHeartbeats(config["broker.session.timeout.ms"])
        self._clock: Callable[[], float] = time.monotonic
        self._next_unclean_check = 0.0
        self._next_balance_check = 0.0
        #: Wall-clock milliseconds: token timestamps are absolute times clients compare with theirs.
        self._wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000
        self._next_token_sweep = 0.0

    @contextlib.asynccontextmanager
    async def _active(self) -> AsyncIterator[None]:
        """Decide one operation at a time, and only as the active controller (others answer NOT_CONTROLLER)."""
        async with self._lock:
            if self._quorum.controller_id != self._node_id:
                self._was_active = False
                raise ControllerError(ErrorCode.not_controller, "this node is not the active controller")
            if not self._was_active:
                self.activate()
            yield

    async def _commit(self, records: Sequence[MetadataRecord]) -> int:
        """Append ``records`` and return the offset of the last once committed; -1 when there is nothing."""
        if not records:
            return -1
        try:
            return await self._quorum.append(records)
        except NotControllerError as exc:
            raise ControllerError(ErrorCode.not_controller, str(exc)) from None

    # Client quotas ---------------------------------------------------------

    async def alter_client_quotas(
        self, entries: Sequence[tuple[Sequence[tuple[str, str | None]], Sequence[tuple[str, float, bool]]]],
        validate_only: bool,
    ) -> list[str | None]:
        """Apply each entry's ``(key, value, remove)`` ops to its entity; the error message of each entry, or None.

        Entries are validated one by one, as Kafka does: a bad entry fails
        alone and the others are applied.
        """
        results: list[str | None] = []
        records: list[MetadataRecord] = []
        async with self._active():
            for pairs, ops in entries:
                try:
                    entity = client_quotas.check_entity(pairs)
                    keys = [key for key, _, _ in ops]
                    if len(set(keys)) != len(keys):
                        raise client_quotas.QuotaError(f"duplicate quota key in {keys}")
                    for key, value, remove in ops:
                        client_quotas.check_op(entity, key, value, remove)
                except client_quotas.QuotaError as exc:
                    results.append(str(exc))
                    continue
                data = tuple(EntityData(entity_type=t, entity_name=n) for t, n in entity)
                records += [ClientQuotaRecord(entity=data, key=key, value=0.0 if remove else value, remove=remove)
                            for key, value, remove in ops]
                results.append(None)
            if not validate_only:
                await self._commit(records)
        return results

    # ACLs ------------------------------------------------------------------

    async def create_acls(self, bindings: Sequence[AclBinding | str]) -> list[str | None]:
        """Store each binding (a string is one that could not be read: its error); the error of each, or None.

        A binding already stored is a success that writes nothing, as in
        Kafka's AclControlManager; a bad one fails alone.
        """
        results: list[str | None] = []
        records: list[MetadataRecord] = []
        async with self._active():
            existing = set(self._image().acls.values())
            for binding in bindings:
                if isinstance(binding, str):
                    results.append(binding)
                    continue
                try:
                    binding.check()
                except InvalidAcl as exc:
                    results.append(str(exc))
                    continue
                if binding not in existing:
                    existing.add(binding)
                    records.append(acl_record(uuid.uuid4(), binding))
                results.append(None)
            await self._commit(records)
        return results

    async def delete_acls(self, filters: Sequence[AclBindingFilter | str]) -> list[list[AclBinding] | str]:
        """Remove the bindings each filter matches; per filter, what it removed (or its error)."""
        results: list[list[AclBinding] | str] = []
        records: list[MetadataRecord] = []
        async with self._active():
            removed: set[uuid.UUID] = set()
            acls = self._image().acls
            for wanted in filters:
                if isinstance(wanted, str):
                    results.append(wanted)
                    continue
                matching = [(acl_id, acl) for acl_id, acl in acls.items() if wanted.matches(acl)]
                for acl_id, _ in matching:
                    if acl_id not in removed:
                        removed.add(acl_id)
                        records.append(RemoveAccessControlEntryRecord(id=acl_id))
                results.append([acl for _, acl in matching])
            await self._commit(records)
        return results

    # SCRAM credentials -----------------------------------------------------

    async def alter_user_scram_credentials(
        self, deletions: Sequence[tuple[str, int]], upsertions: Sequence[ScramUpsertion],
    ) -> list[tuple[str, ErrorCode, str | None]]:
        """Kafka's ScramControlManager.alterCredentials: ``(user, error, message)`` per user named, in Kafka's order.

        A user may be named once per request (twice, even for two
        mechanisms, is DUPLICATE_RESOURCE for that user, as in Kafka);
        each user fails or succeeds alone. The controller turns each salted
        password into StoredKey and ServerKey: the password itself never
        reaches the broker, and the salted password never reaches the log.
        """
        failed: dict[str, tuple[ErrorCode, str]] = {}
        deleting: dict[str, tuple[str, int]] = {}
        upserting: dict[str, ScramUpsertion] = {}
        twice = (ErrorCode.duplicate_resource, "A user credential cannot be altered twice in the same request")
        async with self._active():
            credentials = self._image().scram_credentials
            for name, mechanism in deletions:
                if name in failed:
                    continue
                if deleting.pop(name, None) is not None:
                    failed[name] = twice
                elif (error := _check_scram_user(name, mechanism)) is not None:
                    failed[name] = error
                elif (name, mechanism) not in credentials:
                    failed[name] = (ErrorCode.resource_not_found, "Attempt to delete a user credential that does not exist")
                else:
                    deleting[name] = (name, mechanism)
            for upsertion in upsertions:
                name = upsertion.name
                if name in failed:
                    continue
                if deleting.pop(name, None) is not None or upserting.pop(name, None) is not None:
                    failed[name] = twice
                elif (error := _check_scram_user(name, upsertion.mechanism)) is not None:
                    failed[name] = error
                elif (message := scram.check_iterations(upsertion.iterations)) is not None:
                    failed[name] = (ErrorCode.unacceptable_credential, message)
                else:
                    upserting[name] = upsertion
            records: list[MetadataRecord] = [RemoveUserScramCredentialRecord(name=n, mechanism=m)
                                             for n, m in deleting.values()]
            for u in upserting.values():
                algorithm = scram.BY_TYPE[u.mechanism]
                c = scram.credential(algorithm, u.salt, u.salted_password, u.iterations)
                records.append(UserScramCredentialRecord(name=u.name, mechanism=u.mechanism, salt=c.salt,
                                                         stored_key=c.stored_key, server_key=c.server_key,
                                                         iterations=c.iterations))
            await self._commit(records)
        return ([(n, ErrorCode.none, None) for n in deleting] + [(n, ErrorCode.none, None) for n in upserting]
                + [(n, code, message) for n, (code, message) in failed.items()])

    # Delegation tokens (Kafka's DelegationTokenControlManager) -------------------------

    def _token_secret(self) -> str:
        """The secret key signing tokens; DELEGATION_TOKEN_AUTH_DISABLED when it is not set."""
        secret = self._config[delegation_tokens.SECRET_KEY]
        if not secret:
            raise ControllerError(ErrorCode.delegation_token_auth_disabled, "Delegation Token feature is not enabled.")
        return str(secret)

    async def create_delegation_token(self, requester: KafkaPrincipal, owner: KafkaPrincipal | None,
                                      renewers: Sequence[KafkaPrincipal], max_lifetime_ms: int) -> CreatedToken:
        """A new token for ``owner`` (the requester when None), renewable by ``renewers``.

        Its maximum lifetime is ``delegation.token.max.lifetime.ms`` or the
        request's, whichever is shorter (-1 or 0: the default); it expires
        after ``delegation.token.expiry.time.ms`` unless renewed. Renewers
        must be users (INVALID_PRINCIPAL_TYPE), as in Kafka. Raises
        :class:`ControllerError` with Kafka's code.
        """
        async with self._active():
            secret = self._token_secret()
            if any(r.principal_type != "User" for r in renewers):
                raise ControllerError(ErrorCode.invalid_principal_type, "Renewers must be users (User:<name>).")
            now = self._wall_ms()
            max_lifetime = self._config[delegation_tokens.MAX_LIFETIME_MS]
            if max_lifetime_ms > 0:
                max_lifetime = min(max_lifetime, max_lifetime_ms)
            max_timestamp = _sum_ms(now, max_lifetime)
            expiry = min(max_timestamp, _sum_ms(now, self._config[delegation_tokens.EXPIRY_TIME_MS]))
            token = delegation_tokens.TokenInformation(random_uuid(), owner or requester, requester, tuple(renewers),
                                                       now, max_timestamp, expiry)
            await self._commit([token.to_record()])
            return CreatedToken(token, delegation_tokens.create_hmac(token.token_id, secret))

    def _token_for(self, token_hmac: bytes, secret: str) -> delegation_tokens.TokenInformation:
        token = delegation_tokens.token_for_hmac(self._image().delegation_tokens, token_hmac, secret)
        if token is None:
            raise ControllerError(ErrorCode.delegation_token_not_found, "Delegation Token is not found on server.")
        return token

    async def renew_delegation_token(self, principal: KafkaPrincipal, token_hmac: bytes, renew_period_ms: int) -> int:
        """Kafka's renewDelegationToken: the token's new expiry, ``renew_period_ms`` from now (-1: the default,
        and never more than the default) but never past its maximum; only its owner or a renewer may."""
        async with self._active():
            secret = self._token_secret()
            now = self._wall_ms()
            token = self._token_for(token_hmac, secret)
            if token.expired(now):
                raise ControllerError(ErrorCode.delegation_token_expired, "Delegation Token is expired.")
            if not token.owner_or_renewer(principal):
                raise ControllerError(ErrorCode.delegation_token_owner_mismatch,
                                      "Specified Principal is not valid Owner/Renewer.")
            period = self._config[delegation_tokens.EXPIRY_TIME_MS]
            if renew_period_ms > 0:
                period = min(period, renew_period_ms)
            expiry = min(token.max_timestamp, _sum_ms(now, period))
            await self._commit([attrs.evolve(token, expiry_timestamp=expiry).to_record()])
            return expiry

    async def expire_delegation_token(self, principal: KafkaPrincipal, token_hmac: bytes, expiry_period_ms: int) -> int:
        """Kafka's expireDelegationToken: a negative period removes the token now; else it expires that long from
        now (never past its maximum). Only its owner or a renewer may; the new expiry timestamp is returned."""
        async with self._active():
            secret = self._token_secret()
            now = self._wall_ms()
            token = self._token_for(token_hmac, secret)
            if not token.owner_or_renewer(principal):
                raise ControllerError(ErrorCode.delegation_token_owner_mismatch,
                                      "Specified Principal is not valid Owner/Renewer.")
            if expiry_period_ms < 0:
                await self._commit([RemoveDelegationTokenRecord(token_id=token.token_id)])
                return now
            if token.expired(now):
                raise ControllerError(ErrorCode.delegation_token_expired, "Delegation Token is expired.")
            expiry = min(token.max_timestamp, _sum_ms(now, expiry_period_ms))
            await self._commit([attrs.evolve(token, expiry_timestamp=expiry).to_record()])
            return expiry

    async def expire_delegation_tokens_when_due(self) -> list[str]:
        """The active controller's sweep, every ``delegation.token.expiry.check.interval.ms``: tokens past their
        expiry or maximum lifetime are removed from the metadata log (Kafka's sweepExpiredDelegationTokens).
        Returns the ids removed. Call it about once a second."""
        async with self._active():
            now = self._clock()
            if now < self._next_token_sweep:
                return []
            self._next_token_sweep = now + self._config[delegation_tokens.EXPIRY_CHECK_INTERVAL_MS] / 1000
            wall = self._wall_ms()
            expired = [t for t in self._image().delegation_tokens.values() if t.expired(wall)]
            for token in expired:
                log.info("Delegation token expired for token: %s for owner: %s", token.token_id, token.owner)
            await self._commit([RemoveDelegationTokenRecord(token_id=t.token_id) for t in expired])
            return [t.token_id for t in expired]

    # Brokers ---------------------------------------------------------------

    async def register_broker(self, broker_id: int, incarnation_id: str, endpoints: Sequence[Endpoint],
                              rack: str | None, features: Mapping[str, tuple[int, int]],
                              previous_broker_epoch: int = -1, log_dirs: Sequence[str] = ()) -> int:
        """Kafka's BrokerRegistration: record the broker, fenced, and return its new broker epoch.

        ``previous_broker_epoch`` is the epoch the broker had when it last
        shut down cleanly (-1 when it did not): a registered broker coming
        back with another one restarted uncleanly, and with eligible leader
        replicas tracked it leaves every ISR and ELR first (KIP-966).

        ``log_dirs`` are the ``directory.id`` of the broker's online log
        directories (KIP-858), which its heartbeats may later report offline.

        The epoch is above every earlier one (the image's offset plus one),
        so a fence or unfence naming an older registration is ignored. The
        broker is unfenced by a later heartbeat, once its metadata has caught
        up with its own registration.
        """
        async with self._active():
            image = self._image()
            for name, level in image.features.items():
                low, high = features.get(name, (0, 0))
                if not low <= level <= high:
                    raise ControllerError(ErrorCode.unsupported_version,
                                          f"Unable to register because the broker does not support finalized version "
                                          f"{level} of {name}. The broker wants a version between {low} and {high}, "
                                          f"inclusive.")
            records: list[MetadataRecord] = []
            existing = image.brokers.get(broker_id)
            elr = self._elr(image)
            if existing is not None and previous_broker_epoch != existing.epoch and elr is not None:
                log.info("broker %d registers again after an unclean shutdown (previous broker epoch %d, not %d)",
                         broker_id, previous_broker_epoch, existing.epoch)
                records += partition_changes.broker_unclean_shutdown(image, broker_id, self._unclean_policy(image),
                                                                     elr)
            broker = BrokerImage(broker_id, tuple(endpoints), rack, True, image.offset + len(records) + 1,
                                 incarnation_id, features, log_dirs=tuple(log_dirs))
            records.append(broker.to_record())
            offset = await self._commit(records)
            self.heartbeats.registered(broker_id, broker.epoch, offset)
            return broker.epoch

    async def broker_heartbeat(self, broker_id: int, epoch: int, metadata_offset: int, want_fence: bool,
                               want_shut_down: bool, offline_log_dirs: Sequence[str] = ()) -> tuple[bool, bool, bool]:
        """Kafka's BrokerHeartbeat: ``(caught up, fenced, should shut down)`` after acting on the broker's wishes.

        A caught-up broker that does not want to be fenced is unfenced and
        takes back the leaderless partitions it holds in sync; one that
        wants to shut down (controlled shutdown) first hands its leadership
        to other in-sync replicas, then is fenced and told it may stop.
        A registered log directory reported in ``offline_log_dirs`` for the
        first time takes the broker's replicas in it out of leadership and
        the ISR (:func:`partition_changes.broker_dirs_offline`) and leaves the
        broker's online directories (Kafka's handleDirectoriesOffline).
        """
        async with self._active():
            image = self._image()
            broker = image.brokers.get(broker_id)
            session = self.heartbeats.session(broker_id)
            if broker is None or session is None:
                raise ControllerError(ErrorCode.broker_id_not_registered, f"broker {broker_id} is not registered")
            if broker.epoch != epoch:
                raise ControllerError(ErrorCode.stale_broker_epoch,
                                      f"broker {broker_id} heartbeat has epoch {epoch}, not {broker.epoch}")
            self.heartbeats.heartbeat(broker_id)
            caught_up = metadata_offset >= session.registration_offset
            records: list[MetadataRecord] = []
            if want_shut_down or want_fence:
                if not broker.fenced:
                    records += partition_changes.broker_leaving(image, broker_id, self._unclean_policy(image),
                                                                self._elr(image))
                    records.append(FenceBrokerRecord(id=broker_id, epoch=epoch))
                if want_shut_down and not broker.in_controlled_shutdown:
                    records.append(BrokerRegistrationChangeRecord(broker_id=broker_id, broker_epoch=epoch,
                                                                  in_controlled_shutdown=1))
            elif broker.fenced and caught_up:
                records.append(UnfenceBrokerRecord(id=broker_id, epoch=epoch))
                records += partition_changes.broker_returning(image, broker_id, self._unclean_policy(image),
                                                             self._elr(image))
            failed = [d for d in offline_log_dirs if d in broker.log_dirs]
            if failed:
                records += partition_changes.broker_dirs_offline(image, broker_id, failed, self._unclean_policy(image),
                                                                 self._elr(image))
                online = [d for d in broker.log_dirs if d not in offline_log_dirs]
                log.warning("directories %s of broker %d are offline; remaining directories: %s", failed, broker_id,
                            online)
                if online:  # none left: the broker stops, as Kafka's does
                    records.append(BrokerRegistrationChangeRecord(
                        broker_id=broker_id, broker_epoch=epoch, log_dirs=tuple(uuid_from_text(d) for d in online)))
            await self._commit(records)
            fenced = broker.fenced if not records else self._image().brokers[broker_id].fenced
            return caught_up, fenced, want_shut_down and fenced

    async def fence_expired_brokers(self) -> list[int]:
        """Fence the unfenced brokers whose session ran out; called on the active controller about once a second."""
        async with self._active():
            image = self._image()
            expired = self.heartbeats.expired(b for b, info in image.brokers.items() if not info.fenced)
            records: list[MetadataRecord] = []
            for broker_id in expired:
                changes = [*partition_changes.broker_leaving(image, broker_id, self._unclean_policy(image), self._elr(image)),
                           FenceBrokerRecord(id=broker_id, epoch=image.brokers[broker_id].epoch)]
                records += changes
                # The next broker's changes must see this one gone.
                image, _ = image.apply(image.offset, changes)
            await self._commit(records)
            return expired

    async def assign_replicas_to_dirs(self, broker_id: int, broker_epoch: int,
                                      assignments: Sequence[tuple[str, str, int]]) -> list[ErrorCode]:
        """Kafka's AssignReplicasToDirs: ``(directory id, topic id, partition)`` of each replica the broker placed.

        Recorded in the partitions' ``directories``, so a failed directory
        reported later names exactly its replicas. A replica assigned to a
        directory that is already offline leaves leadership and the ISR at
        once. Returns an error code per assignment.
        """
        async with self._active():
            image = self._image()
            broker = image.brokers.get(broker_id)
            if broker is None:
                raise ControllerError(ErrorCode.broker_id_not_registered, f"broker {broker_id} is not registered")
            if broker.epoch != broker_epoch:
                raise ControllerError(ErrorCode.stale_broker_epoch,
                                      f"broker {broker_id} has epoch {broker.epoch}, not {broker_epoch}")
            codes: list[ErrorCode] = []
            changes: list[MetadataRecord] = []
            offline: set[str] = set()
            for directory, topic_id, index in assignments:
                topic = image.topic_by_id(topic_id)
                partition = topic.partitions.get(index) if topic is not None else None
                if topic is None:
                    codes.append(ErrorCode.unknown_topic_id)
                elif partition is None:
                    codes.append(ErrorCode.unknown_topic_or_partition)
                elif broker_id not in partition.replicas:
                    codes.append(ErrorCode.not_leader_or_follower)
                else:
                    codes.append(ErrorCode.none)
                    if partition.directory_of(broker_id) != directory:
                        directories = tuple(directory if r == broker_id else partition.directory_of(r)
                                            for r in partition.replicas)
                        changes.append(PartitionChangeRecord(partition_id=index, topic_id=uuid_from_text(topic_id),
                                                             directories=tuple(uuid_from_text(d) for d in directories)))
                    if not broker.has_online_dir(directory):
                        offline.add(directory)
            records = list(changes)
            if offline:
                placed, _ = image.apply(image.offset, changes)
                records += partition_changes.broker_dirs_offline(placed, broker_id, offline, self._unclean_policy(image),
                                                                 self._elr(image))
            await self._commit(records)
            return codes

    def activate(self) -> None:
        """This node just became the active controller: give every registered broker a full session."""
        self.heartbeats.adopt((b, info.epoch) for b, info in self._image().brokers.items())
        self._next_balance_check = self._clock() + self._config["leader.imbalance.check.interval.seconds"]
        self._was_active = True

    def resign(self) -> None:
        """Another node leads now: the broker sessions kept here go stale, so the next term adopts afresh."""
        self._was_active = False

    # Partitions ------------------------------------------------------------

    async def alter_partition(self, broker_id: int, broker_epoch: int,
                              changes: Sequence[IsrChange]) -> list[IsrChangeResult]:
        """Kafka's AlterPartition: a partition leader's ISR changes (and KIP-704 recovery), decided one by one.

        Raises STALE_BROKER_EPOCH for a sender that is not registered at
        ``broker_epoch``. A change that completes a reassignment may move
        the leadership away from the sender, which is then told
        NEW_LEADER_ELECTED while the change is still committed.
        """
        async with self._active():
            image = self._image()
            sender = image.brokers.get(broker_id)
            if sender is None or sender.epoch != broker_epoch:
                raise ControllerError(ErrorCode.stale_broker_epoch,
                                      f"broker {broker_id} is not registered with epoch {broker_epoch}")
            results: list[IsrChangeResult] = []
            records: list[MetadataRecord] = []
            for change in changes:
                error = self._check_isr_change(image, broker_id, change)
                if error is not None:
                    results.append(IsrChangeResult(error))
                    continue
                topic = image.topic_by_id(change.topic_id)
                assert topic is not None
                record = partition_changes.build(
                    topic, change.partition, partition_changes.leader_acceptor(image),
                    isr=[b for b, _ in change.new_isr], recovery_state=change.leader_recovery_state,
                    election=partition_changes.election_for(self._unclean_policy(image), topic.name),
                    min_isr=self._min_isr(image, topic))
                if record is not None:
                    records.append(record)
                    image, _ = image.apply(image.offset, [record])
                partition = image.topics[topic.name].partitions[change.partition]
                if record is not None and record.leader not in (broker_id, NO_LEADER_CHANGE):
                    log.info("AlterPartition from broker %d for %s-%d completed its reassignment and moved the "
                             "leadership to %d", broker_id, topic.name, change.partition, partition.leader)
                    results.append(IsrChangeResult(ErrorCode.new_leader_elected))
                else:
                    results.append(IsrChangeResult(ErrorCode.none, partition))
            await self._commit(records)
            return results

    @staticmethod
    def _check_isr_change(image: MetadataImage, broker_id: int, change: IsrChange) -> ErrorCode | None:
        """Kafka's validateAlterPartitionData: why the change is refused, or None.

        A member that is not a replica is INVALID_REQUEST, as Kafka's
        Replicas.validateIsr; INELIGIBLE_REPLICA is for replicas that may
        not be in sync now (unregistered, fenced, shutting down, or
        registered again since the leader saw them).
        """
        topic = image.topic_by_id(change.topic_id)
        if topic is None:
            return ErrorCode.unknown_topic_id
        partition = topic.partitions.get(change.partition)
        if partition is None:
            return ErrorCode.unknown_topic_or_partition
        if change.leader_epoch > partition.leader_epoch or change.partition_epoch > partition.partition_epoch:
            return ErrorCode.not_controller  # the sender saw a newer state: this controller is behind
        if change.leader_epoch < partition.leader_epoch:
            return ErrorCode.fenced_leader_epoch
        if broker_id != partition.leader:
            return ErrorCode.invalid_request
        if change.partition_epoch < partition.partition_epoch:
            return ErrorCode.invalid_update_version
        isr = [b for b, _ in change.new_isr]
        if len(set(isr)) != len(isr) or not set(isr) <= set(partition.replicas) or partition.leader not in isr:
            return ErrorCode.invalid_request
        if change.leader_recovery_state == RECOVERING and (len(isr) > 1
                                                            or partition.leader_recovery_state == RECOVERED):
            return ErrorCode.invalid_request
        for member, epoch in change.new_isr:
            broker = image.brokers.get(member)
            if (broker is None or broker.fenced or broker.in_controlled_shutdown
                    or epoch not in (-1, broker.epoch) or not broker.has_online_dir(partition.directory_of(member))):
                return ErrorCode.ineligible_replica
        return None

    def _unclean_policy(self, image: MetadataImage) -> partition_changes.UncleanPolicy:
        """Whether each topic allows unclean leader election, as configured now (topic, then broker configs)."""
        return lambda topic: bool(self._topic_setting(image, topic, UNCLEAN_LEADER_ELECTION))

    def _elr(self, image: MetadataImage) -> partition_changes.Elr | None:
        """How eligible leader replicas are tracked, or None when ``eligible.leader.replicas.version`` is off."""
        if image.features.get(ELIGIBLE_LEADER_REPLICAS_VERSION, 0) < 1:
            return None
        return partition_changes.Elr(lambda topic: self._effective_min_isr(image, topic))

    def _effective_min_isr(self, image: MetadataImage, topic: TopicImage) -> int:
        """The topic's ``min.insync.replicas``, at most its replication factor (Kafka's getTopicEffectiveMinIsr)."""
        min_isr = int(self._topic_setting(image, topic.name, MIN_INSYNC_REPLICAS))
        partition = topic.partitions.get(0) or next(iter(topic.partitions.values()), None)
        return min_isr if partition is None else min(min_isr, len(partition.replicas))

    def _min_isr(self, image: MetadataImage, topic: TopicImage) -> int | None:
        """The ``min_isr`` :func:`partition_changes.build` takes: None when eligible leader replicas are off."""
        elr = self._elr(image)
        return None if elr is None else elr.min_isr(topic)

    def _topic_setting(self, image: MetadataImage, topic: str, broker_key: str) -> Any:
        """A topic-level config's value for ``topic``: its override, else this node's then the cluster's dynamic
        broker value, else the static one (Kafka's ConfigurationControlManager order)."""
        key = self._config.definition[broker_key]
        override = image.config(TOPIC_RESOURCE, topic).get(key.topic_name or broker_key)
        if override is not None:
            return key.parse(override)
        for name in (str(self._node_id), ""):
            value = image.config(BROKER_RESOURCE, name).get(broker_key)
            if value is not None:
                return key.parse(value)
        return self._config[broker_key]

    # Elections -------------------------------------------------------------

    async def elect_leaders(self, election: partition_changes.Election,
                            partitions: Sequence[tuple[str, int]] | None) -> list[ElectionResult]:
        """Kafka's ElectLeaders (PREFERRED or UNCLEAN): the outcome of each partition, all of them when None.

        Partitions that already have the wanted leader are
        ELECTION_NOT_NEEDED, and left out of the answer when every partition
        was asked for, as Kafka does.
        """
        async with self._active():
            image = self._image()
            every = partitions is None
            wanted = [(t.name, i) for t in image.topics.values() for i in sorted(t.partitions)] if every else partitions
            results: list[ElectionResult] = []
            records: list[MetadataRecord] = []
            for name, index in wanted:
                result = self._elect(image, election, name, index, records)
                if not (every and result.error == ErrorCode.election_not_needed):
                    results.append(result)
            await self._commit(records)
            return results

    def _elect(self, image: MetadataImage, election: partition_changes.Election, name: str, index: int,
               records: list[MetadataRecord]) -> ElectionResult:
        """Kafka's ReplicationControlManager.electLeader for one partition; its change goes to ``records``."""
        topic = image.topics.get(name)
        if topic is None:
            return ElectionResult(name, index, ErrorCode.unknown_topic_or_partition, f"No such topic as {name}")
        partition = topic.partitions.get(index)
        if partition is None:
            return ElectionResult(name, index, ErrorCode.unknown_topic_or_partition,
                                  f"No such partition as {name}-{index}")
        if (partition.leader == partition.preferred_leader if election is partition_changes.Election.PREFERRED
                else partition.leader != partition_changes.NO_LEADER):
            return ElectionResult(name, index, ErrorCode.election_not_needed, ELECTION_NOT_NEEDED)
        record = partition_changes.build(topic, index, partition_changes.leader_acceptor(image), election=election,
                                         min_isr=self._min_isr(image, topic))
        if record is None:
            if election is partition_changes.Election.PREFERRED:
                return ElectionResult(name, index, ErrorCode.preferred_leader_not_available,
                                      PREFERRED_LEADER_NOT_AVAILABLE)
            return ElectionResult(name, index, ErrorCode.eligible_leaders_not_available, ELIGIBLE_LEADERS_NOT_AVAILABLE)
        records.append(record)
        return ElectionResult(name, index, ErrorCode.none, None)

    async def elect_leaders_when_due(self) -> None:
        """The periodic elections of the active controller; call about once a second.

        Every ``UNCLEAN_ELECTION_CHECK_S``, leaderless partitions of topics
        that allow unclean election get a leader (the setting may have been
        enabled since they lost theirs); every
        ``leader.imbalance.check.interval.seconds``, when
        ``auto.leader.rebalance.enable``, imbalanced leadership moves back
        to preferred replicas.
        """
        async with self._active():
            now = self._clock()
            image = self._image()
            records: list[MetadataRecord] = []
            if now >= self._next_unclean_check:
                self._next_unclean_check = now + UNCLEAN_ELECTION_CHECK_S
                records += partition_changes.unclean_elections(image, self._unclean_policy(image), self._elr(image))
                image, _ = image.apply(image.offset, records)
            if self._config["auto.leader.rebalance.enable"] and now >= self._next_balance_check:
                self._next_balance_check = now + self._config["leader.imbalance.check.interval.seconds"]
                records += partition_changes.rebalance(image, self._config["leader.imbalance.per.broker.percentage"],
                                                       self._elr(image))
            await self._commit(records)

    # Reassignments ---------------------------------------------------------

    async def alter_partition_reassignments(
        self, targets: Sequence[tuple[str, int, Sequence[int] | None]], allow_replication_factor_change: bool = True,
    ) -> list[ReassignmentResult]:
        """Kafka's AlterPartitionReassignments: move each partition to its target replicas, or cancel (None).

        While a partition moves, its replicas are the target followed by
        the replicas being removed, with adding/removing replicas set; the
        move completes (in this call, or in the AlterPartition that brings
        the last new replica into the ISR) once every adding replica is in
        sync. Partitions are decided one by one, as Kafka does.
        """
        async with self._active():
            image = self._image()
            results: list[ReassignmentResult] = []
            records: list[MetadataRecord] = []
            for name, index, replicas in targets:
                try:
                    record = self._reassign(image, name, index, replicas, allow_replication_factor_change)
                except ControllerError as exc:
                    results.append(ReassignmentResult(name, index, exc.code, exc.message))
                    continue
                if record is not None:
                    records.append(record)
                    image, _ = image.apply(image.offset, [record])
                results.append(ReassignmentResult(name, index, ErrorCode.none, None))
            await self._commit(records)
            return results

    def _reassign(self, image: MetadataImage, name: str, index: int, replicas: Sequence[int] | None,
                  allow_replication_factor_change: bool) -> PartitionChangeRecord | None:
        topic = image.topics.get(name)
        if topic is None:
            raise ControllerError(ErrorCode.unknown_topic_or_partition, f"Unable to find a topic named {name}.")
        partition = topic.partitions.get(index)
        if partition is None:
            raise ControllerError(ErrorCode.unknown_topic_or_partition, f"Unable to find partition {name}:{index}.")
        acceptable = partition_changes.leader_acceptor(image)
        if replicas is None:
            if not partition.reassigning:
                raise ControllerError(ErrorCode.no_reassignment_in_progress,
                                      "No partition reassignment is in progress for this topic or partition.")
            revert = partition_changes.revert_reassignment(partition)
            if revert.unclean and not self._unclean_policy(image)(name):
                raise ControllerError(ErrorCode.invalid_replica_assignment,
                                      f"Unable to revert partition assignment for {name}:{index} because it would "
                                      f"require an unclean leader election.")
            return partition_changes.build(topic, index, acceptable, replicas=revert.replicas, isr=revert.isr,
                                           adding=(), removing=(), min_isr=self._min_isr(image, topic))
        self._check_assignment(image, replicas)
        if not allow_replication_factor_change and len(replicas) != len(partition.replicas) - len(
                partition.removing_replicas):
            raise ControllerError(ErrorCode.invalid_replication_factor,
                                  f"The replication factor is changed from "
                                  f"{len(partition.replicas) - len(partition.removing_replicas)} to {len(replicas)} "
                                  f"but allowReplicationFactorChange is false")
        move = partition_changes.reassignment(partition.replicas, replicas)
        return partition_changes.build(topic, index, acceptable, replicas=move.replicas, adding=move.adding,
                                       removing=move.removing, min_isr=self._min_isr(image, topic))

    @staticmethod
    def _check_assignment(image: MetadataImage, replicas: Sequence[int]) -> None:
        """Kafka's validateManualPartitionAssignment: registered brokers (fenced ones too), each once."""
        if not replicas:
            raise ControllerError(ErrorCode.invalid_replica_assignment,
                                  "The manual partition assignment includes an empty replica list.")
        seen: set[int] = set()
        for broker_id in sorted(replicas):
            if broker_id not in image.brokers:
                raise ControllerError(ErrorCode.invalid_replica_assignment,
                                      f"The manual partition assignment includes broker {broker_id}, but no such "
                                      f"broker is registered.")
            if broker_id in seen:
                raise ControllerError(ErrorCode.invalid_replica_assignment,
                                      f"The manual partition assignment includes the broker {broker_id} more than "
                                      f"once.")
            seen.add(broker_id)

    def list_partition_reassignments(
        self, wanted: Sequence[tuple[str, Sequence[int]]] | None,
    ) -> list[tuple[str, int, PartitionImage]]:
        """The partitions being reassigned, among ``wanted`` (all when None); unknown ones are left out, as Kafka."""
        image = self._image()
        if self._quorum.controller_id != self._node_id:
            raise ControllerError(ErrorCode.not_controller, "this node is not the active controller")
        if wanted is None:
            wanted = [(name, sorted(topic.partitions)) for name, topic in sorted(image.topics.items())]
        found = []
        for name, indexes in wanted:
            topic = image.topics.get(name)
            for index in indexes if topic is not None else ():
                partition = topic.partitions.get(index)  # type: ignore[union-attr]
                if partition is not None and partition.reassigning:
                    found.append((name, index, partition))
        return found

    # Features --------------------------------------------------------------

    async def bootstrap(self, levels: Mapping[str, int], records: Sequence[MetadataRecord] = ()) -> None:
        """Finalize the features of a new cluster: Kafka's bootstrap records, written once, before anything else.

        ``records`` are the other records of the bootstrap file (``josef storage format --add-scram``'s
        credentials), committed with the levels so the first admin exists as soon as the cluster does.
        """
        async with self._active():
            if not self._image().features:
                first: list[MetadataRecord] = [FeatureLevelRecord(name=n, feature_level=v)
                                               for n, v in sorted(levels.items()) if v > 0]
                first += records
                if levels.get(ELIGIBLE_LEADER_REPLICAS_VERSION, 0) >= 1:
                    # Kafka's ActivationRecordsGenerator: with ELR on from the start, min ISR is set cluster-wide.
                    first.append(self._cluster_min_isr_record())
                await self._commit(first)

    def _cluster_min_isr_record(self) -> ConfigRecord:
        """The cluster-level ``min.insync.replicas`` at this controller's static value (Kafka's
        getStaticallyConfiguredMinInsyncReplicas): every broker then counts the ISR against the same number."""
        key = self._config.definition[MIN_INSYNC_REPLICAS]
        value = self._config.static.get(MIN_INSYNC_REPLICAS, key.default)
        log.info("Generating cluster-level %s of %s", MIN_INSYNC_REPLICAS, value)
        return ConfigRecord(resource_type=BROKER_RESOURCE, resource_name="", name=MIN_INSYNC_REPLICAS,
                            value=key.render(value))

    def _elr_safety_records(self, image: MetadataImage) -> list[MetadataRecord]:
        """What makes turning eligible leader replicas on safe (Kafka's maybeGenerateElrSafetyRecords): a
        cluster-level ``min.insync.replicas`` when there is none, and no broker-level one left (every broker must
        count the ISR against the number the controller elects by)."""
        records: list[MetadataRecord] = []
        if MIN_INSYNC_REPLICAS not in image.config(BROKER_RESOURCE, ""):
            records.append(self._cluster_min_isr_record())
        for resource_type, name in sorted(image.configs):
            if resource_type == BROKER_RESOURCE and name and MIN_INSYNC_REPLICAS in image.config(resource_type, name):
                log.info("Removing broker-level %s for broker %s", MIN_INSYNC_REPLICAS, name)
                records.append(ConfigRecord(resource_type=BROKER_RESOURCE, resource_name=name,
                                            name=MIN_INSYNC_REPLICAS, value=None))
        return records

    async def update_features(self, updates: Sequence[tuple[str, int, UpgradeType]],
                              supported: Mapping[str, SupportedFeature], validate_only: bool) -> None:
        """Kafka's UpdateFeatures: every update is checked first, and all are applied or none.

        Raises :class:`ControllerError` (INVALID_UPDATE_VERSION, or
        INVALID_REQUEST for a feature named twice) with Kafka's message.
        """
        names = [name for name, _, _ in updates]
        if len(set(names)) != len(names):
            raise ControllerError(ErrorCode.invalid_request, "The request contains multiple updates for the same feature.")
        async with self._active():
            image = self._image()
            brokers = {b: info.features for b, info in image.brokers.items() if not info.fenced}
            proposed = {**image.features, **{name: max(level, 0) for name, level, _ in updates}}
            records: list[MetadataRecord] = []
            for name, level, upgrade_type in updates:
                try:
                    check_update(name, level, upgrade_type, image.features.get(name, 0), supported, brokers, proposed)
                except FeatureError as exc:
                    raise ControllerError(ErrorCode.invalid_update_version, str(exc)) from None
                records.append(FeatureLevelRecord(name=name, feature_level=max(level, 0)))
            if proposed.get(ELIGIBLE_LEADER_REPLICAS_VERSION, 0) >= 1 and any(
                    name == ELIGIBLE_LEADER_REPLICAS_VERSION for name, _, _ in updates):
                records = self._elr_safety_records(image) + records
            if not validate_only:
                await self._commit(records)

    # Producer ids ----------------------------------------------------------

    async def allocate_producer_ids(self, broker_id: int, broker_epoch: int = -1) -> ProducerIdBlock:
        """Kafka's AllocateProducerIds: the next block of producer ids, taken for good by a ProducerIdsRecord.

        Called in-process by the brokers of this node (the controller is
        co-located). The record is committed before the block is returned,
        so a restart never hands out an id twice; the unused rest of a
        block is lost with the broker that held it, as in Kafka. Broker
        epochs are recorded but not checked: josef has none yet.
        """
        async with self._active():
            first = self._image().next_producer_id
            if first > INT64_MAX - PRODUCER_ID_BLOCK_SIZE:
                raise ControllerError(ErrorCode.unknown_server_error, "the producer id space is exhausted")
            await self._commit([ProducerIdsRecord(broker_id=broker_id, broker_epoch=broker_epoch,
                                                  next_producer_id=first + PRODUCER_ID_BLOCK_SIZE)])
            return ProducerIdBlock(broker_id, first, PRODUCER_ID_BLOCK_SIZE)

    # Topics ----------------------------------------------------------------

    async def create_topic(
        self,
        name: str,
        num_partitions: int = -1,
        replication_factor: int = -1,
        assignments: Mapping[int, Sequence[int]] | None = None,
        configs: Mapping[str, str | None] | None = None,
        validate_only: bool = False,
        policy: CreateTopicPolicy | None = None,
    ) -> CreatedTopic:
        """Create (or with ``validate_only`` check) a topic; ``policy`` decides after every other check."""
        validate_topic_name(name)
        configs = {k: v for k, v in (configs or {}).items() if v is not None}
        try:
            self._config.definition.parse_topic_configs(configs)
        except ConfigError as exc:
            raise ControllerError(ErrorCode.invalid_config, str(exc)) from None
        self._check_tiered(name, None, configs)
        async with self._active():
            image = self._image()
            if name in image.topics:
                raise ControllerError(ErrorCode.topic_already_exists, f"topic {name!r} already exists")
            collision = name.replace(".", "_")
            for other in image.topics:
                if other.replace(".", "_") == collision:
                    raise ControllerError(ErrorCode.invalid_topic_exception,
                                          f"topic {name!r} collides with existing topic {other!r} ('.' and '_' collide in metric names)")
            live = [b for b, info in image.brokers.items() if not info.fenced]
            replicas = self._place(live, num_partitions, replication_factor, assignments)
            if policy is not None:
                manual = bool(assignments)
                _check_policy(policy.validate_create_topic, CreateTopicRequest(
                    name, None if manual else len(replicas), None if manual else len(replicas[0]),
                    dict(enumerate(replicas)) if manual else None, configs))
            topic_id = uuid_from_text(random_uuid())
            records: list[MetadataRecord] = [TopicRecord(name=name, topic_id=topic_id)]
            records += [_new_partition(image, topic_id, p, r) for p, r in enumerate(replicas)]
            records += [ConfigRecord(resource_type=TOPIC_RESOURCE, resource_name=name, name=k, value=v)
                        for k, v in sorted(configs.items())]
            if not validate_only:
                await self._commit(records)
                topic = self._image().topics[name]
            else:
                _, delta = image.apply(image.offset, records)
                topic = delta.created_topics[0]
            return CreatedTopic(topic, len(replicas[0]), configs)

    def _place(self, live: list[int], num_partitions: int, replication_factor: int,
               assignments: Mapping[int, Sequence[int]] | None) -> list[list[int]]:
        if assignments:
            if num_partitions != -1 or replication_factor != -1:
                raise ControllerError(ErrorCode.invalid_request,
                                      "give either replica assignments or partitions and replication factor, not both")
            if sorted(assignments) != list(range(len(assignments))):
                raise ControllerError(ErrorCode.invalid_replica_assignment, "assigned partitions must be 0..N-1")
            result = [list(assignments[p]) for p in range(len(assignments))]
            sizes = {len(r) for r in result}
            if len(sizes) != 1 or 0 in sizes or any(len(set(r)) != len(r) for r in result):
                raise ControllerError(ErrorCode.invalid_replica_assignment, "every partition needs the same number of distinct replicas")
            unknown = {b for r in result for b in r} - set(live)
            if unknown:  # as Kafka's ReplicationControlManager: an assignment error, not an unavailable broker
                raise ControllerError(ErrorCode.invalid_replica_assignment,
                                      f"the manual partition assignment includes brokers {sorted(unknown)}, "
                                      "which are not registered or are fenced")
            return result
        partitions = self._config["num.partitions"] if num_partitions == -1 else num_partitions
        factor = self._config["default.replication.factor"] if replication_factor == -1 else replication_factor
        if partitions <= 0:
            raise ControllerError(ErrorCode.invalid_partitions, f"number of partitions must be positive, got {partitions}")
        if factor <= 0:
            raise ControllerError(ErrorCode.invalid_replication_factor, f"replication factor must be positive, got {factor}")
        if factor > len(live):
            raise ControllerError(ErrorCode.invalid_replication_factor,
                                  f"replication factor {factor} is larger than the {len(live)} available brokers")
        return assign_replicas(live, partitions, factor)

    async def delete_topic(self, name: str | None = None, topic_id: str | None = None) -> TopicImage:
        if not self._config["delete.topic.enable"]:
            raise ControllerError(ErrorCode.topic_deletion_disabled, "delete.topic.enable is false")
        async with self._active():
            image = self._image()
            topic = image.topics.get(name) if name is not None else image.topic_by_id(topic_id or "")
            if topic is None:
                if name is None:
                    raise ControllerError(ErrorCode.unknown_topic_id, f"no topic with id {topic_id}")
                raise ControllerError(ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist")
            await self._commit([RemoveTopicRecord(topic_id=uuid_from_text(topic.topic_id))])
            return topic

    async def create_partitions(self, name: str, count: int, assignments: Sequence[Sequence[int]] | None,
                                validate_only: bool) -> None:
        async with self._active():
            image = self._image()
            topic = image.topics.get(name)
            if topic is None:
                raise ControllerError(ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist")
            current = len(topic.partitions)
            if count <= current:
                raise ControllerError(ErrorCode.invalid_partitions,
                                      f"topic {name!r} has {current} partitions; the new count must be larger, got {count}")
            factor = len(topic.partitions[0].replicas)
            live = [b for b, info in image.brokers.items() if not info.fenced]
            if assignments:
                if len(assignments) != count - current:
                    raise ControllerError(ErrorCode.invalid_replica_assignment,
                                          f"{count - current} new partitions need as many assignments, got {len(assignments)}")
                new = [list(a) for a in assignments]
                if any(len(a) != factor or len(set(a)) != factor or not set(a) <= set(live) for a in new):
                    raise ControllerError(ErrorCode.invalid_replica_assignment,
                                          f"each new partition needs {factor} distinct live brokers")
            else:
                if factor > len(live):
                    raise ControllerError(ErrorCode.invalid_replication_factor, "not enough live brokers")
                new = assign_replicas(live, count - current, factor, first_partition=current)
            topic_id = uuid_from_text(topic.topic_id)
            records = [_new_partition(image, topic_id, current + i, r) for i, r in enumerate(new)]
            if not validate_only:
                await self._commit(records)

    # Configs ---------------------------------------------------------------

    async def alter_configs(self, resource_type: int, resource_name: str,
                            ops: Sequence[tuple[str, int, str | None]], validate_only: bool,
                            incremental: bool = True, policy: AlterConfigPolicy | None = None) -> None:
        """Apply ``(name, op, value)`` changes; a non-incremental call replaces every dynamic value.

        ``policy`` decides after the new values were validated; it sees the
        keys ``ops`` name with the values they would have (None: deleted).
        """
        async with self._active():
            image = self._image()
            current = dict(image.config(resource_type, resource_name))
            if resource_type == TOPIC_RESOURCE:
                if resource_name not in image.topics:
                    raise ControllerError(ErrorCode.unknown_topic_or_partition, f"topic {resource_name!r} does not exist")
                lookup = self._config.definition.topic_key
            elif resource_type == BROKER_RESOURCE:
                if resource_name and (not resource_name.isdigit() or int(resource_name) not in image.brokers):
                    raise ControllerError(ErrorCode.invalid_request, f"no broker {resource_name!r}")
                lookup = self._broker_key
            elif resource_type == GROUP_RESOURCE:  # a group need not exist yet (Kafka's GroupConfigManager)
                if not resource_name:
                    raise ControllerError(ErrorCode.invalid_request, "a group config resource needs a group id")
                lookup = self._config.definition.group_key
            elif resource_type == CLIENT_METRICS_RESOURCE:
                if not resource_name:
                    raise ControllerError(ErrorCode.invalid_request, "Subscription name can't be empty")
                # Unknown keys (None here) are refused with the whole set below, as Kafka's ClientMetricsConfigs does.
                lookup = client_metrics.KEYS.get
            else:
                raise ControllerError(ErrorCode.invalid_request, f"resource type {resource_type} cannot be altered")
            wanted = dict(current) if incremental else {}
            for name, op, value in ops:
                try:
                    key = lookup(name)
                except ConfigError as exc:
                    raise ControllerError(ErrorCode.invalid_config, str(exc)) from None
                if op == SET:
                    wanted[name] = value
                elif op == DELETE:
                    wanted.pop(name, None)
                elif op in (APPEND, SUBTRACT):
                    if key is None or key.type.name != "LIST":
                        raise ControllerError(ErrorCode.invalid_config, f"{name} is not a list; APPEND and SUBTRACT need one")
                    items = (wanted.get(name) or key.render(self._default(resource_type, key)) or "").split(",")
                    items = [i for i in items if i]
                    for item in (value or "").split(","):
                        if op == APPEND and item not in items:
                            items.append(item)
                        elif op == SUBTRACT and item in items:
                            items.remove(item)
                    wanted[name] = ",".join(items)
                else:
                    raise ControllerError(ErrorCode.invalid_request, f"unknown config operation {op}")
                if name in wanted and key is not None:
                    try:
                        key.parse(wanted[name])
                    except ConfigError as exc:
                        raise ControllerError(ErrorCode.invalid_config, str(exc)) from None
            if resource_type == TOPIC_RESOURCE:
                self._check_tiered(resource_name, current, wanted)
            elif resource_type == CLIENT_METRICS_RESOURCE:
                try:
                    client_metrics.check(resource_name, wanted)
                except client_metrics.ClientMetricsError as exc:
                    raise ControllerError(exc.code, str(exc)) from None
            elr = self._elr(image) is not None
            if elr and resource_type == BROKER_RESOURCE:
                self._check_min_isr_change(resource_name, current, wanted, {name for name, _, _ in ops})
            if policy is not None:
                _check_policy(policy.validate_alter_config, AlterConfigRequest(
                    ConfigResource(resource_type, resource_name), {name: wanted.get(name) for name, _, _ in ops}))
            # A broker key set again to the same value is written too (Kafka's KAFKA-14136): brokers take it as
            # the signal to reload what it names (a key store file rewritten in place).
            named = {name for name, _, _ in ops} if resource_type == BROKER_RESOURCE else set()
            records: list[MetadataRecord] = [
                ConfigRecord(resource_type=resource_type, resource_name=resource_name, name=k, value=v)
                for k, v in sorted(wanted.items()) if current.get(k) != v or k in named]
            records += [ConfigRecord(resource_type=resource_type, resource_name=resource_name, name=k, value=None)
                        for k in sorted(current) if k not in wanted]
            if elr and any(isinstance(r, ConfigRecord) and r.name == MIN_INSYNC_REPLICAS for r in records):
                # The ELR was chosen under the old min ISR (Kafka's createClearElrRecordsAsNeeded).
                records.append(ClearElrRecord(topic_name=resource_name if resource_type == TOPIC_RESOURCE else ""))
            if not validate_only:
                await self._commit(records)
                if any(isinstance(r, ConfigRecord) and r.name == UNCLEAN_LEADER_ELECTION for r in records):
                    # Enabling it takes effect at once, not at the next periodic check (as Kafka's controller).
                    image = self._image()
                    await self._commit(partition_changes.unclean_elections(image, self._unclean_policy(image),
                                                                           self._elr(image)))

    def _check_tiered(self, topic: str, current: Mapping[str, str] | None, wanted: Mapping[str, str]) -> None:
        """Kafka's checks of a topic's tiered-storage keys (LogConfig.validateRemoteStorage...): remote storage needs
        the brokers' ``remote.log.storage.system.enable`` and ``cleanup.policy=delete``, local retention may not
        exceed total retention, and remote storage is turned off only with ``remote.log.delete.on.disable``."""
        def value(configs: Mapping[str, str], name: str) -> Any:
            key = self._config.definition.topic_key(name)
            return key.parse(configs[name]) if name in configs else self._config.topic_default(key)

        def tiered(configs: Mapping[str, str]) -> bool:
            explicit = value(configs, "remote.storage.enable") if "remote.storage.enable" in configs else None
            return remote_storage_enabled(topic, explicit, value({}, "remote.storage.enable"),
                                          value(configs, "cleanup.policy"))

        # (current is None for a new topic.) A topic tiered by the brokers' default stays tiered until it says
        # otherwise, so asking it for compaction is refused as if it had said remote.storage.enable=true.
        was = current is not None and tiered(current)
        wants = tiered(wanted) or (was and "remote.storage.enable" not in wanted)
        if was and not wants and not value(wanted, "remote.log.delete.on.disable"):
            raise ControllerError(ErrorCode.invalid_config, "It is invalid to disable remote storage without deleting "
                                  "remote data. If you want to keep the remote data and turn to read only, please set "
                                  "`remote.storage.enable=true,remote.log.copy.disable=true`. If you want to disable "
                                  "remote storage and delete all remote data, please set "
                                  "`remote.storage.enable=false,remote.log.delete.on.disable=true`.")
        if not wants:
            return
        system = "remote.log.storage.system.enable"
        if system not in self._config.definition or not self._config[system]:
            raise ControllerError(ErrorCode.invalid_config, "Tiered Storage functionality is disabled in the broker. "
                                  "Topic cannot be configured with remote log storage.")
        if "compact" in value(wanted, "cleanup.policy"):
            raise ControllerError(ErrorCode.invalid_config,
                                  "Remote log storage only supports topics with cleanup.policy=delete")
        for local, total in (("local.retention.ms", "retention.ms"), ("local.retention.bytes", "retention.bytes")):
            local_value, total_value = value(wanted, local), value(wanted, total)
            if local_value != -2 and total_value != -1 and (local_value == -1 or local_value > total_value):
                raise ControllerError(ErrorCode.invalid_config, f"Value must not be more than {total} property value: "
                                      f"{total_value} (the value of {local} is {local_value})")

    @staticmethod
    def _check_min_isr_change(resource_name: str, current: Mapping[str, str], wanted: Mapping[str, str],
                              named: set[str]) -> None:
        """With eligible leader replicas on, brokers count the ISR against one cluster-wide ``min.insync.replicas``
        (the controller elects by it): a broker's own may not be set, and the cluster's may not be removed
        (Kafka's isDisallowedBrokerMinIsrTransition and isDisallowedClusterMinIsrTransition)."""
        removed = MIN_INSYNC_REPLICAS in current and MIN_INSYNC_REPLICAS not in wanted
        if resource_name and (MIN_INSYNC_REPLICAS in named or removed):
            raise ControllerError(ErrorCode.invalid_config,
                                  f"Broker-level {MIN_INSYNC_REPLICAS} cannot be altered while ELR is enabled.")
        if not resource_name and (removed or (MIN_INSYNC_REPLICAS in named and MIN_INSYNC_REPLICAS not in wanted)):
            raise ControllerError(ErrorCode.invalid_config,
                                  f"Cluster-level {MIN_INSYNC_REPLICAS} cannot be removed while ELR is enabled.")

    def _broker_key(self, name: str):  # type: ignore[no-untyped-def]
        if name not in self._config.definition:
            raise ConfigError(f"unknown broker configuration {name}")
        key = self._config.definition[name]
        if not key.dynamic:
            raise ConfigError(f"broker configuration {name} cannot be updated dynamically")
        return key

    def _default(self, resource_type: int, key):  # type: ignore[no-untyped-def]
        if resource_type == TOPIC_RESOURCE:
            return self._config.topic_default(key)
        if resource_type == GROUP_RESOURCE:
            return self._config.group_default(key)
        if resource_type == CLIENT_METRICS_RESOURCE:
            return key.default
        return self._config[key.name]

