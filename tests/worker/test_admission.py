"""QoS policies enforced at admission: the sync against the simulator over real HTTPS with the official client
(never mocked) creates a ValidatingAdmissionPolicy and binding per enforcing pool, writes nothing on a repeated
pass, replaces after a rule change, deletes when enforcement ends (switched off, policy removed, window ends, pool
gone), skips agent clusters, and records API refusals as clear messages; names, pool labels and the tick's
selection of clusters; one pass per cluster at a time, and a pass cut short by its time limit keeps what it wrote."""

import json
from datetime import UTC, datetime, time

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from kubernetes import client, config

from core.audit import Actor
from core.models import AuditEvent
from fleet.models import NodePool
from scheduling import services as scheduling_services
from sharing import services as sharing_services
from sharing.models import QoSPolicy
from tests.factories import ClusterFactory, NodePoolFactory
from worker import admission, tasks
from worker.drivers.kubernetes.admission import CUT_SHORT, MANIFEST_HASH, AdmissionPolicies, contains
from worker.locks import ADMISSION, WATCH, ClusterLock
from worker.models import AdmissionPolicyState

pytestmark = pytest.mark.django_db

MANAGED = "app.kubernetes.io/managed-by=tessera"
NAME = "tessera-inference-qos-inference"
MONDAY_NOON = datetime(2026, 11, 23, 12, tzinfo=UTC)
MONDAY_NIGHT = datetime(2026, 11, 23, 22, tzinfo=UTC)
NOT_SERVED = ["validatingadmissionpolicies.admissionregistration.k8s.io"]


@pytest.fixture
def sim_options():
    return {"nodes": 2}


@pytest.fixture
def vap(sim):
    with config.new_client_from_config(config_file=sim.kubeconfig_path) as api:
        yield client.AdmissionregistrationV1Api(api)


@pytest.fixture
def actor(admin_user):
    return Actor.for_user(admin_user)


@pytest.fixture
def cluster(sim):
    return ClusterFactory(name="sim", kubeconfig_path=sim.kubeconfig_path)


@pytest.fixture
def pool(cluster):
    return NodePoolFactory(cluster=cluster, name="inference", node_selector="tessera.io/pool=inference")


@pytest.fixture
def policy(actor):
    return sharing_services.qos_policy_create(
        actor=actor,
        name="inference-qos",
        required_qos="guaranteed",
        required_priority_class="inference-high",
        enforce_admission=True,
    )


@pytest.fixture
def enforcing(actor, pool, policy):
    sharing_services.pool_set_qos_policy(actor=actor, pool=pool, policy=policy)
    return pool


def live(vap) -> dict[str, dict]:
    """Tessera's objects in the cluster by kind, as raw JSON."""
    policies = json.loads(vap.list_validating_admission_policy(label_selector=MANAGED, _preload_content=False).data)
    bindings = json.loads(
        vap.list_validating_admission_policy_binding(label_selector=MANAGED, _preload_content=False).data
    )
    return {
        "policy": {p["metadata"]["name"]: p for p in policies["items"]},
        "binding": {b["metadata"]["name"]: b for b in bindings["items"]},
    }


def sync(cluster, at=MONDAY_NOON):
    return admission.admission_sync(cluster=cluster, now=at)


def audit_actions() -> list[str]:
    return list(
        AuditEvent.objects.filter(action__startswith="admission.").order_by("pk").values_list("action", flat=True)
    )


def test_sync_creates_the_pair_and_a_second_pass_writes_nothing(sim, vap, cluster, enforcing):
    result = sync(cluster)
    assert (result.created, result.replaced, result.deleted, result.errors) == (2, 0, 0, 0)
    objects = live(vap)
    policy, binding = objects["policy"][NAME], objects["binding"][NAME]
    assert binding["spec"] == {"policyName": NAME, "validationActions": ["Deny"]}
    assert policy["metadata"]["annotations"]["tessera.io/pool"] == "inference"
    validations = policy["spec"]["validations"]
    assert "inference-high" in validations[-1]["message"] and "Guaranteed" in validations[0]["message"]
    assert any("tessera.io/pool" in v["expression"] for v in policy["spec"]["variables"])

    row = AdmissionPolicyState.objects.get(pool=enforcing)
    assert (row.state, row.object_name, row.policy_name, row.error) == ("applied", NAME, "inference-qos", "")
    assert row.manifest.count(f"name: {NAME}") == 2 and "kind: ValidatingAdmissionPolicyBinding" in row.manifest
    assert policy["metadata"]["annotations"][MANIFEST_HASH] == row.manifest_hash
    assert row.resource_versions == {
        "policy": policy["metadata"]["resourceVersion"],
        "binding": binding["metadata"]["resourceVersion"],
    }
    assert row.applied_at == row.checked_at == MONDAY_NOON
    assert audit_actions() == ["admission.create", "admission.create"]

    version = sim.store.resource_version
    later = datetime(2026, 11, 23, 12, 1, tzinfo=UTC)
    again = sync(cluster, at=later)
    assert (again.created, again.replaced, again.deleted) == (0, 0, 0)
    assert sim.store.resource_version == version  # no write reached the API server
    row.refresh_from_db()
    assert (row.applied_at, row.checked_at) == (MONDAY_NOON, later)
    assert len(audit_actions()) == 2


