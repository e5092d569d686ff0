"""Fleet pages: access, filters and HTMX partials, pagination, object pages, the MIG drawing, query counts."""

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from fleet import selectors
from tests.factories import ClusterFactory, GpuFactory, MigDeviceFactory, NodeFactory, NodePoolFactory

pytestmark = pytest.mark.django_db

H100 = "NVIDIA-H100-80GB-HBM3"
A30 = "NVIDIA-A30"
HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def client_viewer(client, viewer):
    client.force_login(viewer)
    return client


def make_node(*, product=H100, gpus=2, **kwargs):
    node = NodeFactory(**kwargs)
    for index in range(gpus):
        GpuFactory(node=node, index=index, product=product)
    return node


def table_rows(html: str) -> list[str]:
    """Node names of the rows in a rendered node table."""
    return re.findall(r'<td class="primary"><a href="/nodes/\d+/">([^<]+)</a>', html)


def mig_device_rects(html: str) -> list[dict]:
    rects = re.findall(r'<rect class="mig-device [^"]*"([^>]*)>', html)
    return [dict(re.findall(r'(\w[\w-]*)="([^"]*)"', attrs)) for attrs in rects]


# --- access ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,args",
    [
        ("console:overview", []),
        ("console:overview_stats", []),
        ("fleet:node_list", []),
        ("console:node_detail", [1]),
        ("console:node_state", [1]),
        ("fleet:gpu_list", []),
        ("console:gpu_detail", [1]),
        ("fleet:cluster_list", []),
        ("fleet:cluster_detail", [1]),
        ("fleet:pool_list", []),
        ("console:pool_detail", [1]),
    ],
)
def test_pages_need_login(client, name, args):
    url = reverse(name, args=args)
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login") + "?next=")


def test_login_page_renders_a_labelled_form(client):
    response = client.get(reverse("login"))
    html = response.content.decode()
    assert response.status_code == 200
    assert '<label for="id_username">Username</label>' in html
    assert '<label for="id_password">Password</label>' in html


def test_login_through_the_form_lands_on_the_overview(client, viewer):
    response = client.post(reverse("login"), {"username": "viewer", "password": "pw-for-tests-1"}, follow=True)
    assert response.redirect_chain[-1][0] == reverse("console:overview")
    assert b"Fleet overview" in response.content


def test_navigation_shows_admin_only_to_admins(client, viewer, admin_user):
    client.force_login(viewer)
    html = client.get(reverse("console:overview")).content.decode()
    assert 'href="/admin/"' not in html
    assert "API token" in html and 'action="/logout/"' in html
    client.force_login(admin_user)
    assert 'href="/admin/"' in client.get(reverse("console:overview")).content.decode()


def test_token_page_shows_a_new_token_once_and_a_rotate_form(client_viewer, viewer):
    assert "no API token yet" in client_viewer.get(reverse("token_detail")).content.decode()
    made = client_viewer.post(reverse("token_detail"))
    token = made.context["plain"]
    assert f'value="{token}"' in made.content.decode()
    html = client_viewer.get(reverse("token_detail")).content.decode()
    assert token not in html and "stops working immediately" in html
    assert client_viewer.post(reverse("token_detail")).context["plain"] != token


# --- overview --------------------------------------------------------------------------------------------------


def test_empty_fleet_says_how_to_add_a_cluster(client_viewer):
    html = client_viewer.get(reverse("console:overview")).content.decode()
    assert "No GPUs in the fleet yet" in html
    assert "/api/v1/clusters/" in html and "seed_demo" in html
    assert 'id="node-table"' not in html


def test_overview_shows_totals_charts_attention_and_the_node_table(client_viewer):
    cluster = ClusterFactory(name="prod-east")
    make_node(cluster=cluster, name="h100-a", gpus=2)
    make_node(cluster=cluster, name="a30-a", product=A30, gpus=4, config_state="failed", last_error="GPU 3 in use")
    stale = make_node(cluster=cluster, name="old-node", gpus=1)
    stale.last_seen_at = timezone.now() - timedelta(hours=1)
    stale.save()
    response = client_viewer.get(reverse("console:overview"))
    html = response.content.decode()
    assert response.status_code == 200
    stats = response.context["stats"]
    assert (stats["clusters"], stats["nodes"], stats["gpus"], stats["failed"], stats["stale"]) == (1, 3, 7, 1, 1)
    assert "GPUs by product" in html and "GPUs by sharing mode" in html and "GPUs by cluster" in html
    assert f'href="/gpus/?product={A30}"' in html
    assert 'href="/nodes/?config_state=failed"' in html and 'href="/nodes/?stale=true"' in html
    assert 'hx-get="/overview/stats/"' in html and 'hx-trigger="every 15s"' in html
    assert table_rows(html) == ["a30-a", "h100-a", "old-node"]
    assert "django_htmx/htmx-2.min.js" in html
    assert "X-CSRFToken" in html


