"""Kueue quota in step with a pool's layout (issue 20): per enabled binding, ensure the pool's ResourceFlavors and set
the nominalQuota of its flavors in each named ClusterQueue to what `scheduling.kueue.quota_plan` says now — lowered
to what is in use ahead of a transition, raised as nodes report new resources.

A quota Tessera did not write is drift: when a ClusterQueue's value for one of Tessera's flavors differs from the
value Tessera last wrote there (KueueQuotaWrite), that queue is reported (binding.drift, the pool page, the audit log,
/metrics) and not written until an admin takes it over (`kueue_take_over`). Every write is audited (system actor,
before → after). HTTP never runs inside a database transaction; one pass per pool at a time.
"""

import logging

from django.db import transaction
from django.utils import timezone

from capacity.kueue import cluster_workloads_record
from core.audit import Actor, audit_record
from fleet.models import Cluster
from scheduling.kueue import quota_plan
from scheduling.models import KueueBinding
from worker.drivers.kubernetes.api import api_client, error_text
from worker.drivers.kubernetes.kueue import KueueObjects, in_use, live_quota, quota_patch
from worker.locks import KUEUE, ClusterLock
from worker.models import KueueQuotaWrite

log = logging.getLogger(__name__)

ACTOR = Actor.system("kueue")


def _drift(pool_id: int, cq_name: str, live: dict) -> list[dict]:
    """Each value Tessera wrote in this ClusterQueue that is no longer there: flavor, resource, the live value (None:
    absent) and what Tessera wrote ([] when every one is still there, the queue is Tessera's)."""
    writes = KueueQuotaWrite.objects.filter(pool_id=pool_id, cluster_queue=cq_name).order_by("flavor", "resource")
    return [
        {"flavor": w.flavor, "resource": w.resource, "live": live.get((w.flavor, w.resource)), "wrote": w.value}
        for w in writes
        if live.get((w.flavor, w.resource)) != w.value
    ]


def drift_text(changes: list[dict]) -> str:
    """A queue's drift in words, as the audit log and the pool page say it."""
    shown = (f"{c['flavor']} {c['resource']}: {_live(c)} (Tessera wrote {c['wrote']})" for c in changes)
    return f"Changed outside Tessera: {'; '.join(shown)}"


def _live(change: dict):
    return "absent" if change["live"] is None else change["live"]


def _record(binding: KueueBinding, cq_name: str, wanted: dict, before: dict, now) -> None:
    """Remember what was written and audit it, in one transaction."""
    with transaction.atomic():
        changes_before, changes_after = {}, {}
        for flavor, resources in wanted.items():
            for resource, value in resources.items():
                KueueQuotaWrite.objects.update_or_create(
                    pool=binding.pool,
                    cluster_queue=cq_name,
                    flavor=flavor,
                    resource=resource,
                    defaults={"value": value, "written_at": now},
                )
                old = before.get((flavor, resource))
                if old != value:
                    changes_before[f"{flavor}/{resource}"] = old
                    changes_after[f"{flavor}/{resource}"] = value
        audit_record(
            actor=ACTOR,
            action="kueue.quota",
            obj=binding,
            before=changes_before,
            after=changes_after,
            message=f"ClusterQueue {cq_name}",
            now=now,
        )


def kueue_sync(pool_id: int, *, at=None) -> dict:
    """One pass for one pool; returns per ClusterQueue what happened ("written", "in step", "drift", an error)."""
    binding = KueueBinding.objects.select_related("pool__cluster").filter(pool_id=pool_id, enabled=True).first()
    if binding is None or binding.pool.cluster.driver != "kubernetes":
        return {}
    lock = ClusterLock(pool_id, KUEUE)
    if not lock.acquire():
        return {"skipped": "another Kueue sync of this pool is running"}
    try:
        return _sync(binding, at or timezone.now())
    finally:
        lock.release()


