"""A pool's Kueue binding in the API and on the pages (issue 20 point 1): `/api/v1/kueue-bindings/` (viewers read,
admins write, a message per field, every write audited), take-over of a drifted ClusterQueue, the pool page's Kueue
card (quota per flavor and resource, drift value by value), the admins' form, the profile preview's quota before →
after and the week timeline's quota marks. The sync itself runs against the simulator in
tests/integration/test_kueue_quota_e2e.py and tests/browser/test_kueue_ui.py."""

from datetime import UTC, datetime

import pytest
import time_machine
from django.urls import reverse

from core.audit import Actor
from core.exceptions import ApplicationError
from core.models import AuditEvent
from fleet.models import Gpu
from scheduling import quota
from scheduling import services as scheduling_services
from scheduling.kueue import kueue_binding_set, quota_plan
from scheduling.models import KueueBinding
from sharing import services as sharing_services
from tests.factories import ClusterFactory, GpuFactory, NodeFactory, NodePoolFactory
from worker.models import KueueQuotaWrite

pytestmark = pytest.mark.django_db

H100 = "NVIDIA-H100-80GB-HBM3"
URL = "/api/v1/kueue-bindings/"
FLAVOR = "tessera-inference-nvidia-h100-80gb-hbm3"
GPU, MIG = "nvidia.com/gpu", "nvidia.com/mig-1g.10gb"
DRIFT = [{"flavor": FLAVOR, "resource": GPU, "live": 9, "wrote": 4}]


@pytest.fixture
def pool():
    """Pool inference of a Kubernetes cluster: 2 nodes of 2 H100s, each reporting 2 whole GPUs."""
    pool = NodePoolFactory(name="inference", cluster=ClusterFactory(name="east"))
    for i in range(2):
        node = NodeFactory(cluster=pool.cluster, pool=pool, name=f"inf-{i}", allocatable={GPU: 2})
        for index in range(2):
            GpuFactory(node=node, index=index, product=H100)
    return pool


@pytest.fixture
def agent_pool():
    return NodePoolFactory(name="lab", cluster=ClusterFactory(name="lab", driver="agent", kubeconfig_path=""))


@pytest.fixture
def binding(pool):
    return kueue_binding_set(actor=Actor.system("test"), pool=pool, cluster_queues=["gpu", "batch"])


def drifted(binding):
    """What the sync stores when someone changed a quota Tessera wrote in `gpu` (worker.kueue._report)."""
    KueueQuotaWrite.objects.create(
        pool=binding.pool, cluster_queue="gpu", flavor=FLAVOR, resource=GPU, value=4, written_at=datetime.now(UTC)
    )
    KueueBinding.objects.filter(pk=binding.pk).update(drift={"gpu": DRIFT})


# --- API ---------------------------------------------------------------------------------------------------------


def test_admins_create_change_and_delete_bindings_audited(admin_api, pool):
    created = admin_api.post(URL, {"pool": pool.pk, "cluster_queues": ["gpu"], "lead_minutes": 30}, format="json")
    assert created.status_code == 201, created.json()
    body = created.json()
    assert body["pool"]["name"] == "inference" and body["cluster_queues"] == ["gpu"] and body["lead_minutes"] == 30
    assert body["enabled"] is True and body["drift"] == {} and body["written"] == [] and body["synced_at"] is None
    url = f"{URL}{body['id']}/"
    (event,) = AuditEvent.objects.filter(action="kueue.binding")
    assert event.before is None and event.after == {"enabled": True, "cluster_queues": ["gpu"], "lead_minutes": 30}

    changed = admin_api.patch(url, {"enabled": False}, format="json")
    assert changed.status_code == 200 and changed.json()["enabled"] is False
    assert changed.json()["cluster_queues"] == ["gpu"] and changed.json()["lead_minutes"] == 30  # kept
    last = AuditEvent.objects.filter(action="kueue.binding").latest("pk")
    assert (last.before["enabled"], last.after["enabled"]) == (True, False)

    replaced = admin_api.put(url, {"pool": pool.pk, "cluster_queues": ["b", "a"], "lead_minutes": 5}, format="json")
    assert replaced.status_code == 200 and replaced.json()["cluster_queues"] == ["a", "b"]

    assert admin_api.delete(url).status_code == 204
    assert not KueueBinding.objects.exists()
    assert AuditEvent.objects.get(action="kueue.binding_delete").before["cluster_queues"] == ["a", "b"]


