"""Sharing pages: profile list, page, editor (live validation, service errors per field), delete, preview,
assign (and roll out), pins from the preview and the node page; roles on every POST."""

import re

import pytest
from django.urls import reverse
from django.utils import timezone

from core.audit import Actor
from core.models import AuditEvent
from scheduling import services as schedule_services
from sharing import services
from sharing.models import NodePin, PoolSharing, SharingProfile
from tests.factories import ClusterFactory, GpuFactory, NodeFactory, NodePoolFactory, PodFactory
from worker.models import Rollout

pytestmark = pytest.mark.django_db

H100 = "NVIDIA-H100-80GB-HBM3"
A30 = "NVIDIA-A30"
HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def actor(admin_user):
    return Actor.for_user(admin_user)


@pytest.fixture
def mig7(actor):
    return services.profile_create(
        actor=actor, name="mig-7", mode="mig", target_products=[H100], mig_layouts={"all": {"1g.10gb": 7}}
    )


def login(client, user):
    client.force_login(user)
    return client


def make_node(*, pool=None, product=H100, gpus=2, cluster=None, **kwargs):
    cluster = cluster or (pool.cluster if pool else ClusterFactory(driver="agent", kubeconfig_path=""))
    node = NodeFactory(cluster=cluster, pool=pool, allocatable={"nvidia.com/gpu": gpus}, **kwargs)
    for index in range(gpus):
        GpuFactory(node=node, index=index, product=product)
    return node


def editor_data(**overrides) -> dict:
    data = {
        "name": "mig-small",
        "description": "",
        "mode": "mig",
        "target_products": [H100],
        "mig_layout_all": "1g.10gb x7",
        "mig_strategy": "mixed",
        "replicas": "1",
        "time_slice_interval": "default",
        "gpu-TOTAL_FORMS": "2",
        "gpu-INITIAL_FORMS": "0",
        "gpu-MIN_NUM_FORMS": "0",
        "gpu-MAX_NUM_FORMS": "64",
        "gpu-0-index": "",
        "gpu-0-layout": "",
        "gpu-1-index": "",
        "gpu-1-layout": "",
    }
    data.update(overrides)
    return data


def slot(html: str, name: str) -> str:
    """The text of an error slot (id err-<name>) beside a field."""
    match = re.search(rf'<div class="field__error[^"]*" id="err-{re.escape(name)}"[^>]*>(.*?)</div>', html, re.S)
    assert match, f"no error slot for {name}"
    return re.sub(r"<[^>]+>", " ", match.group(1)).strip()


def device_rects(html: str) -> list[dict]:
    rects = re.findall(r'<rect class="mig-device [^"]*"([^>]*)>', html)
    return [dict(re.findall(r'(\w[\w-]*)="([^"]*)"', attrs)) for attrs in rects]


# --- access ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,args",
    [
        ("sharing:profile_list", []),
        ("sharing:profile_create", []),
        ("sharing:profile_detail", [1]),
        ("sharing:profile_update", [1]),
        ("sharing:profile_delete", [1]),
        ("console:profile_preview", [1]),
    ],
)
def test_pages_need_login(client, name, args):
    response = client.get(reverse(name, args=args))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


@pytest.mark.parametrize(
    "name,needs",
    [
        ("sharing:profile_create", "admin"),
        ("sharing:profile_update", "admin"),
        ("sharing:profile_validate", "admin"),
        ("sharing:profile_delete", "admin"),
        ("console:profile_assign", "operator"),
        ("console:profile_pin", "operator"),
        ("sharing:node_pin", "operator"),
        ("sharing:node_unpin", "operator"),
    ],
)
def test_every_post_is_refused_below_its_role(client, viewer, operator, mig7, name, needs):
    node = make_node()
    pk = node.pk if name.startswith("sharing:node_") else mig7.pk
    no_args = ("sharing:profile_validate", "sharing:profile_create")
    url = reverse(name) if name in no_args else reverse(name, args=[pk])
    refused = [viewer] if needs == "operator" else [viewer, operator]
    for user in refused:
        login(client, user)
        assert client.post(url, editor_data()).status_code == 403
    assert SharingProfile.objects.count() == 1 and not NodePin.objects.exists() and not PoolSharing.objects.exists()