def _sync(binding: KueueBinding, at) -> dict:
    plan = quota_plan(binding, at=at)
    result, drift, errors = {}, {}, []
    try:
        kueue = KueueObjects(api_client(binding.pool.cluster))
        for flavor, labels in plan.labels.items():
            kueue.ensure_flavor(flavor, labels)
    except Exception as exc:  # unreachable, forbidden, Kueue not installed: reported on the pool page
        errors.append(f"ResourceFlavors: {error_text(exc)}")
        kueue = None
    for cq_name in binding.cluster_queues if kueue else ():
        try:
            cq = kueue.cluster_queue(cq_name)
            if cq is None:
                errors.append(f"ClusterQueue {cq_name} does not exist")
                result[cq_name] = "missing"
                continue
            live = live_quota(cq, plan.labels)
            changed = _drift(binding.pool_id, cq_name, live)
            if changed:
                drift[cq_name] = changed
                result[cq_name] = "drift"
                continue
            wanted = plan.quota(in_use(cq, plan.labels))
            ops = quota_patch(cq, wanted, plan.resources)
            if ops:
                kueue.patch_cluster_queue(cq, ops)
                _record(binding, cq_name, wanted, live, timezone.now())
                result[cq_name] = "written"
            else:
                result[cq_name] = "in step"
        except Exception as exc:
            errors.append(f"ClusterQueue {cq_name}: {error_text(exc)}")
            result[cq_name] = "error"
    _report(binding, drift, "; ".join(errors), at)
    return result


def _report(binding: KueueBinding, drift: dict, error: str, at) -> None:
    """Store what the pass saw; newly seen drift is audited once."""
    with transaction.atomic():
        current = KueueBinding.objects.select_for_update().get(pk=binding.pk)
        for cq_name, changes in drift.items():
            if current.drift.get(cq_name) != changes:
                audit_record(
                    actor=ACTOR,
                    action="kueue.drift",
                    obj=current,
                    after={"cluster_queue": cq_name, "drift": changes},
                    message=f"ClusterQueue {cq_name} left alone: {drift_text(changes)}",
                    now=at,
                )
        current.drift, current.last_error, current.synced_at = drift, error, timezone.now()
        current.save(update_fields=["drift", "last_error", "synced_at"])


@transaction.atomic
def kueue_take_over(*, actor: Actor, binding: KueueBinding, cluster_queue: str) -> None:
    """An admin's decision: Tessera owns this ClusterQueue's quota for the pool's flavors again (the next pass writes
    the planned values over whatever is there)."""
    binding = KueueBinding.objects.select_for_update().get(pk=binding.pk)
    before = binding.drift.get(cluster_queue)
    KueueQuotaWrite.objects.filter(pool_id=binding.pool_id, cluster_queue=cluster_queue).delete()
    binding.drift = {k: v for k, v in binding.drift.items() if k != cluster_queue}
    binding.save(update_fields=["drift"])
    audit_record(
        actor=actor,
        action="kueue.take_over",
        obj=binding,
        before={"cluster_queue": cluster_queue, "drift": before},
        after={"cluster_queue": cluster_queue},
    )


def bindings_to_sync() -> list[int]:
    return list(
        KueueBinding.objects.filter(enabled=True, pool__cluster__driver="kubernetes").values_list("pool_id", flat=True)
    )


def workload_clusters() -> list[int]:
    """Kubernetes clusters with a pool whose Kueue binding is enabled: the ones whose Workloads are sampled."""
    return list(
        Cluster.objects.filter(driver="kubernetes", pools__kueue__enabled=True)
        .distinct()
        .order_by("pk")
        .values_list("pk", flat=True)
    )


def kueue_workloads_sample(cluster_id: int, *, now=None) -> int | str:
    """Read the cluster's Workloads and record them as demand of its bound pools in the current capacity bucket
    (capacity/kueue.py; sampling the bucket again replaces them). Returns the rows written, or why nothing was."""
    cluster = Cluster.objects.filter(pk=cluster_id, driver="kubernetes").first()
    if cluster is None:
        return "not a Kubernetes cluster"
    try:
        seen = KueueObjects(api_client(cluster)).workloads()
    except Exception as exc:  # unreachable, forbidden, Kueue not installed: the bucket keeps what it had
        log.warning("Kueue Workloads of cluster %s not read: %s", cluster.name, error_text(exc))
        return error_text(exc)
    return cluster_workloads_record(cluster_id, seen, now=now)
