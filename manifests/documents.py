"""Tessera's desired state as documents (docs/config-as-code.md): one per object, `kind` plus identity by name plus
only the fields a person writes; a field left out means its default. The kinds, their fields and JSON Schema are
derived from the models here, so the schema the server publishes and the client ships cannot drift from them."""

import hashlib
import json
from dataclasses import dataclass, field
from datetime import date, time

from django.db import models

from fleet.models import Node, NodePool
from scheduling.models import KueueBinding, Schedule, ScheduleWindow
from scheduling.services import SCHEDULE_FIELDS
from sharing.models import QoSPolicy, SharingProfile
from sharing.services import PROFILE_FIELDS, QOS_FIELDS

SCHEMA_ID = "https://tessera.invalid/schemas/config/v1.json"
INT_MAX = {"PositiveSmallIntegerField": 32767, "PositiveIntegerField": 2147483647}
NAME = {"type": "string", "minLength": 1, "maxLength": 100}
REF = {"type": ["string", "null"], "minLength": 1, "maxLength": 100}
TIME = {"type": "string", "pattern": r"^([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9])?$"}


def _model_schema(model_field: models.Field) -> dict:
    """A model field's values as JSON Schema: type, bounds, choices; null and "" where the model allows them."""
    internal = model_field.get_internal_type()
    if model_field.choices:
        values = [value for value, _ in model_field.flatchoices]
        schema = {"enum": values + ([""] if model_field.blank and "" not in values else [])}
    elif internal == "BooleanField":
        schema = {"type": "boolean"}
    elif internal in INT_MAX:
        low, high = 0, INT_MAX[internal]
        for validator in model_field.validators:
            if validator.code == "min_value":
                low = max(low, validator.limit_value)
            elif validator.code == "max_value":
                high = min(high, validator.limit_value)
        schema = {"type": "integer", "minimum": low, "maximum": high}
    else:
        schema = {"type": "string"}
        if model_field.max_length:
            schema["maxLength"] = model_field.max_length
    if model_field.null:
        schema = (
            {**schema, "enum": [*schema["enum"], None]}
            if "enum" in schema
            else {**schema, "type": [schema["type"], "null"]}
        )
    if model_field.help_text:
        schema["description"] = str(model_field.help_text)
    return schema


def _model_fields(model, names) -> dict[str, dict]:
    return {name: _model_schema(model._meta.get_field(name)) for name in names}


def _defaults(model, names) -> dict:
    return {name: model._meta.get_field(name).get_default() for name in names}


@dataclass(frozen=True)
class Kind:
    """One kind of document: its identity fields (a key such as `Pool/prod-east/inference`), the fields a person
    writes with their JSON Schema, and each field's default (what leaving it out means)."""

    name: str
    identity: tuple[str, ...]
    fields: dict[str, dict]
    defaults: dict = field(default_factory=dict)
    required: tuple[str, ...] = ()
    description: str = ""

    def key(self, document: dict) -> str:
        return "/".join([self.name, *(str(document.get(part, "")) for part in self.identity)])

    def full(self, document: dict) -> dict:
        """The document with every field: defaults where it leaves one out."""
        return {
            "kind": self.name,
            **{k: document[k] for k in self.identity},
            **self.defaults,
            **_fields(self, document),
        }

    def minimal(self, full: dict) -> dict:
        """The document as a person writes it: fields at their default left out."""
        kept = {k: v for k, v in _fields(self, full).items() if k in self.required or v != self.defaults.get(k)}
        return {"kind": self.name, **{k: full[k] for k in self.identity}, **kept}


def _fields(kind: Kind, document: dict) -> dict:
    return {k: document[k] for k in kind.fields if k in document and k not in kind.identity}


_PROFILE = [f for f in PROFILE_FIELDS if f != "name"]
_QOS = [f for f in QOS_FIELDS if f != "name"]
_SCHEDULE = [f for f in SCHEDULE_FIELDS if f not in ("baseline_profile", "baseline_qos_policy")]
_LAYOUT = {
    "type": ["object", "null"],
    "additionalProperties": {"type": "integer", "minimum": 1, "maximum": 7},
    "description": "MIG profile (e.g. 3g.40gb) → count; null: MIG off on that GPU.",
}