def test_attention_badges_are_coloured_only_above_zero(client_viewer):
    cluster = ClusterFactory(name="prod-east")
    make_node(cluster=cluster, name="a30-a", product=A30, config_state="failed")
    html = client_viewer.get(reverse("console:overview_stats")).content.decode()
    attention = html[html.index('<ul class="attention">') : html.index("</ul>", html.index('<ul class="attention">'))]
    badges = dict(
        (label, tone) for tone, label in re.findall(r'<span class="badge badge--(\w+)">([^<]+)</span>', attention)
    )
    assert badges["Failed"] == "failed"  # one failed node: red
    # Nothing stuck, stale, unhealthy, violating or not ready: neutral, not red or amber.
    assert {badges[k] for k in ("Stuck", "Stale", "Unhealthy", "Violations", "Not ready")} == {"zero"}


def test_mig_enabled_counts_agree_between_the_overview_the_gpu_list_and_the_api(client_viewer, viewer, api_client):
    live = NodeFactory(name="live")
    gone = NodeFactory(name="gone", gone_at=timezone.now())
    GpuFactory(node=live, index=0, mig_enabled=True)
    GpuFactory(node=live, index=1, mig_enabled=True, gone_at=timezone.now())
    GpuFactory(node=gone, index=0, mig_enabled=True)  # its node is gone, it was never marked gone itself
    overview = client_viewer.get(reverse("console:overview")).context["stats"]["mig_enabled"]
    listed = client_viewer.get(reverse("fleet:gpu_list"), {"mig_enabled": "true"}).context["page_obj"].paginator.count
    api_client.force_authenticate(viewer)
    api = api_client.get("/api/v1/gpus/", {"mig_enabled": "true"}).json()["count"]
    assert (overview, listed, api) == (1, 1, 1)


def test_overview_stats_partial_is_only_the_stats(client_viewer):
    make_node()
    html = client_viewer.get(reverse("console:overview_stats")).content.decode()
    assert html.lstrip().startswith('<div id="overview-stats"')
    assert "<html" not in html and 'id="node-table"' not in html


def test_overview_htmx_request_returns_only_the_table(client_viewer):
    make_node(name="h100-a")
    make_node(name="a30-a", product=A30)
    response = client_viewer.get(reverse("console:overview"), {"product": A30}, **HTMX)
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="node-table"')
    assert "<html" not in html and "At a glance" not in html and "<form" not in html
    assert table_rows(html) == ["a30-a"]
    assert "stats" not in response.context


@pytest.mark.parametrize("name", ["console:overview", "fleet:node_list", "fleet:gpu_list"])
def test_history_restore_gets_the_whole_page(client_viewer, name):
    make_node()
    response = client_viewer.get(reverse(name), HTTP_HX_HISTORY_RESTORE_REQUEST="true", **HTMX)
    assert b"<html" in response.content and b'<form class="filters"' in response.content


@pytest.mark.parametrize("name", ["console:overview", "fleet:node_list", "fleet:gpu_list"])
def test_list_pages_vary_on_hx_request(client_viewer, name):
    make_node()
    for extra in ({}, HTMX):
        response = client_viewer.get(reverse(name), **extra)
        assert "HX-Request" in response["Vary"]


def test_filter_controls_work_without_javascript(client_viewer):
    make_node()
    html = client_viewer.get(reverse("fleet:node_list")).content.decode()
    form = re.search(r'<form class="filters" method="get" action="/nodes/"[^>]*>', html).group(0)
    assert 'hx-get="/nodes/"' in form and 'hx-trigger="change, submit"' in form
    assert 'hx-target="#node-table"' in html and 'hx-push-url="true"' in html
    assert 'hx-trigger="keyup changed delay:300ms, search"' in html
    for control in ("nodes-q", "nodes-cluster", "nodes-pool", "nodes-product", "nodes-mode", "nodes-config-state"):
        assert f'<label for="{control}">' in html
    assert '<button type="submit" class="btn">Apply</button>' in html