def test_editor_pages_are_admin_only_and_buttons_hidden(client, viewer, operator, mig7):
    for user in (viewer, operator):
        login(client, user)
        assert client.get(reverse("sharing:profile_create")).status_code == 403
        assert client.get(reverse("sharing:profile_update", args=[mig7.pk])).status_code == 403
        html = client.get(reverse("sharing:profile_list")).content.decode()
        assert 'href="/profiles/new/"' not in html
        html = client.get(mig7.get_absolute_url()).content.decode()
        assert f'href="/profiles/{mig7.pk}/edit/"' not in html
    # operators get the assign / pin forms, viewers do not
    assert "Assign to a pool" in html
    login(client, viewer)
    assert "Assign to a pool" not in client.get(mig7.get_absolute_url()).content.decode()


def test_forbidden_page_explains_the_roles(client, viewer):
    login(client, viewer)
    response = client.get(reverse("sharing:profile_create"))
    assert response.status_code == 403 and b"admins edit profiles and schedules" in response.content


# --- list and page ---------------------------------------------------------------------------------------------


def test_list_shows_mode_layout_products_pools_and_pins(client, viewer, actor, mig7):
    pool = NodePoolFactory(name="inference")
    node = make_node(pool=pool)
    services.pool_set_profile(actor=actor, pool=pool, profile=mig7)
    services.node_pin_profile(actor=actor, node=node, profile=mig7)
    services.profile_create(actor=actor, name="ts-4", mode="time_slicing", target_products=[A30], replicas=4)
    html = login(client, viewer).get(reverse("sharing:profile_list")).content.decode()
    assert f'href="/profiles/{mig7.pk}/"' in html
    assert "1g.10gb ×7" in html and "every GPU" in html
    assert f'href="/pools/{pool.pk}/">{pool.cluster.name} / inference</a>' in html
    assert "Time-slicing" in html and "4 replicas per GPU" in html and ">A30<" in html


@pytest.mark.parametrize("count", [2, 20])
def test_list_query_count_is_bounded(client, viewer, actor, django_assert_max_num_queries, count):
    for i in range(count):
        profile = services.profile_create(
            actor=actor, name=f"p{i}", mode="mig", target_products=[H100], mig_layouts={"all": {"3g.40gb": 2}}
        )
        services.pool_set_profile(actor=actor, pool=NodePoolFactory(), profile=profile)
    login(client, viewer)
    # session, user, role; profiles with pin counts; their pools with clusters
    with django_assert_max_num_queries(6):
        assert client.get(reverse("sharing:profile_list")).status_code == 200


def test_profile_page_draws_the_layout_per_product(client, viewer, actor):
    profile = services.profile_create(
        actor=actor,
        name="mixed",
        mode="mig",
        target_products=[H100, "NVIDIA-A100-SXM4-80GB"],
        mig_layouts={"all": {"1g.10gb": 1}, "1": None},
    )
    html = login(client, viewer).get(profile.get_absolute_url()).content.decode()
    assert "NVIDIA H100 80GB HBM3" in html and "NVIDIA A100-SXM4-80GB" in html
    assert "GPU 1" in html and "MIG off" in html
    assert html.count('<rect class="mig-device') == 2  # one 1g.10gb drawn per product
    assert "nvidia.com/mig-1g.10gb: 1" in html