@pytest.mark.parametrize(
    ("body", "field", "text"),
    [
        ({"cluster_queues": ["Not_A_Name"]}, "cluster_queues", "Not a ClusterQueue name: 'Not_A_Name'."),
        ({"cluster_queues": []}, "cluster_queues", "This list may not be empty."),
        ({"cluster_queues": ["gpu"], "lead_minutes": -1}, "lead_minutes", "greater than or equal to 0"),
        ({"cluster_queues": ["gpu"], "lead_minutes": 10081}, "lead_minutes", "less than or equal to 10080"),
        ({"cluster_queues": "gpu"}, "cluster_queues", 'Expected a list of items but got type "str".'),
        ({"cluster_queues": ["gpu"], "pool": 999999}, "pool", "does not exist"),
    ],
)
def test_invalid_input_is_a_400_with_a_message_per_field(admin_api, pool, body, field, text):
    response = admin_api.post(URL, {"pool": pool.pk, **body}, format="json")
    assert response.status_code == 400
    assert text in " ".join(response.json()["errors"][field]), response.json()
    assert not KueueBinding.objects.exists() and not AuditEvent.objects.filter(action="kueue.binding").exists()


def test_the_pool_is_checked_an_agent_cluster_a_second_binding_and_a_change_of_pool(admin_api, binding, agent_pool):
    refused = admin_api.post(URL, {"pool": agent_pool.pk, "cluster_queues": ["gpu"]}, format="json")
    assert refused.status_code == 400
    assert refused.json()["errors"]["pool"] == [
        "Kueue runs in Kubernetes clusters; this pool's cluster uses node agents."
    ]
    twice = admin_api.post(URL, {"pool": binding.pool_id, "cluster_queues": ["gpu"]}, format="json")
    assert twice.status_code == 400
    assert twice.json()["errors"]["pool"] == [f"Pool inference has a Kueue binding already (id {binding.pk})."]
    moved = admin_api.patch(f"{URL}{binding.pk}/", {"pool": agent_pool.pk}, format="json")
    assert moved.status_code == 400 and moved.json()["errors"]["pool"] == ["A binding's pool is fixed once created."]


def test_viewers_read_drift_and_writes_operators_and_viewers_may_not(viewer_api, operator_api, binding):
    drifted(binding)
    listed = viewer_api.get(URL).json()
    (row,) = listed["results"]
    assert row["drift"] == {"gpu": DRIFT}
    assert row["written"] == [
        {
            "cluster_queue": "gpu",
            "flavor": FLAVOR,
            "resource": GPU,
            "value": 4,
            "written_at": row["written"][0]["written_at"],
        }
    ]
    assert viewer_api.get(f"{URL}{binding.pk}/").json()["cluster_queues"] == ["batch", "gpu"]
    assert viewer_api.get(URL, {"enabled": "false"}).json()["results"] == []
    for api in (viewer_api, operator_api):
        assert api.post(URL, {"pool": binding.pool_id, "cluster_queues": ["x"]}, format="json").status_code == 403
        assert api.patch(f"{URL}{binding.pk}/", {"enabled": False}, format="json").status_code == 403
        assert api.delete(f"{URL}{binding.pk}/").status_code == 403
        assert api.post(f"{URL}{binding.pk}/take-over/", {"cluster_queue": "gpu"}, format="json").status_code == 403
    assert KueueBinding.objects.get().drift == {"gpu": DRIFT}


def test_an_admin_takes_a_drifted_queue_over(admin_api, binding):
    drifted(binding)
    unknown = admin_api.post(f"{URL}{binding.pk}/take-over/", {"cluster_queue": "other"}, format="json")
    assert unknown.status_code == 400
    assert unknown.json()["errors"] == {"cluster_queue": ["'other' is not a ClusterQueue of this binding."]}
    missing = admin_api.post(f"{URL}{binding.pk}/take-over/", {}, format="json")
    assert missing.status_code == 400 and "cluster_queue" in missing.json()["errors"]
    taken = admin_api.post(f"{URL}{binding.pk}/take-over/", {"cluster_queue": "gpu"}, format="json")
    assert taken.status_code == 200 and taken.json()["drift"] == {} and taken.json()["written"] == []
    event = AuditEvent.objects.get(action="kueue.take_over")
    assert event.before == {"cluster_queue": "gpu", "drift": DRIFT} and event.actor_label == "admin"