# --- node list: filters, pagination, counts --------------------------------------------------------------------


def test_node_list_filters(client_viewer):
    east, west = ClusterFactory(name="east"), ClusterFactory(name="west")
    pool = NodePoolFactory(cluster=east, name="inference")
    make_node(cluster=east, pool=pool, name="e-mig", observed_mode="mig")
    make_node(cluster=east, name="e-failed", config_state="failed")
    make_node(cluster=west, name="w-a30", product=A30)
    sick = make_node(cluster=west, name="w-sick")
    sick.gpus.filter(index=0).update(health="unhealthy")
    stale = make_node(cluster=west, name="w-stale")
    stale.last_seen_at = timezone.now() - timedelta(hours=2)
    stale.save()

    def rows(**params):
        return table_rows(client_viewer.get(reverse("fleet:node_list"), params, **HTMX).content.decode())

    assert rows(cluster=west.pk) == ["w-a30", "w-sick", "w-stale"]
    assert rows(pool=pool.pk) == ["e-mig"]
    assert rows(product=A30) == ["w-a30"]
    assert rows(mode="mig") == ["e-mig"]
    assert rows(config_state="failed") == ["e-failed"]
    assert rows(unhealthy="true") == ["w-sick"]
    assert rows(stale="true") == ["w-stale"]
    assert rows(q="sick") == ["w-sick"]
    assert rows(ordering="-name")[:2] == ["w-stale", "w-sick"]
    empty = client_viewer.get(reverse("fleet:node_list"), {"q": "nothing-like-this"}, **HTMX).content.decode()
    assert "No nodes match these filters" in empty


def test_gpu_counts_are_not_multiplied_by_a_gpu_filter(client_viewer):
    node = make_node(name="mixed", gpus=3)
    GpuFactory(node=node, index=3, product=A30)
    page = client_viewer.get(reverse("fleet:node_list"), {"product": A30}, **HTMX).context["page_obj"]
    (row,) = page.object_list
    assert row.gpu_count == 4


def test_node_list_paginates_on_the_server(client_viewer):
    cluster = ClusterFactory()
    for i in range(55):
        NodeFactory(cluster=cluster, name=f"node-{i:03d}")
    first = client_viewer.get(reverse("fleet:node_list")).content.decode()
    assert len(table_rows(first)) == 50
    assert "Showing 1–50 of 55 nodes" in first
    assert 'href="/nodes/?page=2" hx-get="/nodes/?page=2" rel="next"' in first
    second = client_viewer.get(reverse("fleet:node_list"), {"page": 2}, **HTMX).content.decode()
    assert table_rows(second) == [f"node-{i:03d}" for i in range(50, 55)]
    assert "Showing 51–55 of 55 nodes" in second


def test_pagination_links_keep_the_filters(client_viewer):
    for i in range(51):
        NodeFactory(name=f"a30-{i:03d}", config_state="failed")
    html = client_viewer.get(reverse("fleet:node_list"), {"config_state": "failed"}).content.decode()
    assert 'href="/nodes/?config_state=failed&amp;page=2"' in html


def _fleet(nodes: int):
    cluster = ClusterFactory()
    pool = NodePoolFactory(cluster=cluster)
    for _ in range(nodes):
        node = NodeFactory(cluster=cluster, pool=pool, observed_mode="mig")
        for index in range(2):
            gpu = GpuFactory(node=node, index=index, mig_enabled=True)
            MigDeviceFactory(gpu=gpu, start=0, profile="3g.40gb", size=4)


@pytest.mark.parametrize("nodes", [2, 40])
def test_overview_query_count_is_bounded(client_viewer, django_assert_max_num_queries, nodes):
    _fleet(nodes)
    # session, user, role; 7 aggregates; 3 filter option lists; count and page of the table;
    # upcoming schedule changes (schedules, node counts; their windows, exceptions and profiles when there are some)
    with django_assert_max_num_queries(17):
        response = client_viewer.get(reverse("console:overview"))
    assert response.status_code == 200


