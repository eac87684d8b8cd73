"""Alembic environment of the run store: migrations run on the connection ``store.migrate`` hands over.

Why no alembic.ini: the store upgrades itself on start-up (``Store.open``), for SQLite files in a run
directory and for a team's PostgreSQL alike, so the configuration is built in code (``store.alembic_config``).
"""

from alembic import context

from cua_rl.monitor.schema import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
