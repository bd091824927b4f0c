"""The one settings object.

Every knob of omniqueue lives here, read from ``OMNIQ_``-prefixed environment variables
(nested groups use ``__``: ``OMNIQ_S3__BUCKET``). Build it with :func:`get_settings` and
inject it; nothing reads the environment at import time. (The realtime group,
``OMNIQ_REALTIME__*``, is in :mod:`storage.realtime_settings`.)
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from models.registry import ServedModel, parse_registry, served_models
from storage.paths import default_data_dir, default_database_url
from storage.realtime_settings import RealtimeSettings as RealtimeSettings

PLACEHOLDER_SECRETS = {"", "changeme", "change-me", "minioadmin", "omniqueue", "secret"}


class DatabaseSettings(BaseModel):
    # The SQLite file in the per-user data directory (storage/paths.py), absolute.
    url: str = Field(default_factory=default_database_url)
    echo: bool = False
    pool_size: int = 10
    # A pooled server connection idle longer than this is pinged before it is used, and
    # replaced if the server dropped it (a restart, an idle timeout); one used more
    # recently is not (a ping per checkout was a round trip per status read) (seconds).
    ping_idle_s: float = Field(default=5.0, ge=0)
    # PostgreSQL: a connection attempt fails after this (seconds).
    connect_timeout_s: int = Field(default=5, ge=1)
    # PostgreSQL: a statement whose bytes the server has not acknowledged for this long
    # fails, and the connection is dropped (libpq's ``tcp_user_timeout``); idle connections
    # are probed by TCP keepalives as often. A link that went down mid-query then costs
    # the caller this long, not the kernel's retransmission limit (about 15 minutes). It
    # does not bound a slow query, only a dead link (seconds).
    link_timeout_s: float = Field(default=10.0, gt=0)


class RedisSettings(BaseModel):
    url: str = "redis://127.0.0.1:6379/0"
    # Bound on one Redis command of a request (create's enqueue and first event, cancel,
    # delete, /ready, an event-stream read beyond its 15 s block): a stalled Redis gives
    # 503 broker_error / an error event instead of a hang (seconds).
    command_timeout_s: float = Field(default=1.5, gt=0)
    connect_timeout_s: float = Field(default=3.0, gt=0)
    # Bound on one Redis command of a worker (its events, session streams, blocking reads
    # of at most a second, and its broker connection): a dead link fails the command
    # rather than hanging the job, and Celery reconnects to the broker (seconds).
    worker_timeout_s: float = Field(default=5.0, gt=1)


def _split_list(value: Any) -> Any:
    """Accept ``a,b`` as well as a JSON list for list settings."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            import json

            return json.loads(text)
        return [item.strip() for item in text.split(",") if item.strip()]
    return value


# A list setting: a JSON list or ``a,b`` (NoDecode: pydantic-settings hands the variable's
# text to the validator rather than parse it as JSON first).
StrList = Annotated[list[str], NoDecode, BeforeValidator(_split_list)]


def _empty_is_none(value: Any) -> Any:
    return value or None


# An optional setting that an empty variable leaves unset.
EmptyIsNone = BeforeValidator(_empty_is_none)


class S3Settings(BaseModel):
    # Empty means AWS S3 itself (boto3's default endpoint for the region).
    endpoint_url: Annotated[str | None, EmptyIsNone] = None
    # Endpoint clients use to follow presigned URLs, when it differs from the one the
    # servers reach (compose: servers use http://minio:9000, browsers http://localhost:9000).
    public_endpoint_url: Annotated[str | None, EmptyIsNone] = None
    bucket: str = "omniqueue"
    region: str = "us-east-1"
    access_key_id: str | None = None
    secret_access_key: str | None = None
    # Presigned GET URLs live this long (seconds).
    presign_ttl_s: int = 3600
    # Serve /content as a 302 to a presigned URL instead of streaming it through the API.
    redirect_content: bool = False
    # Artifacts at or above this size are uploaded in parts (S3 minimum part is 5 MiB).
    multipart_threshold_bytes: int = 8 * 1024 * 1024
    part_size_bytes: int = 8 * 1024 * 1024
    # Path-style addressing works with SeaweedFS, MinIO and AWS alike.
    addressing_style: Literal["path", "virtual", "auto"] = "path"
    # botocore timeouts (seconds) and attempts per call (standard retry mode).
    connect_timeout_s: float = Field(default=3.0, gt=0)
    read_timeout_s: float = Field(default=10.0, gt=0)
    max_attempts: int = Field(default=3, ge=1)
    # Threads of the API's own S3 pool: content streaming, uploads of inputs and deletes
    # run there, never on the pool that serves database reads.
    api_threads: int = Field(default=16, ge=1)


