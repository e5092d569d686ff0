"""The authz matrix (issue 15): every URL pattern of the project, UI and API, tried with every HTTP method by every
kind of caller — anonymous, signed in without a role, viewer, operator, admin, and a node agent's credential — against
ACCESS, the one table that says who may do what. A route missing from ACCESS fails with a message saying what to
declare; a view whose role check is missing or wrong fails on the caller it lets through or keeps out.

"Denied" is 401, 403 or a redirect to the sign-in page; "allowed" is anything else, but never 405 (the declared method
exists) and, for GET, never an error (the URL's objects are real: seeded below). A method a route does not declare is
denied to everyone or answered 405. Side effects of allowed calls are rolled back after each call (a savepoint)."""

from dataclasses import dataclass, field

import pytest
from django.contrib.auth.models import Group
from django.db import transaction
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils import timezone

from agent import protocol
from agent.protocol import HostSettings, Outcome, Report
from core.audit import Actor, audit_record
from core.roles import Role
from fleet import agent_credentials
from fleet.agent_credentials import CREDENTIAL_PREFIX, secret_new
from fleet.models import AgentCredential, PendingAgent, UuidConflict
from scheduling.models import KueueBinding, Schedule
from sharing.models import NodePin, QoSComplianceReport, QoSPolicy, SharingProfile
from tests.factories import ClusterFactory, GpuFactory, MigDeviceFactory, NodeFactory, NodePoolFactory, UserFactory
from worker.models import AdmissionPolicyState, NodeChange, NodeRetry, Rollout

pytestmark = pytest.mark.django_db

VIEWER, OPERATOR, ADMIN = Role.VIEWER, Role.OPERATOR, Role.ADMIN
PUBLIC = "public"  # anyone, signed in or not (what guards it is no role: a join token, a password, nothing)
AGENT = "agent"  # a node agent's credential, and nothing else
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
CALLERS = ("anonymous", "no-role", "viewer", "operator", "admin", "agent")
EXCLUDED = {"admin/": "Django's admin: staff accounts only, its own permission system (tests/core/test_logins.py)"}


@dataclass(frozen=True)
class Access:
    """Who may call a route, per method; `obj` names the seeded object that fills its <pk>."""

    methods: dict = field(default_factory=dict)
    obj: str | None = None


def reads(obj=None, **writes) -> Access:
    """GET for viewers, and the writes given (PUT=ADMIN...)."""
    return Access({"GET": VIEWER, **writes}, obj)


def crud(obj, write=ADMIN) -> Access:
    return reads(obj, PUT=write, PATCH=write, DELETE=write)


def writes(obj=None, **methods) -> Access:
    return Access(methods, obj)


