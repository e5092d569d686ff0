"""QoS GPU settings are checked where they are entered, against the boards of the pools the policy applies to:
ranges from the MIG catalog, the range and the board in the message; the simulated agent refuses the same values."""

import pytest

from agent.simnvml.devices import SimGpu
from core.audit import Actor
from core.exceptions import ApplicationError
from scheduling import services as schedule_services
from sharing import services
from sharing.mig import PRODUCTS
from tests.factories import ClusterFactory, GpuFactory, NodeFactory, NodePoolFactory

pytestmark = pytest.mark.django_db

H100 = "NVIDIA-H100-80GB-HBM3"
MESSAGE = "Power limit 5000 W is outside 200–700 W for H100 80GB HBM3 (pool gpu-a)."


@pytest.fixture
def actor(admin_user):
    return Actor.for_user(admin_user)


@pytest.fixture
def pool():
    pool = NodePoolFactory(name="gpu-a", cluster=ClusterFactory(driver="agent", kubeconfig_path=""))
    node = NodeFactory(cluster=pool.cluster, pool=pool, name="a-0")
    for index in range(2):
        GpuFactory(node=node, index=index, product=H100)
    return pool


def test_every_catalog_product_has_power_and_clock_ranges():
    for product in PRODUCTS.values():
        low, high = product.power_limit_w
        assert 0 < low < high, product.name
        assert product.graphics_clock_mhz[0] < product.graphics_clock_mhz[1], product.name
    h100 = PRODUCTS[H100]
    assert (h100.power_limit_w, h100.power_limit_estimated) == ((200, 700), False)


def test_the_catalog_api_lists_the_ranges(viewer_api):
    products = {p["name"]: p for p in viewer_api.get("/api/v1/mig/products/").json()}
    h100 = products[H100]
    assert (h100["power_limit_w"], h100["graphics_clock_mhz"], h100["power_limit_estimated"]) == (
        [200, 700],
        [210, 1980],
        False,
    )


def test_the_simulated_gpu_refuses_what_the_catalog_refuses():
    gpu = SimGpu(index=0, product=PRODUCTS[H100], uuid="GPU-x", pci_bus_id="0:18:00.0", numa_node=0, phase=0.0)
    assert gpu.power_range_mw == (200_000, 700_000) and gpu.clocks_mhz[0] == 1980


def test_attaching_a_policy_checks_its_settings_against_the_pools_gpus(admin_api, operator_api, pool):
    created = admin_api.post("/api/v1/qos-policies/", {"name": "hot", "power_limit_w": 5000}, format="json")
    assert created.status_code == 201  # attached nowhere yet: no board to check against
    response = operator_api.post(f"/api/v1/qos-policies/{created.json()['id']}/attach/", {"pool": pool.pk})
    assert response.status_code == 400
    assert response.json()["errors"] == {"power_limit_w": [MESSAGE]}
    assert not hasattr(pool, "sharing") or pool.sharing.qos_policy is None


def test_editing_an_attached_policy_checks_every_setting_with_its_range(admin_api, actor, pool):
    policy = services.qos_policy_create(actor=actor, name="tuned", power_limit_w=600)
    services.pool_set_qos_policy(actor=actor, pool=pool, policy=policy)
    url = f"/api/v1/qos-policies/{policy.pk}/"
    errors = admin_api.patch(url, {"power_limit_w": 5000, "gpu_clock_min_mhz": 100, "gpu_clock_max_mhz": 2500}).json()
    clocks = "MHz is outside 210–1980 MHz for H100 80GB HBM3 (pool gpu-a) (an estimated range)."
    assert errors["errors"] == {
        "power_limit_w": [MESSAGE],
        "gpu_clock_min_mhz": [f"Locked GPU clock min 100 {clocks}"],
        "gpu_clock_max_mhz": [f"Locked GPU clock max 2500 {clocks}"],
    }
    policy.refresh_from_db()
    assert policy.power_limit_w == 600
    assert admin_api.patch(url, {"power_limit_w": 700}).status_code == 200


def test_a_schedule_window_policy_is_checked_against_the_schedules_pool(actor, pool):
    mig = services.profile_create(
        actor=actor, name="mig-7", mode="mig", target_products=[H100], mig_layouts={"all": {"1g.10gb": 7}}
    )
    hot = services.qos_policy_create(actor=actor, name="hot", power_limit_w=5000)
    with pytest.raises(ApplicationError) as err:
        schedule_services.schedule_create_day_night(
            actor=actor, pool=pool, day_profile=mig, night_profile=mig, time_zone="UTC", day_qos_policy=hot
        )
    assert err.value.errors == {"day_qos_policy": [MESSAGE]}