@pytest.mark.parametrize("nodes", [2, 40])
def test_node_and_gpu_lists_query_count_is_bounded(client_viewer, django_assert_max_num_queries, nodes):
    _fleet(nodes)
    for name in ("fleet:node_list", "fleet:gpu_list"):
        # session, user, role; 3 filter option lists; count and page of the table; the page's GPU summaries or MIG
        # device counts
        with django_assert_max_num_queries(9):
            assert client_viewer.get(reverse(name)).status_code == 200


@pytest.mark.parametrize("nodes", [1, 10])
def test_node_page_query_count_is_bounded(client_viewer, django_assert_max_num_queries, nodes):
    _fleet(nodes)
    node = NodeFactory(observed_mode="mig")
    for index in range(8):
        gpu = GpuFactory(node=node, index=index, mig_enabled=True)
        for start in range(7):
            MigDeviceFactory(gpu=gpu, start=start)
    # session, user, role; node; its GPUs; their MIG devices;
    # desired vs observed (pins, GPU shapes; pool defaults and schedule when in a pool), its pin, its change history,
    # its open UUID conflicts
    with django_assert_max_num_queries(11):
        assert client_viewer.get(reverse("console:node_detail", args=[node.pk])).status_code == 200


@pytest.mark.parametrize("gpus", [1, 8])
def test_agent_node_page_with_qos_settings_query_count_is_bounded(
    client_viewer, admin_user, django_assert_max_num_queries, gpus
):
    from core.audit import Actor
    from sharing import services as sharing_services

    pool = NodePoolFactory(cluster=ClusterFactory(driver="agent", kubeconfig_path=""))
    node = NodeFactory(cluster=pool.cluster, pool=pool, host_settings={"thp": "madvise"})
    for index in range(gpus):
        GpuFactory(node=node, index=index, settings={"power_limit_w": 700.0, "persistence_mode": True})
    actor = Actor.for_user(admin_user)
    policy = sharing_services.qos_policy_create(
        actor=actor, name="tuned", transparent_hugepages="never", power_limit_w=600, persistence_mode=True
    )
    sharing_services.pool_set_qos_policy(actor=actor, pool=pool, policy=policy)
    # The list above, plus the pool's QoS state (sharing, schedule), its compliance report and the agent credential.
    with django_assert_max_num_queries(18):
        page = client_viewer.get(reverse("console:node_detail", args=[node.pk])).content.decode()
    assert "Power limit" in page and "differs" in page


# --- node and GPU pages ----------------------------------------------------------------------------------------


def test_node_page_shows_place_state_error_and_gpus(client_viewer):
    cluster = ClusterFactory(name="prod-east")
    pool = NodePoolFactory(cluster=cluster, name="inference")
    node = make_node(
        cluster=cluster,
        pool=pool,
        name="inf-01",
        config_state="failed",
        config_state_since=timezone.now(),
        last_error="MIG Manager: GPU 3 is in use by pod ml/llama",
        observed_mig_config="all-1g.10gb",
        labels={"nvidia.com/gpu.product": H100},
    )
    html = client_viewer.get(reverse("console:node_detail", args=[node.pk])).content.decode()
    assert f'href="/clusters/{cluster.pk}/"' in html and f'href="/pools/{pool.pk}/"' in html
    assert "GPU 3 is in use by pod ml/llama" in html and "callout--failed" in html
    assert "<code>all-1g.10gb</code>" in html
    assert '<details class="disclosure mt-3">' in html and "nvidia.com/gpu.product" in html
    assert f'hx-get="/nodes/{node.pk}/state/"' in html and 'hx-trigger="every 10s"' in html
    assert html.count('class="card gpu-card"') == 2
    assert "79.6 GiB total" in html


def test_node_state_partial_is_only_the_state_section(client_viewer):
    node = make_node(config_state="pending", config_state_since=timezone.now() - timedelta(hours=1))
    html = client_viewer.get(reverse("console:node_state", args=[node.pk])).content.decode()
    assert html.lstrip().startswith('<section id="node-state"')
    assert "Pending since" in html and "too long" in html
    assert "gpu-card" not in html


def test_missing_node_and_gpu_are_404(client_viewer):
    assert client_viewer.get(reverse("console:node_detail", args=[999])).status_code == 404
    assert client_viewer.get(reverse("console:node_state", args=[999])).status_code == 404
    assert client_viewer.get(reverse("console:gpu_detail", args=[999])).status_code == 404


