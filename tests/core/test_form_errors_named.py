"""Every form error names its field: each UI form posted invalid (by its own parsing or refused by a service)
answers with every message attached to a field of the form, none floating as a form-wide error."""

import pytest
from django import forms
from django.urls import reverse

from core.audit import Actor
from fleet.models import NodePool
from scheduling import services as schedule_services
from sharing import services
from tests.factories import ClusterFactory, GpuFactory, NodeFactory, NodePoolFactory

pytestmark = pytest.mark.django_db

H100 = "NVIDIA-H100-80GB-HBM3"


@pytest.fixture
def world(admin_user):
    actor = Actor.for_user(admin_user)
    pool = NodePoolFactory(name="gpu-a", cluster=ClusterFactory(name="lab", driver="agent", kubeconfig_path=""))
    node = NodeFactory(cluster=pool.cluster, pool=pool, name="a-0", allocatable={"nvidia.com/gpu": 2})
    for index in range(2):
        GpuFactory(node=node, index=index, product=H100)
    a30 = services.profile_create(
        actor=actor, name="a30-split", mode="mig", target_products=["NVIDIA-A30"], mig_layouts={"all": {"1g.6gb": 4}}
    )
    ts = services.profile_create(actor=actor, name="ts", mode="time_slicing", target_products=[H100], replicas=2)
    whole = services.profile_create(actor=actor, name="whole", mode="passthrough", target_products=[H100])
    isolated = services.qos_policy_create(actor=actor, name="isolated", requires_memory_isolation=True)
    hot = services.qos_policy_create(actor=actor, name="hot", power_limit_w=5000)
    services.pool_set_profile(actor=actor, pool=pool, profile=ts)
    loose = services.qos_policy_create(actor=actor, name="loose")
    services.pool_set_qos_policy(actor=actor, pool=pool, policy=loose)
    other = NodePoolFactory(name="gpu-b", cluster=pool.cluster)
    schedule_services.schedule_create_day_night(
        actor=actor, pool=other, day_profile=whole, night_profile=whole, time_zone="UTC"
    )
    return {"pool": pool, "other": other, "node": node, "a30": a30, "ts": ts, "whole": whole, "isolated": isolated,
            "hot": hot, "loose": loose}  # fmt: skip


def profile_data(**overrides):
    data = {"name": "p", "description": "", "mode": "passthrough", "mig_strategy": "mixed", "replicas": "1",
            "time_slice_interval": "default", "gpu-TOTAL_FORMS": "2", "gpu-INITIAL_FORMS": "0"}  # fmt: skip
    return {**data, **overrides}


def qos_data(**overrides):
    return {"name": "q", "required_qos": "any", **overrides}


def day_night_data(w, **overrides):
    data = {"pool": w["pool"].pk, "day_profile": w["whole"].pk, "night_profile": w["whole"].pk, "time_zone": "UTC",
            "day_start": "08:00", "day_end": "20:00", "weekdays": ["0"], "busy_policy": "wait",
            "wait_minutes": "30"}  # fmt: skip
    return {**data, **overrides}


def schedule_data(w, **overrides):
    data = {"name": "s", "pool": w["pool"].pk, "time_zone": "UTC", "busy_policy": "wait", "wait_minutes": "30",
            "enabled": "on", "windows-TOTAL_FORMS": "1", "windows-INITIAL_FORMS": "0", "windows-0-name": "day",
            "windows-0-weekdays": ["0"], "windows-0-start": "08:00", "windows-0-end": "20:00",
            "windows-0-profile": w["whole"].pk, "exceptions-TOTAL_FORMS": "0",
            "exceptions-INITIAL_FORMS": "0"}  # fmt: skip
    return {**data, **overrides}