# One place: every route, who may call it. A new route fails test_every_route_declares_who_may_call_it until it is here.
ACCESS: dict[str, Access] = {
    # --- the node agent (agent/protocol.py): its credential, for its own node only ---------------------------------
    "agent-report": writes(POST=AGENT),
    "agent-desired": Access({"GET": AGENT}),
    "agent-outcome": writes(POST=AGENT),
    "agent-register": writes(POST=PUBLIC),  # the join token in the body is the lock (tests/agents/test_trust.py)
    # --- API: agents' admin ---------------------------------------------------------------------------------------
    "agentjointoken-list": Access({"GET": ADMIN, "POST": ADMIN}),
    "agentjointoken-detail": Access({"GET": ADMIN}, "join_token"),
    "agentjointoken-revoke": writes("join_token", POST=ADMIN),
    "agentcredential-list": Access({"GET": ADMIN}),
    "agentcredential-detail": Access({"GET": ADMIN}, "credential"),
    "agentcredential-revoke": writes("credential", POST=ADMIN),
    "pendingagent-list": Access({"GET": ADMIN}),
    "pendingagent-detail": Access({"GET": ADMIN}, "pending"),
    "pendingagent-approve": writes("pending", POST=ADMIN),
    "pendingagent-reject": writes("pending", POST=ADMIN),
    "uuidconflict-list": reads(),
    "uuidconflict-detail": reads("conflict"),
    "uuidconflict-resolve": writes("conflict", POST=ADMIN),
    "node-revoke-agent": writes("node", POST=ADMIN),
    # --- API: core --------------------------------------------------------------------------------------------------
    "auditevent-list": reads(),
    "auditevent-detail": reads("audit"),
    "api-me": reads(),
    "api-token-rotate": writes(POST=VIEWER),  # one's own token
    # --- API: fleet -------------------------------------------------------------------------------------------------
    "cluster-list": reads(POST=ADMIN),
    "cluster-detail": crud("cluster"),
    "nodepool-list": reads(POST=ADMIN),
    "nodepool-detail": crud("pool"),
    "nodepool-members": reads("pool", POST=ADMIN),
    "node-list": reads(),
    "node-detail": reads("node"),
    "gpu-list": reads(),
    "gpu-detail": reads("gpu"),
    "migdevice-list": reads(),
    "migdevice-detail": reads("mig"),
    # --- API: sharing -----------------------------------------------------------------------------------------------
    "mig-validate": writes(POST=VIEWER),  # a check, nothing is written
    "mig-products": reads(),
    "sharingprofile-list": reads(POST=ADMIN),
    "sharingprofile-detail": crud("profile"),
    "sharingprofile-preview": writes("profile", POST=VIEWER),  # read only
    "sharingprofile-assign": writes("profile", POST=OPERATOR),
    "sharingprofile-pin": writes("profile", POST=OPERATOR),
    "nodepin-list": reads(),
    "nodepin-detail": reads("pin", DELETE=OPERATOR),
    "qospolicy-list": reads(POST=ADMIN),
    "qospolicy-detail": crud("qos"),
    "qospolicy-attach": writes("qos", POST=OPERATOR),
    "qospolicy-detach": writes("qos", POST=OPERATOR),
    "qoscompliancereport-list": reads(),
    # --- API: scheduling --------------------------------------------------------------------------------------------
    "transitions": reads(),
    "gpu-hours": reads(),
    "schedule-list": reads(POST=ADMIN),
    "schedule-day-night": writes(POST=ADMIN),
    "schedule-detail": crud("schedule"),
    "schedule-transitions": reads("schedule"),
    "desired-state-list": reads(),
    # --- API: worker ------------------------------------------------------------------------------------------------
    "rollout-list": reads(POST=OPERATOR),
    "rollout-detail": reads("rollout"),
    "rollout-pause": writes("rollout", POST=OPERATOR),
    "rollout-resume": writes("rollout", POST=OPERATOR),
    "rollout-cancel": writes("rollout", POST=OPERATOR),
    "rollout-retry-now": writes("rollout", POST=OPERATOR),
    "noderetry-list": reads(),
    "noderetry-detail": reads("retry"),
    "noderetry-retry-now": writes("retry", POST=OPERATOR),
    "nodechange-list": reads(),
    "nodechange-detail": reads("change"),
    "admissionpolicystate-list": reads(),
    "admissionpolicystate-detail": reads("admission"),
    "admissionpolicystate-forget": writes("admission", POST=ADMIN),
    "cluster-nvidia-import": reads("cluster", POST=ADMIN),  # GET previews, POST creates profiles
    "kueuebinding-list": reads(POST=ADMIN),
    "kueuebinding-detail": crud("kueue"),
    "kueuebinding-take-over": writes("kueue", POST=ADMIN),
    # --- API: config as code (docs/config-as-code.md) -------------------------------------------------------------
    "config-documents": reads(),
    "config-schema": reads(),
    "config-plan": writes(POST=VIEWER),  # a plan: carried out and rolled back, nothing kept
    "config-apply": writes(POST=ADMIN),
    # --- schema, docs, probes, metrics ------------------------------------------------------------------------------
    "api-schema": reads(),  # or anyone with TESSERA_API_DOCS_PUBLIC (tests/core/test_access.py)
    "api-docs": reads(),
    "metrics": reads(),  # or TESSERA_METRICS_TOKEN's bearer token, or a viewer's API token (tests/core/test_access.py)
    "healthz": Access({"GET": PUBLIC}),
    "readyz": Access({"GET": PUBLIC}),  # the status; its checks only as /metrics (tests/core/test_health.py)
    "favicon": Access({"GET": PUBLIC}),
    # --- UI: signing in ---------------------------------------------------------------------------------------------
    "login": Access({"GET": PUBLIC, "POST": PUBLIC}),
    "logout": writes(POST=PUBLIC),
    "admin_sign_in": Access({"GET": PUBLIC, "POST": PUBLIC}),  # Django admin's sign-in (off with password sign-in)
    "oidc_authentication_init": Access({"GET": PUBLIC}),  # 404 unless single sign-on is configured (test_sso.py)
    "oidc_authentication_callback": Access({"GET": PUBLIC}),  # the provider's answer; state checked (test_sso.py)
    # --- UI: pages --------------------------------------------------------------------------------------------------
    "token_detail": reads(POST=VIEWER),  # one's own token
    "audit_log": reads(),
    "console:overview": reads(),
    "console:overview_stats": reads(),
    "console:node_detail": reads("node"),
    "console:node_state": reads("node"),
    "console:uuid_conflict_resolve": writes("conflict", POST=ADMIN),
    "console:gpu_detail": reads("gpu"),
    "console:node_retry_now": writes("node", POST=OPERATOR),
    "console:pool_detail": reads("pool"),
    "capacity:pool_capacity": reads("pool"),
    "capacity:pool_capacity_draft": writes("pool", POST=ADMIN),
    "capacity:gpu_hours": reads(),
    "console:pool_create": Access({"GET": ADMIN, "POST": ADMIN}),
    "console:pool_members": writes(POST=ADMIN),  # the live "members matched" check of the admins' editor
    "console:pool_update": Access({"GET": ADMIN, "POST": ADMIN}, "pool"),
    "console:pool_delete": Access({"GET": ADMIN, "POST": ADMIN}, "pool"),
    "console:pool_kueue": Access({"GET": ADMIN, "POST": ADMIN}, "pool"),
    "console:pool_kueue_take_over": writes("pool", POST=ADMIN),
    "console:cluster_import": reads("cluster"),
    "console:cluster_import_confirm": writes("cluster", POST=ADMIN),
    "console:profile_preview": reads("profile"),
    "console:profile_assign": writes("profile", POST=OPERATOR),
    "console:profile_pin": writes("profile", POST=OPERATOR),
    "console:qos_list": reads(),
    "console:qos_create": Access({"GET": ADMIN, "POST": ADMIN}),
    "console:qos_validate": writes(POST=ADMIN),  # the live check of the admins' editor
    "console:qos_detail": reads("qos"),
    "console:qos_update": Access({"GET": ADMIN, "POST": ADMIN}, "qos"),
    "console:qos_delete": Access({"GET": ADMIN, "POST": ADMIN}, "qos"),
    "console:qos_attach": writes("qos", POST=OPERATOR),
    "console:qos_detach": writes("qos", POST=OPERATOR),
    "console:compliance_list": reads(),
    "console:pool_compliance": reads("pool"),
    "console:pool_compliance_check": writes("pool", POST=OPERATOR),
    "fleet:cluster_list": reads(),
    "fleet:cluster_detail": reads("cluster"),
    "fleet:pool_list": reads(),
    "fleet:node_list": reads(),
    "fleet:node_agent_revoke": writes("node", POST=ADMIN),
    "fleet:gpu_list": reads(),
    "fleet:agent_token_list": Access({"GET": ADMIN, "POST": ADMIN}),
    "fleet:agent_token_revoke": writes("join_token", POST=ADMIN),
    "fleet:pending_approve": writes("pending", POST=ADMIN),
    "fleet:pending_reject": writes("pending", POST=ADMIN),
    "sharing:profile_list": reads(),
    "sharing:profile_create": Access({"GET": ADMIN, "POST": ADMIN}),
    "sharing:profile_validate": writes(POST=ADMIN),  # the live check of the admins' editor
    "sharing:profile_detail": reads("profile"),
    "sharing:profile_update": Access({"GET": ADMIN, "POST": ADMIN}, "profile"),
    "sharing:profile_delete": Access({"GET": ADMIN, "POST": ADMIN}, "profile"),
    "sharing:node_pin": writes("node", POST=OPERATOR),
    "sharing:node_unpin": writes("node", POST=OPERATOR),
    "scheduling:schedule_list": reads(),
    "scheduling:schedule_create": Access({"GET": ADMIN, "POST": ADMIN}),
    "scheduling:schedule_daynight": Access({"GET": ADMIN, "POST": ADMIN}),
    "scheduling:schedule_timeline": writes(POST=ADMIN),  # the admins' editor draws its week; nothing is written
    "scheduling:schedule_detail": reads("schedule"),
    "scheduling:schedule_update": Access({"GET": ADMIN, "POST": ADMIN}, "schedule"),
    "scheduling:schedule_delete": Access({"GET": ADMIN, "POST": ADMIN}, "schedule"),
    "worker:rollout_list": reads(),
    "worker:rollout_detail": reads("rollout"),
    "worker:rollout_live": reads("rollout"),
    "worker:rollout_pause": writes("rollout", POST=OPERATOR),
    "worker:rollout_resume": writes("rollout", POST=OPERATOR),
    "worker:rollout_cancel": writes("rollout", POST=OPERATOR),
    "worker:rollout_retry_now": writes("rollout", POST=OPERATOR),
}
# Allowed GETs that answer an error with good reason (the URL's objects are real all the same).
GET_ERRORS = {
    "agent-desired": "404: no rollout is changing the agent's node",
    "cluster-nvidia-import": "400: an agent cluster has no GPU Operator configs to import",
    "console:cluster_import": "400: an agent cluster has no GPU Operator configs to import",
    "oidc_authentication_init": "404: single sign-on is not configured here (tests/core/test_sso.py turns it on)",
    "oidc_authentication_callback": "404: single sign-on is not configured here (tests/core/test_sso.py turns it on)",
}