def test_the_server_defaults_count_as_a_match(vap, cluster, enforcing):
    sync(cluster)
    stored = live(vap)["policy"][NAME]["spec"]["matchConstraints"]
    assert stored["matchPolicy"] == "Equivalent" and stored["resourceRules"][0]["scope"] == "*"
    assert contains({"a": 1, "b": [{"c": 2, "d": 3}]}, {"b": [{"c": 2}]})
    assert not contains({"b": [{"c": 2}, {"c": 3}]}, {"b": [{"c": 2}]})


def test_a_rule_change_replaces_and_an_edit_in_the_cluster_is_repaired(sim, vap, actor, cluster, enforcing, policy):
    sync(cluster)
    label = {"metadata": {"labels": {"team": "ml"}}}  # someone else's label on Tessera's object
    vap.patch_validating_admission_policy(NAME, label, _content_type="application/merge-patch+json")
    before = live(vap)["policy"][NAME]["metadata"]["resourceVersion"]
    sharing_services.qos_policy_update(actor=actor, policy=policy, required_priority_class="inference-critical")
    assert admission.clusters_out_of_date(at=MONDAY_NOON) == [cluster.pk]
    result = sync(cluster)
    assert (result.created, result.replaced) == (0, 2)
    replaced = live(vap)["policy"][NAME]
    assert replaced["metadata"]["resourceVersion"] != before
    assert "inference-critical" in replaced["spec"]["validations"][-1]["message"]
    assert replaced["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "tessera", "team": "ml"}
    assert audit_actions()[-2:] == ["admission.replace", "admission.replace"]
    assert admission.clusters_out_of_date(at=MONDAY_NOON) == []

    # Someone deletes the binding and loosens the policy by hand: the next pass puts both back.
    vap.delete_validating_admission_policy_binding(NAME)
    vap.patch_validating_admission_policy(
        NAME, {"spec": {"failurePolicy": "Ignore"}}, _content_type="application/merge-patch+json"
    )
    repaired = sync(cluster)
    assert (repaired.created, repaired.replaced) == (1, 1)
    objects = live(vap)
    assert NAME in objects["binding"] and objects["policy"][NAME]["spec"]["failurePolicy"] == "Fail"


def test_switching_enforcement_off_deletes_the_pair(vap, actor, cluster, enforcing, policy):
    sync(cluster)
    sharing_services.qos_policy_update(actor=actor, policy=policy, enforce_admission=False)
    assert admission.clusters_out_of_date(at=MONDAY_NOON) == [cluster.pk]
    result = sync(cluster)
    assert (result.deleted, result.errors) == (2, 0)
    assert live(vap) == {"policy": {}, "binding": {}}
    assert not AdmissionPolicyState.objects.exists()
    assert audit_actions()[-2:] == ["admission.delete", "admission.delete"]
    event = AuditEvent.objects.filter(action="admission.delete").first()
    assert (event.object_type, event.object_id, event.actor_label) == ("cluster", str(cluster.pk), "admission")
    assert admission.clusters_to_sync(at=MONDAY_NOON) == []


def test_removing_the_pools_policy_or_the_pool_deletes_the_pair(vap, actor, cluster, enforcing):
    other = NodePoolFactory(cluster=cluster, name="training", node_selector="tessera.io/pool=training")
    sharing_services.pool_set_qos_policy(actor=actor, pool=other, policy=QoSPolicy.objects.get())
    sync(cluster)
    assert set(live(vap)["policy"]) == {NAME, "tessera-inference-qos-training"}

    sharing_services.pool_set_qos_policy(actor=actor, pool=enforcing, policy=None)
    sync(cluster)
    assert set(live(vap)["policy"]) == {"tessera-inference-qos-training"}

    NodePool.objects.filter(pk=other.pk).delete()
    orphan = AdmissionPolicyState.objects.get()
    assert orphan.pool is None and orphan.pool_name == "training"
    assert admission.clusters_to_sync(at=MONDAY_NOON) == [cluster.pk]
    sync(cluster)
    assert live(vap) == {"policy": {}, "binding": {}} and not AdmissionPolicyState.objects.exists()


def test_a_schedule_window_with_another_policy_removes_the_pair_while_it_lasts(vap, actor, cluster, pool, policy):
    whole = sharing_services.profile_create(
        actor=actor, name="whole", mode="passthrough", target_products=["NVIDIA-H100-80GB-HBM3"]
    )
    relaxed = sharing_services.qos_policy_create(actor=actor, name="relaxed", required_qos="burstable")
    scheduling_services.schedule_create(
        actor=actor,
        pool=pool,
        name="nights",
        time_zone="UTC",
        baseline_profile=whole,
        baseline_qos_policy=policy,
        windows=[
            {
                "name": "night",
                "weekdays": [0, 1, 2, 3, 4, 5, 6],
                "start": time(20),
                "end": time(23),
                "profile": whole,
                "qos_policy": relaxed,
            }
        ],
    )
    sync(cluster, at=MONDAY_NOON)
    assert set(live(vap)["policy"]) == {NAME}
    assert admission.clusters_out_of_date(at=MONDAY_NIGHT) == [cluster.pk]  # the window began: the tick syncs
    assert sync(cluster, at=MONDAY_NIGHT).deleted == 2
    assert live(vap)["policy"] == {}


def test_agent_clusters_are_skipped_and_say_so(actor, policy):
    agent = ClusterFactory(name="bare-metal", driver="agent", kubeconfig_path="")
    pool = NodePoolFactory(cluster=agent, name="slurm", node_selector="tessera.io/pool=slurm")
    sharing_services.pool_set_qos_policy(actor=actor, pool=pool, policy=policy)
    result = sync(agent)
    assert "no Kubernetes API server" in result.skipped and result.as_dict()["wanted"] == 1
    row = AdmissionPolicyState.objects.get()
    assert (row.state, row.manifest, row.error) == ("not_applicable", "", "")
    assert admission.clusters_out_of_date(at=MONDAY_NOON) == []  # recorded: the tick leaves it alone
    (view,) = admission.pool_admission_views(NodePool.objects.select_related("cluster"))
    assert view.status == "not_applicable"


def test_an_api_server_older_than_1_30_is_a_clear_error_then_recovers(sim, vap, cluster, enforcing):
    sim.faults.update({"unserved": NOT_SERVED})
    result = sync(cluster)
    assert result.errors == 1 and result.created == 0
    row = AdmissionPolicyState.objects.get()
    assert row.state == "error" and row.error_at == MONDAY_NOON
    assert "does not serve admissionregistration.k8s.io/v1 ValidatingAdmissionPolicies" in row.error
    assert "Kubernetes 1.30 or later" in row.error and "404" in row.error
    assert row.manifest and row.applied_at is None  # what would be applied is still shown

    sync(cluster, at=datetime(2026, 11, 23, 12, 5, tzinfo=UTC))
    row.refresh_from_db()
    assert row.error_at == MONDAY_NOON  # the same error: "since" the first time

    sim.faults.update({"unserved": []})
    assert sync(cluster).created == 2
    row.refresh_from_db()
    assert (row.state, row.error, row.error_at) == ("applied", "", None)


def test_a_refused_object_is_recorded_per_pool(sim, cluster, enforcing):
    sim.faults.update({"write_error_rate": 1.0, "error_codes": [403]})
    result = sync(cluster)
    assert result.errors == 1
    assert AdmissionPolicyState.objects.get().error.startswith("Tessera may not manage ValidatingAdmissionPolicies")


def test_nothing_enforced_and_nothing_recorded_touches_no_row(sim, cluster, pool):
    sim.faults.update({"unserved": NOT_SERVED})
    result = sync(cluster)
    assert result.wanted == 0 and "1.30" in result.skipped
    assert not AdmissionPolicyState.objects.exists()


def test_credentials_stay_out_of_the_recorded_state(actor, policy, tmp_path):
    secret_path = tmp_path / "secret-kubeconfig"
    secret_path.write_text("apiVersion: v1\nusers:\n- name: u\n  user: {token: s3cr3t-token}\n")
    broken = ClusterFactory(name="broken", kubeconfig_path=str(secret_path))
    pool = NodePoolFactory(cluster=broken, name="p", node_selector="tessera.io/pool=p")
    sharing_services.pool_set_qos_policy(actor=actor, pool=pool, policy=policy)
    sync(broken)
    row = AdmissionPolicyState.objects.get()
    assert row.state == "error" and "cannot load the kubeconfig credentials of cluster broken" in row.error
    stored = json.dumps(list(AdmissionPolicyState.objects.values()), default=str)
    assert "s3cr3t" not in stored and str(secret_path) not in stored


def test_a_pool_without_a_usable_label_is_an_error_and_gets_no_objects(vap, actor, cluster, policy):
    explicit = NodePoolFactory(cluster=cluster, name="hand-picked", node_selector="")
    sharing_services.pool_set_qos_policy(actor=actor, pool=explicit, policy=policy)
    assert sync(cluster).errors == 1
    row = AdmissionPolicyState.objects.get()
    assert row.state == "error" and "has explicit members" in row.error and row.manifest == ""
    assert live(vap)["policy"] == {}


def test_object_names_are_dns_subdomains_unique_per_cluster(cluster, policy):
    pool = NodePool(pk=7, name="GPU Pool_A (day)")
    long_policy = QoSPolicy(pk=3, name="x" * 100)
    assert admission.object_name(policy, pool) == "tessera-inference-qos-gpu-pool-a-day"
    assert len(admission.object_name(long_policy, NodePool(pk=8, name="y" * 100))) <= 253
    assert admission.object_name(QoSPolicy(pk=3, name="!!"), NodePool(pk=9, name="ü")) == "tessera-policy-3-pool-9"

    a = NodePoolFactory(cluster=cluster, name="a-b", node_selector="k=a")
    b = NodePoolFactory(cluster=cluster, name="a b", node_selector="k=b")
    actor = Actor.system("test")
    for each in (a, b):
        sharing_services.pool_set_qos_policy(actor=actor, pool=each, policy=policy)
    # A pool whose natural name looks like a suffixed one: suffixes use two hyphens, which no natural name has.
    c = NodePoolFactory(cluster=cluster, name=f"a-b-{a.pk}", node_selector="k=c")
    sharing_services.pool_set_qos_policy(actor=actor, pool=c, policy=policy)
    names = {pk: d.name for pk, d in admission.desired_admissions([a, b, c]).items()}
    assert names == {
        a.pk: f"tessera-inference-qos-a-b--{a.pk}",
        b.pk: f"tessera-inference-qos-a-b--{b.pk}",
        c.pk: f"tessera-inference-qos-a-b-{a.pk}",
    }


@pytest.mark.parametrize(
    ("selector", "label"),
    [
        ("tessera.io/pool=inference", "tessera.io/pool=inference"),
        ("nvidia.com/gpu.product=H100, tessera.io/pool=day", "tessera.io/pool=day"),
        ("zone in (a), team", "zone=a"),
        ("team, zone!=b", "team"),
        ("zone in (a,b)", None),
        ("!team", None),
        ("", None),
    ],
)
def test_the_pool_label_admission_matches_on(selector, label):
    pool = NodePool(name="p", node_selector=selector)
    if label is None:
        with pytest.raises(ValueError, match="admission can only recognise pods"):
            admission.pool_admission_label(pool)
    else:
        assert admission.pool_admission_label(pool) == label


def test_the_tasks_sync_out_of_date_clusters_and_sweep_enforcing_ones(vap, cluster, enforcing):
    assert tasks.admission_sync(0) == {}
    assert tasks.clusters_sync_admission() == 1  # eager: the per-cluster task ran inline
    assert set(live(vap)["policy"]) == {NAME}
    assert admission.clusters_out_of_date() == []
    assert tasks.reconcile_tick()["admission"] == 0
    AdmissionPolicyState.objects.update(manifest_hash="stale")
    assert tasks.reconcile_tick()["admission"] == 1
    assert AdmissionPolicyState.objects.get().manifest_hash != "stale"


def test_a_policy_change_syncs_once_it_commits(vap, actor, cluster, pool, policy, django_capture_on_commit_callbacks):
    """pool_set_qos_policy and qos_policy_update signal the reconcile tick on commit; the tick syncs the cluster."""
    with django_capture_on_commit_callbacks(execute=True):
        sharing_services.pool_set_qos_policy(actor=actor, pool=pool, policy=policy)
    assert set(live(vap)["policy"]) == {NAME}
    with django_capture_on_commit_callbacks(execute=True):
        sharing_services.qos_policy_update(actor=actor, policy=policy, enforce_admission=False)
    assert live(vap)["policy"] == {} and not AdmissionPolicyState.objects.exists()


def test_a_pass_finding_the_clusters_lock_held_does_nothing(sim, vap, cluster, enforcing):
    other = ClusterLock(cluster.pk, ADMISSION)
    assert other.acquire()
    try:
        result = sync(cluster)
        assert result.skipped == admission.BUSY and "next tick or sweep" in result.skipped
        assert live(vap)["policy"] == {} and not AdmissionPolicyState.objects.exists() and audit_actions() == []
        watcher = ClusterLock(cluster.pk, WATCH)  # the watcher's lock of the same cluster is another one
        assert watcher.acquire()
        watcher.release()
    finally:
        other.release()
    assert sync(cluster).created == 2
    after = ClusterLock(cluster.pk, ADMISSION)
    assert after.acquire()  # released when the pass ended
    after.release()


def test_a_pass_cut_short_records_what_it_wrote_and_releases_the_lock(sim, vap, actor, monkeypatch, cluster, policy):
    first = NodePoolFactory(cluster=cluster, name="inference", node_selector="tessera.io/pool=inference")
    second = NodePoolFactory(cluster=cluster, name="training", node_selector="tessera.io/pool=training")
    for pool in (first, second):
        sharing_services.pool_set_qos_policy(actor=actor, pool=pool, policy=policy)
    training = "tessera-inference-qos-training"
    ensure, delete = AdmissionPolicies._ensure, AdmissionPolicies._delete

    def ensure_until_the_time_limit(self, kind, name, body, live):
        if (kind, name) == ("binding", training):
            raise SoftTimeLimitExceeded()  # as Celery raises it, in the middle of the pass
        return ensure(self, kind, name, body, live)

    monkeypatch.setattr(AdmissionPolicies, "_ensure", ensure_until_the_time_limit)
    with pytest.raises(SoftTimeLimitExceeded):
        sync(cluster)
    objects = live(vap)
    assert set(objects["policy"]) == {NAME, training} and set(objects["binding"]) == {NAME}
    assert audit_actions() == ["admission.create"] * 3  # every write made before the limit is audited
    rows = {row.pool_name: row for row in AdmissionPolicyState.objects.all()}
    assert rows["inference"].state == "applied"
    assert (rows["training"].state, rows["training"].error) == ("error", CUT_SHORT)
    assert rows["training"].resource_versions == {"policy": objects["policy"][training]["metadata"]["resourceVersion"]}
    lock = ClusterLock(cluster.pk, ADMISSION)
    assert lock.acquire()  # released on the way out
    lock.release()

    monkeypatch.setattr(AdmissionPolicies, "_ensure", ensure)
    assert (sync(cluster).created, AdmissionPolicyState.objects.get(pool=second).state) == (1, "applied")

    # Cut short while deleting: the pair deleted first loses its row, the one cut short keeps it (still removing).
    def delete_until_the_time_limit(self, kind, name):
        if (kind, name) == ("policy", training):
            raise SoftTimeLimitExceeded()
        return delete(self, kind, name)

    monkeypatch.setattr(AdmissionPolicies, "_delete", delete_until_the_time_limit)
    sharing_services.qos_policy_update(actor=actor, policy=policy, enforce_admission=False)
    with pytest.raises(SoftTimeLimitExceeded):
        sync(cluster)
    objects = live(vap)
    assert set(objects["policy"]) == {training} and objects["binding"] == {}
    row = AdmissionPolicyState.objects.get()
    assert (row.pool_id, row.state, row.error) == (second.pk, "removing", CUT_SHORT)
    assert audit_actions()[-3:] == ["admission.delete"] * 3
    monkeypatch.setattr(AdmissionPolicies, "_delete", delete)
    assert sync(cluster).deleted == 1 and live(vap)["policy"] == {} and not AdmissionPolicyState.objects.exists()