# --- pages -------------------------------------------------------------------------------------------------------


def test_the_pool_page_shows_the_binding_its_quota_and_drift(client, viewer, admin_user, pool, binding):
    client.force_login(viewer)
    html = client.get(pool.get_absolute_url()).content.decode()
    assert 'id="pool-kueue"' in html and "Enabled" in html and "<code>batch</code>, <code>gpu</code>" in html
    assert "Last sync</dt><dd>" in html and "not yet" in html
    # 2 nodes × 2 whole GPUs: the layout (none: what they report) gives 4; nothing written yet.
    assert f'<td class="mono small">{FLAVOR}</td><td><code>{GPU}</code></td>\n      <td class="num">4</td>' in html
    assert "Take over" not in html and "changed outside Tessera" not in html
    drifted(binding)
    KueueBinding.objects.filter(pk=binding.pk).update(last_error="ClusterQueue batch does not exist")
    html = client.get(pool.get_absolute_url()).content.decode()
    assert "ClusterQueue gpu changed outside Tessera: left alone" in html
    assert '<td class="num"><strong>9</strong></td><td class="num">4</td>' in html  # live vs what Tessera wrote
    assert "ClusterQueue batch does not exist" in html
    assert "An admin may take it over." in html and "Take over gpu" not in html
    client.force_login(admin_user)
    html = client.get(pool.get_absolute_url()).content.decode()
    assert "Take over gpu" in html and reverse("console:pool_kueue_take_over", args=[pool.pk]) in html


def test_a_pool_without_a_binding_offers_admins_to_set_one_up(client, viewer, admin_user, agent_pool):
    client.force_login(viewer)
    html = client.get(agent_pool.get_absolute_url()).content.decode()
    assert "Not bound" in html and "this pool's cluster uses node agents" in html
    assert "Set up Kueue quota" not in html
    client.force_login(admin_user)
    assert "Set up Kueue quota" in client.get(agent_pool.get_absolute_url()).content.decode()


def test_admins_create_edit_and_disable_the_binding_from_a_form(client, admin_user, pool, agent_pool):
    client.force_login(admin_user)
    url = reverse("console:pool_kueue", args=[pool.pk])
    assert "Create binding" in client.get(url).content.decode()
    bad = client.post(url, {"cluster_queues": "gpu, Bad_Name", "lead_minutes": "15", "enabled": "on"})
    assert bad.status_code == 400 and not KueueBinding.objects.exists()
    assert "Not a ClusterQueue name: &#x27;Bad_Name&#x27;." in bad.content.decode()
    assert 'id="err-cluster_queues"' in bad.content.decode()
    out_of_range = client.post(url, {"cluster_queues": "gpu", "lead_minutes": "-5"})
    assert out_of_range.status_code == 400 and "greater than or equal to 0" in out_of_range.content.decode()
    saved = client.post(url, {"cluster_queues": "gpu batch", "lead_minutes": "20", "enabled": "on"})
    assert saved.status_code == 302 and saved["Location"].endswith("#pool-kueue")
    binding = KueueBinding.objects.get()
    assert (binding.cluster_queues, binding.lead_minutes, binding.enabled) == (["batch", "gpu"], 20, True)
    form = client.get(url).content.decode()
    assert 'value="batch, gpu"' in form and "Save changes" in form
    client.post(url, {"cluster_queues": "batch, gpu", "lead_minutes": "20"})  # the box unticked: disabled
    assert KueueBinding.objects.get().enabled is False
    assert AuditEvent.objects.filter(action="kueue.binding", actor_label="admin").count() == 2
    log = client.get(reverse("audit_log"), {"object_type": "kueuebinding", "object_id": binding.pk})
    assert log.status_code == 200 and log.content.decode().count("kueue.binding") >= 2
    agent = client.post(
        reverse("console:pool_kueue", args=[agent_pool.pk]), {"cluster_queues": "gpu", "lead_minutes": "1"}
    )
    assert agent.status_code == 400 and "uses node agents" in agent.content.decode()