def _routes(patterns=None, prefix="", namespace=""):
    """(name, route, its URL kwargs) of every URL pattern, walking the resolver; EXCLUDED prefixes left out."""
    for entry in get_resolver().url_patterns if patterns is None else patterns:
        route = prefix + str(entry.pattern)
        if route in EXCLUDED:
            continue
        if isinstance(entry, URLResolver):
            inner = f"{namespace}{entry.namespace}:" if entry.namespace else namespace
            yield from _routes(entry.url_patterns, route, inner)
        elif isinstance(entry, URLPattern):
            name = f"{namespace}{entry.name}" if entry.name else f"<unnamed: {route}>"
            yield name, route, tuple(entry.pattern.regex.groupindex)


ROUTES = sorted(_routes())


def test_every_route_declares_who_may_call_it():
    names = [name for name, _, _ in ROUTES]
    assert len(names) == len(set(names)), "two URL patterns share a name: the matrix tells routes apart by name"
    missing = [f"{name} (/{route})" for name, route, _ in ROUTES if name not in ACCESS]
    assert not missing, (
        "Routes without a declared role: add each to ACCESS in tests/core/test_authz_matrix.py with who may call it, "
        "per method (and give the view the matching role check): " + ", ".join(missing)
    )
    assert not set(ACCESS) - set(names), f"ACCESS names routes that no longer exist: {sorted(set(ACCESS) - set(names))}"
    for name, _, kwargs in ROUTES:
        assert not kwargs or (kwargs == ("pk",) and ACCESS[name].obj), f"{name}: say which seeded object fills {kwargs}"


