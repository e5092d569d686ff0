"""Fixtures the schedule tests share: an admin's actor and the two profiles a day/night schedule switches between."""

import pytest

from core.audit import Actor
from sharing import services as sharing_services

H100 = "NVIDIA-H100-80GB-HBM3"


@pytest.fixture
def actor(admin_user):
    return Actor.for_user(admin_user)


@pytest.fixture
def profiles(actor):
    mig = sharing_services.profile_create(
        actor=actor, name="mig-7", mode="mig", target_products=[H100], mig_layouts={"all": {"1g.10gb": 7}}
    )
    whole = sharing_services.profile_create(actor=actor, name="whole", mode="passthrough", target_products=[H100])
    return mig, whole