def test_only_admins_use_the_form_and_take_over(client, operator, pool, binding):
    client.force_login(operator)
    assert client.get(reverse("console:pool_kueue", args=[pool.pk])).status_code == 403
    take_over = reverse("console:pool_kueue_take_over", args=[pool.pk])
    assert client.post(take_over, {"cluster_queue": "gpu"}).status_code == 403


def test_take_over_from_the_pool_page(client, admin_user, pool, binding):
    drifted(binding)
    client.force_login(admin_user)
    url = reverse("console:pool_kueue_take_over", args=[pool.pk])
    unknown = client.post(url, {"cluster_queue": "nope"}, follow=True)
    assert "&#x27;nope&#x27; is not a ClusterQueue of this binding." in unknown.content.decode()
    assert KueueBinding.objects.get().drift == {"gpu": DRIFT}
    done = client.post(url, {"cluster_queue": "gpu"}, follow=True)
    assert "ClusterQueue gpu is Tessera&#x27;s again" in done.content.decode()
    assert KueueBinding.objects.get().drift == {} and not KueueQuotaWrite.objects.exists()
    assert AuditEvent.objects.get(action="kueue.take_over").actor_label == "admin"


def test_the_profile_preview_shows_the_quota_before_and_after(client, viewer, pool):
    mig = sharing_services.profile_create(
        actor=Actor.system("test"),
        name="mig-7",
        mode="mig",
        target_products=[H100],
        mig_layouts={"all": {"1g.10gb": 7}},
    )
    client.force_login(viewer)
    url = reverse("console:profile_preview", args=[mig.pk]) + f"?pool={pool.pk}"
    assert 'id="preview-kueue"' not in client.get(url).content.decode()  # no binding
    kueue_binding_set(actor=Actor.system("test"), pool=pool, cluster_queues=["gpu"])
    html = client.get(url).content.decode()
    assert "Kueue quota before → after" in html and "ClusterQueues gpu" in html
    assert f"<code>{GPU}</code> 4 → <strong>0</strong>" in html  # 4 whole GPUs go
    assert f"<code>{MIG}</code> 0 → <strong>28</strong>" in html  # 4 GPUs × 7 slices come


@time_machine.travel(datetime(2026, 3, 4, 12, 0, tzinfo=UTC), tick=False)  # a Wednesday
def test_the_week_timeline_marks_each_change_of_quota(client, viewer, pool, binding):
    actor = Actor.system("test")
    mig = sharing_services.profile_create(
        actor=actor, name="mig-7", mode="mig", target_products=[H100], mig_layouts={"all": {"1g.10gb": 7}}
    )
    whole = sharing_services.profile_create(actor=actor, name="whole", mode="passthrough", target_products=[H100])
    schedule = scheduling_services.schedule_create_day_night(
        actor=actor, pool=pool, time_zone="UTC", day_profile=mig, night_profile=whole, weekdays=list(range(7))
    )
    client.force_login(viewer)
    html = client.get(schedule.get_absolute_url()).content.decode()
    # From Wednesday 12:00 to Sunday: 20:00 Wed–Sun (5) and 08:00 Thu–Sun (4) in the drawn week.
    assert html.count('<g class="tl-mark"') == 9
    assert f"Wed 20:00 · Kueue quota: {FLAVOR}: {GPU} 0 → 4, {MIG} 28 → 0</title>" in html
    assert f"<li><strong>Thu 08:00</strong> Kueue quota: {FLAVOR}: {GPU} 4 → 0, {MIG} 0 → 28</li>" in html
    assert "a change of Kueue quota (hover for before → after)" in html


def test_a_single_strategy_pool_with_two_products_is_refused_a_binding(pool):
    pool.cluster.mig_strategy = "single"
    pool.cluster.save(update_fields=["mig_strategy"])
    GpuFactory(node=pool.nodes.first(), index=2, product="NVIDIA-A100-SXM4-80GB")
    with pytest.raises(ApplicationError) as refused:
        kueue_binding_set(actor=Actor.system("test"), pool=pool, cluster_queues=["gpu"])
    assert "make a pool per product" in refused.value.errors["pool"][0]
    Gpu.objects.filter(product="NVIDIA-A100-SXM4-80GB").delete()
    binding = kueue_binding_set(actor=Actor.system("test"), pool=pool, cluster_queues=["gpu"])
    plan = quota_plan(binding)
    assert all(quota.PRODUCT_LABEL not in labels for labels in plan.labels.values())
