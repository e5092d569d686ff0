"""One FilterSet per fleet model, shared by the HTML lists and the API: the same query string means the same rows."""

import django_filters
from django.db.models import Exists, OuterRef, Q

from fleet.choices import ClusterDriver, ConfigState, ConnectionState, GpuHealth, GpuStack, SharingMode
from fleet.models import Cluster, Gpu, MigDevice, Node, NodePool


class GoneFilter(django_filters.BooleanFilter):
    """Live rows unless asked: `gone=true` lists only what disappeared, leaving it out lists only what is there."""

    def filter(self, qs, value):
        return qs.filter(**{f"{self.field_name}__isnull": value is not True})


class StableOrderingFilter(django_filters.OrderingFilter):
    """Whitelisted ordering with the id as last key, so pages never repeat or skip rows that tie."""

    def filter(self, qs, value):
        qs = super().filter(qs, value)
        return qs.order_by(*qs.query.order_by, "pk") if value else qs


def search_filter(help_text: str = "", *, alias: bool = False):
    """A list's free-text search: `q` as the UI's search boxes name it, and `search` (alias) as DRF names it on the
    other lists; both call the FilterSet's `text_search`."""
    label = "Search (same as q)" if alias else "Search"
    return django_filters.CharFilter(method="text_search", label=label, help_text=help_text)


def cluster_filter(field_name):
    return django_filters.ModelChoiceFilter(field_name=field_name, queryset=Cluster.objects.all(), label="Cluster")


def pool_filter(field_name):
    return django_filters.ModelChoiceFilter(
        field_name=field_name,
        queryset=NodePool.objects.select_related("cluster"),
        null_label="No pool",
        null_value="none",
        label="Pool",
        help_text="Pool id, or `none` for nodes in no pool.",
    )


def node_has_live_gpu(*conditions, **lookups):
    """A live GPU of the outer node matches: filters nodes by their GPUs without the duplicates of a join."""
    return Exists(Gpu.objects.live().filter(*conditions, node=OuterRef("pk"), **lookups))


class ClusterFilterSet(django_filters.FilterSet):
    """Clusters by driver and connection health."""

    q = search_filter()
    search = search_filter(alias=True)
    driver = django_filters.ChoiceFilter(choices=ClusterDriver.choices)
    connection_state = django_filters.ChoiceFilter(choices=ConnectionState.choices)
    ordering = StableOrderingFilter(fields=("name", "driver", "connection_state", "last_contact_at", "created_at"))

    class Meta:
        model = Cluster
        fields: list[str] = []

    def text_search(self, queryset, name, value):
        return queryset.filter(Q(name__icontains=value) | Q(description__icontains=value))


class NodePoolFilterSet(django_filters.FilterSet):
    """Pools by cluster."""

    q = search_filter()
    search = search_filter(alias=True)
    cluster = cluster_filter("cluster")
    cluster_name = django_filters.CharFilter(field_name="cluster__name")
    ordering = StableOrderingFilter(fields=(("cluster__name", "cluster"), "name", "created_at"))

    class Meta:
        model = NodePool
        fields: list[str] = []

    def text_search(self, queryset, name, value):
        return queryset.filter(Q(name__icontains=value) | Q(description__icontains=value))


