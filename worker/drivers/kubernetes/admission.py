"""ValidatingAdmissionPolicies and their bindings (admissionregistration.k8s.io/v1, Kubernetes >= 1.30) that Tessera
manages in one cluster: read them by label, then create, replace or delete each pair until the cluster shows what is
wanted. A pass that finds nothing different writes nothing. Each pair's outcome is handed to the caller as soon as
the pair is done, so a pass cut short by the task's time limit has recorded (and audited) every write it made.

The API server fills in defaults (failurePolicy, matchPolicy, empty selectors, rule scopes), so a live object
matches when it carries everything Tessera sent (defaults may be added) and the manifest hash annotation.
"""

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from celery.exceptions import SoftTimeLimitExceeded
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from worker.drivers.base import DriverError
from worker.drivers.kubernetes.api import api_client, call, error_text, is_transient, list_all, read_json
from worker.drivers.kubernetes.labels import MANAGED_BY, MANAGED_BY_TESSERA

MANIFEST_HASH = "tessera.io/manifest-sha256"
KINDS = ("policy", "binding")  # creation order; deletion runs backwards (a binding never outlives its policy)
CONFLICT_ATTEMPTS = 4
CUT_SHORT = "the sync was cut short by its time limit; the next pass finishes it"
NOT_SERVED = (
    "the API server does not serve admissionregistration.k8s.io/v1 ValidatingAdmissionPolicies "
    "(they need Kubernetes 1.30 or later)"
)
FORBIDDEN = (
    "Tessera may not manage ValidatingAdmissionPolicies in this cluster: grant its service account get, list, "
    "create, update and delete on validatingadmissionpolicies and validatingadmissionpolicybindings "
    "(deploy/components/admission)"
)


@dataclass(frozen=True)
class Wanted:
    """One policy and binding pair to have in the cluster (both named `name`), and the hash of their manifest."""

    name: str
    policy: dict
    binding: dict
    manifest_hash: str


@dataclass
class Outcome:
    """What a pass did to one pair: `actions` as (kind, "created" | "replaced" | "deleted"), or the error."""

    name: str
    actions: list[tuple[str, str]] = field(default_factory=list)
    error: str = ""
    resource_versions: dict[str, str] = field(default_factory=dict)


def contains(live, wanted) -> bool:
    """`wanted` is part of `live`: every key with an equal value, recursively (the server may add defaults);
    lists must have the same length, item by item."""
    if isinstance(wanted, dict):
        return isinstance(live, dict) and all(k in live and contains(live[k], v) for k, v in wanted.items())
    if isinstance(wanted, list):
        return isinstance(live, list) and len(live) == len(wanted) and all(map(contains, live, wanted))
    return live == wanted


def _with_hash(obj: dict, manifest_hash: str) -> dict:
    body = copy.deepcopy(obj)
    body.setdefault("metadata", {}).setdefault("annotations", {})[MANIFEST_HASH] = manifest_hash
    return body


def matches(live: dict | None, wanted: dict) -> bool:
    """The live object is what Tessera would write: its labels, annotations and spec contain the wanted ones."""
    if live is None:
        return False
    meta, wanted_meta = live.get("metadata") or {}, wanted.get("metadata") or {}
    return (
        contains(meta.get("labels") or {}, wanted_meta.get("labels") or {})
        and contains(meta.get("annotations") or {}, wanted_meta.get("annotations") or {})
        and contains(live.get("spec") or {}, wanted.get("spec") or {})
    )


def _update(live: dict, wanted: dict) -> dict:
    """The object just read with Tessera's spec, labels and annotations: others' labels and annotations stay, and
    its resourceVersion makes the write conditional."""
    body = copy.deepcopy(live)
    body.pop("status", None)
    meta, wanted_meta = body["metadata"], wanted["metadata"]
    for key in ("labels", "annotations"):
        meta[key] = {**(meta.get(key) or {}), **(wanted_meta.get(key) or {})}
    body["spec"] = copy.deepcopy(wanted["spec"])
    return body


def _retry_unless_conflict(exc: BaseException) -> bool:
    return is_transient(exc) and not (isinstance(exc, ApiException) and exc.status == 409)


def describe(exc: BaseException) -> str:
    """An error of these calls in an admin's words: an API server too old to serve the kinds, or RBAC, plainly."""
    status = getattr(exc, "status", None)
    if isinstance(exc, ApiException) and status == 404:
        return f"{NOT_SERVED}: {error_text(exc)}"
    if isinstance(exc, ApiException) and status == 403:
        return f"{FORBIDDEN}: {error_text(exc)}"
    return error_text(exc)


