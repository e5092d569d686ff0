"""The pure Kueue quota plan (scheduling/quota.py): flavor names, quota from layout and reports, lowering ahead."""

from scheduling import quota
from sharing.spec import ProfileSpec

H100 = "NVIDIA-H100-80GB-HBM3"
GPUS = tuple((i, H100) for i in range(8))
MIG7 = ProfileSpec(mode="mig", mig_layouts={"all": {"1g.10gb": 7}})
WHOLE = ProfileSpec(mode="passthrough")
GPU, MIG = "nvidia.com/gpu", "nvidia.com/mig-1g.10gb"


def node(reported, now, next_=None):
    return quota.PoolNode(product=H100, gpus=GPUS, reported=reported, now=now, next=next_)


def test_flavor_names_are_dns_subdomains():
    assert quota.flavor_name("Training Pool", H100) == "tessera-training-pool-nvidia-h100-80gb-hbm3"
    long = quota.flavor_name("p" * 300, H100)
    assert len(long) == 253 and long.startswith("tessera-ppp")
    assert quota.flavor_labels({"tessera.io/pool": "a"}, H100) == {"tessera.io/pool": "a", quota.PRODUCT_LABEL: H100}


def test_quota_is_the_layout_capped_by_what_nodes_report():
    nodes = [node({GPU: 8}, MIG7), node({MIG: 56}, MIG7)]  # one node has switched, the other not yet
    assert quota.targets(nodes, [GPU, MIG], transition_ahead=False, in_use={}) == {H100: {GPU: 0, MIG: 56}}


def test_ahead_of_a_transition_vanishing_resources_are_lowered_to_what_is_in_use():
    nodes = [node({GPU: 8}, WHOLE, MIG7), node({GPU: 8}, WHOLE, MIG7)]
    assert quota.targets(nodes, [GPU, MIG], transition_ahead=True, in_use={H100: {GPU: 3}}) == {H100: {GPU: 3, MIG: 0}}
    # A resource the next layout keeps as much of is not lowered.
    same = [node({GPU: 8}, WHOLE, WHOLE)]
    assert quota.targets(same, [GPU], transition_ahead=True, in_use={}) == {H100: {GPU: 8}}


def test_covered_resources_and_transition_changes():
    nodes = [node({GPU: 8}, WHOLE, MIG7)]
    resources = quota.covered(nodes, [MIG7, WHOLE])
    assert resources == [GPU, MIG]
    assert quota.transition_changes("p", nodes, resources) == [
        quota.QuotaChange("tessera-p-nvidia-h100-80gb-hbm3", GPU, 8, 0),
        quota.QuotaChange("tessera-p-nvidia-h100-80gb-hbm3", MIG, 0, 56),
    ]


def test_under_the_single_strategy_a_flavor_does_not_name_the_product():
    """GFD writes `<product>-MIG-<profile>` into nvidia.com/gpu.product under `single`: a flavor naming the product
    would match no node once the layout is MIG."""
    labels = quota.flavor_labels({"tessera.io/pool": "a"}, H100, single_strategy=True)
    assert labels == {"tessera.io/pool": "a"}