CASES = {
    # The case: a passthrough profile without a GPU product.
    "profile passthrough, no product": lambda w: ("sharing:profile_create", [], profile_data()),
    "profile mig, no layout": lambda w: ("sharing:profile_create", [], profile_data(mode="mig", target_products=H100)),
    "profile passthrough, blank mig strategy": lambda w: (
        "sharing:profile_create", [], profile_data(target_products=H100, mig_strategy="")),
    "profile in use no longer fits": lambda w: (
        "sharing:profile_update", [w["ts"].pk], profile_data(name="ts", mode="time_slicing", replicas="2",
                                                             target_products="NVIDIA-A30")),
    "qos clocks min above max": lambda w: (
        "console:qos_create", [], qos_data(gpu_clock_min_mhz="1500", gpu_clock_max_mhz="1000")),
    "qos power off the pool's boards": lambda w: (
        "console:qos_create", [], qos_data(power_limit_w="5000", check_pool=w["pool"].pk, action="check")),
    "qos contradicts a profile it runs with": lambda w: (
        "console:qos_update", [w["loose"].pk], qos_data(name="loose", requires_memory_isolation="on")),
    "qos attach contradicting the pool's profile": lambda w: (
        "console:qos_attach", [w["isolated"].pk], {"pool": w["pool"].pk}),
    "qos attach off the pool's boards": lambda w: ("console:qos_attach", [w["hot"].pk], {"pool": w["pool"].pk}),
    "assign a profile that does not fit": lambda w: (
        "console:profile_assign", [w["a30"].pk], {"pool": w["pool"].pk, "rollout_now": "on"}),
    "pin a profile that does not fit": lambda w: ("console:profile_pin", [w["a30"].pk], {"nodes": [w["node"].pk]}),
    "day/night for a pool with a schedule": lambda w: (
        "scheduling:schedule_daynight", [], day_night_data(w, pool=w["other"].pk)),
    "day/night without working days": lambda w: ("scheduling:schedule_daynight", [], day_night_data(w, weekdays=[])),
    "day/night with a policy off the boards": lambda w: (
        "scheduling:schedule_daynight", [], day_night_data(w, day_qos_policy=w["hot"].pk)),
    "day/night with a profile that does not fit": lambda w: (
        "scheduling:schedule_daynight", [], day_night_data(w, night_profile=w["a30"].pk)),
    "schedule for a pool with a schedule": lambda w: (
        "scheduling:schedule_create", [], schedule_data(w, pool=w["other"].pk)),
    "schedule with a profile that does not fit": lambda w: (
        "scheduling:schedule_create", [], schedule_data(w, baseline_profile=w["a30"].pk)),
    "join token without a name": lambda w: ("fleet:agent_token_list", [], {"cluster": w["pool"].cluster.pk}),
}  # fmt: skip


def bound_forms(contexts) -> list[forms.BaseForm]:
    found, values = [], {id(v): v for context in contexts for v in context.flatten().values()}
    for value in values.values():
        if isinstance(value, forms.BaseForm) and value.is_bound:
            found.append(value)
        elif isinstance(value, forms.BaseFormSet) and value.is_bound:
            found.extend(value.forms)
    return found


@pytest.mark.parametrize("case", CASES)
def test_every_error_is_beside_a_named_field(client, admin_user, world, case):
    name, args, data = CASES[case](world)
    client.force_login(admin_user)
    response = client.post(reverse(name, args=args), data)
    assert response.status_code in (400, 409, 200), response.status_code
    errors = {form.prefix or type(form).__name__: dict(form.errors) for form in bound_forms(response.context)}
    assert any(errors.values()), f"{case}: no error at all"
    for where, form_errors in errors.items():
        assert forms.forms.NON_FIELD_ERRORS not in form_errors, f"{case}: {where}: {form_errors}"
    for form in bound_forms(response.context):
        assert set(form.errors) <= set(form.fields), f"{case}: {form.errors}"
    assert b"This field cannot be blank." not in response.content


def test_the_refusal_message_names_the_field(client, admin_user, world):
    client.force_login(admin_user)
    html = client.post(reverse("sharing:profile_create"), profile_data(target_products=[])).content.decode()
    assert "target products: Name at least one GPU product" in html or "Name at least one GPU product" in html
    assert NodePool.objects.count() == 2