def test_mig_drawing_has_one_block_per_device_at_its_slices(client_viewer):
    node = NodeFactory(observed_mode="mig")
    gpu = GpuFactory(node=node, index=0, mig_enabled=True)
    MigDeviceFactory(gpu=gpu, profile="3g.40gb", start=0, size=4, in_use_by="train/llm-7f")
    MigDeviceFactory(gpu=gpu, profile="2g.20gb", start=4, size=2)
    MigDeviceFactory(gpu=gpu, profile="1g.10gb", start=6, size=1)
    for url in (reverse("console:node_detail", args=[node.pk]), reverse("console:gpu_detail", args=[gpu.pk])):
        html = client_viewer.get(url).content.decode()
        rects = mig_device_rects(html)
        width = selectors.SLICE_WIDTH
        assert [(r["data-profile"], int(r["x"]), int(r["width"])) for r in rects] == [
            ("3g.40gb", 0, 4 * width),
            ("2g.20gb", 4 * width, 2 * width),
            ("1g.10gb", 6 * width, width),
        ]
        assert f'viewBox="0 0 {8 * width} 112"' in html
        assert html.count('<rect class="mig-free"') == 1  # slice 7, hatched
        assert f'fill="url(#mig-hatch-{gpu.pk})"' in html and f'<pattern id="mig-hatch-{gpu.pk}"' in html
        assert "In use by train/llm-7f" in html
        assert "3g.40gb × 1" in html  # legend


def test_mig_drawing_of_an_a30_has_four_slices():
    gpu = GpuFactory(product=A30, mig_enabled=True)
    MigDeviceFactory(gpu=gpu, profile="2g.12gb", start=0, size=2)
    layout = selectors.mig_layout(gpu, gpu.mig_devices.all())
    assert layout.slices == 4
    assert [slot["index"] for slot in layout.free] == [2, 3]


def test_mig_drawing_falls_back_to_eight_slices_for_an_unknown_product():
    assert selectors.memory_slices("NVIDIA-Imaginary-9000") == 8
    assert selectors.memory_slices(f"{H100}-MIG-1g.10gb") == 8


def test_gpu_page_shows_fields_devices_and_neighbours(client_viewer):
    node = NodeFactory(name="inf-02")
    gpu = GpuFactory(node=node, index=3, mig_enabled=True, temperature_c=61.4, power_w=402.0, metrics_at=timezone.now())
    MigDeviceFactory(gpu=gpu, profile="1g.10gb", start=2, size=1, uuid="MIG-1234", in_use_by="ml/bert-0")
    html = client_viewer.get(reverse("console:gpu_detail", args=[gpu.pk])).content.decode()
    assert f'href="/nodes/{node.pk}/"' in html and f'href="/clusters/{node.cluster_id}/"' in html
    assert gpu.uuid in html and "79.6 GiB" in html and "61 °C" in html and "402 W" in html
    assert "MIG-1234" in html and "ml/bert-0" in html and "slices 2–2" in html
    assert "Gone since" not in html


def test_gone_gpu_shows_a_gone_banner(client_viewer):
    gpu = GpuFactory(gone_at=timezone.now() - timedelta(days=1))
    html = client_viewer.get(reverse("console:gpu_detail", args=[gpu.pk])).content.decode()
    assert "Gone since" in html


def test_gpu_list_filters_and_shows_units(client_viewer):
    make_node(name="n1", gpus=2)
    sick = GpuFactory(node=make_node(name="n2", gpus=0), index=0, health="unhealthy", temperature_c=88.0)
    html = client_viewer.get(reverse("fleet:gpu_list"), {"health": "unhealthy"}, **HTMX).content.decode()
    assert html.lstrip().startswith('<div id="gpu-table"')
    assert f'href="/gpus/{sick.pk}/"' in html and html.count('<td class="primary">') == 1
    assert "88 °C" in html and "79.6 GiB" in html


# --- clusters and pools ----------------------------------------------------------------------------------------


