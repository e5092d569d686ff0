"""factory-boy factories for the models of every app; one place, imported by the app test modules."""

import factory
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.utils import timezone

from fleet.models import Cluster, Gpu, MigDevice, Node, NodePool, Pod


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.django.Password("pw-for-tests-1")

    @factory.post_generation
    def role(self, create, extracted, **kwargs):
        """UserFactory(role="operator") puts the user in that role's group."""
        if create and extracted:
            self.groups.add(Group.objects.get(name=extracted))


class ClusterFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Cluster

    name = factory.Sequence(lambda n: f"cluster-{n}")
    driver = "kubernetes"
    kubeconfig_path = "kubeconfig.yaml"  # a name in TESSERA["KUBECONFIG_DIR"]


class NodePoolFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = NodePool

    cluster = factory.SubFactory(ClusterFactory)
    name = factory.Sequence(lambda n: f"pool-{n}")


class NodeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Node

    cluster = factory.SubFactory(ClusterFactory)
    name = factory.Sequence(lambda n: f"gpu-node-{n:04d}")
    ready = True
    observed_mode = "passthrough"
    config_state = "success"
    last_seen_at = factory.LazyFunction(timezone.now)
    driver_version = "570.133.20"
    cuda_version = "12.8"


class GpuFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Gpu

    node = factory.SubFactory(NodeFactory)
    index = factory.Sequence(lambda n: n % 8)
    uuid = factory.Sequence(lambda n: f"GPU-{n:08x}-0000-4000-8000-000000000000")
    product = "NVIDIA-H100-80GB-HBM3"
    memory_mib = 81559
    pci_bus_id = factory.Sequence(lambda n: f"{n:08X}:18:00.0")  # unique domain: no accidental search hits
    mig_capable = True
    health = "healthy"
    utilization_pct = 40.0
    memory_used_mib = 20000


class MigDeviceFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = MigDevice

    gpu = factory.SubFactory(GpuFactory, mig_enabled=True)
    profile = "1g.10gb"
    start = factory.Sequence(lambda n: n % 7)
    size = 1
    memory_mib = 9984


class PodFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Pod

    node = factory.SubFactory(NodeFactory)
    namespace = "ml-serving"
    name = factory.Sequence(lambda n: f"pod-{n}")
    uid = factory.Sequence(lambda n: f"uid-{n:08d}")
    phase = "Running"
    qos_class = "Guaranteed"
    gpu_resources = factory.LazyFunction(lambda: {"nvidia.com/gpu": 1})
    observed_at = factory.LazyFunction(timezone.now)