PROFILE = Kind(
    "Profile",
    ("name",),
    {
        "name": NAME,
        **_model_fields(SharingProfile, _PROFILE),
        "target_products": {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "description": str(SharingProfile._meta.get_field("target_products").help_text),
        },  # fmt: skip
        "mig_layouts": {
            "type": "object",
            "propertyNames": {"pattern": "^(all|[0-9]+)$"},
            "additionalProperties": _LAYOUT,
            "description": '"all" or a GPU index → its MIG layout.',
        },
    },
    _defaults(SharingProfile, _PROFILE),
    required=("mode",),
    description="A sharing profile: how a node's GPUs are shared (passthrough, MIG, MPS, time-slicing).",
)
QOS = Kind(
    "QoSPolicy",
    ("name",),
    {"name": NAME, **_model_fields(QoSPolicy, _QOS)},
    _defaults(QoSPolicy, _QOS),
    description="A QoS policy: workload rules, GPU settings and host tuning, kubelet expectations.",
)
POOL = Kind(
    "Pool",
    ("cluster", "name"),
    {
        "cluster": {**NAME, "description": "The cluster's name (clusters are registered, not defined here)."},
        "name": NAME,
        **_model_fields(NodePool, ("description", "node_selector")),
        "members": {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "description": "Node names, for a pool without a node selector.",
        },
        "profile": {**REF, "description": "The default sharing profile (by name)."},
        "qos_policy": {**REF, "description": "The default QoS policy (by name)."},
    },
    {"description": "", "node_selector": "", "members": [], "profile": None, "qos_policy": None},
    description="A node pool of a cluster, with its default profile and QoS policy.",
)
_WINDOW = {
    "type": "object",
    "additionalProperties": False,
    "required": ["weekdays", "start", "end", "profile"],
    "properties": {
        "name": {"type": "string", "maxLength": 100},
        "weekdays": {
            "type": "array",
            "minItems": 1,
            "items": {"type": "integer", "minimum": 0, "maximum": 6},
            "description": "Days the window starts on, 0 = Monday … 6 = Sunday.",
        },
        "start": {**TIME, "description": "HH:MM in the schedule's time zone."},
        "end": {**TIME, "description": "HH:MM; at or before start crosses midnight."},
        "profile": {**NAME, "description": "The sharing profile during the window (by name)."},
        "qos_policy": {**REF, "description": "The QoS policy during the window; null: the pool's."},
    },
}
_EXCEPTION = {
    "type": "object",
    "additionalProperties": False,
    "required": ["date"],
    "properties": {
        "date": {"type": "string", "pattern": r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
        "note": {"type": "string", "maxLength": 200},
    },
}
SCHEDULE = Kind(
    "Schedule",
    ("cluster", "pool"),
    {
        "cluster": NAME,
        "pool": {**NAME, "description": "The pool the schedule belongs to (one schedule per pool)."},
        "name": NAME,
        **_model_fields(Schedule, _SCHEDULE),
        "baseline_profile": {**REF, "description": "Outside every window; null: the pool's default profile."},
        "baseline_qos_policy": {**REF, "description": "Outside every window; null: the pool's default policy."},
        "windows": {"type": "array", "items": _WINDOW},
        "exceptions": {"type": "array", "items": _EXCEPTION, "description": "Dates on which no window starts."},
    },
    {
        **_defaults(Schedule, _SCHEDULE),
        "baseline_profile": None,
        "baseline_qos_policy": None,
        "windows": [],
        "exceptions": [],
    },
    required=("name",),
    description="A pool's schedule: windows of the week that switch its profile and QoS policy.",
)
KUEUE = Kind(
    "KueueBinding",
    ("cluster", "pool"),
    {
        "cluster": NAME,
        "pool": NAME,
        "cluster_queues": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
        **_model_fields(KueueBinding, ("lead_minutes", "enabled")),
    },
    {"cluster_queues": [], **_defaults(KueueBinding, ("lead_minutes", "enabled"))},
    required=("cluster_queues",),
    description="The ClusterQueues whose quota Tessera keeps in step with a pool's layout.",
)
# Dependency order: what a document names comes before it (applied in this order, pruned in the reverse one).
KINDS: dict[str, Kind] = {k.name: k for k in (QOS, PROFILE, POOL, SCHEDULE, KUEUE)}
ORDER = {name: i for i, name in enumerate(KINDS)}


def schema() -> dict:
    """The JSON Schema of a document (draft 2020-12), one definition per kind chosen by `kind`."""
    defs = {}
    for kind in KINDS.values():
        defs[kind.name] = {
            "type": "object",
            "description": kind.description,
            "additionalProperties": False,
            "required": ["kind", *kind.identity, *kind.required],
            "properties": {"kind": {"const": kind.name}, **kind.fields},
        }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "Tessera desired state: one document per object",
        "type": "object",
        "required": ["kind"],
        "properties": {"kind": {"enum": list(KINDS)}},
        "allOf": [
            {"if": {"properties": {"kind": {"const": name}}, "required": ["kind"]}, "then": {"$ref": f"#/$defs/{name}"}}
            for name in KINDS
        ],
        "$defs": defs,
    }


