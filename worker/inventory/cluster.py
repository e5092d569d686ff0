"""Whole-cluster passes: the full listing (nodes, then GPUs), the periodic metrics scrape and the health check."""

import logging
from dataclasses import dataclass, field

from django.db import transaction
from kubernetes import client

from fleet.choices import DRA_STACKS
from fleet.models import Node
from fleet.observations import GpuObservation, NodeObservation
from fleet.services import (
    NODE_FIELDS,
    cluster_record_contact,
    cluster_record_policy,
    gpu_metrics_record,
    inventory_record,
)
from worker.drivers.base import DriverError
from worker.drivers.kubernetes import api as k8s
from worker.drivers.kubernetes.labels import node_labels, node_ready
from worker.drivers.kubernetes.operator import HealthReport, Operator
from worker.inventory.dcgm import gpu_metrics, gpu_observations
from worker.inventory.exporters import fetch_metrics
from worker.inventory.gpustack import DraView, leave_dra_devices, pool_observations, read_dra
from worker.inventory.nodes import list_gpu_nodes, node_observation, warnings_by_node

log = logging.getLogger(__name__)


@dataclass
class SyncResult:
    """What a sync saw and changed."""

    resource_version: str = ""
    nodes: int = 0
    gpus: int = 0
    changed: object = None
    metrics_recorded: int = 0
    warnings: dict = field(default_factory=dict)
    dra: DraView | None = None  # what the listing read of DRA (the watch keeps it current)


def sync_cluster_full(cluster, *, gpus: bool = True, metrics: bool = True, record_contact: bool = True) -> SyncResult:
    """List every GPU node and record them all (nodes not listed are marked gone). With `gpus`, dcgm-exporter is
    scraped for the GPUs and MIG devices; with `metrics` too, their utilisation and health are recorded."""
    api = k8s.api_client(cluster)
    core = client.CoreV1Api(api)
    nodes, version = list_gpu_nodes(core)
    warnings = warnings_by_node(core, cluster.operator_namespace)
    dra = read_dra(api)
    scraped = {}
    if gpus:
        try:
            scraped = fetch_metrics(cluster, [n["metadata"]["name"] for n in nodes if node_ready(n)])
        except Exception as exc:  # nodes still sync; GPUs wait for the next scrape
            log.warning("metrics scrape of %s failed: %s", cluster.name, k8s.error_text(exc))
    observations = []
    for node in nodes:
        name = node["metadata"]["name"]
        samples = scraped.get(name)
        found = gpu_observations(node_labels(node).get("nvidia.com/gpu.product", ""), samples) if samples else None
        if dra is not None and name in dra.slices:  # a DRA node: its pool says which GPUs and MIG devices exist
            found = pool_observations(name, dra.slices[name], found)
        observations.append(node_observation(node, gpus=found, warning=warnings.get(name, ""), stack=dra))
    changed = inventory_record(cluster=cluster, nodes=observations, complete=True)
    recorded = gpu_metrics_record(samples=gpu_metrics(scraped)) if scraped and metrics else 0
    if record_contact:
        cluster_record_contact(cluster)
    gpus_seen = sum(len(g) for g in scraped.values())
    return SyncResult(version, len(nodes), gpus_seen, changed, recorded, warnings, dra)


def scrape_metrics(cluster) -> SyncResult:
    """GPUs, MIG devices and their latest metrics from dcgm-exporter, for the cluster's live nodes as stored.

    Node fields are re-read under a row lock in the same transaction as the recording, so a watch event landing
    meanwhile is never overwritten by an older copy."""
    live = list(Node.objects.live().filter(cluster=cluster, ready=True).values_list("name", flat=True))
    scraped = fetch_metrics(cluster, live) if live else {}
    live_names = set(live)
    names = [name for name in scraped if name in live_names]
    with transaction.atomic():
        rows = []
        for i in range(0, len(names), 900):
            rows += Node.objects.select_for_update().filter(cluster=cluster, name__in=names[i : i + 900])
        observations = [
            NodeObservation(
                name=row.name,
                **{f: getattr(row, f) for f in NODE_FIELDS},
                gpus=_exported(row, gpu_observations(row.labels.get("nvidia.com/gpu.product", ""), scraped[row.name])),
            )
            for row in rows
        ]
        changed = inventory_record(cluster=cluster, nodes=observations)
    recorded = gpu_metrics_record(samples=gpu_metrics(scraped))
    return SyncResult("", len(rows), sum(len(g) for g in scraped.values()), changed, recorded)


def record_pools(cluster, view: DraView, names) -> int:
    """Record the GPUs and MIG devices of these DRA nodes from their pools as `view` holds them (the watch's slice
    events), with the GPU stack they imply; the rest of each node is re-read under a row lock, as the scrape does.
    Returns how many nodes were recorded."""
    with transaction.atomic():
        rows = []
        names = sorted(names)
        for i in range(0, len(names), 900):
            rows += Node.objects.select_for_update().filter(cluster=cluster, name__in=names[i : i + 900], gone_at=None)
        observations = []
        for row in rows:
            gpu_stack, dynamic_mig = view.stack(row.name, row.labels, row.allocatable)
            pool = view.slices.get(row.name)
            observations.append(
                NodeObservation(
                    name=row.name,
                    **{f: getattr(row, f) for f in NODE_FIELDS},
                    gpu_stack=gpu_stack,
                    dynamic_mig=dynamic_mig,
                    gpus=pool_observations(row.name, pool, _stored_gpus(row)) if pool is not None else None,
                )
            )
        inventory_record(cluster=cluster, nodes=observations)
    return len(rows)


def _stored_gpus(node: Node) -> tuple:
    """The node's live GPUs as observations, to lend pool_observations their index and health."""
    return tuple(
        GpuObservation(index=g.index, uuid=g.uuid, product=g.product, health=g.health) for g in node.gpus.live()
    )


def _exported(node: Node, gpus):
    """What the scrape may record of a node's GPUs: on a DRA node the slices own MIG devices and DRA keys."""
    return leave_dra_devices(gpus) if node.gpu_stack in DRA_STACKS else gpus


def cluster_health(cluster, *, record: bool = True) -> HealthReport:
    """API reachable, ClusterPolicy found, MIG and device-plugin ConfigMaps managed by Tessera; the first problem
    is stored on the cluster (connection state error + last_error) so the UI says it plainly. The policy's MIG
    strategy and the device plugin's version are stored whenever the policy was read."""
    try:
        report = Operator(k8s.api_client(cluster), cluster.operator_namespace, cluster.name).health()
    except DriverError as exc:
        report = HealthReport()
        report.add("credentials", False, str(exc))
    except Exception as exc:
        report = HealthReport()
        report.add("api_reachable", False, f"{cluster.name}: {k8s.error_text(exc)}")
    if report.policy is not None:
        cluster_record_policy(
            cluster, mig_strategy=report.policy.mig_strategy, device_plugin_version=report.device_plugin_version
        )
    if record:
        cluster_record_contact(cluster, report.problem, reached=report.reachable)
    return report