class NodeFilterSet(django_filters.FilterSet):
    """Nodes by place, readiness, sharing state and freshness, and by the GPUs they hold (live GPUs only)."""

    q = search_filter("Node name, GPU UUID or PCI bus id.")
    search = search_filter("Node name, GPU UUID or PCI bus id.", alias=True)
    cluster = cluster_filter("cluster")
    cluster_name = django_filters.CharFilter(field_name="cluster__name")
    pool = pool_filter("pool")
    product = django_filters.CharFilter(method="has_product", label="GPU product")
    mig_capable = django_filters.BooleanFilter(method="has_gpu_with", label="Has a MIG-capable GPU")
    mig_enabled = django_filters.BooleanFilter(method="has_gpu_with", label="Has a GPU in MIG mode")
    unhealthy = django_filters.BooleanFilter(method="has_unhealthy_gpu", label="Has an unhealthy GPU")
    mode = django_filters.ChoiceFilter(field_name="observed_mode", choices=SharingMode.choices, label="Sharing mode")
    config_state = django_filters.ChoiceFilter(choices=ConfigState.choices)
    gpu_stack = django_filters.ChoiceFilter(choices=GpuStack.choices, label="GPU stack")
    ready = django_filters.BooleanFilter()
    stale = django_filters.BooleanFilter(method="filter_stale", label="Stale")
    gone = GoneFilter(field_name="gone_at", label="Gone")
    ordering = StableOrderingFilter(
        fields=(
            ("cluster__name", "cluster"),
            ("pool__name", "pool"),
            "name",
            "ready",
            ("observed_mode", "mode"),
            "config_state",
            "last_seen_at",
        )
    )

    class Meta:
        model = Node
        fields: list[str] = []

    def text_search(self, queryset, name, value):
        gpu_match = node_has_live_gpu(Q(uuid__icontains=value) | Q(pci_bus_id__icontains=value))
        return queryset.filter(Q(name__icontains=value) | gpu_match)

    def has_product(self, queryset, name, value):
        return queryset.filter(node_has_live_gpu(product=value))

    def has_gpu_with(self, queryset, name, value):
        exists = node_has_live_gpu(**{name: True})
        return queryset.filter(exists if value else ~exists)

    def has_unhealthy_gpu(self, queryset, name, value):
        exists = Exists(Gpu.objects.live().unhealthy().filter(node=OuterRef("pk")))
        return queryset.filter(exists if value else ~exists)

    def filter_stale(self, queryset, name, value):
        return queryset.stale() if value else queryset.fresh()


class GpuFilterSet(django_filters.FilterSet):
    """GPUs by their own state and by their node's place, sharing mode, readiness and freshness."""

    q = search_filter("Node name, GPU UUID or PCI bus id.")
    search = search_filter("Node name, GPU UUID or PCI bus id.", alias=True)
    cluster = cluster_filter("node__cluster")
    cluster_name = django_filters.CharFilter(field_name="node__cluster__name")
    pool = pool_filter("node__pool")
    node = django_filters.NumberFilter(field_name="node")
    product = django_filters.CharFilter()
    mig_capable = django_filters.BooleanFilter()
    mig_enabled = django_filters.BooleanFilter()
    health = django_filters.ChoiceFilter(choices=GpuHealth.choices)
    mode = django_filters.ChoiceFilter(
        field_name="node__observed_mode", choices=SharingMode.choices, label="Sharing mode"
    )
    config_state = django_filters.ChoiceFilter(field_name="node__config_state", choices=ConfigState.choices)
    ready = django_filters.BooleanFilter(field_name="node__ready")
    stale = django_filters.BooleanFilter(method="filter_stale", label="Node stale")
    gone = GoneFilter(field_name="gone_at", label="Gone")
    ordering = StableOrderingFilter(
        fields=(
            ("node__name", "node"),
            "index",
            "product",
            "health",
            "utilization_pct",
            "memory_used_mib",
            "temperature_c",
            "power_w",
            "metrics_at",
        )
    )

    class Meta:
        model = Gpu
        fields: list[str] = []

    def text_search(self, queryset, name, value):
        return queryset.filter(
            Q(node__name__icontains=value) | Q(uuid__icontains=value) | Q(pci_bus_id__icontains=value)
        )

    def filter_stale(self, queryset, name, value):
        nodes = Node.objects.stale() if value else Node.objects.fresh()
        return queryset.filter(node__in=nodes.values("pk"))


class MigDeviceFilterSet(django_filters.FilterSet):
    """MIG devices by GPU, node, cluster, profile and use; those of gone GPUs only with `gone=true`."""

    q = search_filter("MIG or GPU UUID, node name, user.")
    search = search_filter("MIG or GPU UUID, node name, user.", alias=True)
    cluster = cluster_filter("gpu__node__cluster")
    node = django_filters.NumberFilter(field_name="gpu__node")
    gpu = django_filters.NumberFilter(field_name="gpu")
    profile = django_filters.CharFilter()
    in_use = django_filters.BooleanFilter(method="filter_in_use", label="In use")
    gone = GoneFilter(field_name="gpu__gone_at", label="GPU gone")
    ordering = StableOrderingFilter(fields=(("gpu__node__name", "node"), "gpu", "start", "profile", "in_use_by"))

    class Meta:
        model = MigDevice
        fields: list[str] = []

    def text_search(self, queryset, name, value):
        return queryset.filter(
            Q(uuid__icontains=value)
            | Q(gpu__uuid__icontains=value)
            | Q(gpu__node__name__icontains=value)
            | Q(in_use_by__icontains=value)
        )

    def filter_in_use(self, queryset, name, value):
        return queryset.in_use() if value else queryset.filter(in_use_by="")