def test_an_agent_cluster_is_connected_while_its_agents_report(client_viewer):
    """An agent cluster has no API server: its connection is its agents reporting, not "Never connected"."""
    lab = ClusterFactory(name="lab-west", driver="agent", kubeconfig_path="")
    empty = ClusterFactory(name="lab-empty", driver="agent", kubeconfig_path="")
    node = NodeFactory(cluster=lab, name="l4-00")

    def badges():
        html = client_viewer.get(reverse("fleet:cluster_list")).content.decode()
        detail = client_viewer.get(reverse("fleet:cluster_detail", args=[lab.pk])).content.decode()
        rows = {name: re.search(rf">{name}</a>.*?</tr>", html, re.S).group(0) for name in ("lab-west", "lab-empty")}
        return rows, detail

    rows, detail = badges()
    assert ">Connected</span>" in rows["lab-west"] and "Never connected" not in rows["lab-west"]
    assert ">Connected</span>" in detail.split("</h1>")[1].split("</div>")[0]
    assert ">No agent yet</span>" in rows["lab-empty"] and empty.connection_state == "never"
    node.last_seen_at = timezone.now() - timedelta(hours=1)
    node.save()
    rows, detail = badges()
    assert ">Agents silent</span>" in rows["lab-west"] and ">Connected</span>" not in rows["lab-west"]


def test_cluster_and_pool_pages(client_viewer):
    cluster = ClusterFactory(name="prod-east", connection_state="error", last_error="connection refused")
    pool = NodePoolFactory(cluster=cluster, name="inference", node_selector="tessera.io/pool=inference")
    make_node(cluster=cluster, pool=pool, gpus=3)
    html = client_viewer.get(reverse("fleet:cluster_list")).content.decode()
    assert f'href="/clusters/{cluster.pk}/"' in html and f'href="/gpus/?cluster={cluster.pk}">3</a>' in html
    html = client_viewer.get(reverse("fleet:cluster_detail", args=[cluster.pk])).content.decode()
    assert "connection refused" in html and f'href="/pools/{pool.pk}/"' in html
    assert "kubeconfig" not in html or "path not shown" in html
    assert "/etc/tessera/kubeconfig" not in html
    assert "not read yet" in html
    html = client_viewer.get(reverse("fleet:pool_list")).content.decode()
    assert f'href="/pools/{pool.pk}/"' in html
    html = client_viewer.get(reverse("console:pool_detail", args=[pool.pk])).content.decode()
    assert "tessera.io/pool=inference" in html and f'href="/nodes/?pool={pool.pk}"' in html


@pytest.mark.parametrize(
    ("strategy", "version", "says"),
    [
        ("mixed", "v0.17.0", ["<strong>mixed</strong>", "refuses MPS under mixed", "Older than v0.20.0"]),
        ("single", "v0.20.0", ["<strong>single</strong>", "slices of one profile", "v0.20.0 or later"]),
        ("none", "", ["advertises no MIG slice", "version unknown", "older versions refuse"]),
        ("", "sha256:0f3a", ["<strong>not set</strong>", "each node's device-plugin config decides"]),
    ],
)
def test_cluster_page_says_what_its_mig_strategy_and_plugin_version_mean(client_viewer, strategy, version, says):
    cluster = ClusterFactory(
        name="prod", mig_strategy=strategy, device_plugin_version=version, cluster_policy_read_at=timezone.now()
    )
    html = client_viewer.get(reverse("fleet:cluster_detail", args=[cluster.pk])).content.decode()
    for text in says:
        assert text in html


def test_a_gpu_tessera_does_not_know_says_so_and_what_still_works(client_viewer):
    notice = "Not in Tessera's MIG catalog: passthrough, time-slicing and MPS still work"
    node = NodeFactory()
    for index in range(2):  # as inventory records a model the catalog lacks: not MIG-capable
        GpuFactory(node=node, index=index, product="NVIDIA-Tesla-V100-SXM2-32GB", mig_capable=False)
    response = client_viewer.get(reverse("console:node_detail", args=[node.pk]))
    assert response.status_code == 200 and response.content.decode().count(notice) == 2
    html = client_viewer.get(reverse("console:gpu_detail", args=[node.gpus.first().pk])).content.decode()
    assert notice in html and "Not in MIG catalog" in html
    l4 = GpuFactory(product="NVIDIA-L4", mig_capable=False).node  # known, just not MIG-capable
    html = client_viewer.get(reverse("console:gpu_detail", args=[l4.gpus.get().pk])).content.decode()
    assert notice not in html and "Not MIG-capable" in html
    html = client_viewer.get(reverse("console:node_detail", args=[l4.pk])).content.decode()
    assert notice not in html
