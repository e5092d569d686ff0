"""The audit log is kept for good, so its growth per change is measured: an admin assigns a MIG profile to a pool of
N agent nodes and rolls it out; every node applies it. Rows counted, bytes read from SQLite's dbstat (table and
indexes). `pytest -s` prints the figures quoted in docs/operations.md#bounded-state."""

import pytest
from django.db import connection

from core.audit import Actor
from core.models import AuditEvent
from fleet import services as fleet_services
from fleet.models import Node
from fleet.observations import GpuObservation, NodeObservation
from sharing import services as sharing_services
from tests.factories import ClusterFactory, NodePoolFactory
from worker import rollouts, services
from worker.choices import RolloutStatus

pytestmark = pytest.mark.django_db
H100 = "NVIDIA-H100-80GB-HBM3"
STRATEGY = {"batch_size": 10, "canary_count": 1, "max_failures": 2, "busy_policy": "wait", "wait_minutes": 30}
COPIES = 40  # the change's rows repeated this often: page-level bytes per row at a realistic table size


def _node(name: str, *, to: dict | None = None) -> NodeObservation:
    """A node with 8 H100s, running passthrough, or (`to`) the config a change brought it."""
    gpus = tuple(
        GpuObservation(index=i, uuid=f"GPU-{name}-{i}", product=H100, memory_mib=81559, mig_capable=True)
        for i in range(8)
    )
    config = {"observed_mig_config": "all-disabled", "observed_device_plugin_config": "whole", "allocatable": {}}
    if to is not None:
        config = {
            "observed_mig_config": to["mig_config"],
            "observed_device_plugin_config": to["device_plugin_config"],
            "allocatable": to["allocatable"],
        }
    return NodeObservation(name=name, ready=True, config_state="success", gpus=gpus, **config)


def _audit_bytes() -> int:
    """Bytes of the audit table and its indexes, in pages, as SQLite stores them."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name IN "
            "(SELECT name FROM sqlite_schema WHERE tbl_name = 'core_auditevent')"
        )
        return cursor.fetchone()[0]


def _roll_out_to_pool(nodes: int, admin_user) -> list[AuditEvent]:
    """Assign a profile to a pool of `nodes` agent nodes and drive the rollout to success; the audit rows written."""
    cluster = ClusterFactory(driver="agent", kubeconfig_path="")
    pool = NodePoolFactory(cluster=cluster)
    fleet_services.inventory_record(cluster=cluster, nodes=[_node(f"n{i:04d}") for i in range(nodes)])
    Node.objects.update(pool=pool)
    actor = Actor.for_user(admin_user)
    profile = sharing_services.profile_create(
        actor=actor, name="mig-7", mode="mig", target_products=[H100], mig_layouts={"all": {"1g.10gb": 7}}
    )
    first = AuditEvent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    _, rollout = rollouts.pool_assign_and_roll_out(actor=actor, pool=pool, profile=profile, strategy=STRATEGY)
    rollout_id = rollout.pk
    rollout = rollouts.Rollout.objects.get(pk=rollout_id)
    while rollout.status == RolloutStatus.RUNNING:
        services.node_changes_step(services.rollout_advance(rollout_id))
        for change in rollout.changes.filter(status="verifying").select_related("node"):  # the agents report
            fleet_services.inventory_record(cluster=cluster, nodes=[_node(change.node.name, to=change.to_config)])
            Node.objects.filter(pk=change.node_id).update(agent_config_id=change.to_config["config_id"])
        services.node_changes_step(list(rollout.changes.values_list("pk", flat=True)))
        rollout.refresh_from_db()
    assert rollout.status == RolloutStatus.SUCCEEDED
    return list(AuditEvent.objects.filter(pk__gt=first))


@pytest.mark.parametrize("nodes", [10, 50])
def test_audit_rows_and_bytes_per_change_grow_with_nodes_only(nodes, admin_user):
    """A change writes 3 rows of its own (pool.set_profile, rollout.create, rollout.succeeded) and 4 per node (its
    change waiting, applying, verifying, succeeded); each row takes a few hundred bytes, not kilobytes."""
    if connection.vendor != "sqlite":
        pytest.skip("bytes are read from SQLite's dbstat")
    events = _roll_out_to_pool(nodes, admin_user)
    per_node = sum(e.object_type == "nodechange" for e in events)
    assert len(events) - per_node == 3
    assert per_node == 4 * nodes

    AuditEvent.objects.all().delete()
    base = _audit_bytes()
    fields = [f.attname for f in AuditEvent._meta.concrete_fields if not f.primary_key]
    copies = [AuditEvent(**{f: getattr(e, f) for f in fields}) for e in events for _ in range(COPIES)]
    AuditEvent.objects.bulk_create(copies, batch_size=500)
    per_row = (_audit_bytes() - base) / len(copies)
    per_change = per_row * len(events)
    print(f"\naudit per change, {nodes} nodes: {len(events)} rows, {per_row:.0f} B/row, {per_change / 1024:.1f} KiB")
    assert per_row < 600