class LimitSettings(BaseModel):
    max_prompt_chars: int = 4000
    max_width: int = 1920
    max_height: int = 1920
    max_frames: int = 481
    max_seconds: float = 20.0
    max_steps: int = 200
    max_upload_bytes: int = 20 * 1024 * 1024
    max_reference_pixels: int = 4096 * 4096
    max_reference_seconds: float = 30.0
    # Largest request timeout a client may ask for, and the default (seconds).
    max_job_timeout_s: int = 3600
    default_job_timeout_s: int = 1800
    # The largest ``ttl`` (queue wait) a create may ask for (seconds).
    max_ttl_s: int = Field(default=7 * 24 * 3600, ge=1)


class QuotaSettings(BaseModel):
    """Server-wide per-key defaults (``api/quotas.py``); a key's own value, set with
    ``omniqueue keys create/update``, overrides each. 0 means unlimited."""

    # Job create requests per key per minute (a moving window, counted in Redis).
    creates_per_minute: int = Field(default=0, ge=0)
    # Jobs of a key that are queued or running at once.
    max_active_jobs: int = Field(default=0, ge=0)
    # Realtime sessions (voice and video) of a key connected at once.
    max_sessions: int = Field(default=0, ge=0)
    # ``Retry-After`` of a create refused for ``max_active_jobs`` (seconds): when one of
    # the key's jobs ends cannot be known; a job usually frees within this.
    active_retry_after_s: int = Field(default=10, ge=1)
    # Workers claim the fair next queued job of the message's model (the key with the
    # fewest running, then the one started longest ago, FIFO within a key) instead of
    # the message's own job; off: strictly the message's job (FIFO by message).
    fair_share: bool = True


class QueueSettings(BaseModel):
    """Admission above saturation, per model queue (``api/queue_admission.py``,
    docs/limits.md "Above saturation"). A model's registry entry may override the first
    two (``max_queue_depth``, ``ttl_s``)."""

    # Queued jobs of one model beyond which a create is refused: 429 ``queue_full`` with
    # ``Retry-After`` from the measured drain rate; 0: unbounded.
    max_depth: int = Field(default=0, ge=0)
    # A job's ``ttl`` when its create gives none: seconds from creation (queue time
    # included) after which a job that has not started ends ``ttl_expired``; 0: none.
    default_ttl_s: int = Field(default=0, ge=0)
    # How many of a model's most recent completed jobs its measured run time averages
    # (``estimated_start_at``, ``Retry-After``).
    eta_sample: int = Field(default=50, ge=1)
    # An API process re-reads a model's queue figures at most this often (seconds).
    eta_refresh_s: float = Field(default=2.0, gt=0)
    # ``Retry-After`` of a ``queue_full`` while nothing has been measured yet (seconds).
    retry_after_s: int = Field(default=10, ge=1)


class InputSettings(BaseModel):
    # Remote http(s) URLs given as input references (``input_reference``,
    # ``image_reference``): ``off`` refuses them, ``public`` fetches only hosts whose every
    # address is public (no loopback, private, link-local, metadata ...), ``any`` fetches
    # any host, loopback and the private network included: opt in only when every caller
    # is trusted. ``data:`` URLs work in every mode.
    url_fetch: Literal["off", "public", "any"] = "public"
    # One fetch, DNS and redirects included, gives up after this many seconds.
    url_fetch_timeout_s: float = Field(default=10.0, gt=0)
    url_fetch_max_redirects: int = Field(default=3, ge=0, le=10)


class LoraSettings(BaseModel):
    """Per-request LoRA adapters (docs/adapters.md, "LoRA")."""

    # Where adapters may come from (comma-separated): directories, and ``s3://bucket/prefix``
    # roots. A request's ``lora.local_path`` must resolve (symlinks and ``..`` followed)
    # inside one of them; empty: no adapter is accepted. Every ``*.safetensors`` file and
    # adapter directory directly under a directory root is also in the catalog, named by
    # its stem (``GET /v1/models``, ``omniqueue loras``), so ``lora.name`` alone finds it.
    roots: StrList = Field(default_factory=list)
    # A worker's cache of loaded adapters (already converted, on its device), per model:
    # at most this many, and this many bytes of adapter tensors.
    cache_adapters: int = Field(default=8, ge=1)
    cache_bytes: int = Field(default=2 * 1024**3, ge=1)
    # The rank of the one adapter slot a model's transformer gets (every adapter is
    # hot-swapped into it, padded to this rank); a higher-rank adapter fails the job
    # with ``invalid_lora``. The slot costs ``max_rank * (in + out)`` parameters per
    # linear layer of the transformer, whether a job uses LoRA or not.
    max_rank: int = Field(default=32, ge=1, le=1024)
    # ``lora.scale`` must lie within [-max_scale, max_scale].
    max_scale: float = Field(default=4.0, gt=0)


