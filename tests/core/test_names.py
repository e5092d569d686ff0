"""Names people give refuse control characters, whichever door they come in by (issue 15, point 10)."""

import pytest
from django.core.exceptions import ValidationError

from core.fields import validate_name
from fleet.models import Cluster, NodePool
from scheduling.models import Schedule, ScheduleWindow
from sharing.models import QoSPolicy, SharingProfile
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db
H100 = "NVIDIA-H100-80GB-HBM3"
BAD = ["east\x1b[31m", "a\nb", "evil\u202eexe.txt", "zero\u200bwidth", "nul\x00", "del\x7f", "c1\x85"]


@pytest.mark.parametrize("name", BAD)
def test_control_characters_are_refused(name):
    with pytest.raises(ValidationError, match="control characters"):
        validate_name(name)


@pytest.mark.parametrize("name", ["prod-east", "inférence GPU 7", "夜間", "day / night (UTC+1)"])
def test_ordinary_names_pass(name):
    validate_name(name)


@pytest.mark.parametrize("model", [Cluster, NodePool, SharingProfile, QoSPolicy, Schedule, ScheduleWindow])
def test_every_named_model_refuses_them(model):
    with pytest.raises(ValidationError):
        model._meta.get_field("name").clean("bad\x1bname", None)


def test_through_the_api(admin_api):
    bodies = {
        "/api/v1/clusters/": {"driver": "agent"},
        "/api/v1/node-pools/": {"cluster": ClusterFactory().pk},
        "/api/v1/profiles/": {"mode": "mig", "target_products": [H100], "mig_layouts": {"all": "1g.10gb x7"}},
        "/api/v1/qos-policies/": {"required_qos": "guaranteed"},
    }
    for path, body in bodies.items():
        response = admin_api.post(path, {**body, "name": "x\x1b[2J"}, format="json")
        assert response.status_code == 400 and "name" in response.json()["errors"], (path, response.json())
        assert admin_api.post(path, {**body, "name": "fine"}, format="json").status_code == 201, path
