"""QoS pages: policy list, page (settings, users, attach and detach), editor (live checks against a pool, service
errors per field), delete; compliance per pool and fleet-wide with "Check now"; the overview's violation count;
roles on every page and POST."""

import re
from datetime import time

import pytest
from django.urls import reverse

from core.audit import Actor
from core.models import AuditEvent
from scheduling import services as scheduling_services
from sharing import services
from sharing.models import PoolSharing, QoSComplianceReport, QoSPolicy
from tests.factories import ClusterFactory, GpuFactory, NodeFactory, NodePoolFactory, PodFactory

pytestmark = pytest.mark.django_db

H100 = "NVIDIA-H100-80GB-HBM3"
HTMX = {"HTTP_HX_REQUEST": "true"}
GUARANTEED_SPEC = {"containers": [{"name": "c", "resources": {"limits": {"cpu": "2", "memory": "8Gi"}}}]}
BEST_EFFORT_SPEC = {"containers": [{"name": "c", "resources": {}}]}
TIME_SLICING_ERROR = "time-slicing gives no memory isolation; use MIG or whole GPUs."


@pytest.fixture
def actor(admin_user):
    return Actor.for_user(admin_user)


def login(client, user):
    client.force_login(user)
    return client


def slot(html: str, name: str) -> str:
    """The text of an error slot (id err-<name>) beside a field."""
    match = re.search(rf'<div class="field__error[^"]*" id="err-{re.escape(name)}"[^>]*>(.*?)</div>', html, re.S)
    assert match, f"no error slot for {name}"
    return re.sub(r"<[^>]+>", " ", match.group(1)).strip()


