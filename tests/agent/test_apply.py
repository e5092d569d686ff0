"""Changing GPUs through the NVML backend over the simulated layer: MIG, MPS, time-slicing, persistence mode."""

import subprocess
from pathlib import Path

import pynvml
import pytest

from agent.errors import ApplyError, BusyError
from agent.protocol import MigSettings, MpsSettings
from sharing.mig import validate_layout
from sharing.render import MigDeviceSpec, render_mig_parted_config
from tests.agent.conftest import mig_settings

BALANCED = {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}


def placements(gpu):
    return [(gi.profile, gi.start, gi.size) for gi in gpu.gpu_instances]


@pytest.mark.parametrize(
    ("product", "layout"),
    [
        ("NVIDIA-H100-80GB-HBM3", {"1g.10gb": 7}),
        ("NVIDIA-H100-80GB-HBM3", {"4g.40gb": 1, "3g.40gb": 1}),
        ("NVIDIA-A100-SXM4-40GB", {"1g.10gb": 2, "2g.10gb": 1, "1g.5gb+me": 1}),
        ("NVIDIA-A30", {"2g.12gb": 1, "1g.6gb": 2}),
        ("NVIDIA-H200", {"7g.141gb": 1}),
    ],
)
def test_a_valid_layout_lands_with_the_catalogs_placements(make_backend, product, layout):
    backend = make_backend(product=product)
    plan = backend.plan_mig(mig_settings(layout))
    assert [t.index for t in plan.changed] == [0, 1] and all(t.mode_change for t in plan.changed)
    backend.apply_mig(plan)
    expected = [(p.profile, p.start, p.size) for p in validate_layout(product, layout).placements]
    for gpu in backend.snapshot().gpus:
        assert (gpu.mig_mode_current, gpu.mig_mode_pending) == (True, True)
        assert placements(gpu) == expected
        assert [d.profile for d in gpu.mig_devices] == [profile for profile, _, _ in expected]
    assert backend.plan_mig(mig_settings(layout)).changed == ()  # applied: nothing left to do


@pytest.mark.parametrize(
    ("config", "selected", "message"),
    [
        (mig_settings({"3g.40gb": 2, "2g.20gb": 1}).mig_parted_config, "layout", "has 7 compute slices"),
        (mig_settings({"1g.20gb": 4, "1g.10gb": 1}).mig_parted_config, "layout", "no room for 1g.10gb"),
        (mig_settings({"1g.5gb": 7}).mig_parted_config, "layout", "did you mean 1g.10gb"),
        (mig_settings(BALANCED).mig_parted_config, "missing", "no config named 'missing'"),
        ("version: v2\nmig-configs: {}\n", "layout", "the mig-parted config is invalid"),
    ],
)
def test_a_layout_that_does_not_fit_is_refused_before_anything_is_touched(make_backend, config, selected, message):
    backend = make_backend()
    before = backend.snapshot()
    with pytest.raises(ApplyError, match=message):
        backend.plan_mig(MigSettings(config, selected))
    assert backend.snapshot().gpus == before.gpus
    assert backend.sim.tools.calls == []


def test_mig_on_a_gpu_without_mig(make_backend):
    backend = make_backend(product="NVIDIA-L4")
    assert backend.plan_mig(mig_settings(BALANCED)).targets == ()  # `devices: all` skips it, as mig-parted does
    text = render_mig_parted_config({"one": [MigDeviceSpec([0], True, {"1g.10gb": 1})]})
    with pytest.raises(ApplyError, match="GPU 0: NVIDIA L4 does not support MIG"):
        backend.plan_mig(MigSettings(text, "one"))


def test_a_mode_change_resets_only_the_changed_gpus(make_backend):
    backend = make_backend(gpus=3)
    text = render_mig_parted_config(
        {"split": [MigDeviceSpec([0, 2], True, {"7g.80gb": 1}), MigDeviceSpec([1], False, {})]}
    )
    backend.apply_mig(backend.plan_mig(MigSettings(text, "split")))
    bus_ids = [gpu.pci_bus_id for gpu in backend.snapshot().gpus]
    assert backend.sim.tools.calls == [["/usr/bin/nvidia-smi", "-r", "-i", f"{bus_ids[0]},{bus_ids[2]}"]]
    assert [gpu.mig_mode_current for gpu in backend.snapshot().gpus] == [True, False, True]


