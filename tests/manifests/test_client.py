"""The `tessera` client: files read with their lines, checked offline against the schema it ships (the server's,
byte for byte), and against a live server: export → diff plans nothing, a change is planned (exit 2) and applied,
a concurrent edit between diff and apply is refused, a bad file is named with its line."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from django.urls import reverse
from jsonschema import Draft202012Validator

from config.celery import app as celery_app
from core.services import api_token_rotate
from manifests.documents import schema
from manifests.management.commands.config_schema import SHIPPED, schema_text
from sharing.models import QoSPolicy, SharingProfile
from tessera_cli import files
from tessera_cli.main import main
from tessera_cli.schema import validate

ROOT = Path(__file__).resolve().parents[2]


def test_the_client_ships_the_servers_schema():
    assert SHIPPED.read_text() == schema_text(), "run `.venv/bin/python manage.py config_schema`"


def write(directory: Path, name: str, text: str) -> None:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_bad_file_is_named_with_the_line_of_each_problem(tmp_path):
    write(tmp_path, "profiles/whole.yaml", "kind: Profile\nname: whole\nmode: passthrough\n")
    write(
        tmp_path,
        "schedules/east/inference.yaml",
        "# the night shift\nkind: Schedule\ncluster: east\npool: inference\nname: nights\n"
        "windows:\n  - weekdays: [0, 1]\n    start: 22:00\n    end: '06:00'\n    profile: whole\n"
        "    colour: blue\nwait_minutes: soon\n",
    )
    with pytest.raises(files.DocumentsError) as caught:
        files.load(tmp_path)
    assert [str(p) for p in caught.value.problems] == [
        "schedules/east/inference.yaml:11: Schedule/east/inference: windows[0].colour: Unknown field 'colour'.",
        "schedules/east/inference.yaml:12: Schedule/east/inference: wait_minutes: 'soon' is not of type integer.",
    ]  # `start: 22:00` unquoted is a time here, not YAML 1.1's base-60 integer


def test_yaml_errors_and_non_mappings_are_named_too(tmp_path):
    write(tmp_path, "a.yaml", "kind: Profile\nname: [unclosed\n")
    write(tmp_path, "b.yaml", "- just\n- a list\n")
    with pytest.raises(files.DocumentsError) as caught:
        files.load(tmp_path)
    assert [(p.file, p.line) for p in caught.value.problems] == [("a.yaml", 3), ("b.yaml", 1)]


SAMPLES = [
    {"kind": "Profile", "name": "p", "mode": "mig", "mig_layouts": {"all": {"1g.10gb": 7}, "3": None}},
    {"kind": "Profile", "name": "p", "mode": "mig", "mig_layouts": {"gpu0": {}}},
    {"kind": "Profile", "name": "p", "mode": "mig", "replicas": True},
    {"kind": "Profile", "name": "", "mode": "mps"},
    {"kind": "Profile", "name": "p"},
    {"kind": "QoSPolicy", "name": "q", "persistence_mode": None, "swappiness": 201},
    {"kind": "QoSPolicy", "name": "q", "compute_mode": "", "required_qos": "guaranteed", "power_limit_w": 300},
    {"kind": "QoSPolicy", "name": "q", "required_qos": "strict"},
    {"kind": "Pool", "cluster": "c", "name": "x", "members": ["n1"], "profile": None},
    {"kind": "Pool", "cluster": "c", "name": "x", "members": "n1"},
    {"kind": "Schedule", "cluster": "c", "pool": "x", "name": "s", "windows": [{"weekdays": [7], "start": "25:00"}]},
    {"kind": "Schedule", "cluster": "c", "pool": "x", "name": "s", "exceptions": [{"date": "2026-12-25"}]},
    {"kind": "KueueBinding", "cluster": "c", "pool": "x", "cluster_queues": []},
    {"kind": "KueueBinding", "cluster": "c", "pool": "x", "cluster_queues": ["q"], "lead_minutes": 15},
    {"kind": "Node", "name": "n"},
    {"name": "n"},
]


@pytest.mark.parametrize("document", SAMPLES)
def test_the_clients_check_agrees_with_jsonschema(document):
    """The server checks with `jsonschema`, the client with its own small checker: the same verdicts."""
    assert bool(validate(document, schema())) == (not Draft202012Validator(schema()).is_valid(document))


# --- against a live server --------------------------------------------------------------------------------------


@pytest.fixture
def server(request, admin_user, live_server, monkeypatch):
    """The world on a live server, the client's environment pointing at it with an admin's token. Tasks run eagerly
    but a task's failure is not the request's, as with a worker: cluster `east` has no reachable API here."""
    monkeypatch.setitem(celery_app.conf, "task_eager_propagates", False)
    request.getfixturevalue("world")
    _, token = api_token_rotate(user=admin_user)
    monkeypatch.setenv("TESSERA_URL", live_server.url)
    monkeypatch.setenv("TESSERA_TOKEN", token)
    return live_server.url


def tessera(capsys, *args) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.django_db(transaction=True)
def test_export_then_diff_plans_nothing_then_a_change_is_planned_and_applied(server, tmp_path, capsys):
    code, out, _ = tessera(capsys, "export", str(tmp_path))
    assert code == 0 and out.strip() == f"Wrote 6 document(s) to {tmp_path}."
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.yaml")) == [
        "kueue-bindings/east/inference.yaml",
        "pools/east/inference.yaml",
        "profiles/mig-7.yaml",
        "profiles/whole.yaml",
        "qos-policies/serving.yaml",
        "schedules/east/inference.yaml",
    ]
    assert (
        (tmp_path / "pools/east/inference.yaml")
        .read_text()
        .startswith(
            "# yaml-language-server: $schema=../../tessera.schema.json\nkind: Pool\ncluster: east\nname: inference\n"
        )
    )
    assert tessera(capsys, "diff", "-f", str(tmp_path), "--prune")[:2] == (
        0,
        "No changes: the server matches the files.\n",
    )

    pool = tmp_path / "pools/east/inference.yaml"
    pool.write_text(pool.read_text().replace("profile: whole", "profile: mig-7"))
    code, out, _ = tessera(capsys, "--output", "json", "diff", "-f", str(tmp_path))
    assert code == 2
    plan = json.loads(out)
    assert [(c["key"], c["fields"]) for c in plan["changes"]] == [
        ("Pool/east/inference", [{"field": "profile", "before": "whole", "after": "mig-7"}])
    ]
    code, out, _ = tessera(capsys, "diff", "-f", str(tmp_path))
    assert '~ Pool/east/inference\n    profile: "whole" → "mig-7"' in out
    assert "pool east/inference" in out and "Kueue quota" in out

    code, out, _ = tessera(capsys, "apply", "-f", str(tmp_path), "-m", "abc123")
    assert code == 0 and "Applied: 0 to create, 1 to update, 0 to delete." in out
    assert tessera(capsys, "diff", "-f", str(tmp_path))[0] == 0
    exported = tmp_path / "again"
    tessera(capsys, "export", str(exported))
    assert (exported / "pools/east/inference.yaml").read_text() == pool.read_text()


@pytest.mark.django_db(transaction=True)
def test_an_edit_between_diff_and_apply_is_refused_naming_the_object(
    server, world, tmp_path, capsys, client, admin_user
):
    tessera(capsys, "export", str(tmp_path))
    profile = tmp_path / "profiles/whole.yaml"
    profile.write_text(profile.read_text().replace("Whole GPUs.", "Whole GPUs, no sharing."))
    saved = tmp_path / "plan.json"
    assert tessera(capsys, "diff", "-f", str(tmp_path), "--save-plan", str(saved))[0] == 2

    client.force_login(admin_user)  # meanwhile someone edits the pool in the UI's pool editor
    whole, serving = SharingProfile.objects.get(name="whole"), QoSPolicy.objects.get(name="serving")
    form = {"name": "inference", "cluster": world.cluster.pk, "description": "Edited in the UI.", "members": "",
            "node_selector": world.node_selector, "profile": whole.pk, "qos_policy": serving.pk,
            "schedule": "keep"}  # fmt: skip
    edit = client.post(reverse("console:pool_update", args=[world.pk]), form)
    assert edit.status_code == 302, edit.content.decode()[-3000:]

    code, _, err = tessera(capsys, "apply", "-f", str(tmp_path), "--plan", str(saved))
    assert code == 1
    assert "Changed on the server since the plan was made: Pool/east/inference." in err
    assert SharingProfile.objects.get(name="whole").description == "Whole GPUs."


@pytest.mark.django_db(transaction=True)
def test_a_reference_the_server_refuses_is_named_with_file_and_line(server, tmp_path, capsys):
    tessera(capsys, "export", str(tmp_path))
    schedule = tmp_path / "schedules/east/inference.yaml"
    lines = schedule.read_text().splitlines()
    number = next(i for i, line in enumerate(lines, 1) if "profile: mig-7" in line)
    schedule.write_text(schedule.read_text().replace("profile: mig-7", "profile: mig-3"))
    code, _, err = tessera(capsys, "apply", "-f", str(tmp_path))
    assert code == 1
    assert (
        f"schedules/east/inference.yaml:{number}: Schedule/east/inference: windows[0].profile: "
        "No profile named 'mig-3' in the files." in err
    )


def test_the_console_script_runs_without_the_server_code(tmp_path):
    """`python -m tessera_cli` from the client's directory alone (what `pip install ./client` installs)."""
    write(tmp_path, "p.yaml", "kind: Profile\nname: whole\nmode: passthrough\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "client")}
    done = subprocess.run([sys.executable, "-m", "tessera_cli", "validate", "-f", str(tmp_path)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert (done.returncode, done.stdout) == (0, "1 document(s): valid.\n"), done.stderr
    assert "django" not in subprocess.run(
        [sys.executable, "-c", "import sys, tessera_cli.main; print(sorted(sys.modules))"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    ).stdout  # fmt: skip


def test_make_test_installs_the_tessera_command():
    """CI on a fresh clone has `tessera` (requirements/base.txt installs ./client)."""
    path = shutil.which("tessera", path=str(Path(sys.executable).parent))
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the `tessera` command is not installed: `make install` installs ./client")
        pytest.skip("`tessera` is not installed in this virtualenv: run `make install`")
    done = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "export" in done.stdout