class WorkerSettings(BaseModel):
    # Models this worker serves (comma-separated); empty means every served model.
    models: StrList = Field(default_factory=list)
    device: str = "cpu"
    # A worker group: one job across these devices, one process per rank (``cuda:0,cuda:1``;
    # ``cpu,cpu`` runs a gloo group on CPUs). Empty: a single-device worker on ``device``.
    devices: StrList = Field(default_factory=list)
    # A worker group's collectives give up after this long: a rank that hangs fails the
    # group (restarted, its job taken over) instead of holding the others forever.
    collective_timeout_s: float = Field(default=300.0, gt=0)
    heartbeat_s: float = 5.0
    # A job whose owner has not heartbeated for this long is taken over.
    heartbeat_timeout_s: float = 30.0
    max_attempts: int = 3
    # A worker that could load none of its models exits; its records of why (the API's
    # ``model_unavailable``: storage/worker_presence.py) outlive it this long (seconds).
    # A live worker's records last as long as its presence lease.
    load_failure_ttl_s: float = Field(default=86400.0, gt=0)
    # Minimum interval between two progress writes of one job (seconds).
    progress_interval_s: float = 0.25
    tmp_dir: str | None = None
    # How often a worker runs the reconciler (seconds; 0 turns it off on this worker).
    reconcile_interval_s: float = 10.0
    # Multipart uploads older than this are aborted by the reconciler (seconds).
    stale_upload_s: float = 3600.0
    # A job queued this long while its model's broker queue holds no message at all is
    # put on the broker again by the reconciler (its message was lost: a broker restarted
    # without its data, a message lost in transit); 0: never.
    lost_message_after_s: float = Field(default=30.0, ge=0)
    # SIGTERM/Ctrl-C: a running job goes back to the queue at its next stop point; with a
    # drain timeout, only if it is still running that many seconds later
    # (workers/jobs/shutdown.py).
    drain_timeout_s: float = Field(default=0.0, ge=0)
    # Publish a preview JPEG every N denoise steps (0: off; previews cost a decode).
    preview_every: int = 0
    preview_max_side: int = 256
    # Log each video job's raw frames' SHA-256 (``job <id>: frames sha256 …``): the same
    # request gives the same frames on any worker, which x264's output cannot show. Off by
    # default: hashing is ~25 ms of a 832x480x81 clip's decode stage.
    log_frame_digests: bool = False
    # Tests only: a JSON file of fault-injection points (see workers/common/failpoints.py).
    failpoints_file: str | None = None
    # Where this worker says how its start went (``models/worker_status.py``): once it
    # consumes, the models it serves and those it could not load; or that it loaded none.
    # ``omniqueue up`` sets it for each worker it runs, and waits on it. None: not said.
    status_file: Path | None = None
    # Cap this worker's CUDA memory at this fraction of each of its devices'
    # (``torch.cuda.set_per_process_memory_fraction``, once at start, before the models
    # load; each rank of a group on its own device). A job that needs more fails ``oom``
    # and the worker goes on with the next. None: no cap; ignored on CPU.
    memory_fraction: float | None = None
    # Benchmarks only: load registry entries with ``weights = "random"`` (seeded random
    # weights built from default configs). Off, such an entry refuses to load.
    random_weights: bool = False
    # How many jobs of a model whose steps batch (its adapter's ``SupportsStepBatch``:
    # LongCat) a job worker runs at once, their denoise steps one batched model call
    # (workers/jobs/batcher.py; Celery's thread pool of this size). 1: one job at a time.
    batch_size: int = Field(default=1, ge=1, le=64)
    # How long a batch waits for its other jobs' steps before it runs without them (ms).
    batch_wait_ms: float = Field(default=20.0, ge=0)
    # How many cancel points of a text encoder, VAE or vocoder (the checkpoints of prepare
    # and decode) the host may queue ahead of the device on CUDA
    # (workers/pipelines/run_ahead.py): fewer leaves less queued behind a stop, more costs
    # the decode fewer host waits. 0: not paced (the host queues freely; a stop still lands
    # at the next cancel point it reaches). The denoiser's block gates keep their own.
    checkpoint_lookahead: int = Field(default=3, ge=0, le=1000)

    @field_validator("memory_fraction", mode="before")
    @classmethod
    def _check_memory_fraction(cls, value: Any) -> Any:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None  # an empty variable: no cap
        try:
            fraction = float(value)
        except (TypeError, ValueError):
            raise ValueError(
                f"OMNIQ_WORKER__MEMORY_FRACTION must be a number in (0, 1], not {value!r}"
            ) from None
        if not 0 < fraction <= 1:  # NaN fails this too
            raise ValueError(
                f"OMNIQ_WORKER__MEMORY_FRACTION must be in (0, 1] (a fraction of the "
                f"device's memory), not {value!r}"
            )
        return fraction

    @property
    def group_size(self) -> int:
        """Devices one job of this worker runs on (1 unless it is a worker group)."""
        return max(1, len(self.devices))