def test_mps_profile_page_says_what_each_clusters_device_plugin_does(client, viewer, admin_user, actor):
    now = timezone.now()
    ClusterFactory(
        name="old-plugin", mig_strategy="single", device_plugin_version="v0.17.0", cluster_policy_read_at=now
    )
    ClusterFactory(name="new-plugin", mig_strategy="", device_plugin_version="v0.20.0", cluster_policy_read_at=now)
    ClusterFactory(name="mixed-one", mig_strategy="mixed", device_plugin_version="v0.20.0", cluster_policy_read_at=now)
    ClusterFactory(name="never-read")
    profile = services.profile_create(actor=actor, name="mps-4", mode="mps", target_products=[H100], replicas=4)
    html = login(client, viewer).get(profile.get_absolute_url()).content.decode()
    section = html[html.index('id="clusters-heading"') :]
    assert section.index("mixed-one") < section.index("new-plugin") < section.index("old-plugin")
    assert "never-read" not in section
    assert "Older than v0.20.0: under MPS it refuses every request for more than one replica" in section
    assert "v0.20.0 or later: an MPS client may ask for more than one replica" in section
    assert "Refused</span> cluster mixed-one&#x27;s ClusterPolicy sets spec.mig.strategy=mixed" in section
    html = login(client, admin_user).get(reverse("sharing:profile_update", args=[profile.pk])).content.decode()
    assert "device plugin v0.20.0 and later honour it either way" in html
    assert "Older than v0.20.0" in html and "spec.mig.strategy=mixed, under which" in html


# --- editor ----------------------------------------------------------------------------------------------------


def test_editor_offers_the_gpus_the_fleet_reports_outside_the_mig_catalog(client, admin_user):
    make_node(product="NVIDIA-Tesla-V100-SXM2-32GB", gpus=1)
    html = login(client, admin_user).get(reverse("sharing:profile_create")).content.decode()
    assert "NVIDIA-Tesla-V100-SXM2-32GB · not in the MIG catalog (no MIG)" in html
    data = editor_data(
        name="v100-ts", mode="time_slicing", target_products=["NVIDIA-Tesla-V100-SXM2-32GB"], replicas="4"
    )
    response = client.post(reverse("sharing:profile_create"), data)
    assert response.status_code == 302, response.content.decode()[:2000]
    assert SharingProfile.objects.get(name="v100-ts").target_products == ["NVIDIA-Tesla-V100-SXM2-32GB"]


def test_create_a_mig_profile(client, admin_user):
    response = login(client, admin_user).post(reverse("sharing:profile_create"), editor_data())
    profile = SharingProfile.objects.get(name="mig-small")
    assert response.status_code == 302 and response["Location"] == profile.get_absolute_url()
    assert (profile.mode, profile.target_products, profile.mig_layouts) == ("mig", [H100], {"all": {"1g.10gb": 7}})
    assert AuditEvent.objects.filter(action="profile.create", actor_label="admin").exists()


def test_create_with_per_gpu_rows(client, admin_user):
    data = editor_data(**{"gpu-0-index": "7", "gpu-0-layout": "off", "gpu-1-index": "3", "gpu-1-layout": "3g.40gb x2"})
    login(client, admin_user).post(reverse("sharing:profile_create"), data)
    profile = SharingProfile.objects.get(name="mig-small")
    assert profile.mig_layouts == {"all": {"1g.10gb": 7}, "7": None, "3": {"3g.40gb": 2}}


def test_refused_layout_shows_the_reason_beside_the_field(client, admin_user):
    response = login(client, admin_user).post(
        reverse("sharing:profile_create"), editor_data(mig_layout_all="1g.10gb x8")
    )
    html = response.content.decode()
    assert response.status_code == 400 and not SharingProfile.objects.exists()
    assert "NVIDIA-H100-80GB-HBM3 has 7 compute slices; 1g.10gb × 8 needs 8" in slot(html, "mig_layout_all")
    assert "Does not fit" in html and 'value="1g.10gb x8"' in html


