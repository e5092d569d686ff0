"""The config API: export, plan and apply round-trip; bad documents are refused per document path; a plan is refused
once an object in it changed on the server; one audit event per apply; prune only when asked."""

from dataclasses import asdict
from datetime import UTC, datetime

import pytest
import time_machine

from core.models import AuditEvent
from manifests import documents
from scheduling.kueue import profile_quota
from scheduling.models import KueueBinding, Schedule
from sharing.models import QoSPolicy, SharingProfile

pytestmark = pytest.mark.django_db


def export(client) -> dict:
    response = client.get("/api/v1/config/documents/")
    assert response.status_code == 200, response.content
    return response.json()


def plan(client, docs, **options):
    return client.post("/api/v1/config/plan/", {"documents": docs, **options}, format="json")


def apply(client, docs, **options):
    return client.post("/api/v1/config/apply/", {"documents": docs, **options}, format="json")


def test_export_lists_every_object_with_only_the_fields_a_person_writes(world, viewer_api):
    docs = export(viewer_api)["documents"]
    assert [(d["kind"], d.get("pool") or d.get("name")) for d in docs] == [
        ("QoSPolicy", "serving"),
        ("Profile", "mig-7"),
        ("Profile", "whole"),
        ("Pool", "inference"),
        ("Schedule", "inference"),
        ("KueueBinding", "inference"),
    ]
    assert docs[0] == {"kind": "QoSPolicy", "name": "serving", "required_qos": "guaranteed"}
    assert docs[3] == {
        "kind": "Pool",
        "cluster": "east",
        "name": "inference",
        "node_selector": "tessera.io/pool=inference",
        "profile": "whole",
        "qos_policy": "serving",
    }
    assert docs[4]["windows"] == [
        {"name": "am", "weekdays": [0, 1, 2, 3, 4], "start": "06:00", "end": "09:00", "profile": "mig-7",
         "qos_policy": None}
    ]  # fmt: skip
    assert docs[4]["exceptions"] == [{"date": "2026-12-25", "note": "Christmas"}]
    assert not any(k in d for d in docs for k in ("id", "created_at", "updated_at", "drift", "synced_at"))


def test_applying_the_export_plans_and_changes_nothing(world, admin_api):
    exported = export(admin_api)
    events = AuditEvent.objects.count()
    response = apply(admin_api, exported["documents"], prune=True, versions=exported["versions"])
    assert response.status_code == 200, response.content
    assert response.json()["changes"] == [] and response.json()["applied"] is False
    assert AuditEvent.objects.count() == events


def test_apply_into_an_empty_server_reproduces_every_object(world, admin_api):
    exported = export(admin_api)["documents"]
    for model in (KueueBinding, Schedule):
        model.objects.all().delete()
    world.delete()
    SharingProfile.objects.all().delete()
    QoSPolicy.objects.all().delete()
    world.cluster.nodes.update(pool=None)

    response = apply(admin_api, exported, message="commit 1a2b3c")
    assert response.status_code == 200, response.content
    body = response.json()
    assert [(c["action"], c["key"]) for c in body["changes"]] == [
        ("create", "QoSPolicy/serving"),
        ("create", "Profile/mig-7"),
        ("create", "Profile/whole"),
        ("create", "Pool/east/inference"),
        ("create", "Schedule/east/inference"),
        ("create", "KueueBinding/east/inference"),
    ]
    assert body["applied"] is True
    assert export(admin_api)["documents"] == exported
    event = AuditEvent.objects.get(pk=body["audit_event"])
    assert event.action == "config.apply" and event.message == "commit 1a2b3c"
    assert [c["action"] for c in event.after["changes"]][:3] == ["qos.create", "profile.create", "profile.create"]
    assert AuditEvent.objects.filter(at__gte=event.at).count() == 1  # the services' own events are in this one


def test_plan_lists_changes_field_by_field_and_writes_nothing(world, viewer_api):
    docs = export(viewer_api)["documents"]
    docs[2]["description"] = "Whole GPUs, no sharing."
    docs[4]["windows"][0]["end"] = "10:00"
    events = AuditEvent.objects.count()
    response = plan(viewer_api, docs)
    assert response.status_code == 200, response.content
    changes = response.json()["changes"]
    window = {"name": "am", "weekdays": [0, 1, 2, 3, 4], "start": "06:00", "end": "09:00", "profile": "mig-7",
              "qos_policy": None}  # fmt: skip
    description = {"field": "description", "before": "Whole GPUs.", "after": "Whole GPUs, no sharing."}
    windows = {"field": "windows", "before": [window], "after": [{**window, "end": "10:00"}]}
    assert [(c["action"], c["key"], c["fields"]) for c in changes] == [
        ("update", "Profile/whole", [description]),
        ("update", "Schedule/east/inference", [windows]),
    ]
    assert AuditEvent.objects.count() == events
    assert SharingProfile.objects.get(name="whole").description == "Whole GPUs."


def test_bad_documents_are_refused_per_document_and_field(world, admin_api):
    docs = export(admin_api)["documents"]
    docs[0]["colour"] = "blue"
    docs[2]["replicas"] = "two"
    docs[4]["windows"][0]["profile"] = "mig-3"
    docs.append({"kind": "Pool", "cluster": "west", "name": "x"})
    response = apply(admin_api, docs)
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert errors == {
        "documents[0].colour": ["Unknown field 'colour'."],
        "documents[2].replicas": ["'two' is not of type 'integer'"],
    }  # the schema first; references only once the documents are well-formed
    docs[0].pop("colour")
    docs[2]["replicas"] = 1
    errors = apply(admin_api, docs).json()["errors"]
    assert errors == {
        "documents[4].windows[0].profile": ["No profile named 'mig-3' in the files."],
        "documents[6].cluster": ["No cluster named 'west' on the server (register clusters before applying)."],
    }


