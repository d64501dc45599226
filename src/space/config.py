"""Settings, read once from the environment into one msgspec Struct."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from space.notifications.smtp import check_mail_settings

PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
SecretKeys = Annotated[str, msgspec.Meta(pattern=r"^[^,]{32,}(,[^,]{32,})*$")]
"""One or more comma-separated keys of at least 32 characters each (HMAC-SHA256 wants 32 bytes)."""
# Letters, digits and . _ - only: the name becomes part of Redis keys and of a PostgreSQL NOTIFY channel
# (`saq:<name>`, an identifier of at most 63 bytes: longer names would be cut short and could meet).
# At most 50: the outbound lane's queue is `<name>-outbound` (space.queue), and that name must fit too.
QueueName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9._-]{1,50}$")]
# `postgres`, or `s3://` and a valid bucket name (3-63 lowercase letters, digits, dots, hyphens), then an optional
# `/prefix` of path segments.
ResultStoreUrl = Annotated[
    str, msgspec.Meta(pattern=r"^(postgres|s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[A-Za-z0-9!_.*'()-]+)*/?)$")
]


class SettingsError(Exception):
    """A setting is missing, unknown or malformed; the message names the variable."""


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """Everything Space reads from the environment. Units are in the field names or comments."""

    database_url: str | None = None
    """Superuser/owner URL used for migrations; None means the embedded server."""
    app_database_url: str | None = None
    """URL of the non-superuser application role; derived from database_url when unset."""
    data_dir: str = "./.space"
    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8000
    queue_url: str | None = None
    """SAQ broker; None means the database, a redis:// URL selects Redis."""
    export_row_limit: PositiveInt = 1_000_000
    export_byte_limit: PositiveInt = 536_870_912
    export_ttl_seconds: PositiveFloat = 86_400
    export_lease_seconds: PositiveFloat = 60
    export_rate_limit: PositiveInt = 3
    export_timeout_seconds: PositiveFloat = 60
    export_batch_rows: PositiveInt = 10_000
    """Rows read per keyset batch by the export worker."""
    export_batch_bytes: PositiveInt = 2 * 1024 * 1024
    """Bytes of output per keyset batch (in bytes): a batch of wide rows ends here, whatever its row count."""
    export_chunk_bytes: PositiveInt = 4 * 1024 * 1024
    """Size of one stored result chunk, in bytes (the S3 store raises it to a part, at least 8 MiB)."""
    export_retries: PositiveInt = 3
    """Attempts (SAQ counts attempts: 1 means no retry)."""
    deletion_grace_seconds: NonNegativeInt = 604_800
    worker_concurrency: PositiveInt = 2
    debug: bool = False
    """The CLI shows the traceback of an expected failure instead of its one line."""
    export_user_rate_limit: PositiveInt = 10
    """Active-or-recent exports per user across all their orgs (besides the per-org export_rate_limit)."""
    orgs_per_user: PositiveInt = 20
    """Organizations (not deleted) one user may own."""
    org_result_quota_bytes: PositiveInt = 2_147_483_648
    """Bytes of completed, downloadable results one org may keep."""
    export_org_concurrency: PositiveInt = 1
    """Exports of one org that run at once, over all workers."""
    api_statement_timeout_ms: PositiveInt = 5_000
    """statement_timeout of the API's database connections, in milliseconds."""
    api_pool_timeout_seconds: PositiveFloat = 30.0
    """Seconds an API request waits for a free pooled database connection; then 503 unavailable."""
    download_concurrency: PositiveInt = 64
    """Downloads one API process streams at once; beyond it, 503 busy."""
    secret_key: SecretKeys | None = None
    """Download-link signing keys, comma-separated, each >= 32 characters: the first signs, all verify.
    None: the key `space migrate` keeps in the database."""
    download_link_ttl_seconds: PositiveInt = 300
    """How long a download link works after it is minted, in seconds."""
    webhook_allow_private: bool = False
    """Webhook URLs may point at loopback, private and link-local addresses (tests and local development only)."""
    webhook_retry_seconds: Annotated[float, msgspec.Meta(ge=0)] = 10
    """Delay before a webhook's second attempt, in seconds; each later attempt waits 4 times longer."""
    delivery_retry_seconds: Annotated[float, msgspec.Meta(ge=0)] = 30
    """Delay before a destination delivery's second attempt, in seconds; each later attempt waits 4 times longer."""
    queue_name: QueueName | None = None
    """SAQ queue name (Redis key prefix, PostgreSQL queue column); None: `space-<installation id>`."""
    result_store: ResultStoreUrl = "postgres"
    """Where results live: `postgres` (chunks in the database) or `s3://bucket/prefix` (SPEC §15)."""
    result_redirect: bool = True
    """With S3: a download answers 303 to a presigned GET (valid 60 s); 0 streams it through the API."""
    log_format: Literal["text", "json"] = "text"
    """Log lines: human-readable text, or one JSON object per line."""
    worker_metrics_port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 9100
    """TCP port of `space worker`'s Prometheus endpoint (/metrics); 0 serves none."""
    webhooks_per_org: PositiveInt = 10
    """Webhook endpoints one org may register; beyond it, 409 webhook_limit_reached."""
    schedules_per_org: PositiveInt = 20
    """Schedules one org may have (SPEC §21); beyond it, 409 schedule_limit_reached."""
    link_rate_limit: PositiveInt = 60
    """Download links one user may mint per minute (over all orgs); beyond it, 429 rate_limited."""
    archive_row_limit: PositiveInt = 20_000_000
    """Rows one member file of a complete archive may hold, counted per file (the archive's own export_row_limit)."""
    archive_byte_limit: PositiveInt = 17_179_869_184
    """Bytes a complete archive's whole ZIP may take, in bytes (the archive's own export_byte_limit)."""
    archive_timeout_seconds: PositiveFloat = 1800
    """Bound on a complete archive's read transaction, in seconds (the archive's own export_timeout_seconds)."""
    import_byte_limit: PositiveInt = 1_073_741_824
    """Bytes an uploaded archive (POST /imports) may have; beyond it, 413 too_large (SPEC §23)."""
    import_dir: str = ""
    """Folder where a process keeps its local copy of an uploaded archive (empty: the system's temporary folder):
    the API while the body arrives, a worker while it restores it. The upload waits in PostgreSQL between them."""
    trusted_proxies: str = ""
    """Comma-separated addresses or CIDRs of proxies whose X-Forwarded-For names the client (audit `ip`)."""
    outbound_concurrency: PositiveInt = 8
    """Outbound attempts (webhook deliveries, and every other `space.outbox` channel) one worker process makes at
    once, in its outbound lane: slots of their own, beside the worker_concurrency export slots."""
    outbound_org_concurrency: PositiveInt = 2
    """Outbound attempts of one org in flight at once, over every channel and every worker."""
    smtp_url: str | None = None
    """Where email is sent (SPEC §19): smtp://[user:pass@]host[:port] (?starttls=1), or smtps:// (implicit TLS).
    None: nothing is emailed, in-app notifications only. A secret (its password): never logged or repeated."""
    mail_from: str = "Space <space@localhost>"
    """The From of every email: an address, with a display name or without."""
    public_url: str | None = None
    """Where people open the page, the base of every link an email holds; None: http://SPACE_HOST:SPACE_PORT."""
    mail_retry_seconds: Annotated[float, msgspec.Meta(ge=0)] = 60
    """Delay before an email's second attempt, in seconds; each later attempt waits twice as long (7 retries)."""

    def __post_init__(self) -> None:
        # Fails start-up (wrapped by msgspec as a validation error naming the field) on a malformed entry.
        parse_networks(self.trusted_proxies)
        check_mail_settings(self.smtp_url, self.mail_from, self.public_url)

    @property
    def public_base(self) -> str:
        """SPACE_PUBLIC_URL without a trailing slash, or http://SPACE_HOST:SPACE_PORT."""
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")


