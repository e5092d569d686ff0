"""Prometheus gauges for the fleet, computed from the database on each scrape (no in-process state to lose)."""

from django.db.models import Count
from prometheus_client.core import GaugeMetricFamily

from fleet.models import Gpu, Node


class FleetCollector:
    """Nodes by config state, stale nodes, GPUs by product and health."""

    def collect(self):
        nodes = GaugeMetricFamily("tessera_nodes", "Live nodes by sharing config state.", labels=["state"])
        for row in Node.objects.live().values("config_state").annotate(n=Count("pk")):
            nodes.add_metric([row["config_state"]], row["n"])
        yield nodes
        stale = GaugeMetricFamily("tessera_nodes_stale", "Live nodes whose last observation is too old.")
        stale.add_metric([], Node.objects.live().stale().count())
        yield stale
        gpus = GaugeMetricFamily("tessera_gpus", "Live GPUs by product and health.", labels=["product", "health"])
        for row in Gpu.objects.live().values("product", "health").annotate(n=Count("pk")):
            gpus.add_metric([row["product"], row["health"]], row["n"])
        yield gpus
