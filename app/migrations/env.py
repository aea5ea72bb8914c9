"""Alembic environment. The service passes an open connection in ``config.attributes["connection"]``
(see :func:`app.store.migrate.upgrade`); the ``alembic`` CLI may instead set ``sqlalchemy.url``
to a synchronous URL (e.g. ``sqlite:///var/ttc.db``)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from app.store.models import metadata

config = context.config
connection = config.attributes.get("connection")

if connection is not None:
    context.configure(connection=connection, target_metadata=metadata,
                      render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()
elif context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=metadata,
                      literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    engine = create_engine(config.get_main_option("sqlalchemy.url") or "sqlite:///var/ttc.db")
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=metadata,
                          render_as_batch=conn.dialect.name == "sqlite")
        with context.begin_transaction():
            context.run_migrations()