def test_unreadable_layout_and_per_gpu_errors_go_to_their_row(client, admin_user):
    data = editor_data(mig_layout_all="1g.10gb xx", **{"gpu-1-index": "2", "gpu-1-layout": "7g.80gb x2"})
    html = login(client, admin_user).post(reverse("sharing:profile_create"), data).content.decode()
    assert "write terms like" in slot(html, "mig_layout_all")
    assert "7g.80gb" in slot(html, "gpu-1-layout")


def test_duplicate_name_is_shown_on_the_name_field(client, admin_user, mig7):
    html = login(client, admin_user).post(reverse("sharing:profile_create"), editor_data(name="mig-7")).content.decode()
    assert "already exists" in slot(html, "name")


def test_fields_of_other_modes_are_ignored(client, admin_user):
    data = editor_data(
        name="slices", mode="time_slicing", target_products=[A30], replicas="4", mps_active_thread_percentage="50"
    )
    response = login(client, admin_user).post(reverse("sharing:profile_create"), data)
    assert response.status_code == 302
    profile = SharingProfile.objects.get(name="slices")
    assert (profile.mig_layouts, profile.replicas, profile.mps_active_thread_percentage) == ({}, 4, None)


def test_spec_errors_land_on_their_fields(client, admin_user):
    data = editor_data(mode="mps", target_products=[H100], replicas="64", mps_active_thread_percentage="150")
    html = login(client, admin_user).post(reverse("sharing:profile_create"), data).content.decode()
    assert "at most 48 replicas" in slot(html, "replicas")
    assert "between 1 and 100" in slot(html, "mps_active_thread_percentage")


def test_live_validation_returns_drawing_and_field_messages_out_of_band(client, admin_user):
    login(client, admin_user)
    html = client.post(reverse("sharing:profile_validate"), editor_data(), **HTMX).content.decode()
    assert html.lstrip().startswith('<section id="profile-drawings"') and "<html" not in html
    rects = device_rects(html)
    assert [(r["data-profile"], r["data-start"]) for r in rects] == [("1g.10gb", str(i)) for i in range(7)]
    assert html.count('class="mig-free"') == 1 and "Fits" in html
    assert 'id="err-mig_layout_all" aria-live="polite" hx-swap-oob="innerHTML"></div>' in html
    bad = client.post(reverse("sharing:profile_validate"), editor_data(mig_layout_all="1g.10gb x8", name=""), **HTMX)
    html = bad.content.decode()
    assert "Does not fit" in html and "has 7 compute slices; 1g.10gb × 8 needs 8" in html
    assert "needs 8" in slot(html, "mig_layout_all")
    assert slot(html, "name") == ""  # no "required" nagging while typing


def test_editor_form_posts_live_validation_as_the_admin_types(client, admin_user):
    html = login(client, admin_user).get(reverse("sharing:profile_create")).content.decode()
    form = re.search(r'<form id="profile-form"[^>]*>', html).group(0)
    assert 'hx-post="/profiles/validate/"' in form
    assert 'hx-trigger="input changed delay:300ms, change, tessera:edited"' in form
    assert 'method="post"' in form and 'action="/profiles/new/"' in form
    assert 'data-modes="mig"' in html and 'data-modes="mps"' in html


def test_edit_shows_the_stored_layout_and_saves(client, admin_user, mig7):
    login(client, admin_user)
    html = client.get(reverse("sharing:profile_update", args=[mig7.pk])).content.decode()
    assert 'value="1g.10gb ×7"' in html and 'value="mig-7"' in html
    data = editor_data(name="mig-7", mig_layout_all="3g.40gb x1 + 2g.20gb x1 + 1g.10gb x1")
    assert client.post(reverse("sharing:profile_update", args=[mig7.pk]), data).status_code == 302
    mig7.refresh_from_db()
    assert mig7.mig_layouts == {"all": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}}