def test_the_matrix_covers_the_ui_the_api_the_agent_and_the_probes():
    routes = {route for _, route, _ in ROUTES}
    assert {"api/v1/agent/report/", "api/schema/", "api/docs/", "metrics", "readyz", "healthz", ""} <= routes
    assert len([r for r in routes if r.startswith("api/v1/")]) > 60 and len(ROUTES) > 120


# --- the world every route is tried in ------------------------------------------------------------------------------


@pytest.fixture
def world():
    """One of every object a URL names, two agent nodes with credentials, and a client per caller."""
    for name in ("viewer", "operator", "admin"):
        Group.objects.get_or_create(name=name)
    now = timezone.now()
    cluster = ClusterFactory(name="east", driver="agent", kubeconfig_path="")
    pool = NodePoolFactory(cluster=cluster, name="inference")
    node, other = (NodeFactory(cluster=cluster, pool=pool, name=n) for n in ("node-a", "node-b"))
    gpu = GpuFactory(node=node, product="NVIDIA-H100-80GB-HBM3")
    profile = SharingProfile.objects.create(name="whole", mode="passthrough")
    qos = QoSPolicy.objects.create(name="inference")
    rollout = Rollout.objects.create(title="t", trigger="user", actor_label="t", pool=pool, status="running")
    token, _ = agent_credentials.agent_join_token_create(actor=Actor.system(), cluster=cluster, name="lab")
    plain = {}
    for agent_node in (node, other):
        plain[agent_node.name], key_id, secret_hash = secret_new(CREDENTIAL_PREFIX)
        AgentCredential.objects.create(node=agent_node, join_token=token, key_id=key_id, secret_hash=secret_hash)
    objects = {
        "cluster": cluster,
        "pool": pool,
        "node": node,
        "gpu": gpu,
        "mig": MigDeviceFactory(gpu=gpu),
        "profile": profile,
        "pin": NodePin.objects.create(node=other, profile=profile),
        "qos": qos,
        "schedule": Schedule.objects.create(pool=pool, name="office-hours", time_zone="UTC"),
        "kueue": KueueBinding.objects.create(pool=pool, cluster_queues=["gpu"]),
        "rollout": rollout,
        "change": NodeChange.objects.create(rollout=rollout, node=node, position=0),
        "retry": NodeRetry.objects.create(node=node, config_id="c1", failures=1, next_retry_at=now, rollout=rollout),
        "admission": AdmissionPolicyState.objects.create(
            cluster=cluster, pool=pool, pool_name=pool.name, qos_policy=qos, state="applied"
        ),
        "join_token": token,
        "credential": AgentCredential.objects.get(node=node),
        "pending": PendingAgent.objects.create(node=node, key_hash="f" * 64, requested_at=now, last_asked_at=now),
        "conflict": UuidConflict.objects.create(
            node=other, holder=node, uuid=gpu.uuid, kind="gpu", first_seen_at=now, last_seen_at=now
        ),
    }
    QoSComplianceReport.objects.create(pool=pool, policy=qos, checked_at=now)
    objects["audit"] = audit_record(actor=Actor.system(), action="matrix.seed", obj=profile)
    clients = {"anonymous": Client(), "agent": Client(HTTP_AUTHORIZATION=f"Bearer {plain['node-a']}")}
    clients["agent of node-b"] = Client(HTTP_AUTHORIZATION=f"Bearer {plain['node-b']}")
    for caller, role in (("no-role", None), ("viewer", "viewer"), ("operator", "operator"), ("admin", "admin")):
        clients[caller] = Client()
        clients[caller].force_login(UserFactory(username=f"matrix-{caller}", role=role))
    return objects, clients


