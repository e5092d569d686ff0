"""Profiles, pool defaults and pins: validated against the fleet's GPUs, audited, desired state selected."""

from datetime import time

import pytest

from core.audit import Actor
from core.exceptions import ApplicationError
from core.models import AuditEvent
from fleet.models import Cluster, Node
from scheduling import services as schedule_services
from scheduling.selectors import desired_state, desired_vs_observed
from sharing import services
from sharing.models import SharingProfile
from sharing.render import MigDeviceSpec
from sharing.selectors import preview_summary, preview_totals, profile_preview
from sharing.spec import KeptConfigs, allocatable, node_config
from tests.factories import GpuFactory, MigDeviceFactory, NodeFactory, NodePoolFactory, PodFactory
from worker import selectors

pytestmark = pytest.mark.django_db
H100 = "NVIDIA-H100-80GB-HBM3"


@pytest.fixture
def actor(admin_user):
    return Actor.for_user(admin_user)


def _mig_profile(actor, name="mig-7", layout=None, **kw):
    return services.profile_create(
        actor=actor, name=name, mode="mig", target_products=[H100], mig_layouts={"all": layout or {"1g.10gb": 7}}, **kw
    )


def _node_with_gpus(pool=None, product=H100, count=2, mig=False, **kw):
    node = NodeFactory(pool=pool, cluster=pool.cluster if pool else None, **kw) if pool else NodeFactory(**kw)
    for i in range(count):
        GpuFactory(node=node, index=i, product=product, mig_enabled=mig)
    return node


def test_profile_create_validates_and_audits(actor):
    with pytest.raises(ApplicationError) as err:
        _mig_profile(actor, layout={"1g.10gb": 8})
    assert "mig_layouts.all" in err.value.errors
    profile = _mig_profile(actor)
    event = AuditEvent.objects.get(action="profile.create")
    assert (event.actor_label, event.object_id, event.after["mig_layouts"]) == (
        "admin",
        str(profile.pk),
        {"all": {"1g.10gb": 7}},
    )


def test_profile_update_records_before_and_after_and_no_op_is_silent(actor):
    profile = _mig_profile(actor)
    services.profile_update(actor=actor, profile=profile, description="same layout")
    services.profile_update(actor=actor, profile=profile, description="same layout")
    events = AuditEvent.objects.filter(action="profile.update")
    assert events.count() == 1
    assert (events[0].before["description"], events[0].after["description"]) == ("", "same layout")


def test_pool_default_and_pin_drive_desired_state(actor):
    pool = NodePoolFactory()
    node = _node_with_gpus(pool)
    mig = _mig_profile(actor)
    whole = services.profile_create(actor=actor, name="whole", mode="passthrough", target_products=[H100])
    assert desired_state(node).profile is None
    services.pool_set_profile(actor=actor, pool=pool, profile=mig)
    assert (desired_state(node).profile, desired_state(node).source) == (mig, "pool")
    services.node_pin_profile(actor=actor, node=node, profile=whole, reason="long training run")
    assert (desired_state(node).profile, desired_state(node).source) == (whole, "pin")
    services.node_unpin(actor=actor, node=node)
    assert desired_state(node).profile == mig
    assert list(AuditEvent.objects.values_list("action", flat=True).order_by("pk")) == [
        "profile.create",
        "profile.create",
        "pool.set_profile",
        "node.pin",
        "node.unpin",
    ]


def test_assignment_refused_when_profile_does_not_fit_the_pool(actor):
    pool = NodePoolFactory()
    _node_with_gpus(pool, product="NVIDIA-A30")
    with pytest.raises(ApplicationError) as err:
        services.pool_set_profile(actor=actor, pool=pool, profile=_mig_profile(actor))
    assert "targets NVIDIA-H100-80GB-HBM3" in err.value.errors["profile"][0]


def test_profile_in_use_cannot_be_deleted_or_changed_to_not_fit(actor):
    pool = NodePoolFactory()
    _node_with_gpus(pool)
    profile = _mig_profile(actor)
    services.pool_set_profile(actor=actor, pool=pool, profile=profile)
    with pytest.raises(ApplicationError) as err:
        services.profile_delete(actor=actor, profile=profile)
    assert err.value.status == 409
    with pytest.raises(ApplicationError):
        services.profile_update(actor=actor, profile=profile, target_products=["NVIDIA-A30"], mig_layouts={})