class HttpSettings(BaseModel):
    # A client must send a request's headers within this many seconds of starting it
    # (or of opening the connection), and its whole body within ``body_timeout_s`` of
    # the headers; otherwise the API answers 408 and closes the connection.
    header_timeout_s: float = Field(default=10.0, gt=0)
    body_timeout_s: float = Field(default=120.0, gt=0)
    # /ready answers within this many seconds, naming the services that did not answer.
    ready_timeout_s: float = Field(default=1.5, gt=0)
    # Let several ``omniqueue api`` processes listen on one port (SO_REUSEPORT: the kernel
    # spreads connections over them); ``omniqueue up --api-processes N`` sets it.
    reuse_port: bool = False
    # One log line per request (uvicorn's access log).
    access_log: bool = True
    # FastAPI's native OpenTelemetry (spans, metrics and logs per request, sent to the
    # global OpenTelemetry providers an operator configures). Off by default: with no
    # provider configured it only looked for one on every request, ~7% of a status read.
    opentelemetry: bool = False
    # Threads an API process runs blocking calls on (database reads, broker publishes).
    # anyio's default is 40; fewer fight the event loop less for the GIL under load.
    threads: int = Field(default=8, ge=1, le=1000)
    # WebSocket permessage-deflate (RFC 7692), when a client offers it. Off by default:
    # realtime traffic is mostly base64 PCM and video, which deflate barely shrinks, and
    # compressing every frame cost the API and the client ~5% of a voice session's CPU.
    ws_compression: bool = False


class MetricsSettings(BaseModel):
    # Prometheus metrics (docs/metrics.md): ``GET /metrics`` on the API (no API key: keep
    # it off the public network) and each worker's own port. Off: neither is served.
    enabled: bool = True
    # The port a worker (or the webhook sender) serves ``/metrics`` on (its own HTTP
    # server; a worker group's rank 0 serves the group's); 0: none. ``omniqueue up`` gives
    # its workers and sender free ports from this one up (9400 when it is 0), printed.
    worker_port: int = Field(default=0, ge=0, le=65535)
    # The address that metrics server binds.
    worker_host: str = "0.0.0.0"
    # API processes that share one port (``omniqueue up --api-processes N``, or several
    # ``omniqueue api`` with ``OMNIQ_HTTP__REUSE_PORT``) keep their metrics in files in
    # this directory (prometheus-client's multiprocess mode), so a scrape answered by any
    # of them reports them all. Empty: each process counts in memory (one process per
    # port). The directory must be emptied before the first of them starts.
    multiproc_dir: Annotated[Path | None, EmptyIsNone] = None
    # Queue depth and oldest-queued age are one SQL aggregate per scrape, reused for this
    # long, so many scrapers cost one query (seconds).
    queue_cache_s: float = Field(default=1.0, ge=0)