# --- the matrix -------------------------------------------------------------------------------------------------------


def _is_denied(response) -> bool:
    """401, 403, or sent to sign in (and back): signing out also ends on the sign-in page, without a `next`."""
    if response.status_code in (401, 403):
        return True
    return response.status_code == 302 and response["Location"].startswith(reverse("login") + "?next=")


def _may(who, caller: str) -> bool:
    if who == PUBLIC:
        return True
    if who == AGENT:
        return caller == "agent"
    ranks = {"viewer": VIEWER, "operator": OPERATOR, "admin": ADMIN}
    return caller in ranks and ranks[caller] >= who


def _call(client, method: str, path: str, api: bool):
    """The request, with an empty body (JSON for the API, a form for the UI), undone afterwards."""
    body = {"data": "{}", "content_type": "application/json"} if api and method != "GET" else {}
    with transaction.atomic():
        response = getattr(client, method.lower())(path, **body)
        transaction.set_rollback(True)
    return response


@pytest.mark.parametrize(("name", "route"), [(n, r) for n, r, _ in ROUTES], ids=[n for n, _, _ in ROUTES])
def test_every_route_lets_in_exactly_whom_it_declares(world, name, route):
    access = ACCESS.get(name)
    if access is None:
        pytest.fail(f"{name} (/{route}) has no declared role: add it to ACCESS")
    objects, clients = world
    path = reverse(name, kwargs={"pk": objects[access.obj].pk} if access.obj else None)
    api = route.startswith("api/")
    page = not api and name != "metrics"  # a page tells a user without a role to ask for one; /metrics is text
    wrong = []
    for method in METHODS:
        who = access.methods.get(method)
        for caller in CALLERS:
            response = _call(clients[caller], method, path, api)
            code = response.status_code
            if who is None:
                if not (_is_denied(response) or code == 405):
                    wrong.append(f"{method} by {caller}: {code}, but {name} declares no {method}")
            elif not _may(who, caller):
                if not _is_denied(response):
                    wrong.append(f"{method} by {caller}: {code}, not denied (needs {_label(who)})")
                elif caller == "no-role" and page and "Your account has no role yet" not in response.content.decode():
                    wrong.append(f"{method} by {caller}: refused without telling them to ask an admin for a role")
            elif _is_denied(response) or code == 405:
                wrong.append(f"{method} by {caller}: {code}, not allowed (needs {_label(who)})")
            elif method == "GET" and code >= 400 and name not in GET_ERRORS:
                wrong.append(f"GET by {caller}: {code}, an error (are the URL's objects real?)")
    assert not wrong, f"{path}:\n  " + "\n  ".join(wrong)


