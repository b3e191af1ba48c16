"""Alembic environment: runs on the connection handed in by storage.engine.upgrade_database,
or on `sqlalchemy.url` when invoked from the alembic command line."""

from alembic import context
from sqlalchemy import create_engine
from sqlmodel import SQLModel

import storage.tables  # noqa: F401  (registers the tables on the metadata)

target_metadata = SQLModel.metadata
config = context.config


def run() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(
            connection=connection, target_metadata=target_metadata, render_as_batch=True
        )
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url"))
    with engine.begin() as conn:
        context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()


run()
