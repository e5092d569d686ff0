"""Room on each page of the two tables every agent report and metrics scrape overwrites (fleet_gpu: metrics;
fleet_node: last-seen), so that PostgreSQL updates a row in place on its page (a HOT update) instead of writing a new
entry into every index of the table (seven on fleet_gpu) for each report. PostgreSQL only: SQLite has no such
setting. Instant: the lock is SHARE UPDATE EXCLUSIVE, nothing is rewritten, pages written from then on keep the room."""

from django.db import migrations

FILLFACTOR = {"fleet_gpu": 50, "fleet_node": 70}


def set_fillfactor(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for table, percent in FILLFACTOR.items():
            schema_editor.execute(f"ALTER TABLE {schema_editor.quote_name(table)} SET (fillfactor = {percent})")


def reset_fillfactor(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for table in FILLFACTOR:
            schema_editor.execute(f"ALTER TABLE {schema_editor.quote_name(table)} RESET (fillfactor)")


class Migration(migrations.Migration):
    dependencies = [("fleet", "0012_pod_labels_times_pending_pods")]

    operations = [migrations.RunPython(set_fillfactor, reset_fillfactor)]