class AdmissionPolicies:
    """Tessera's ValidatingAdmissionPolicy/Binding pairs in one cluster, through AdmissionregistrationV1Api."""

    def __init__(self, cluster):
        self.api = client.AdmissionregistrationV1Api(api_client(cluster))
        self._calls = {
            "policy": (
                self.api.list_validating_admission_policy,
                self.api.read_validating_admission_policy,
                self.api.create_validating_admission_policy,
                self.api.replace_validating_admission_policy,
                self.api.delete_validating_admission_policy,
            ),
            "binding": (
                self.api.list_validating_admission_policy_binding,
                self.api.read_validating_admission_policy_binding,
                self.api.create_validating_admission_policy_binding,
                self.api.replace_validating_admission_policy_binding,
                self.api.delete_validating_admission_policy_binding,
            ),
        }

    def observed(self) -> dict[str, dict[str, dict]]:
        """Every Tessera-managed pair by name: {name: {"policy": obj, "binding": obj}} (either may be missing).
        One list per kind, by label; raises DriverError with a clear text when the kinds are not served."""
        found: dict[str, dict[str, dict]] = {}
        for kind in KINDS:
            try:
                items, _ = list_all(self._calls[kind][0], label_selector=f"{MANAGED_BY}={MANAGED_BY_TESSERA}")
            except SoftTimeLimitExceeded:
                raise
            except Exception as exc:
                raise DriverError(describe(exc), transient=is_transient(exc)) from None
            for item in items:
                found.setdefault(item["metadata"]["name"], {})[kind] = item
        return found

    def sync(
        self,
        wanted: list[Wanted],
        observed: dict[str, dict[str, dict]],
        done: Callable[[Outcome], None] = lambda outcome: None,
    ) -> list[Outcome]:
        """Create or replace each wanted pair that differs, delete every managed pair not wanted; one Outcome per
        pair touched or checked (wanted ones always, unwanted ones that existed), each passed to `done` as soon as
        its pair is finished. Celery's soft time limit is not an error of the pair: the pair's outcome so far goes
        to `done` (its writes are real) and the exception propagates, ending the pass."""
        outcomes = []
        names = {item.name for item in wanted}
        work = [(item.name, partial(self._ensure_pair, item, observed.get(item.name, {}))) for item in wanted]
        work += [(name, partial(self._delete_pair, observed[name])) for name in sorted(set(observed) - names)]
        for name, write in work:
            outcome = Outcome(name)
            try:
                write(outcome)
            except SoftTimeLimitExceeded:
                outcome.error = CUT_SHORT
                done(outcome)
                raise
            except Exception as exc:
                outcome.error = describe(exc)
            outcomes.append(outcome)
            done(outcome)
        return outcomes

    def _ensure_pair(self, item: Wanted, live: dict[str, dict], outcome: Outcome) -> None:
        for kind in KINDS:
            body = _with_hash(getattr(item, kind), item.manifest_hash)
            action, version = self._ensure(kind, item.name, body, live.get(kind))
            outcome.resource_versions[kind] = version
            if action:
                outcome.actions.append((kind, action))

    def _delete_pair(self, live: dict[str, dict], outcome: Outcome) -> None:
        for kind in reversed(KINDS):
            if kind in live and self._delete(kind, outcome.name):
                outcome.actions.append((kind, "deleted"))

    def _read(self, kind: str, name: str) -> dict | None:
        try:
            return read_json(self._calls[kind][1], name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _ensure(self, kind: str, name: str, body: dict, live: dict | None) -> tuple[str | None, str]:
        """Make one object match `body`: create when missing, replace (with the resourceVersion just read) when it
        differs; a conflict means someone wrote first, so read again and decide again."""
        _, _, create, replace, _ = self._calls[kind]
        for _ in range(CONFLICT_ATTEMPTS):
            if matches(live, body):
                return None, live["metadata"].get("resourceVersion", "")
            try:
                if live is None:
                    written = read_json(create, body, retry_if=_retry_unless_conflict)
                    return "created", written["metadata"].get("resourceVersion", "")
                written = read_json(replace, name, _update(live, body), retry_if=_retry_unless_conflict)
                return "replaced", written["metadata"].get("resourceVersion", "")
            except ApiException as exc:
                if exc.status not in (404, 409):
                    raise
            live = self._read(kind, name)
        raise DriverError(f"{name} kept changing under Tessera; the next pass tries again", transient=True)

    def _delete(self, kind: str, name: str) -> bool:
        """Delete one object; False when it was already gone."""
        try:
            call(self._calls[kind][4], name)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True
