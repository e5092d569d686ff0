import pytest

from fleet.demo import seed_demo
from fleet.models import Cluster, Gpu, MigDevice, Node, NodePool

pytestmark = pytest.mark.django_db


def test_seed_demo_is_realistic_and_idempotent():
    counts = seed_demo()
    assert counts["gpus"] >= 400 and counts["nodes"] >= 60
    assert Cluster.objects.count() == 2 and NodePool.objects.count() == 5
    assert Gpu.objects.count() == counts["gpus"]
    assert Node.objects.filter(pool__isnull=True).count() == 0
    assert Gpu.objects.filter(mig_enabled=True).exists() and MigDevice.objects.exists()
    assert Node.objects.stale().count() == 3
    assert Gpu.objects.unhealthy().exists()
    assert Node.objects.filter(config_state="failed").exists()
    # MIG GPUs show what dcgm-exporter reports for them: each slice, and the GPU as their sum.
    gpu = Gpu.objects.filter(mig_enabled=True, metrics_at__isnull=False).first()
    slices = list(gpu.mig_devices.all())
    assert all(s.utilization_pct is not None for s in slices)
    assert gpu.memory_used_mib == sum(s.memory_used_mib for s in slices)

    before = (Node.objects.count(), Gpu.objects.count(), MigDevice.objects.count())
    seed_demo()
    assert (Node.objects.count(), Gpu.objects.count(), MigDevice.objects.count()) == before