def version(full: dict) -> str:
    """A document's version: a digest of all its fields, so any change on the server (UI, API, another apply)
    gives it a new one."""
    return hashlib.sha256(json.dumps(full, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _clock(value: time) -> str:
    return f"{value:%H:%M:%S}" if value.second else f"{value:%H:%M}"


def _name(obj) -> str | None:
    return obj.name if obj is not None else None


def current() -> dict[str, dict]:
    """Every object on the server as a full document, by key, in a constant number of queries."""
    docs = []
    for policy in QoSPolicy.objects.all():
        docs.append(QOS.full({"name": policy.name, **{f: getattr(policy, f) for f in _QOS}}))
    for profile in SharingProfile.objects.all():
        docs.append(PROFILE.full({"name": profile.name, **{f: getattr(profile, f) for f in _PROFILE}}))
    pools = list(NodePool.objects.select_related("cluster", "sharing__profile", "sharing__qos_policy"))
    members: dict[int, list[str]] = {}
    explicit = [p.pk for p in pools if not p.node_selector]
    for pool_id, name in Node.objects.live().filter(pool_id__in=explicit).values_list("pool_id", "name"):
        members.setdefault(pool_id, []).append(name)
    for pool in pools:
        sharing = getattr(pool, "sharing", None)
        docs.append(
            POOL.full(
                {
                    "cluster": pool.cluster.name,
                    "name": pool.name,
                    "description": pool.description,
                    "node_selector": pool.node_selector,
                    "members": sorted(members.get(pool.pk, [])),
                    "profile": _name(sharing.profile) if sharing else None,
                    "qos_policy": _name(sharing.qos_policy) if sharing else None,
                }
            )
        )
    schedules = Schedule.objects.select_related("pool__cluster", "baseline_profile", "baseline_qos_policy")
    windows = ScheduleWindow.objects.select_related("profile", "qos_policy").order_by("schedule", "start", "pk")
    for schedule in schedules.prefetch_related(models.Prefetch("windows", windows), "exceptions"):
        docs.append(
            SCHEDULE.full(
                {
                    "cluster": schedule.pool.cluster.name,
                    "pool": schedule.pool.name,
                    **{f: getattr(schedule, f) for f in _SCHEDULE},
                    "baseline_profile": _name(schedule.baseline_profile),
                    "baseline_qos_policy": _name(schedule.baseline_qos_policy),
                    "windows": sorted((window_document(w) for w in schedule.windows.all()), key=_window_order),
                    "exceptions": [exception_document(e.date, e.note) for e in schedule.exceptions.all()],
                }
            )
        )
    for binding in KueueBinding.objects.select_related("pool__cluster"):
        docs.append(
            KUEUE.full(
                {
                    "cluster": binding.pool.cluster.name,
                    "pool": binding.pool.name,
                    "cluster_queues": sorted(binding.cluster_queues),
                    "lead_minutes": binding.lead_minutes,
                    "enabled": binding.enabled,
                }
            )
        )
    return {KINDS[d["kind"]].key(d): d for d in docs}


def window_document(window: ScheduleWindow) -> dict:
    doc = {"name": window.name, "weekdays": sorted(window.weekdays), "start": _clock(window.start)}
    return {**doc, "end": _clock(window.end), "profile": window.profile.name, "qos_policy": _name(window.qos_policy)}


def _window_order(window: dict) -> tuple:
    return window["start"], window["weekdays"], window["end"], window["name"]


def exception_document(day: date, note: str) -> dict:
    return {"date": day.isoformat(), "note": note}


def normalised(document: dict) -> dict:
    """A valid document (schema-checked) in the form `current` gives: every field, lists in a stable order, a
    window's optional parts filled, times as HH:MM."""
    kind = KINDS[document["kind"]]
    full = kind.full(document)
    if kind is SCHEDULE:
        full["windows"] = [
            {
                "name": w.get("name", ""),
                "weekdays": sorted(set(w["weekdays"])),
                "start": _clock(time.fromisoformat(w["start"])),
                "end": _clock(time.fromisoformat(w["end"])),
                "profile": w["profile"],
                "qos_policy": w.get("qos_policy"),
            }
            for w in full["windows"]
        ]
        full["windows"].sort(key=_window_order)
        full["exceptions"] = sorted(
            (exception_document(date.fromisoformat(e["date"]), e.get("note", "")) for e in full["exceptions"]),
            key=lambda e: e["date"],
        )
    elif kind is POOL:
        full["members"] = sorted(set(full["members"]))
    elif kind is KUEUE:
        full["cluster_queues"] = sorted(set(full["cluster_queues"]))
    return full


def exported() -> list[dict]:
    """The server's state as the documents a person would write, in dependency order then by key."""
    docs = current()
    return [KINDS[docs[key]["kind"]].minimal(docs[key]) for key in sorted(docs, key=sort_key)]


def sort_key(key: str) -> tuple:
    kind, _, rest = key.partition("/")
    return ORDER[kind], rest


def current_object(key: str):
    """The model object a key names on the server (None when it is gone)."""
    kind, *parts = key.split("/", 2)
    if kind in (QOS.name, PROFILE.name):
        model = QoSPolicy if kind == QOS.name else SharingProfile
        return model.objects.filter(name=key.split("/", 1)[1]).first()
    cluster, name = parts
    if kind == POOL.name:
        return NodePool.objects.filter(cluster__name=cluster, name=name).first()
    model = Schedule if kind == SCHEDULE.name else KueueBinding
    return model.objects.filter(pool__cluster__name=cluster, pool__name=name).first()
