"""The database is all Tessera needs back after a loss (issue 19, point 5; docs/operations.md, "Backups"): a
`pg_dump` taken mid-rollout, restored into a fresh database, and a new worker on a fresh broker (Redis holds nothing
that matters) finish the rollout against the cluster, each node's transitions recorded once."""

import os
import subprocess
import time
import uuid

import psycopg
import pytest
from django.db import connection
from kombu import Connection

from config.celery import app
from tests.integration.test_rollout_faults import (
    TRANSITIONS,
    _fleet,
    broker,  # noqa: F401 - the fixture: tasks go to an unread broker
    start_rollout,
    step,
)
from tests.processes import celery_worker, database_url, required_binary, wait_until
from worker.choices import IN_FLIGHT_STATUSES

IN_FLIGHT = set(IN_FLIGHT_STATUSES)
pytestmark = [pytest.mark.services, pytest.mark.filterwarnings("ignore::celery.exceptions.AlwaysEagerIgnored")]


def _require_postgresql() -> None:
    if connection.vendor != "postgresql":
        message = "the backup test restores a pg_dump: run it with a PostgreSQL DATABASE_URL"
        if os.environ.get("CI") == "true":
            pytest.fail(message + "; it is required in CI")
        pytest.skip(message)


def _half_done(sim, rollout) -> dict[str, str]:
    """Step the rollout in this process until its canary succeeded and the next batch is mid-change (MIG Manager
    takes a second per step here)."""
    sim.faults.update({"apply_delay": 1.0})

    def half_done() -> dict[str, str] | None:
        step(rollout)
        statuses = dict(rollout.changes.values_list("node__name", "status"))
        return statuses if "succeeded" in statuses.values() and set(statuses.values()) & IN_FLIGHT else None

    return wait_until(half_done, timeout=60, interval=0.3, message="a succeeded canary and a batch mid-change")


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("broker")
def test_a_restored_pg_dump_finishes_a_half_done_rollout(sim, core, sim_cluster, tmp_path):
    _require_postgresql()
    pg_dump, pg_restore = (
        required_binary("pg_dump", "postgresql-client"),
        required_binary("pg_restore", "postgresql-client"),
    )
    _fleet(sim, core, sim_cluster)
    rollout = start_rollout(canary_count=1, batch_size=2)  # its tasks go to a broker nobody consumes
    before = _half_done(sim, rollout)
    assert "queued" in before.values()

    source = database_url()
    dump = tmp_path / "tessera.dump"
    subprocess.run([pg_dump, "--format=custom", "--no-owner", f"--file={dump}", source], check=True, timeout=120)
    restored_name = f"tessera_restored_{uuid.uuid4().hex[:8]}"
    server = source.rsplit("/", 1)[0]
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{restored_name}"')
    restored = f"{server}/{restored_name}"
    try:
        subprocess.run([pg_restore, "--no-owner", f"--dbname={restored}", str(dump)], check=True, timeout=120)
        _carry_on(restored, tmp_path / "restored", rollout.pk)
        _check(restored, core, rollout.pk, before)
        rollout.refresh_from_db()
        assert rollout.status == "running"  # the old database was left behind: the restored one did the rest
    finally:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{restored_name}" WITH (FORCE)')


def _carry_on(restored: str, var_dir, rollout_id: int) -> None:
    """A worker on the restored database and a fresh, empty broker; beat's tick every 2 s (30 s in production).
    In-flight changes are re-stepped once their last step is 30 s old (worker.services.STEP_STALL_SECONDS)."""
    folders = {key: var_dir / "celery" / name for key, name in
               (("data_folder_in", "queue"), ("data_folder_out", "queue"), ("processed_folder", "processed"),
                ("control_folder", "control"))}  # fmt: skip
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    options = {key: str(path) for key, path in folders.items()} | {"polling_interval": 0.05, "store_processed": False}
    with (
        celery_worker(var_dir, "tessera-fs://", DATABASE_URL=restored, TESSERA_STEP_POLL_SECONDS="0.3"),
        Connection("tessera-fs://", transport_options=options) as broker_connection,
        psycopg.connect(restored, autocommit=True) as db,
    ):

        def finished() -> bool:
            app.send_task("worker.tasks.reconcile_tick", connection=broker_connection)
            (status,) = db.execute("SELECT status FROM worker_rollout WHERE id = %s", (rollout_id,)).fetchone()
            if status == "running":
                time.sleep(2)
                return False
            return True

        wait_until(finished, timeout=120, interval=0, message="the restored installation to finish the rollout")


def _check(restored: str, core, rollout_id: int, before: dict[str, str]) -> None:
    with psycopg.connect(restored) as db:
        (status,) = db.execute("SELECT status FROM worker_rollout WHERE id = %s", (rollout_id,)).fetchone()
        changes = db.execute(
            "SELECT c.id, n.name, c.status, c.applied_mig_config FROM worker_nodechange c "
            "JOIN fleet_node n ON n.id = c.node_id WHERE c.rollout_id = %s",
            (rollout_id,),
        ).fetchall()
        for change_id, node, change_status, applied in changes:
            assert change_status == "succeeded", (node, change_status)
            actions = [
                row[0]
                for row in db.execute(
                    "SELECT action FROM core_auditevent WHERE object_type = 'nodechange' AND object_id = %s "
                    "ORDER BY id",
                    (str(change_id),),
                )
            ]
            assert actions == list(TRANSITIONS), (node, before[node], actions)  # nothing repeated, nothing lost
            labels = core.read_node(node).metadata.labels
            assert (labels["nvidia.com/mig.config"], labels["nvidia.com/mig.config.state"]) == (applied, "success")
    assert status == "succeeded"
    assert len(changes) == len(before) == 5