class WebhookSettings(BaseModel):
    # Destinations whose host resolves to a loopback, private, link-local … address are
    # refused (at registration and again at every delivery) unless this is true, as for
    # URL inputs (storage/url_guard.py). ``omniqueue up`` on loopback turns it on.
    allow_private: bool = False
    # One delivery attempt (DNS, connect, the receiver's answer) gives up after this long.
    timeout_s: float = Field(default=10.0, gt=0)
    # An event is retried (5xx, 408, 429, timeouts, connection errors) until it is this old,
    # then marked failed (seconds).
    max_age_s: float = Field(default=24 * 3600.0, gt=0)
    # Retry n waits ``min(backoff_cap_s, backoff_base_s * 2**(n-1))``, the second half of
    # it drawn at random (jitter), so receivers coming back are not hit all at once.
    backoff_base_s: float = Field(default=5.0, gt=0)
    backoff_cap_s: float = Field(default=900.0, gt=0)
    # The sender looks for due deliveries this often when it found none (seconds).
    poll_interval_s: float = Field(default=0.5, gt=0)
    # Deliveries one sender claims at once and has in flight at most.
    batch_size: int = Field(default=32, ge=1, le=1000)
    # After a rotation the previous secret still signs (a second signature) this long, so
    # receivers can switch without dropping events (seconds; 0: the new one only).
    rotation_grace_s: float = Field(default=24 * 3600.0, ge=0)
    # How often the sender looks for ended jobs whose events were never queued (a worker
    # that died between the job's last UPDATE and the insert of its deliveries), and how
    # far back (seconds).
    sweep_interval_s: float = Field(default=60.0, gt=0)
    sweep_window_s: float = Field(default=3600.0, gt=0)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="OMNIQ_", env_nested_delimiter="__", extra="ignore"
    )

    # ``embedded`` is what ``omniqueue up`` runs: local services, placeholder secrets allowed.
    mode: Literal["embedded", "production"] = "production"
    data_dir: Path = Field(default_factory=default_data_dir)  # OMNIQ_DATA_DIR
    host: str = "127.0.0.1"
    port: int = 8000

    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    redis: RedisSettings = Field(default_factory=RedisSettings)
    s3: S3Settings = Field(default_factory=S3Settings)
    # ``OMNIQ_AUTH=off`` is allowed only while the API listens on loopback.
    auth: Literal["off", "required"] = "required"
    limits: LimitSettings = Field(default_factory=LimitSettings)
    quotas: QuotaSettings = Field(default_factory=QuotaSettings)
    queue: QueueSettings = Field(default_factory=QueueSettings)
    inputs: InputSettings = Field(default_factory=InputSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    realtime: RealtimeSettings = Field(default_factory=RealtimeSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    webhooks: WebhookSettings = Field(default_factory=WebhookSettings)
    lora: LoraSettings = Field(default_factory=LoraSettings)

    # Served models (comma-separated); the first is the default for requests naming none.
    # Unset: every model of the registry file, or ``reference/video`` without one.
    models: StrList | None = None
    # TOML file mapping model names to adapters, weights paths, dtype and device.
    model_registry: Path | None = None
    # Artifacts expire this long after the job completes (seconds).
    artifact_ttl_s: int = 7 * 24 * 3600
    # /v1/videos/sync gives up (and cancels the job) after this many seconds.
    sync_timeout_s: float = 600.0
    # Idempotency-Key reuse window (seconds).
    idempotency_ttl_s: int = 24 * 3600
    # Job event streams (Redis) expire this long after their last event (seconds).
    events_ttl_s: int = 24 * 3600
    # Hint for pollers (``openai-poll-after-ms``).
    poll_after_ms: int = 1000
    # The API's graceful shutdown: open requests (SSE streams, WebSockets) get this long
    # to finish before they are cancelled (``omniqueue up`` waits 5 s longer than this).
    shutdown_grace_s: int = Field(default=5, ge=0)
    # ``omniqueue up`` restarts a child that died after this long, doubled after each fast
    # failure in a row (at most 30 s); the tests of its giving up shorten it.
    restart_backoff_s: float = Field(default=1.0, gt=0)

    @model_validator(mode="after")
    def _check_models(self) -> Settings:
        if self.models is not None and not self.models:
            raise ValueError("OMNIQ_MODELS must name at least one served model")
        return self

    def served_models(self) -> dict[str, ServedModel]:
        """The served models with their adapters and specs (reads the registry file)."""
        registry: dict[str, ServedModel] = {}
        if self.model_registry is not None:
            try:
                text = self.model_registry.read_text()
            except OSError as exc:
                raise ValueError(
                    f"OMNIQ_MODEL_REGISTRY: cannot read {self.model_registry}: {exc.strerror}"
                ) from exc
            registry = parse_registry(text, str(self.model_registry))
        return served_models(self.models, registry)

    def check_secrets(self) -> None:
        """Refuse placeholder S3 credentials outside the embedded mode."""
        if self.mode == "embedded":
            return
        secret = self.s3.secret_access_key
        if secret is not None and secret.lower() in PLACEHOLDER_SECRETS:
            raise ValueError(
                "OMNIQ_S3__SECRET_ACCESS_KEY is a placeholder; set a real secret "
                "(placeholders are accepted only with OMNIQ_MODE=embedded)"
            )

    def check_auth_binding(self, host: str) -> None:
        """``auth.mode=off`` is only allowed when the API is bound to loopback."""
        if self.auth == "off" and host not in {"127.0.0.1", "localhost", "::1"}:
            raise ValueError(
                f"OMNIQ_AUTH=off is only allowed on a loopback address, not {host!r}; "
                "create a key with 'omniqueue keys create' and use OMNIQ_AUTH=required"
            )


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
