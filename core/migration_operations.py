"""Migration operations that keep big tables writable while they run (tests/core/test_migration_safety.py)."""

from django.contrib.postgres.operations import AddIndexConcurrently as PostgresAddIndexConcurrently
from django.db.migrations import AddIndex


class AddIndexConcurrently(PostgresAddIndexConcurrently):
    """CREATE INDEX CONCURRENTLY on PostgreSQL, so agents' reports keep writing the table while the index builds;
    a plain CREATE INDEX on SQLite (the embedded default), which has no concurrent build. The migration using it
    must say `atomic = False`."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        return AddIndex.database_forwards(self, app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        return AddIndex.database_backwards(self, app_label, schema_editor, from_state, to_state)