# Environment variable -> Settings field. Only these are read; everything else in the environment is ignored.
ENV_VARS: dict[str, str] = {
    "DATABASE_URL": "database_url",
    "SPACE_APP_DATABASE_URL": "app_database_url",
    "SPACE_DATA_DIR": "data_dir",
    "SPACE_HOST": "host",
    "SPACE_PORT": "port",
    "SPACE_QUEUE_URL": "queue_url",
    "SPACE_EXPORT_ROW_LIMIT": "export_row_limit",
    "SPACE_EXPORT_BYTE_LIMIT": "export_byte_limit",
    "SPACE_EXPORT_TTL_SECONDS": "export_ttl_seconds",
    "SPACE_EXPORT_LEASE_SECONDS": "export_lease_seconds",
    "SPACE_EXPORT_RATE_LIMIT": "export_rate_limit",
    "SPACE_EXPORT_TIMEOUT_SECONDS": "export_timeout_seconds",
    "SPACE_EXPORT_BATCH_ROWS": "export_batch_rows",
    "SPACE_EXPORT_BATCH_BYTES": "export_batch_bytes",
    "SPACE_EXPORT_CHUNK_BYTES": "export_chunk_bytes",
    "SPACE_EXPORT_RETRIES": "export_retries",
    "SPACE_DELETION_GRACE_SECONDS": "deletion_grace_seconds",
    "SPACE_WORKER_CONCURRENCY": "worker_concurrency",
    "SPACE_DEBUG": "debug",
    "SPACE_EXPORT_USER_RATE_LIMIT": "export_user_rate_limit",
    "SPACE_ORGS_PER_USER": "orgs_per_user",
    "SPACE_ORG_RESULT_QUOTA_BYTES": "org_result_quota_bytes",
    "SPACE_EXPORT_ORG_CONCURRENCY": "export_org_concurrency",
    "SPACE_API_STATEMENT_TIMEOUT_MS": "api_statement_timeout_ms",
    "SPACE_API_POOL_TIMEOUT_SECONDS": "api_pool_timeout_seconds",
    "SPACE_DOWNLOAD_CONCURRENCY": "download_concurrency",
    "SPACE_SECRET_KEY": "secret_key",
    "SPACE_DOWNLOAD_LINK_TTL_SECONDS": "download_link_ttl_seconds",
    "SPACE_TRUSTED_PROXIES": "trusted_proxies",
    "SPACE_WEBHOOK_ALLOW_PRIVATE": "webhook_allow_private",
    "SPACE_WEBHOOK_RETRY_SECONDS": "webhook_retry_seconds",
    "SPACE_DELIVERY_RETRY_SECONDS": "delivery_retry_seconds",
    "SPACE_WEBHOOKS_PER_ORG": "webhooks_per_org",
    "SPACE_SCHEDULES_PER_ORG": "schedules_per_org",
    "SPACE_LINK_RATE_LIMIT": "link_rate_limit",
    "SPACE_ARCHIVE_ROW_LIMIT": "archive_row_limit",
    "SPACE_ARCHIVE_BYTE_LIMIT": "archive_byte_limit",
    "SPACE_ARCHIVE_TIMEOUT_SECONDS": "archive_timeout_seconds",
    "SPACE_IMPORT_BYTE_LIMIT": "import_byte_limit",
    "SPACE_IMPORT_DIR": "import_dir",
    "SPACE_QUEUE_NAME": "queue_name",
    "SPACE_RESULT_STORE": "result_store",
    "SPACE_RESULT_REDIRECT": "result_redirect",
    "SPACE_LOG_FORMAT": "log_format",
    "SPACE_WORKER_METRICS_PORT": "worker_metrics_port",
    "SPACE_OUTBOUND_CONCURRENCY": "outbound_concurrency",
    "SPACE_OUTBOUND_ORG_CONCURRENCY": "outbound_org_concurrency",
    "SPACE_SMTP_URL": "smtp_url",
    "SPACE_MAIL_FROM": "mail_from",
    "SPACE_PUBLIC_URL": "public_url",
    "SPACE_MAIL_RETRY_SECONDS": "mail_retry_seconds",
}
_FIELD_TO_ENV = {field: env for env, field in ENV_VARS.items()}
_PREFIX = "SPACE_"
_SECRET_FIELDS = frozenset({"secret_key", "smtp_url"})
"""Settings whose value an error message never repeats."""