def _label(who) -> str:
    return who if isinstance(who, str) else f"the {who.name.lower()} role"


# --- an agent credential speaks for its own node only -----------------------------------------------------------------


def _report(hostname: str) -> Report:
    return Report("0.1.0", hostname, "550.54.15", "12.4", 1, (), (), HostSettings(None, None, None, None, None), None)


def test_an_agent_credential_speaks_for_its_own_node_only(world):
    """Where the body names a node (a report's hostname, an outcome's change), another node's credential is refused,
    and nothing of the call is stored; the matrix above shows it reaches no route but the agent's own."""
    objects, clients = world
    node_b = clients["agent of node-b"]
    refused = node_b.post(protocol.REPORT_PATH, _report("node-a").to_dict(), content_type="application/json")
    assert refused.status_code == 403 and "belongs to node node-b" in refused.json()["message"]
    change = objects["change"]  # node-a's
    outcome = Outcome(change.pk, "cfg", "failed", "not mine", _report("node-b"))
    refused = node_b.post(protocol.OUTCOME_PATH, outcome.to_dict(), content_type="application/json")
    assert refused.status_code == 403 and f"Change {change.pk} is not one of node node-b" in refused.json()["message"]
    change.refresh_from_db()
    assert change.status == "queued" and change.error == ""
    own = node_b.post(protocol.REPORT_PATH, _report("node-b").to_dict(), content_type="application/json")
    assert own.status_code == 200
