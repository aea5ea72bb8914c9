"""Tables of the store (SQLAlchemy 2 declarative). Changing them means a new Alembic revision in
``app/migrations/versions``; start-up runs ``upgrade head``.

* ``policies``: one row per policy name (latest version, soft-delete flag, where it came from);
* ``policy_versions``: every version ever written, immutable (``name``, ``version``) -> spec;
* ``service_settings``: small key/value settings (the default policy);
* ``api_keys``: hashed keys with role, default policy and per-minute limits;
* ``recordings``: served samples, one row per answered query;
* ``batches``: one row per batch (request, status, progress, lease, result);
* ``batch_samples``: the samples a batch has drawn, one row per (prompt, slot), written as they
  finish (the checkpoint a replica taking the batch over resumes from).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, MetaData, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class PolicyRow(Base):
    __tablename__ = "policies"
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    latest_version: Mapped[int] = mapped_column(Integer)
    deleted: Mapped[bool] = mapped_column(Boolean, default=False)
    source: Mapped[str] = mapped_column(String(16), default="api")  # api | config | builtin
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class PolicyVersionRow(Base):
    __tablename__ = "policy_versions"
    name: Mapped[str] = mapped_column(String(128), ForeignKey("policies.name"), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    description: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str | None] = mapped_column(String(64), nullable=True)


class SettingRow(Base):
    __tablename__ = "service_settings"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class ApiKeyRow(Base):
    __tablename__ = "api_keys"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str | None] = mapped_column(String(128), nullable=True)
    role: Mapped[str] = mapped_column(String(16))
    hash: Mapped[str] = mapped_column(String(64))
    default_policy: Mapped[str | None] = mapped_column(String(128), nullable=True)
    requests_per_minute: Mapped[int | None] = mapped_column(Integer, nullable=True)
    samples_per_minute: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class RecordingRow(Base):
    __tablename__ = "recordings"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    created_at: Mapped[float] = mapped_column(Float)
    request_id: Mapped[str] = mapped_column(String(64))
    query_id: Mapped[str] = mapped_column(String(64))
    policy_name: Mapped[str] = mapped_column(String(128))
    policy_version: Mapped[int] = mapped_column(Integer)
    model: Mapped[str | None] = mapped_column(String(256), nullable=True)
    key_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    question: Mapped[str] = mapped_column(Text)
    reference: Mapped[str | None] = mapped_column(Text, nullable=True)
    answers: Mapped[list[Any]] = mapped_column(JSON)
    scores: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    tokens: Mapped[list[Any]] = mapped_column(JSON)
    logprobs: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    texts: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    traces: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)  # per sample: token confidences
    selected: Mapped[int | None] = mapped_column(Integer, nullable=True)
    latency_ms: Mapped[float] = mapped_column(Float)
    meta: Mapped[dict[str, Any]] = mapped_column(JSON)

    __table_args__ = (Index("ix_recordings_created_at", "created_at"),)


class BatchRow(Base):
    __tablename__ = "batches"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    owner: Mapped[str | None] = mapped_column(String(32), nullable=True)  # the key id (None: config admin)
    owner_role: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16))  # queued | in_progress | completed | failed | cancelled
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    request: Mapped[dict[str, Any]] = mapped_column(JSON)  # the body (seed filled in), model, policy snapshot
    policy: Mapped[dict[str, Any]] = mapped_column(JSON)  # PolicySnapshot.describe()
    prompts: Mapped[int] = mapped_column(Integer)
    budget_samples: Mapped[int] = mapped_column(Integer)
    progress: Mapped[dict[str, Any]] = mapped_column(JSON)  # rounds, samples_drawn, samples_cancelled, usage
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    lease_owner: Mapped[str | None] = mapped_column(String(32), nullable=True)
    lease_until: Mapped[float | None] = mapped_column(Float, nullable=True)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    takeovers: Mapped[int] = mapped_column(Integer, default=0)

    __table_args__ = (Index("ix_batches_status_lease", "status", "lease_until"),
                      Index("ix_batches_owner_created", "owner", "created_at"))


class BatchSampleRow(Base):
    __tablename__ = "batch_samples"
    batch_id: Mapped[str] = mapped_column(String(40), ForeignKey("batches.id", ondelete="CASCADE"),
                                          primary_key=True)
    query_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)


metadata = Base.metadata