def test_edit_refused_when_the_change_does_not_fit_nodes_using_it(client, admin_user, actor, mig7):
    pool = NodePoolFactory()
    make_node(pool=pool)
    services.pool_set_profile(actor=actor, pool=pool, profile=mig7)
    data = editor_data(name="mig-7", target_products=[H100, A30], mig_layout_all="1g.6gb x4")
    response = login(client, admin_user).post(reverse("sharing:profile_update", args=[mig7.pk]), data)
    assert response.status_code == 400
    assert "1g.6gb" in response.content.decode()


def test_delete_in_use_is_409_with_the_reason(client, admin_user, actor, mig7):
    pool = NodePoolFactory(name="inference")
    services.pool_set_profile(actor=actor, pool=pool, profile=mig7)
    login(client, admin_user)
    assert b"Delete mig-7?" in client.get(reverse("sharing:profile_delete", args=[mig7.pk])).content
    response = client.post(reverse("sharing:profile_delete", args=[mig7.pk]))
    assert response.status_code == 409 and b"is in use" in response.content
    services.pool_set_profile(actor=actor, pool=pool, profile=None)
    response = client.post(reverse("sharing:profile_delete", args=[mig7.pk]))
    assert response.status_code == 302 and not SharingProfile.objects.exists()


# --- preview, assign, pin --------------------------------------------------------------------------------------


@pytest.fixture
def pool_with_nodes():
    pool = NodePoolFactory(name="inference", cluster=ClusterFactory(driver="agent", kubeconfig_path=""))
    busy = make_node(pool=pool, name="inf-00")
    make_node(pool=pool, name="inf-01")
    PodFactory(node=busy, namespace="ml", name="bert-serve", gpu_resources={"nvidia.com/gpu": 1})
    return pool


def test_pool_preview_shows_before_after_disruption_and_pods(client, viewer, mig7, pool_with_nodes):
    url = reverse("console:profile_preview", args=[mig7.pk]) + f"?pool={pool_with_nodes.pk}"
    response = login(client, viewer).get(url)
    html = response.content.decode()
    assert response.status_code == 200
    assert response.context["summary"] == {
        "nodes": 2,
        "changing": 2,
        "refused": 0,
        "resetting": 2,
        "gpus_resetting": 4,
        "pods_losing": 1,
    }
    # "GPU resets" counts GPUs (two per node here), and says over how many nodes.
    assert re.search(
        r"GPU resets</span><span class=\"stat__value\">4</span>[^<]*<[^>]*>GPUs switching MIG mode, on 2 nodes", html
    )
    assert "MIG mode changes on 4 GPUs of 2 nodes" in html
    assert "nvidia.com/gpu: 2" in html and "nvidia.com/mig-1g.10gb: 14" in html
    assert "MIG mode changes: GPU reset" in html and "GPU 0, 1" in html
    assert "ml/bert-serve" in html
    assert "Assign mig-7 to inference" not in html  # viewers see, operators confirm


def test_node_preview_and_refusal_reasons(client, operator, mig7):
    h100, a30 = make_node(name="h"), make_node(name="a", product=A30)
    url = reverse("console:profile_preview", args=[mig7.pk]) + f"?nodes={h100.pk},{a30.pk}"
    html = login(client, operator).get(url).content.decode()
    assert "Refused" in html and "the profile targets NVIDIA-H100-80GB-HBM3; the node has NVIDIA-A30" in html
    assert "Pin 2 nodes to mig-7" in html and "disabled" in html


def test_preview_names_the_cluster_and_rule_its_mig_strategy_breaks(client, operator, actor):
    cluster = ClusterFactory(name="prod-east", mig_strategy="mixed")
    node = make_node(cluster=cluster, name="h")
    mps = services.profile_create(actor=actor, name="mps-4", mode="mps", target_products=[H100], replicas=4)
    url = reverse("console:profile_preview", args=[mps.pk]) + f"?nodes={node.pk}"
    response = login(client, operator).get(url)
    assert response.status_code == 400
    html = response.content.decode()
    assert "mps-4 cannot run there: cluster prod-east&#x27;s ClusterPolicy sets spec.mig.strategy=mixed" in html
    assert "Pin 1 node to mps-4" not in html
    response = client.post(reverse("console:profile_pin", args=[mps.pk]), {"nodes": [node.pk]})
    assert response.status_code == 400 and not NodePin.objects.exists()


