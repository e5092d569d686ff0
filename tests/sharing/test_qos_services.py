"""QoS policies: validation, consistency with the profiles they run with, attachment, schedule windows,
compliance reports with offending pods and kubelet mismatches, the API."""

from datetime import UTC, datetime, time

import pytest

from core.audit import Actor
from core.exceptions import ApplicationError
from scheduling import services as scheduling_services
from scheduling.selectors import desired_state
from sharing import services
from sharing.models import QoSComplianceReport
from tests.factories import GpuFactory, NodeFactory, NodePoolFactory, PodFactory
from worker.tasks import qos_compliance_check

pytestmark = pytest.mark.django_db
H100 = "NVIDIA-H100-80GB-HBM3"
GUARANTEED_SPEC = {"containers": [{"name": "c", "resources": {"limits": {"cpu": "2", "memory": "8Gi"}}}]}
BEST_EFFORT_SPEC = {"containers": [{"name": "c", "resources": {}}]}


@pytest.fixture
def actor(admin_user):
    return Actor.for_user(admin_user)


@pytest.fixture
def pool():
    pool = NodePoolFactory(name="inference")
    node = NodeFactory(cluster=pool.cluster, pool=pool, kubelet_config={"topologyManagerPolicy": "best-effort"})
    GpuFactory(node=node, index=0, product=H100)
    PodFactory(node=node, name="svc-good", spec=GUARANTEED_SPEC)
    PodFactory(node=node, name="svc-besteffort", spec=BEST_EFFORT_SPEC)
    return pool


def test_policy_validation_per_field(actor):
    with pytest.raises(ApplicationError) as err:
        services.qos_policy_create(
            actor=actor, name="bad", exclusive_taint="tessera.io/pool", swappiness=300, gpu_clock_min_mhz=1500
        )
    assert {"exclusive_taint", "swappiness", "gpu_clock_max_mhz"} <= set(err.value.errors)


def test_memory_isolation_is_refused_on_time_slicing(actor, pool):
    ts = services.profile_create(actor=actor, name="ts", mode="time_slicing", target_products=[H100], replicas=4)
    services.pool_set_profile(actor=actor, pool=pool, profile=ts)
    strict = services.qos_policy_create(actor=actor, name="isolated", requires_memory_isolation=True)
    with pytest.raises(ApplicationError) as err:
        services.pool_set_qos_policy(actor=actor, pool=pool, policy=strict)
    assert "time-slicing gives no memory isolation; use MIG" in err.value.message
    loose = services.qos_policy_create(actor=actor, name="loose")
    services.pool_set_qos_policy(actor=actor, pool=pool, policy=loose)
    with pytest.raises(ApplicationError):
        services.qos_policy_update(actor=actor, policy=loose, requires_memory_isolation=True)


def test_schedule_switches_qos_with_the_profile(actor, pool):
    day = services.profile_create(
        actor=actor, name="day", mode="mig", target_products=[H100], mig_layouts={"all": {"1g.10gb": 7}}
    )
    night = services.profile_create(actor=actor, name="night", mode="passthrough", target_products=[H100])
    inference = services.qos_policy_create(actor=actor, name="inference", transparent_hugepages="never")
    training = services.qos_policy_create(
        actor=actor, name="training", transparent_hugepages="always", gpu_clock_min_mhz=1980, gpu_clock_max_mhz=1980
    )
    scheduling_services.schedule_create(
        actor=actor,
        pool=pool,
        name="dn",
        time_zone="UTC",
        baseline_profile=night,
        baseline_qos_policy=training,
        windows=[
            {
                "name": "day",
                "weekdays": [0, 1, 2, 3, 4],
                "start": time(8),
                "end": time(20),
                "profile": day,
                "qos_policy": inference,
            }
        ],
    )
    node = pool.nodes.first()
    noon = desired_state(node, at=datetime(2026, 11, 23, 12, tzinfo=UTC))
    night_state = desired_state(node, at=datetime(2026, 11, 23, 22, tzinfo=UTC))
    assert (noon.profile, noon.qos_policy) == (day, inference)
    assert (night_state.profile, night_state.qos_policy) == (night, training)
    assert training.node_settings() == {
        "gpu": {"gpu_clock_min_mhz": 1980, "gpu_clock_max_mhz": 1980},
        "host": {"transparent_hugepages": "always"},
    }


def test_compliance_report_names_offending_pods_and_kubelet_mismatch(actor, pool):
    policy = services.qos_policy_create(
        actor=actor, name="guaranteed-only", required_qos="guaranteed", topology_manager_policy="single-numa-node"
    )
    services.pool_set_qos_policy(actor=actor, pool=pool, policy=policy)
    assert qos_compliance_check(pool.pk) == 1
    report = QoSComplianceReport.objects.get(pool=pool)
    assert report.pods_checked == 2
    assert [(v["name"], v["rule"]) for v in report.violations] == [("svc-besteffort", "qos")]
    assert report.kubelet_mismatches == [
        {
            "node": pool.nodes.first().name,
            "setting": "topologyManagerPolicy",
            "expected": "single-numa-node",
            "actual": "best-effort",
        }
    ]


def test_qos_api(pool, admin_api, operator_api, viewer_api):
    body = {"name": "inference", "required_qos": "guaranteed", "transparent_hugepages": "never", "swappiness": 10}
    assert operator_api.post("/api/v1/qos-policies/", body, format="json").status_code == 403
    created = admin_api.post("/api/v1/qos-policies/", body, format="json")
    assert created.status_code == 201, created.json()
    pk = created.json()["id"]
    bad = admin_api.post("/api/v1/qos-policies/", {"name": "x", "exclusive_taint": "oops"}, format="json")
    assert bad.status_code == 400 and "exclusive_taint" in bad.json()["errors"]
    assert viewer_api.post(f"/api/v1/qos-policies/{pk}/attach/", {"pool": pool.pk}, format="json").status_code == 403
    assert operator_api.post(f"/api/v1/qos-policies/{pk}/attach/", {"pool": pool.pk}, format="json").status_code == 200
    qos_compliance_check(pool.pk)
    report = viewer_api.get("/api/v1/qos-compliance/").json()["results"][0]
    assert report["violation_count"] == 1 and report["violations"][0]["name"] == "svc-besteffort"
    assert admin_api.delete(f"/api/v1/qos-policies/{pk}/").status_code == 409