def test_without_a_gpu_reset_the_mode_change_stays_pending_until_a_reboot(make_backend):
    backend = make_backend(reset_supported=False)  # a pass-through VM (§1.3)
    with pytest.raises(ApplyError, match=r"MIG mode change on GPU 0, 1 is pending: it needs a GPU reset or a reboot"):
        backend.apply_mig(backend.plan_mig(mig_settings(BALANCED)))
    gpu = backend.snapshot().gpus[0]
    assert (gpu.mig_mode_current, gpu.mig_mode_pending, gpu.gpu_instances) == (False, True, ())

    backend.sim.reboot()
    plan = backend.plan_mig(mig_settings(BALANCED))
    assert [(t.mode_change, t.layout_change) for t in plan.changed] == [(False, True), (False, True)]
    backend.apply_mig(plan)
    assert placements(backend.snapshot().gpus[1]) == [("2g.20gb", 0, 2), ("1g.10gb", 2, 1), ("1g.10gb", 3, 1),
                                                       ("3g.40gb", 4, 4)]  # fmt: skip


def test_a_geometry_change_needs_no_reset_and_mig_off_destroys_everything(make_backend):
    backend = make_backend(gpus=1)
    backend.apply_mig(backend.plan_mig(mig_settings(BALANCED)))
    calls = len(backend.sim.tools.calls)
    backend.apply_mig(backend.plan_mig(mig_settings({"1g.10gb": 7})))
    assert len(backend.sim.tools.calls) == calls
    assert placements(backend.snapshot().gpus[0]) == [("1g.10gb", start, 1) for start in range(7)]

    backend.apply_mig(backend.plan_mig(mig_settings(None, "all-disabled")))
    gpu = backend.snapshot().gpus[0]
    assert (gpu.mig_mode_current, gpu.mig_mode_pending, gpu.gpu_instances, gpu.mig_devices) == (False, False, (), ())


def test_busy_gpus_are_named_and_nvml_in_use_means_busy(make_backend):
    backend = make_backend()
    pid = backend.sim.start_process(0)
    plan = backend.plan_mig(mig_settings(BALANCED))
    uuids = [target.uuid for target in plan.changed]
    assert backend.busy_processes(uuids) == [(uuids[0], pid)]
    with pytest.raises(BusyError, match=r"GPU 0: set MIG mode: the GPU is in use \(NVML_ERROR_IN_USE\)"):
        backend.apply_mig(plan)

    backend.sim.stop_process(pid)
    backend.apply_mig(backend.plan_mig(mig_settings(BALANCED)))
    gpu = backend.snapshot().gpus[1]
    backend.sim.start_process(1, gpu_instance_id=gpu.gpu_instances[3].gpu_instance_id)
    with pytest.raises(BusyError, match="GPU 1: destroy a compute instance of 3g.40gb at 4"):
        backend.apply_mig(backend.plan_mig(mig_settings({"7g.80gb": 1})))


def test_the_driver_is_checked_against_the_catalog_before_any_instance_is_destroyed(make_backend, monkeypatch):
    backend = make_backend(gpus=1)
    backend.apply_mig(backend.plan_mig(mig_settings({"1g.10gb": 7})))
    real = backend.sim.nvmlDeviceGetGpuInstanceProfileInfo

    def without_double_memory_1g(handle, profile, version=2):
        if profile == pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return real(handle, profile, version)

    monkeypatch.setattr(backend.sim, "nvmlDeviceGetGpuInstanceProfileInfo", without_double_memory_1g)
    with pytest.raises(ApplyError, match="GPU 0: the driver has no profile 1g.20gb"):
        backend.apply_mig(backend.plan_mig(mig_settings({"1g.20gb": 2})))
    assert len(backend.snapshot().gpus[0].gpu_instances) == 7


