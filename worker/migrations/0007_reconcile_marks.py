"""The incremental reconcile tick's marks and state, and the triggers that write the marks (worker/marks.py)."""

from django.db import migrations, models

from worker import marks


def install(apps, schema_editor):
    marks.install(schema_editor)


def uninstall(apps, schema_editor):
    marks.uninstall(schema_editor)


class Migration(migrations.Migration):
    dependencies = [
        ("worker", "0006_kueue_quota_write"),
        ("fleet", "0014_gpu_unhealthy_live_index"),
        ("sharing", "0005_node_pin_until"),
        ("scheduling", "0004_kueue_binding"),
    ]

    operations = [
        migrations.CreateModel(
            name="ReconcileMark",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("node_id", models.BigIntegerField(blank=True, null=True)),
                ("pool_id", models.BigIntegerField(blank=True, null=True)),
                ("everything", models.BooleanField(default=False)),
            ],
        ),
        migrations.CreateModel(
            name="ReconcileState",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("evaluated_at", models.DateTimeField(blank=True, null=True)),
                ("full_at", models.DateTimeField(blank=True, help_text="Empty: no full pass yet.", null=True)),
                (
                    "full_requested_at",
                    models.DateTimeField(
                        blank=True,
                        help_text="A tick sent the full pass's task (worker.tasks.reconcile_full); it clears this.",
                        null=True,
                    ),
                ),
                (
                    "held",
                    models.JSONField(
                        default=list, help_text="Ids of live nodes out of the loop at the last evaluation."
                    ),
                ),
                (
                    "missed",
                    models.PositiveBigIntegerField(
                        default=0, help_text="Nodes a full pass planned that no tick looked at."
                    ),
                ),
                ("last_missed_at", models.DateTimeField(blank=True, null=True)),
            ],
        ),
        migrations.RunPython(install, uninstall),
    ]
