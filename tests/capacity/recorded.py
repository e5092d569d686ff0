"""A recorded week in the database whose best day layout is known (tests/capacity/test_whatif.py replays the same
pattern without Django): pool `serve`, 4 nodes of 2 A100-40GB as whole GPUs. By day (Mon–Fri 08–20 UTC) 4 GPUs are
held and 1 new whole-GPU pod an hour starts at once, while 8 3g.20gb slices are asked for (2 new pods an hour) and
none exists. Best by day: 2 nodes at 3g.20gb ×2. Usage: team vision holds 3 GPUs by day, team speech 1, at night
vision 8."""

from datetime import datetime, timedelta

from capacity.models import DemandSample, UsageSample
from capacity.whatif import in_window
from tests.factories import ClusterFactory, GpuFactory, NodeFactory, NodePoolFactory

A100 = "NVIDIA-A100-SXM4-40GB"
GPU, SLICE = "nvidia.com/gpu", "nvidia.com/mig-3g.20gb"
DAY = {"weekdays": range(5), "start": datetime.min.time().replace(hour=8), "end": datetime.min.time().replace(hour=20)}


def recorded_pool(end: datetime, *, name="serve"):
    cluster = ClusterFactory(name=f"{name}-cluster")
    pool = NodePoolFactory(cluster=cluster, name=name)
    for n in range(4):
        node = NodeFactory(cluster=cluster, pool=pool, name=f"{name}-{n}", allocatable={GPU: 2})
        for i in range(2):
            GpuFactory(node=node, index=i, product=A100, mig_capable=True)
    start = end.replace(minute=0, second=0, microsecond=0) - timedelta(days=7)
    demand, usage = [], []
    for hour in range(1, 7 * 24 + 1):
        at = start + timedelta(hours=hour)
        if at >= end:
            break
        common = {"pool": pool, "at": at, "seconds": 3600}
        if in_window(at, tz="UTC", **DAY):
            demand += [
                DemandSample(**common, resource=GPU, capacity=8, used=4, used_gpus=4, arrived=1, arrived_units=1,
                             started=1, started_within_5min=1),
                DemandSample(**common, resource=SLICE, capacity=0, pending=8, pending_units=8, arrived=2,
                             arrived_units=2, gpu_share=3 / 7),
            ]  # fmt: skip
            usage += [
                UsageSample(**common, namespace="ml", team="vision", resource=GPU, units=3, gpus=3),
                UsageSample(**common, namespace="asr", team="speech", resource=GPU, units=1, gpus=1),
            ]
        else:
            demand.append(DemandSample(**common, resource=GPU, capacity=8, used=8, used_gpus=8))
            usage.append(UsageSample(**common, namespace="ml", team="vision", resource=GPU, units=8, gpus=8))
    DemandSample.objects.bulk_create(demand)
    UsageSample.objects.bulk_create(usage)
    return pool