def test_a_service_refusal_names_the_document_field(world, admin_api):
    docs = export(admin_api)["documents"]
    docs[1]["mig_layouts"] = {"all": {"7g.80gb": 2}}
    response = apply(admin_api, docs)
    assert response.status_code == 400
    assert response.json()["message"].startswith("Profile/mig-7: ")
    assert list(response.json()["errors"]) == ["documents[1].mig_layouts.all"]


def test_an_object_changed_since_the_plan_is_refused_by_name(world, admin_api):
    exported = export(admin_api)
    docs = exported["documents"]
    docs[3]["description"] = "Serving."
    planned = plan(admin_api, docs).json()
    schedule = Schedule.objects.get()
    edit = admin_api.patch(f"/api/v1/schedules/{schedule.pk}/", {"wait_minutes": 45}, format="json")
    assert edit.status_code == 200, edit.content

    response = apply(admin_api, docs, versions=planned["versions"])
    assert response.status_code == 409
    assert "Schedule/east/inference" in response.json()["message"]
    assert response.json()["errors"]["versions"] == ["Schedule/east/inference: changed since the plan was made."]
    assert world.__class__.objects.get(pk=world.pk).description == ""


def test_prune_deletes_only_what_the_files_no_longer_name_and_only_when_asked(world, admin_api):
    docs = [d for d in export(admin_api)["documents"] if d["kind"] != "KueueBinding"]
    assert plan(admin_api, docs).json()["changes"] == []
    response = apply(admin_api, docs, prune=True)
    assert [(c["action"], c["key"]) for c in response.json()["changes"]] == [("delete", "KueueBinding/east/inference")]
    assert not KueueBinding.objects.exists()


def test_a_reference_to_what_prune_deletes_is_an_error(world, admin_api):
    docs = [d for d in export(admin_api)["documents"] if d["kind"] != "Profile"]
    assert plan(admin_api, docs).status_code == 200
    errors = plan(admin_api, docs, prune=True).json()["errors"]
    message = "No profile named 'whole' in the files (--prune removes what the files do not name)."
    assert errors["documents[1].profile"] == [message]


def test_the_schema_route_serves_the_schema(viewer_api):
    assert viewer_api.get("/api/v1/config/schema/").json() == documents.schema()


def test_only_admins_apply(world, operator_api):
    docs = export(operator_api)["documents"]
    assert plan(operator_api, docs).status_code == 200
    assert apply(operator_api, docs, dry_run=True).status_code == 403


WEDNESDAY_11_BERLIN = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)


@time_machine.travel(WEDNESDAY_11_BERLIN, tick=False)
def test_the_plans_impact_is_the_schedule_previews_for_the_same_change(world, admin_api):
    docs = export(admin_api)["documents"]
    window = {"name": "late", "weekdays": [0, 1, 2, 3, 4, 5, 6], "start": "10:00", "end": "12:00", "profile": "mig-7"}
    docs[4]["windows"] = [window]
    impact = plan(admin_api, docs).json()["impact"]
    assert [i["pool"]["name"] for i in impact] == ["inference"]

    schedule = Schedule.objects.get()
    preview = admin_api.patch(
        f"/api/v1/schedules/{schedule.pk}/?dry_run=true",
        {"windows": [{**window, "profile": SharingProfile.objects.get(name="mig-7").pk}]},
        format="json",
    )
    assert preview.status_code == 200, preview.content
    assert impact[0]["changes"] == preview.json()["impact"]
    now = impact[0]["changes"][0]
    assert now["when"] == "now" and now["profile"]["name"] == "mig-7"
    assert now["summary"] == {"nodes": 2, "changing": 2, "refused": 0, "resetting": 2, "gpus_resetting": 4,
                              "pods_losing": 0}  # fmt: skip
    assert impact[0]["changes"][1]["when"] == "transition"


@time_machine.travel(WEDNESDAY_11_BERLIN, tick=False)
def test_the_plans_impact_is_the_profile_previews_for_a_new_pool_default(world, admin_api):
    docs = [d for d in export(admin_api)["documents"] if d["kind"] != "Schedule"]
    docs[3]["profile"] = "mig-7"
    impact = plan(admin_api, docs, prune=True).json()["impact"]
    mig = SharingProfile.objects.get(name="mig-7")
    preview = admin_api.post(f"/api/v1/profiles/{mig.pk}/preview/", {"pool": world.pk}, format="json").json()
    (now,) = impact[0]["changes"]
    assert (now["summary"], now["nodes"]) == (preview["summary"], preview["nodes"])
    quota = [{"flavor": "tessera-inference-nvidia-h100-80gb-hbm3", "resource": r, "before": b, "after": a}
             for r, b, a in [("nvidia.com/gpu", 4, 0), ("nvidia.com/mig-1g.10gb", 0, 28)]]  # fmt: skip
    assert impact[0]["quota"] == [quota]
    assert [asdict(q) for q in profile_quota(world, mig)] == quota  # the UI preview's quota (console/views/preview.py)