def load_settings(environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Read Settings from the environment; an unknown SPACE_* variable or a malformed value raises."""
    env = os.environ if environ is None else environ
    unknown = sorted(k for k in env if k.startswith(_PREFIX) and k not in ENV_VARS and not _ignored(k))
    if unknown:
        raise SettingsError(f"unknown setting {unknown[0]} (known: {', '.join(sorted(ENV_VARS))})")
    raw: dict[str, Any] = {field: env[name] for name, field in ENV_VARS.items() if env.get(name, "") != ""}
    raw.update(overrides)
    for field, value in raw.items():
        try:
            msgspec.convert({field: value}, Settings, strict=False)
        except msgspec.ValidationError as exc:
            name = _FIELD_TO_ENV.get(field, field)
            shown = "(hidden)" if field in _SECRET_FIELDS else repr(value)
            raise SettingsError(f"invalid value for {name}: {shown} ({exc})") from None
    return msgspec.convert(raw, Settings, strict=False)


def _ignored(name: str) -> bool:
    # Test-suite variables share the prefix but are not settings of the service.
    return name.startswith("SPACE_TEST_")


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(text: str) -> tuple[Network, ...]:
    """`SPACE_TRUSTED_PROXIES`: comma-separated addresses or CIDRs; ValueError names the entry that is neither."""
    networks = []
    for part in text.split(","):
        entry = part.strip()
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(f"{entry!r} is not an IP address or network") from None
    return tuple(networks)


def data_path(settings: Settings) -> Path:
    """The embedded server's data folder, absolute."""
    return Path(settings.data_dir).expanduser().resolve()