def test_preview_without_scope_asks_for_one(client, viewer, mig7):
    response = login(client, viewer).get(reverse("console:profile_preview", args=[mig7.pk]))
    assert response.status_code == 200 and b"Preview on which nodes?" in response.content
    response = client.get(reverse("console:profile_preview", args=[mig7.pk]), {"nodes": "x"})
    assert response.status_code == 400 and b"Give node ids" in response.content


def test_profile_page_assign_form_goes_to_the_preview_first(client, operator, mig7, pool_with_nodes):
    html = login(client, operator).get(mig7.get_absolute_url()).content.decode()
    form = re.search(r'<form class="card__body stack" method="get" action="([^"]+)">', html)
    assert form.group(1) == reverse("console:profile_preview", args=[mig7.pk])
    assert f'<option value="{pool_with_nodes.pk}">' in html


def test_assign_from_the_preview(client, operator, mig7, pool_with_nodes):
    login(client, operator)
    url = reverse("console:profile_preview", args=[mig7.pk]) + f"?pool={pool_with_nodes.pk}"
    assert b"Assign to pool" in client.get(url).content
    response = client.post(reverse("console:profile_assign", args=[mig7.pk]), {"pool": pool_with_nodes.pk})
    assert response.status_code == 302 and response["Location"] == mig7.get_absolute_url()
    assert PoolSharing.objects.get(pool=pool_with_nodes).profile == mig7
    assert not Rollout.objects.exists()


def test_assign_and_roll_out_now_lands_on_the_rollout(client, operator, mig7, pool_with_nodes):
    data = {
        "pool": pool_with_nodes.pk,
        "rollout_now": "on",
        "batch_size": "1",
        "canary_count": "1",
        "max_failures": "1",
        "busy_policy": "drain",
        "wait_minutes": "5",
        "on_failure": "pause",
    }
    response = login(client, operator).post(reverse("console:profile_assign", args=[mig7.pk]), data)
    rollout = Rollout.objects.get()
    assert rollout.on_failure == "pause"
    assert response.status_code == 302 and response["Location"] == rollout.get_absolute_url()
    assert (rollout.batch_size, rollout.busy_policy, rollout.wait_minutes, rollout.changes.count()) == (
        1,
        "drain",
        5,
        2,
    )
    assert rollout.actor_label == "operator"


def test_assign_over_htmx_answers_with_hx_location(client, operator, mig7, pool_with_nodes):
    response = login(client, operator).post(
        reverse("console:profile_assign", args=[mig7.pk]), {"pool": pool_with_nodes.pk}, **HTMX
    )
    assert response.status_code == 200 and mig7.get_absolute_url() in response["HX-Location"]


def test_refused_assignment_is_shown_and_nothing_changes(client, operator, mig7):
    pool = NodePoolFactory(name="a30s")
    make_node(pool=pool, product=A30)
    response = login(client, operator).post(
        reverse("console:profile_assign", args=[mig7.pk]),
        {
            "pool": pool.pk,
            "rollout_now": "on",
            "batch_size": "2",
            "canary_count": "1",
            "max_failures": "1",
            "busy_policy": "wait",
            "wait_minutes": "30",
        },
    )
    html = response.content.decode()
    assert response.status_code == 400 and "Not assigned" in html
    assert "does not fit 1 node(s) of pool a30s" in html or "the node has NVIDIA-A30" in html
    assert not PoolSharing.objects.exists() and not Rollout.objects.exists()