def test_desired_vs_observed_flags_drift(actor):
    pool = NodePoolFactory()
    node = _node_with_gpus(pool, observed_mig_config="all-disabled", config_state="success")
    services.pool_set_profile(actor=actor, pool=pool, profile=_mig_profile(actor))
    (row,) = desired_vs_observed([node])
    assert row.in_sync is False and row.desired_mig_config.startswith("tessera-mig-")
    node.observed_mig_config = row.desired_mig_config
    node.observed_device_plugin_config = row.desired_device_plugin_config
    (row,) = desired_vs_observed([node])
    assert row.in_sync is True


def test_preview_reports_resources_reset_and_pods_losing_their_slice(actor):
    pool = NodePoolFactory()
    node = _node_with_gpus(pool, count=2, mig=True, allocatable={"nvidia.com/mig-1g.10gb": 14})
    for gpu in node.gpus.all():
        for start in range(7):
            MigDeviceFactory(gpu=gpu, profile="1g.10gb", start=start)
    PodFactory(node=node, name="infer-a", gpu_resources={"nvidia.com/mig-1g.10gb": 1})
    whole = services.profile_create(actor=actor, name="whole", mode="passthrough", target_products=[H100])

    (impact,) = profile_preview(whole, pool.nodes.all())
    assert impact.allocatable_before == {"nvidia.com/mig-1g.10gb": 14}
    assert impact.allocatable_after == {"nvidia.com/gpu": 2}
    assert (impact.disruption, impact.reset_gpus) == ("gpu-reset", [0, 1])
    assert [p.name for p in impact.pods_losing] == ["infer-a"]

    same = _mig_profile(actor)
    (impact,) = profile_preview(same, pool.nodes.all())
    assert impact.disruption != "gpu-reset" and impact.pods_losing == []
    geometry = _mig_profile(actor, name="big", layout={"3g.40gb": 2})
    (impact,) = profile_preview(geometry, pool.nodes.all())
    assert impact.disruption == "mig-geometry"
    assert preview_summary([impact])["pods_losing"] == 1


def test_preview_totals_equal_the_summary_of_the_per_node_preview(actor):
    """The schedule page's totals count nodes by shape; a pool mixing shapes, MIG states, advertised resources, a
    product the profile cannot run and nodes with pods gives the totals of the per-node preview."""
    pool = NodePoolFactory()
    for _ in range(3):
        _node_with_gpus(pool, count=2)
    _node_with_gpus(pool, count=2, allocatable={"nvidia.com/gpu": 2})
    _node_with_gpus(pool, count=1, observed_device_plugin_config="tessera-x")
    _node_with_gpus(pool, product="Tesla-T4")
    for mig_profile in ("1g.10gb", "3g.40gb"):
        node = _node_with_gpus(pool, count=2, mig=True, allocatable={"nvidia.com/mig-1g.10gb": 14})
        for gpu in node.gpus.all():
            MigDeviceFactory(gpu=gpu, profile=mig_profile, start=0)
        PodFactory(node=node, name=f"infer-{mig_profile}", gpu_resources={"nvidia.com/mig-1g.10gb": 1})
    whole = services.profile_create(actor=actor, name="whole", mode="passthrough", target_products=[H100])
    big = _mig_profile(actor, name="big", layout={"3g.40gb": 2})
    # A node without pods already running "big" (its MIG devices are what "big" makes: no change), and one whose
    # GPU has MIG off but still lists a device from before (which no impact reads).
    spec, gpus = big.to_spec(), [(0, H100), (1, H100)]
    config = node_config(spec, gpus)
    node = _node_with_gpus(
        pool, mig=True, allocatable=allocatable(spec, gpus), observed_device_plugin_config=config.device_plugin_key
    )
    for gpu in node.gpus.all():
        MigDeviceFactory(gpu=gpu, profile="3g.40gb", start=0)
        MigDeviceFactory(gpu=gpu, profile="3g.40gb", start=4)
    MigDeviceFactory(gpu=_node_with_gpus(pool, count=1).gpus.get(), profile="1g.10gb", start=0)
    for profile in (whole, _mig_profile(actor), big):
        totals = preview_totals(profile, pool.nodes.all())
        assert totals == preview_summary(profile_preview(profile, pool.nodes.all()))
    assert totals["nodes"] == 10 and totals["refused"] == 1 and totals["pods_losing"] >= 1
    assert totals["changing"] == 8  # all but the refused node and the one running "big" already


