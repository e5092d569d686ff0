"""Prometheus series of the inventory, read from the database at scrape time: nodes by the config state their
cluster reports, stale nodes, GPUs by health with their XID and ECC errors, cluster connections, node agents.

Fleet-wide series are counted by cluster and pool, never by node; the per-node and per-GPU series exist only for
nodes and GPUs in trouble (a config change pending, applying, rebooting or failed; a GPU unhealthy), so a
10,000-node fleet makes a few hundred series when it is well (docs/metrics.md)."""

from collections import defaultdict

from django.db.models import Count, Min, Q, Sum
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from core.metrics import age_seconds, timestamp
from fleet.choices import ClusterDriver, ConfigState, ConnectionState, GpuHealth
from fleet.models import AgentCredential, Cluster, Gpu, GpuEvent, Node
from fleet.querysets import agent_stale_cutoff, stale_q

# Config states a node is "in trouble" in: the per-node series and the oldest-age series cover only these.
TROUBLE_STATES = (ConfigState.PENDING, ConfigState.APPLYING, ConfigState.REBOOTING, ConfigState.FAILED)
ROW_REMAP_FAILURE_XID = 64  # "row remapper failure" (nvidia-contracts.md §10)


class FleetCollector:
    """Nodes, GPUs, clusters and agents; one query per family group."""

    def collect(self):
        now = timezone.now()
        yield from self._nodes(now)
        yield from self._gpus()
        yield from self._clusters()
        yield from self._agents(now)

    def _nodes(self, now):
        nodes = GaugeMetricFamily(
            "tessera_nodes",
            "Live nodes by the state of their sharing config as the cluster reports it "
            "(nvidia.com/mig.config.state, or the node agent).",
            labels=["cluster", "pool", "state"],
        )
        oldest = GaugeMetricFamily(
            "tessera_nodes_config_state_oldest_seconds",
            "How long the longest-waiting node of the group has been in this state (pending, applying, rebooting, "
            "failed only).",
            labels=["cluster", "pool", "state"],
        )
        rows = (
            Node.objects.live()
            .values_list("cluster__name", "pool__name", "config_state")
            .annotate(n=Count("pk"), since=Min("config_state_since"))
            .order_by()
        )
        for cluster, pool, state, n, since in rows:
            nodes.add_metric([cluster, pool or "", state], n)
            if state in TROUBLE_STATES and since is not None:
                oldest.add_metric([cluster, pool or "", state], age_seconds(since, now))
        per_node = GaugeMetricFamily(
            "tessera_node_config_state_seconds",
            "Seconds a node has been in a troubled config state (pending, applying, rebooting, failed); only nodes in "
            "those states have this series.",
            labels=["cluster", "node", "state"],
        )
        for cluster, name, state, since in (
            Node.objects.live()
            .filter(config_state__in=TROUBLE_STATES)
            .values_list("cluster__name", "name", "config_state", "config_state_since")
        ):
            per_node.add_metric([cluster, name, state], age_seconds(since, now) or 0.0)
        stale = GaugeMetricFamily(
            "tessera_nodes_stale", "Live nodes whose last observation is too old, by cluster.", labels=["cluster"]
        )
        for cluster, n in (
            Node.objects.live().values_list("cluster__name").annotate(n=Count("pk", filter=stale_q(now))).order_by()
        ):
            stale.add_metric([cluster], n)
        yield from (nodes, oldest, per_node, stale)

    def _gpus(self):
        gpus = GaugeMetricFamily("tessera_gpus", "Live GPUs by product and health.", labels=["product", "health"])
        ecc = GaugeMetricFamily(
            "tessera_gpu_ecc_errors",
            "Volatile ECC errors summed over the live GPUs of a product, as the GPUs report them (type sbe: "
            "single-bit, corrected; dbe: double-bit, uncorrectable).",
            labels=["product", "type"],
        )
        totals = defaultdict(lambda: [0, 0])
        for product, health, n, sbe, dbe in (
            Gpu.objects.live()
            .values_list("product", "health")
            .annotate(n=Count("pk"), sbe=Sum("ecc_sbe_total"), dbe=Sum("ecc_dbe_total"))
            .order_by()
        ):
            gpus.add_metric([product, health], n)
            totals[product][0] += sbe or 0
            totals[product][1] += dbe or 0
        for product, (sbe, dbe) in totals.items():
            ecc.add_metric([product, "sbe"], sbe)
            ecc.add_metric([product, "dbe"], dbe)
        xids = CounterMetricFamily(
            "tessera_gpu_xid_events",
            "XID errors node agents reported, by GPU product and XID.",
            labels=["product", "xid"],
        )
        for product, code, n in (
            GpuEvent.objects.filter(kind=GpuEvent.Kind.XID)
            .values_list("gpu__product", "code")
            .annotate(n=Count("pk"))
            .order_by()
        ):
            xids.add_metric([product, str(code)], n)
        unhealthy = GaugeMetricFamily(
            "tessera_gpu_unhealthy",
            "1 for each unhealthy GPU (only those have the series); reason ecc (uncorrectable ECC errors), row_remap "
            "(XID 64, row remapping failed) or xid (another critical XID).",
            labels=["cluster", "node", "gpu", "product", "reason"],
        )
        for cluster, node, index, product, xid, dbe in (
            Gpu.objects.live()
            .filter(health=GpuHealth.UNHEALTHY)
            .values_list("node__cluster__name", "node__name", "index", "product", "last_xid", "ecc_dbe_total")
        ):
            reason = "ecc" if dbe else ("row_remap" if xid == ROW_REMAP_FAILURE_XID else "xid")
            unhealthy.add_metric([cluster, node, str(index), product, reason], 1)
        yield from (gpus, ecc, xids, unhealthy)

    def _clusters(self):
        reachable = GaugeMetricFamily(
            "tessera_cluster_api_reachable",
            "1 if Tessera's last call to the cluster's API server was answered and its health check passed.",
            labels=["cluster"],
        )
        contact = GaugeMetricFamily(
            "tessera_cluster_last_contact_timestamp_seconds",
            "When the cluster's API server last answered Tessera.",
            labels=["cluster"],
        )
        for name, state, last_contact in Cluster.objects.filter(driver=ClusterDriver.KUBERNETES).values_list(
            "name", "connection_state", "last_contact_at"
        ):
            reachable.add_metric([name], 1 if state == ConnectionState.OK else 0)
            if last_contact is not None:
                contact.add_metric([name], timestamp(last_contact))
        yield from (reachable, contact)

    def _agents(self, now):
        agents = GaugeMetricFamily(
            "tessera_agents",
            "Node agents with an active credential, by state: reporting, stale (missed three reports) or "
            "never_reported.",
            labels=["cluster", "state"],
        )
        oldest = GaugeMetricFamily(
            "tessera_agents_last_report_oldest_seconds",
            "Age of the oldest last report among the cluster's agents that have reported.",
            labels=["cluster"],
        )
        cutoff = agent_stale_cutoff(now)
        seen = "node__agent_last_seen_at"
        for cluster, never, stale, reporting, since in (
            AgentCredential.objects.filter(revoked_at__isnull=True, node__gone_at__isnull=True)
            .values_list("node__cluster__name")
            .annotate(
                never=Count("pk", filter=Q(**{f"{seen}__isnull": True})),
                stale=Count("pk", filter=Q(**{f"{seen}__lt": cutoff})),
                reporting=Count("pk", filter=Q(**{f"{seen}__gte": cutoff})),
                since=Min(seen),
            )
            .order_by()
        ):
            agents.add_metric([cluster, "reporting"], reporting)
            agents.add_metric([cluster, "stale"], stale)
            agents.add_metric([cluster, "never_reported"], never)
            if since is not None:
                oldest.add_metric([cluster], age_seconds(since, now))
        dropped = CounterMetricFamily(
            "tessera_agent_reports_dropped",
            "Buffered agent reports the database would not take, each lost alone (the log names the node).",
            labels=["cluster"],
        )
        for cluster, n in (
            Node.objects.filter(agent_reports_dropped__gt=0)
            .values_list("cluster__name")
            .annotate(n=Sum("agent_reports_dropped"))
            .order_by()
        ):
            dropped.add_metric([cluster], n)
        yield from (agents, oldest, dropped)