def test_pin_from_a_node_preview(client, operator, mig7):
    node = make_node(name="inf-09")
    login(client, operator)
    response = client.post(reverse("console:profile_pin", args=[mig7.pk]), {"nodes": [node.pk], "reason": "long run"})
    assert response.status_code == 302 and response["Location"] == node.get_absolute_url()
    pin = NodePin.objects.get()
    assert (pin.node, pin.profile, pin.reason, pin.pinned_by.username) == (node, mig7, "long run", "operator")


def test_node_page_pin_previews_first_or_pins_at_once_and_unpins(client, operator, mig7):
    node = make_node(name="inf-10")
    login(client, operator)
    html = client.get(node.get_absolute_url()).content.decode()
    assert f'action="/nodes/{node.pk}/pin/"' in html and "Preview impact" in html
    response = client.post(reverse("sharing:node_pin", args=[node.pk]), {"profile": mig7.pk, "action": "preview"})
    assert response["Location"] == reverse("console:profile_preview", args=[mig7.pk]) + f"?nodes={node.pk}"
    assert not NodePin.objects.exists()
    client.post(reverse("sharing:node_pin", args=[node.pk]), {"profile": mig7.pk, "action": "pin", "reason": "debug"})
    assert NodePin.objects.get().reason == "debug"
    html = client.get(node.get_absolute_url()).content.decode()
    assert "Pinned to" in html and f'action="/nodes/{node.pk}/unpin/"' in html and "pinned</span>" in html
    client.post(reverse("sharing:node_unpin", args=[node.pk]))
    assert not NodePin.objects.exists()


def test_node_page_pin_refused_says_why(client, operator, mig7):
    node = make_node(name="a30-node", product=A30)
    login(client, operator)
    response = client.post(
        reverse("sharing:node_pin", args=[node.pk]), {"profile": mig7.pk, "action": "pin"}, follow=True
    )
    assert b"mig-7 does not fit a30-node" in response.content and not NodePin.objects.exists()


# --- the node page's desired vs observed card -------------------------------------------------------------------


def test_node_page_shows_desired_vs_observed_and_drift(client, viewer, actor, mig7, pool_with_nodes):
    node = pool_with_nodes.nodes.get(name="inf-00")
    node.config_state = "failed"
    node.last_error = "GPU 1 in use by pod ml/bert-serve"
    node.save()
    services.pool_set_profile(actor=actor, pool=pool_with_nodes, profile=mig7)
    html = login(client, viewer).get(node.get_absolute_url()).content.decode()
    assert "Desired vs observed" in html and "badge--drift" in html and "pool default" in html
    assert "tessera-mig-" in html and "failed: GPU 1 in use by pod ml/bert-serve" in html
    assert f'action="/nodes/{node.pk}/pin/"' not in html  # viewers cannot pin


def test_node_page_desired_state_from_a_schedule(client, viewer, actor, mig7, pool_with_nodes):
    whole = services.profile_create(actor=actor, name="whole", mode="passthrough", target_products=[H100])
    schedule_services.schedule_create(
        actor=actor,
        pool=pool_with_nodes,
        name="always",
        time_zone="UTC",
        baseline_profile=whole,
        windows=[],
    )
    node = pool_with_nodes.nodes.first()
    html = login(client, viewer).get(node.get_absolute_url()).content.decode()
    assert "from schedule" in html and f'href="/schedules/{node.pool.schedule.pk}/"' in html


def test_node_page_in_sync(client, viewer, actor):
    whole = services.profile_create(actor=actor, name="whole", mode="passthrough", target_products=[H100])
    node = make_node(name="n-sync")
    services.node_pin_profile(actor=actor, node=node, profile=whole)
    from scheduling.selectors import desired_vs_observed

    row = desired_vs_observed([node])[0]
    node.observed_device_plugin_config = row.desired_device_plugin_config
    node.observed_mig_config = row.desired_mig_config or ""
    node.save()
    html = login(client, viewer).get(node.get_absolute_url()).content.decode()
    assert "In sync" in html and "match--diff" not in html