def test_assignment_and_pin_of_a_deleted_pool_or_node_is_a_clear_conflict(actor):
    """The services lock the pool (node) row before its sharing row (pin), which may not exist yet: a pool or node
    deleted meanwhile is a 409 that says so, not an IntegrityError."""
    pool = NodePoolFactory()
    node = _node_with_gpus(pool)
    _mig_profile(actor)
    stale_pool, stale_node = type(pool).objects.get(pk=pool.pk), type(node).objects.get(pk=node.pk)
    node.delete()
    pool.delete()
    with pytest.raises(ApplicationError) as err:
        services.pool_set_profile(actor=actor, pool=stale_pool, profile=None)
    assert err.value.status == 409 and "deleted meanwhile" in err.value.message
    with pytest.raises(ApplicationError) as err:
        services.node_unpin(actor=actor, node=stale_node)
    assert err.value.status == 409


def test_pinning_several_nodes_is_all_or_nothing(actor):
    pool = NodePoolFactory()
    fits, too_small = _node_with_gpus(pool), _node_with_gpus(pool, product="Tesla-T4")
    profile = _mig_profile(actor)
    with pytest.raises(ApplicationError):
        services.nodes_pin_profile(actor=actor, nodes=[fits, too_small], profile=profile)
    assert not fits.__class__.objects.filter(pin__isnull=False).exists()
    pins = services.nodes_pin_profile(actor=actor, nodes=[fits], profile=profile, reason="canary")
    assert [p.node_id for p in pins] == [fits.pk]


# --- the cluster's MIG strategy (ClusterPolicy spec.mig.strategy, contracts §1.2) -----------------------------------


def test_a_node_whose_cluster_strategy_cannot_run_its_profile_gets_no_config(actor):
    pool = NodePoolFactory()
    node = _node_with_gpus(pool, observed_mig_config="all-disabled", config_state="success")
    mps = services.profile_create(actor=actor, name="mps-4", mode="mps", target_products=[H100], replicas=4)
    services.pool_set_profile(actor=actor, pool=pool, profile=mps)
    Cluster.objects.filter(pk=pool.cluster_id).update(mig_strategy="mixed")  # the ClusterPolicy changed since
    (row,) = desired_vs_observed([Node.objects.get(pk=node.pk)])
    assert row.config is None and row.in_sync is False  # the reconcile loop plans nothing for it
    assert row.problems == (
        f"cluster {pool.cluster.name}'s ClusterPolicy sets spec.mig.strategy=mixed, under which the device plugin "
        "refuses MPS (it exits at start-up: the node advertises no GPU)",
    )
    assert selectors.plan([Node.objects.get(pk=node.pk)]) == {}


def test_the_clusters_strategy_decides_the_rendered_config_and_expected_resources(actor):
    pool = NodePoolFactory(cluster__mig_strategy="single")
    node = _node_with_gpus(pool)
    profile = _mig_profile(actor, mig_strategy="mixed", replicas=2)
    services.pool_set_profile(actor=actor, pool=pool, profile=profile)
    (row,) = desired_vs_observed([Node.objects.get(pk=node.pk)])
    assert "migStrategy: single" in row.config.device_plugin_text
    assert "      - name: nvidia.com/gpu\n        replicas: 2\n" in row.config.device_plugin_text
    assert selectors.to_config(row)["allocatable"] == {"nvidia.com/gpu": 28}


def test_a_schedule_window_the_clusters_strategy_cannot_run_is_refused(actor):
    pool = NodePoolFactory(cluster__mig_strategy="mixed")
    _node_with_gpus(pool)
    mps = services.profile_create(actor=actor, name="mps-4", mode="mps", target_products=[H100], replicas=4)
    windows = [{"name": "day", "weekdays": [0], "start": time(8), "end": time(18), "profile": mps}]
    with pytest.raises(ApplicationError) as err:
        schedule_services.schedule_create(actor=actor, pool=pool, name="s", time_zone="UTC", windows=windows)
    assert "spec.mig.strategy=mixed" in err.value.message and err.value.errors["windows[0].profile"]


def test_an_imported_profile_forgets_its_config_names_when_its_meaning_changes(actor):
    kept = KeptConfigs("team-7x1g", (MigDeviceSpec("all", True, {"1g.10gb": 7}),), "", "version: v1\n")
    profile = _mig_profile(actor)
    SharingProfile.objects.filter(pk=profile.pk).update(imported={"cluster": "prod", **kept.to_json()})
    profile.refresh_from_db()
    assert profile.to_spec().kept == kept  # stored as JSON, read back whole
    assert node_config(profile.to_spec(), [(0, H100)]).mig_config_name == "team-7x1g"
    profile = services.profile_update(actor=actor, profile=profile, description="renamed, same meaning")
    assert profile.imported
    profile = services.profile_update(actor=actor, profile=profile, mig_layouts={"all": {"3g.40gb": 2}})
    assert profile.imported == {} and node_config(profile.to_spec(), [(0, H100)]).mig_config_name.startswith(
        "tessera-mig-"
    )