def test_device_filters_select_gpus_by_pci_id(make_backend):
    backend = make_backend()
    text = render_mig_parted_config(
        {
            "mixed": [
                MigDeviceSpec("all", True, {"1g.10gb": 7}, device_filter=("0x20B010DE",)),  # A100-40GB: not here
                MigDeviceSpec("all", True, {"7g.80gb": 1}, device_filter=("0x233010DE:0x16C110DE",)),
            ]
        }
    )
    plan = backend.plan_mig(MigSettings(text, "mixed"))
    assert [(t.index, t.devices) for t in plan.targets] == [(0, {"7g.80gb": 1}), (1, {"7g.80gb": 1})]


def test_with_mig_parted_installed_the_agent_runs_it(make_backend):
    backend = make_backend()
    seen = []

    def run(argv, input=None):
        seen.append((argv, Path(argv[3]).read_text()))
        return subprocess.CompletedProcess(argv, 0, "", "")

    backend.run = run
    backend.which = lambda name: f"/usr/local/bin/{name}" if name == "nvidia-mig-parted" else None
    mig = mig_settings(BALANCED)
    plan = backend.plan_mig(mig)
    with pytest.raises(ApplyError, match="MIG mode change on GPU 0, 1 is pending"):
        backend.apply_mig(plan)  # the stand-in exits 0 but changes nothing: the agent checks the modes itself
    ((argv, text),) = seen
    assert argv[:3] == ["/usr/local/bin/nvidia-mig-parted", "apply", "-f"] and argv[4:] == ["-c", "layout"]
    assert text == mig.mig_parted_config and not Path(argv[3]).exists()

    backend.run = lambda argv, input=None: subprocess.CompletedProcess(argv, 1, "", "ERROR: In use by another client")
    with pytest.raises(ApplyError, match=r"nvidia-mig-parted apply failed \(exit 1\): ERROR: In use by another client"):
        backend.apply_mig(plan)


def test_mps_starts_the_daemon_with_per_gpu_limits_and_stops_it(make_backend):
    backend = make_backend()
    backend.apply_mps(MpsSettings(replicas=4))
    mps = backend.sim.mps
    assert (mps.running, mps.active_thread_percentage, mps.pinned_mem_limits) == (True, 25, {0: "20389M", 1: "20389M"})
    assert {gpu.compute_mode for gpu in backend.snapshot().gpus} == {"exclusive_process"}
    control = "/usr/bin/nvidia-cuda-mps-control"
    assert backend.sim.tools.calls[:2] == [[control], [control, "-d"]]

    backend.apply_mps(MpsSettings(replicas=2, default_active_thread_percentage=40, pinned_device_memory_limit_mib=8192))
    mps = backend.sim.mps
    assert (mps.running, mps.active_thread_percentage, mps.pinned_mem_limits) == (True, 40, {0: "8192M", 1: "8192M"})

    backend.apply_mps(None)
    assert not backend.sim.mps.running
    assert {gpu.compute_mode for gpu in backend.snapshot().gpus} == {"default"}


def test_mps_needs_its_control_tool(make_backend):
    backend = make_backend()
    backend.which = lambda name: None
    with pytest.raises(ApplyError, match="nvidia-cuda-mps-control is not installed on this host"):
        backend.apply_mps(MpsSettings(replicas=2))
    backend.apply_mps(None)  # nothing to stop


def test_time_slice_is_set_on_whole_gpus_only(make_backend):
    backend = make_backend(gpus=3)
    text = render_mig_parted_config({"one": [MigDeviceSpec([1], True, {"7g.80gb": 1})]})
    backend.apply_mig(backend.plan_mig(MigSettings(text, "one")))
    backend.sim.gpus[0].compute_mode = pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    backend.set_time_slice("long")
    assert [gpu.time_slice for gpu in backend.sim.gpus] == [3, 0, 3]
    assert backend.snapshot().gpus[0].compute_mode == "default"  # as NVIDIA's DRA driver does first (§5)
    uuid = backend.snapshot().gpus[2].uuid
    assert ["/usr/bin/nvidia-smi", "compute-policy", "-i", uuid, "--set-timeslice", "3"] in backend.sim.tools.calls


def test_persistence_mode(make_backend):
    backend = make_backend()
    backend.set_persistence_mode(True)
    assert {gpu.persistence_mode for gpu in backend.snapshot().gpus} == {True}
    backend.set_persistence_mode(False)
    assert {gpu.persistence_mode for gpu in backend.snapshot().gpus} == {False}