def text(html: str) -> str:
    """The page's text with tags and runs of white space collapsed, for phrases that span elements."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def make_pool(name, *, actor, mode, driver="kubernetes", pods=(), kubelet=None):
    """A pool of one H100 node running a profile of `mode`, with pods given as (name, spec)."""
    cluster = ClusterFactory(name=f"{name}-cluster", driver=driver, kubeconfig_path="" if driver == "agent" else "/k")
    pool = NodePoolFactory(cluster=cluster, name=name)
    node = NodeFactory(cluster=cluster, pool=pool, name=f"{name}-node-0", kubelet_config=kubelet or {})
    GpuFactory(node=node, index=0, product=H100)
    for pod_name, spec in pods:
        PodFactory(node=node, namespace="ml", name=pod_name, spec=spec)
    layouts = {"all": {"1g.10gb": 7}} if mode == "mig" else {}
    extra = {"replicas": 4} if mode == "time_slicing" else {}
    profile = services.profile_create(
        actor=actor, name=f"{name}-{mode}", mode=mode, target_products=[H100], mig_layouts=layouts, **extra
    )
    services.pool_set_profile(actor=actor, pool=pool, profile=profile)
    return pool


@pytest.fixture
def ts_pool(actor):
    return make_pool("batch", actor=actor, mode="time_slicing", pods=[("train-0", GUARANTEED_SPEC)])


@pytest.fixture
def mig_pool(actor):
    return make_pool(
        "inference",
        actor=actor,
        mode="mig",
        pods=[("svc-good", GUARANTEED_SPEC), ("svc-besteffort", BEST_EFFORT_SPEC)],
        kubelet={"topologyManagerPolicy": "best-effort", "cpuManagerPolicy": "static"},
    )


@pytest.fixture
def policy(actor):
    return services.qos_policy_create(
        actor=actor,
        name="guaranteed-only",
        required_qos="guaranteed",
        persistence_mode=True,
        gpu_clock_min_mhz=1500,
        gpu_clock_max_mhz=1980,
        power_limit_w=600,
        transparent_hugepages="never",
        topology_manager_policy="single-numa-node",
    )


def editor_data(**overrides) -> dict:
    data = {
        "name": "inference-strict",
        "description": "",
        "required_qos": "any",
        "required_priority_class": "",
        "max_pods_per_gpu": "",
        "exclusive_taint": "",
        "persistence_mode": "",
        "compute_mode": "",
        "time_slice_interval": "",
        "mps_active_thread_percentage": "",
        "mps_pinned_memory_limit_mib": "",
        "gpu_clock_min_mhz": "",
        "gpu_clock_max_mhz": "",
        "power_limit_w": "",
        "transparent_hugepages": "",
        "swappiness": "",
        "cpu_governor": "",
        "dirty_ratio": "",
        "dirty_background_ratio": "",
        "topology_manager_policy": "",
        "cpu_manager_policy": "",
        "check_pool": "",
    }
    data.update(overrides)
    return data


# --- access ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,args",
    [
        ("console:qos_list", []),
        ("console:qos_create", []),
        ("console:qos_detail", [1]),
        ("console:qos_update", [1]),
        ("console:qos_delete", [1]),
        ("console:compliance_list", []),
        ("console:pool_compliance", [1]),
    ],
)
def test_pages_need_login(client, name, args):
    response = client.get(reverse(name, args=args))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


@pytest.mark.parametrize(
    "name,needs",
    [
        ("console:qos_create", "admin"),
        ("console:qos_update", "admin"),
        ("console:qos_validate", "admin"),
        ("console:qos_delete", "admin"),
        ("console:qos_attach", "operator"),
        ("console:qos_detach", "operator"),
        ("console:pool_compliance_check", "operator"),
    ],
)
def test_every_post_is_refused_below_its_role(client, viewer, operator, policy, mig_pool, name, needs):
    if name in ("console:qos_create", "console:qos_validate"):
        url = reverse(name)
    elif name == "console:pool_compliance_check":
        url = reverse(name, args=[mig_pool.pk])
    else:
        url = reverse(name, args=[policy.pk])
    refused = [viewer] if needs == "operator" else [viewer, operator]
    for user in refused:
        login(client, user)
        assert client.post(url, editor_data(pool=mig_pool.pk, name="other")).status_code == 403
    assert list(QoSPolicy.objects.values_list("name", flat=True)) == ["guaranteed-only"]
    assert not PoolSharing.objects.filter(qos_policy__isnull=False).exists()
    assert not QoSComplianceReport.objects.exists()


def test_editor_pages_are_admin_only_and_buttons_hidden(client, viewer, operator, policy):
    for user in (viewer, operator):
        login(client, user)
        assert client.get(reverse("console:qos_create")).status_code == 403
        assert client.get(reverse("console:qos_update", args=[policy.pk])).status_code == 403
        assert client.get(reverse("console:qos_delete", args=[policy.pk])).status_code == 403
        assert 'href="/qos/new/"' not in client.get(reverse("console:qos_list")).content.decode()
        html = client.get(policy.get_absolute_url()).content.decode()
        assert f'href="/qos/{policy.pk}/edit/"' not in html
    assert "Attach to a pool" in html  # operators attach
    login(client, viewer)
    assert "Attach to a pool" not in client.get(policy.get_absolute_url()).content.decode()


def test_navigation_has_qos_for_everyone_and_agents_for_admins(client, viewer, admin_user):
    html = login(client, viewer).get(reverse("console:qos_list")).content.decode()
    assert '<a href="/qos/" aria-current="page">QoS</a>' in html
    assert '<a href="/profiles/">Profiles</a>' in html  # not current on a QoS page
    assert 'href="/agents/tokens/"' not in html
    assert 'href="/agents/tokens/"' in login(client, admin_user).get("/qos/").content.decode()


# --- list and page ---------------------------------------------------------------------------------------------


def test_list_shows_rules_settings_users_and_violations(client, viewer, actor, policy, mig_pool):
    services.pool_set_qos_policy(actor=actor, pool=mig_pool, policy=policy)
    services.qos_compliance_record(pool=mig_pool, policy=policy)
    html = login(client, viewer).get(reverse("console:qos_list")).content.decode()
    assert f'href="/qos/{policy.pk}/"' in html and "Guaranteed only" in html
    assert "4 GPU · 1 host" in html and "topology single-numa-node" in html
    assert f'href="/pools/{mig_pool.pk}/compliance/"' in html
    assert '<a class="text-failed" href="/compliance/"><strong>1</strong></a>' in html


def test_empty_list_says_what_a_policy_is(client, admin_user):
    html = login(client, admin_user).get(reverse("console:qos_list")).content.decode()
    assert "No QoS policies yet" in html and 'href="/qos/new/"' in html


@pytest.mark.parametrize("count", [2, 20])
def test_list_query_count_is_bounded(client, viewer, actor, django_assert_max_num_queries, count):
    for i in range(count):
        policy = services.qos_policy_create(actor=actor, name=f"p{i}", swappiness=10)
        services.pool_set_qos_policy(actor=actor, pool=NodePoolFactory(), policy=policy)
    login(client, viewer)
    # session, user, role; policies with window counts; their pools; violations per policy
    with django_assert_max_num_queries(6):
        assert client.get(reverse("console:qos_list")).status_code == 200


def test_page_shows_settings_with_units_users_windows_and_log(client, viewer, actor, policy, mig_pool):
    services.pool_set_qos_policy(actor=actor, pool=mig_pool, policy=policy)
    profile = mig_pool.sharing.profile
    scheduling_services.schedule_create(
        actor=actor,
        pool=NodePoolFactory(name="nightly"),
        name="dn",
        time_zone="UTC",
        windows=[{"name": "day", "weekdays": [0, 1, 2, 3, 4], "start": time(8), "end": time(20), "profile": profile}],
        baseline_qos_policy=policy,
    )
    window_policy = services.qos_policy_create(actor=actor, name="window-only")
    scheduling_services.schedule_create(
        actor=actor,
        pool=NodePoolFactory(name="weekday"),
        name="office",
        time_zone="Europe/Berlin",
        windows=[
            {
                "name": "office",
                "weekdays": [0, 1, 2, 3, 4],
                "start": time(9),
                "end": time(17),
                "profile": profile,
                "qos_policy": policy,
            }
        ],
    )
    html = login(client, viewer).get(policy.get_absolute_url()).content.decode()
    page = text(html)
    assert "Pod QoS class Guaranteed only" in page
    assert "Locked GPU clock, min 1500 MHz" in page and "Locked GPU clock, max 1980 MHz" in page
    assert "Power limit 600 W" in page and "Persistence mode On" in page
    assert "Topology manager policy single-numa-node" in page and "CPU manager policy no expectation" in page
    assert "vm.swappiness left as is" in page
    assert f'href="/pools/{mig_pool.pk}/compliance/"' in html
    assert "office" in page and "Mon–Fri 09:00–17:00 Europe/Berlin" in page
    assert "outside every window" in page  # the baseline of "dn"
    assert "qos.create" in html
    assert window_policy.name not in page
    assert "Detach" not in html  # viewers do not attach or detach


def test_page_shows_the_impact_of_attaching_before_the_button(client, operator, policy, mig_pool):
    login(client, operator)
    html = client.get(policy.get_absolute_url() + f"?pool={mig_pool.pk}").content.decode()
    page = text(html)
    assert "These rules would flag 1 of 2 observed pods on pool inference" in page
    assert "ml/svc-besteffort" in page and "QoS class BestEffort; the pool requires Guaranteed" in page
    assert "Not enforced on this pool" in page  # a Kubernetes cluster: no agent applies the node settings
    assert "topologyManagerPolicy is best-effort, expected single-numa-node" in page
    assert f'<input type="hidden" name="pool" value="{mig_pool.pk}">' in html
    assert "Attach to inference</button>" in html
    # over HTMX only the attach card comes back
    fragment = client.get(policy.get_absolute_url(), {"pool": mig_pool.pk}, **HTMX).content.decode()
    assert fragment.lstrip().startswith('<section id="qos-attach"') and "<html" not in fragment
    assert client.get(policy.get_absolute_url(), {"pool": mig_pool.pk}, **HTMX)["Vary"].count("HX-Request")


def test_attach_is_disabled_with_the_reason_when_it_contradicts_the_profile(client, operator, actor, ts_pool):
    strict = services.qos_policy_create(actor=actor, name="isolated", requires_memory_isolation=True)
    html = login(client, operator).get(strict.get_absolute_url() + f"?pool={ts_pool.pk}").content.decode()
    assert TIME_SLICING_ERROR in html and "would be refused" in html
    assert 'disabled aria-describedby="attach-blocked"' in html


def test_attach_refused_by_the_service_shows_its_message(client, operator, actor, ts_pool):
    strict = services.qos_policy_create(actor=actor, name="isolated", requires_memory_isolation=True)
    response = login(client, operator).post(reverse("console:qos_attach", args=[strict.pk]), {"pool": ts_pool.pk})
    html = response.content.decode()
    assert response.status_code == 400 and "Not attached" in html
    assert TIME_SLICING_ERROR in html
    assert ts_pool.sharing.qos_policy is None


def test_attach_without_a_pool_is_a_form_error(client, operator, policy):
    response = login(client, operator).post(reverse("console:qos_attach", args=[policy.pk]), {"pool": ""})
    assert response.status_code == 400 and "This field is required." in slot(response.content.decode(), "pool")


def test_attach_then_detach(client, operator, policy, mig_pool):
    login(client, operator)
    response = client.post(reverse("console:qos_attach", args=[policy.pk]), {"pool": mig_pool.pk})
    assert response.status_code == 302 and response["Location"] == policy.get_absolute_url()
    assert PoolSharing.objects.get(pool=mig_pool).qos_policy == policy
    html = client.get(response["Location"]).content.decode()
    assert "guaranteed-only is now the QoS policy of pool inference" in html and "Detach" in html
    assert (
        "already the default QoS policy of inference"
        in client.get(f"{policy.get_absolute_url()}?pool={mig_pool.pk}").content.decode()
    )
    over_htmx = client.post(reverse("console:qos_detach", args=[policy.pk]), {"pool": mig_pool.pk}, **HTMX)
    assert over_htmx.status_code == 200 and "HX-Location" in over_htmx
    assert PoolSharing.objects.get(pool=mig_pool).qos_policy is None
    assert AuditEvent.objects.filter(action="pool.set_qos_policy", actor_label="operator").count() == 2


def test_detach_from_a_pool_that_uses_another_policy_changes_nothing(client, operator, actor, policy, mig_pool):
    other = services.qos_policy_create(actor=actor, name="other")
    services.pool_set_qos_policy(actor=actor, pool=mig_pool, policy=other)
    response = login(client, operator).post(reverse("console:qos_detach", args=[policy.pk]), {"pool": mig_pool.pk})
    assert response.status_code == 302 and PoolSharing.objects.get(pool=mig_pool).qos_policy == other
    assert "does not use guaranteed-only" in client.get(response["Location"]).content.decode()


# --- editor ----------------------------------------------------------------------------------------------------


def test_editor_groups_fields_in_sections_with_units(client, admin_user):
    html = login(client, admin_user).get(reverse("console:qos_create")).content.decode()
    for legend in ("Workload rules", "GPU settings", "Host tuning", "Kubelet expectations"):
        assert f"<legend>{legend}</legend>" in html
    for unit in ("MHz", "W", "%", "MiB"):
        assert f'<span class="input-unit__suffix" aria-hidden="true">{unit}</span>' in html
    assert 'hx-post="/qos/validate/"' in html and 'form="qos-form"' in html
    assert "Choose a pool to see whether the policy contradicts" in html


def test_create_a_policy(client, admin_user):
    data = editor_data(
        required_qos="guaranteed",
        persistence_mode="on",
        gpu_clock_min_mhz="1500",
        gpu_clock_max_mhz="1980",
        power_limit_w="450",
        swappiness="10",
        transparent_hugepages="never",
        exclusive_taint="tessera.io/pool=inference:NoSchedule",
    )
    response = login(client, admin_user).post(reverse("console:qos_create"), data)
    policy = QoSPolicy.objects.get(name="inference-strict")
    assert response.status_code == 302 and response["Location"] == policy.get_absolute_url()
    assert policy.node_settings() == {
        "gpu": {"persistence_mode": True, "gpu_clock_min_mhz": 1500, "gpu_clock_max_mhz": 1980, "power_limit_w": 450},
        "host": {"transparent_hugepages": "never", "swappiness": 10},
    }
    assert (policy.required_qos, policy.compute_mode, policy.mps_active_thread_percentage) == ("guaranteed", "", None)
    assert AuditEvent.objects.filter(action="qos.create", actor_label="admin").exists()


def test_refused_values_show_the_services_messages_beside_their_fields(client, admin_user):
    data = editor_data(exclusive_taint="tessera.io/pool", swappiness="300", gpu_clock_min_mhz="1500")
    response = login(client, admin_user).post(reverse("console:qos_create"), data)
    html = response.content.decode()
    assert response.status_code == 400 and not QoSPolicy.objects.exists()
    assert "write key=value:NoSchedule" in slot(html, "exclusive_taint")
    assert "less than or equal to 200" in slot(html, "swappiness")
    assert "Give both the minimum and maximum locked clock" in slot(html, "gpu_clock_max_mhz")
    assert "Not saved" in html and 'value="tessera.io/pool"' in html


def test_duplicate_name_is_shown_on_the_name_field(client, admin_user, policy):
    html = login(client, admin_user).post(reverse("console:qos_create"), editor_data(name=policy.name)).content.decode()
    assert "already exists" in slot(html, "name")


def test_live_check_returns_impact_and_field_messages_out_of_band(client, admin_user, ts_pool):
    login(client, admin_user)
    data = editor_data(name="", requires_memory_isolation="on", swappiness="300", check_pool=ts_pool.pk)
    response = client.post(reverse("console:qos_validate"), data, **HTMX)
    html = response.content.decode()
    assert response.status_code == 200 and "<html" not in html
    assert html.lstrip().startswith('<div id="qos-impact"')
    assert TIME_SLICING_ERROR in html and "Attaching it to batch would be refused" in text(html)
    assert 'id="err-swappiness" aria-live="polite" hx-swap-oob="innerHTML"><p>' in html
    assert "less than or equal to 200" in slot(html, "swappiness")
    assert slot(html, "name") == ""  # no "required" complaint while typing
    assert not QoSPolicy.objects.exists()


def test_live_check_counts_the_pods_the_rules_would_flag(client, admin_user, mig_pool):
    login(client, admin_user)
    data = editor_data(required_qos="guaranteed", requires_memory_isolation="on", check_pool=mig_pool.pk)
    html = text(client.post(reverse("console:qos_validate"), data, **HTMX).content.decode())
    assert "These rules would flag 1 of 2 observed pods on pool inference" in html
    assert "Consistent" in html and "would be refused" not in html
    everyone = text(
        client.post(reverse("console:qos_validate"), editor_data(check_pool=mig_pool.pk), **HTMX).content.decode()
    )
    assert "would flag 0 of 2" in everyone and "All comply" in everyone


def test_live_check_of_an_unparsable_taint_does_not_measure_pods(client, admin_user, mig_pool):
    data = editor_data(exclusive_taint="nonsense", check_pool=mig_pool.pk)
    html = login(client, admin_user).post(reverse("console:qos_validate"), data, **HTMX).content.decode()
    assert "Fix the workload rules first" in html and "is not a taint" in slot(html, "exclusive_taint")


def test_live_check_of_an_edited_policy_accepts_its_own_name(client, admin_user, policy):
    login(client, admin_user)
    url = reverse("console:qos_validate") + f"?policy={policy.pk}"
    assert slot(client.post(url, editor_data(name=policy.name), **HTMX).content.decode(), "name") == ""
    plain = client.post(reverse("console:qos_validate"), editor_data(name=policy.name), **HTMX).content.decode()
    assert "already exists" in slot(plain, "name")


def test_check_button_without_javascript_shows_the_checks_without_saving(client, admin_user, ts_pool):
    data = editor_data(requires_memory_isolation="on", check_pool=ts_pool.pk, action="check")
    response = login(client, admin_user).post(reverse("console:qos_create"), data)
    html = response.content.decode()
    assert response.status_code == 200 and not QoSPolicy.objects.exists()
    assert TIME_SLICING_ERROR in html and "<html" in html
    assert f'<option value="{ts_pool.pk}" selected>' in html


def test_edit_form_is_filled_and_measured_against_a_pool_using_it(client, admin_user, actor, policy, mig_pool):
    services.pool_set_qos_policy(actor=actor, pool=mig_pool, policy=policy)
    html = login(client, admin_user).get(reverse("console:qos_update", args=[policy.pk])).content.decode()
    assert 'value="guaranteed-only"' in html and 'value="1980"' in html
    assert '<option value="on" selected>On</option>' in html
    assert f'<option value="{mig_pool.pk}" selected>' in html
    assert f'hx-post="/qos/validate/?policy={policy.pk}"' in html
    assert "would flag 1 of 2" in text(html)


def test_update_refused_when_it_contradicts_a_profile_it_runs_with(client, admin_user, actor, ts_pool):
    loose = services.qos_policy_create(actor=actor, name="loose")
    services.pool_set_qos_policy(actor=actor, pool=ts_pool, policy=loose)
    data = editor_data(name="loose", requires_memory_isolation="on")
    response = login(client, admin_user).post(reverse("console:qos_update", args=[loose.pk]), data)
    html = response.content.decode()
    assert response.status_code == 400 and TIME_SLICING_ERROR in slot(html, "requires_memory_isolation")
    loose.refresh_from_db()
    assert loose.requires_memory_isolation is False


def test_update_saves_over_htmx_with_a_client_redirect(client, admin_user, policy):
    data = editor_data(name="guaranteed-only", required_qos="burstable", power_limit_w="500")
    response = login(client, admin_user).post(reverse("console:qos_update", args=[policy.pk]), data, **HTMX)
    assert response.status_code == 200 and policy.get_absolute_url() in response["HX-Location"]
    policy.refresh_from_db()
    assert (policy.required_qos, policy.power_limit_w, policy.gpu_clock_min_mhz) == ("burstable", 500, None)


def test_delete_in_use_is_refused_with_409_then_allowed(client, admin_user, actor, policy, mig_pool):
    services.pool_set_qos_policy(actor=actor, pool=mig_pool, policy=policy)
    login(client, admin_user)
    page = client.get(reverse("console:qos_delete", args=[policy.pk])).content.decode()
    assert "1 pool" in text(page) and "detach it first" in page
    response = client.post(reverse("console:qos_delete", args=[policy.pk]))
    assert response.status_code == 409 and "is in use; detach it first" in response.content.decode()
    services.pool_set_qos_policy(actor=actor, pool=mig_pool, policy=None)
    response = client.post(reverse("console:qos_delete", args=[policy.pk]))
    assert response.status_code == 302 and response["Location"] == reverse("console:qos_list")
    assert not QoSPolicy.objects.exists()


# --- compliance ------------------------------------------------------------------------------------------------


def test_pool_without_a_policy_says_so(client, viewer, mig_pool):
    html = login(client, viewer).get(reverse("console:pool_compliance", args=[mig_pool.pk])).content.decode()
    assert "No QoS policy on this pool" in html and "Check now" not in html


def test_compliance_page_groups_offending_pods_by_node_and_lists_kubelet_mismatches(
    client, viewer, actor, policy, mig_pool
):
    services.pool_set_qos_policy(actor=actor, pool=mig_pool, policy=policy)
    node = mig_pool.nodes.get()
    other = NodeFactory(cluster=mig_pool.cluster, pool=mig_pool, name="inference-node-1")
    GpuFactory(node=other, index=0, product=H100)
    PodFactory(node=other, namespace="ml", name="svc-loose", spec=BEST_EFFORT_SPEC, priority_class="low")
    services.qos_compliance_record(pool=mig_pool, policy=policy)
    html = login(client, viewer).get(reverse("console:pool_compliance", args=[mig_pool.pk])).content.decode()
    page = text(html)
    assert "2 violations" in page and "Pods checked 3" in page
    assert f'<a href="/nodes/{node.pk}/">inference-node-0</a>' in html
    assert f'<a href="/nodes/{other.pk}/">inference-node-1</a>' in html
    assert html.index("inference-node-0") < html.index("ml/svc-besteffort") < html.index("inference-node-1")
    assert html.index("inference-node-1") < html.index("ml/svc-loose")
    assert "QoS class BestEffort; the pool requires Guaranteed" in html
    assert '<span class="tag tag--rule-qos">Pod QoS class</span>' in html
    assert "Kubelet settings" in html and "topologyManagerPolicy" in html
    assert "single-numa-node" in page and "best-effort" in page
    assert "guaranteed-only" in page and "pool default" in page
    assert "Check now" not in html  # viewers only read


def test_all_pods_comply(client, viewer, actor, mig_pool):
    anyone = services.qos_policy_create(actor=actor, name="anyone")
    services.pool_set_qos_policy(actor=actor, pool=mig_pool, policy=anyone)
    services.qos_compliance_record(pool=mig_pool, policy=anyone)
    html = login(client, viewer).get(reverse("console:pool_compliance", args=[mig_pool.pk])).content.decode()
    assert "All 2 pods comply with anyone." in html and "expects nothing of the kubelet" in html


def test_a_pool_whose_kubelets_differ_is_never_called_compliant(client, viewer, actor, mig_pool):
    """No pod breaks a rule, but a kubelet runs another policy than the pool's expects: the pages say what is wrong,
    and nowhere that the pool complies."""
    numa = services.qos_policy_create(actor=actor, name="numa", topology_manager_policy="single-numa-node")
    services.pool_set_qos_policy(actor=actor, pool=mig_pool, policy=numa)
    services.qos_compliance_record(pool=mig_pool, policy=numa)
    login(client, viewer)
    page = text(client.get(reverse("console:pool_compliance", args=[mig_pool.pk])).content.decode())
    assert "1 kubelet mismatch" in page and "All 2 pods comply with numa." in page
    assert "Compliant" not in page
    pool_page = text(client.get(reverse("console:pool_detail", args=[mig_pool.pk])).content.decode())
    assert "1 kubelet mismatch" in pool_page and "Compliant" not in pool_page


def test_an_agent_pool_says_its_workload_rules_have_no_pods_to_check(client, operator, actor, policy):
    pool = NodePoolFactory(cluster=ClusterFactory(name="lab", driver="agent", kubeconfig_path=""), name="lab-h100")
    NodeFactory(cluster=pool.cluster, pool=pool, name="lab-0")
    services.pool_set_qos_policy(actor=actor, pool=pool, policy=policy)
    services.qos_compliance_record(pool=pool, policy=policy)
    login(client, operator)
    page = text(client.get(reverse("console:pool_compliance", args=[pool.pk])).content.decode())
    assert "Workload rules not checked here" in page and "Agent nodes run no Kubernetes pods" in page
    assert "Compliant" not in page and "Pods checked" not in page and "Check now" not in page
    listed = text(client.get(reverse("console:compliance_list")).content.decode())
    assert "agent nodes: no Kubernetes pods to check" in listed


def test_check_now_runs_the_check_and_shows_the_result(client, operator, actor, policy, mig_pool):
    services.pool_set_qos_policy(actor=actor, pool=mig_pool, policy=policy)
    login(client, operator)
    before = client.get(reverse("console:pool_compliance", args=[mig_pool.pk])).content.decode()
    assert "Not checked yet" in before and "Check now" in before
    response = client.post(reverse("console:pool_compliance_check", args=[mig_pool.pk]))
    assert response.status_code == 302 and response["Location"] == reverse(
        "console:pool_compliance", args=[mig_pool.pk]
    )
    report = QoSComplianceReport.objects.get(pool=mig_pool)
    assert (report.violation_count, report.pods_checked) == (1, 2)
    html = client.get(response["Location"]).content.decode()
    assert "Pool inference checked: 1 violation." in html and "ml/svc-besteffort" in html


def test_a_report_against_an_older_policy_says_so(client, viewer, actor, policy, mig_pool):
    services.qos_compliance_record(pool=mig_pool, policy=policy)
    services.pool_set_qos_policy(actor=actor, pool=mig_pool, policy=services.qos_policy_create(actor=actor, name="new"))
    html = login(client, viewer).get(reverse("console:pool_compliance", args=[mig_pool.pk])).content.decode()
    assert "The last check used guaranteed-only" in html


def test_compliance_list_counts_per_pool(client, viewer, actor, policy, mig_pool, ts_pool):
    services.pool_set_qos_policy(actor=actor, pool=mig_pool, policy=policy)
    services.qos_compliance_record(pool=mig_pool, policy=policy)
    NodePoolFactory(name="idle")
    html = login(client, viewer).get(reverse("console:compliance_list")).content.decode()
    page = text(html)
    assert f'href="/pools/{mig_pool.pk}/compliance/"' in html and "batch" not in page  # no policy, no report
    assert "Policy violations 1 in 1 of 1 pool" in page
    assert '<span class="badge badge--failed">1</span>' in html and '<span class="badge badge--drift">1</span>' in html
    assert "Pools without a policy 2" in page


def test_compliance_list_without_policies_is_an_empty_state(client, viewer, mig_pool):
    html = login(client, viewer).get(reverse("console:compliance_list")).content.decode()
    assert "No pool has a QoS policy" in html


def test_overview_counts_policy_violations_and_links_to_compliance(client, viewer, actor, policy, mig_pool):
    services.pool_set_qos_policy(actor=actor, pool=mig_pool, policy=policy)
    services.qos_compliance_record(pool=mig_pool, policy=policy)
    html = login(client, viewer).get(reverse("console:overview")).content.decode()
    item = re.search(r'<li><a href="/compliance/">(.*?)</a></li>', html, re.S).group(1)
    assert "Policy violations" in item and "in 1 pool" in item
    assert '<span class="attention__count">1</span>' in item
    stats = client.get(reverse("console:overview_stats")).content.decode()
    assert 'href="/compliance/"' in stats


def test_pool_page_links_to_its_compliance(client, viewer, actor, policy, mig_pool):
    services.pool_set_qos_policy(actor=actor, pool=mig_pool, policy=policy)
    html = login(client, viewer).get(reverse("console:pool_detail", args=[mig_pool.pk])).content.decode()
    assert f'href="/pools/{mig_pool.pk}/compliance/"' in html and f'href="/qos/{policy.pk}/"' in html
