"""Alembic migrations of the store, run programmatically at start-up by :func:`app.store.db`."""
