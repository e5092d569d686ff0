"""No migration locks a big table for long or breaks the pods still running the previous release (issue 19,
point 5; docs/operations.md, "Upgrades").

An upgrade migrates first (the Job tessera-migrate) while the old pods keep serving, on PostgreSQL. On a fleet of
10,000 nodes the tables in BIG hold tens of thousands to millions of rows, where PostgreSQL (>= 11) would:
- rewrite the table under an ACCESS EXCLUSIVE lock for a column type change, or a new column whose database default
  is volatile (a constant default, Django's AddField default included, is stored in the catalog: instant);
- scan it under that lock to set NOT NULL on an existing column;
- block every write while it builds an index (AddIndex, a unique or indexed new field, a unique constraint), unless
  built CONCURRENTLY (django.contrib.postgres.operations.AddIndexConcurrently);
- run whatever RunPython and RunSQL do, for as long as they take.
And an old pod still selects every column and table it knows: removing or renaming one breaks it until it is
replaced. Such a change is split over two releases (add, then drop once no code reads it).

Every migration is checked against PostgreSQL's column types, whichever database the tests run on. One that must
do such a thing anyway goes into ALLOWED with the reason it is safe.
"""

import pytest
from django.db import connections, migrations, models
from django.db.backends.postgresql.base import DatabaseWrapper
from django.db.migrations.loader import MigrationLoader
from django.db.models import NOT_PROVIDED, Value

BIG = {
    ("fleet", "node"),
    ("fleet", "gpu"),
    ("fleet", "migdevice"),
    ("fleet", "pod"),
    ("fleet", "gpuevent"),
    ("fleet", "agentcredential"),
    ("worker", "nodechange"),
    ("worker", "nodedrift"),
    ("core", "auditevent"),
}
TESSERA_APPS = ("core", "fleet", "scheduling", "sharing", "worker", "capacity", "agents", "console")
REMOVES = (migrations.RemoveField, migrations.RenameField, migrations.DeleteModel, migrations.RenameModel)
# (app, migration, operation index): why it is safe.
BEFORE_FIRST_RELEASE = "before the first release: no installation had a big fleet when it ran"
ALLOWED = {
    ("agents", "0001_report_cache_notify", 0): "CREATE TRIGGER on PostgreSQL: catalog only, a brief lock, no scan",
    ("worker", "0007_reconcile_marks", 2): "CREATE TRIGGER (worker/marks.py): catalog only, a brief lock, no scan",
    ("core", "0001_role_groups", 0): "get_or_create of three auth groups",
    ("core", "0003_api_token", 1): "one row per user's DRF token, copied into a new table: users, not nodes",
    ("fleet", "0003_gpu_list_indexes", 0): BEFORE_FIRST_RELEASE,
    ("fleet", "0003_gpu_list_indexes", 1): BEFORE_FIRST_RELEASE,
    ("fleet", "0008_dcgm_health_signals_mig_metrics_prometheus_url", 9): BEFORE_FIRST_RELEASE,
    ("fleet", "0013_report_rows_fillfactor", 0): "ALTER TABLE … SET (fillfactor) on PostgreSQL: catalog only, instant",
}
POSTGRES = DatabaseWrapper(dict(connections["default"].settings_dict))  # never connects: column types only


def _column_type(field) -> str:
    return field.db_parameters(connection=POSTGRES)["type"]


def _indexed(field) -> bool:
    return bool(field.db_index or field.unique)  # a ForeignKey is indexed unless told not to be


def problems_of(operation, state, app: str) -> list[str]:
    """What `operation` would do to a big table (or to the old pods), given the project state before it."""
    model = getattr(operation, "model_name", None) or getattr(operation, "name_lower", None)
    model = (app, (model or "").lower())
    if isinstance(operation, REMOVES):
        return [f"{type(operation).__name__} breaks the pods of the previous release that still use it"]
    if isinstance(operation, (migrations.RunPython, migrations.RunSQL)):
        return [f"{type(operation).__name__} runs for as long as its code takes, on whatever tables it touches"]
    if model not in BIG:
        return []
    found = []
    if isinstance(operation, migrations.AddField):
        field = operation.field
        if field.db_default is not NOT_PROVIDED and not isinstance(field.db_default, Value):
            found.append("a database default that is an expression may be volatile: the table is rewritten")
        if _indexed(field):
            found.append("a new indexed field builds its index while writes wait")
    elif isinstance(operation, migrations.AlterField):
        after = state.clone()
        operation.state_forwards(app, after)
        old, new = (s.apps.get_model(*model)._meta.get_field(operation.name) for s in (state, after))
        if _column_type(old) != _column_type(new):
            found.append(f"column type {_column_type(old)} -> {_column_type(new)} rewrites the table")
        if old.null and not new.null:
            found.append("NOT NULL scans the table under an exclusive lock")
        if _indexed(new) and not _indexed(old):
            found.append("a new index is built while writes wait")
    elif isinstance(operation, migrations.AddIndex) and type(operation).__name__ != "AddIndexConcurrently":
        found.append("AddIndex builds while writes wait (use AddIndexConcurrently)")
    elif isinstance(operation, (migrations.AddConstraint, migrations.AlterUniqueTogether)):
        found.append(
            f"{type(operation).__name__} checks every row while writes wait (add it NOT VALID, validate later)"
        )
    return found


def _all_problems() -> dict[tuple[str, str, int], list[str]]:
    loader = MigrationLoader(None, ignore_no_migrations=True)
    found = {}
    for (app, name), migration in loader.graph.nodes.items():
        if app not in TESSERA_APPS:
            continue
        state = loader.project_state((app, name), at_end=False)  # everything before this migration
        created = {op.name_lower for op in migration.operations if isinstance(op, migrations.CreateModel)}
        for index, operation in enumerate(migration.operations):
            model = (getattr(operation, "model_name", None) or "").lower()
            issues = [] if model in created else problems_of(operation, state, app)  # a new table is empty
            if issues:
                found[(app, name, index)] = issues
            operation.state_forwards(app, state)
    return found


def test_no_migration_rewrites_or_locks_a_big_table_or_breaks_the_old_pods():
    found = _all_problems()
    unexplained = {key: issues for key, issues in found.items() if key not in ALLOWED}
    assert not unexplained, "\n".join(f"{k}: {v}" for k, v in sorted(unexplained.items()))
    assert not set(ALLOWED) - set(found), "allowed, but no longer found: drop from ALLOWED"


@pytest.mark.parametrize(
    "operation, issue",
    [
        (migrations.AlterField("node", "name", models.TextField()), "rewrites"),
        (migrations.AddIndex("gpu", models.Index(fields=["uuid"], name="x")), "writes wait"),
        (migrations.AddField("gpuevent", "seen", models.BooleanField(null=True, db_index=True)), "writes wait"),
        (migrations.RemoveField("gpu", "uuid"), "previous release"),
        (migrations.RunPython(migrations.RunPython.noop), "as long as"),
    ],
    ids=["type change", "index", "indexed field", "remove", "run python"],
)  # fmt: skip
def test_the_check_flags_what_would_lock_a_10000_node_fleet(operation, issue):
    loader = MigrationLoader(None, ignore_no_migrations=True)
    state = loader.project_state(at_end=True)
    assert any(issue in text for text in problems_of(operation, state, "fleet"))
    assert not problems_of(migrations.AddIndex("nodepool", models.Index(fields=["name"], name="y")), state, "fleet")
    assert not problems_of(migrations.AddField("node", "note", models.TextField(default="")), state, "fleet")
