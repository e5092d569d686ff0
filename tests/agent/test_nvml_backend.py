"""The NVML mapping (agent/backends/nvml/) run over the simulated NVML layer: every field of a GPU report."""

import ctypes
import re

import pynvml
import pytest

from agent.backends.nvml import NvmlBackend
from agent.backends.nvml.inventory import gfd_product
from agent.host import LinuxHost
from agent.protocol import GpuInstance, HostSettings
from agent.simnvml import SimNvml
from tests.agent.conftest import mig_settings


def test_snapshot_maps_every_field_of_an_idle_gpu(make_backend):
    backend = make_backend(seed=7, product="NVIDIA-A100-SXM4-80GB", gpus=4)
    snapshot = backend.snapshot()
    assert snapshot.hostname == "sim-node-7" and snapshot.boot_id
    assert (snapshot.driver_version, snapshot.cuda_version, snapshot.numa_nodes) == ("570.133.20", "12.8", 2)
    assert snapshot.host == HostSettings("madvise", 60, "performance", 20, 10)
    assert [gpu.index for gpu in snapshot.gpus] == [0, 1, 2, 3]
    gpu = snapshot.gpus[3]
    assert re.fullmatch(r"GPU-[0-9a-f-]{36}", gpu.uuid)
    assert gpu.name == "NVIDIA A100-SXM4-80GB" and gpu.product == "NVIDIA-A100-SXM4-80GB"
    assert gpu.pci_bus_id == "00000000:3C:00.0" and gpu.pci_device_id == "0x20B210DE"
    assert gpu.numa_node == 1
    assert (gpu.memory_total_mib, gpu.memory_used_mib) == (81920, 0)
    assert (gpu.mig_capable, gpu.mig_mode_current, gpu.mig_mode_pending) == (True, False, False)
    assert (gpu.gpu_instances, gpu.mig_devices, gpu.processes) == ((), (), ())
    assert (gpu.utilization_pct, gpu.power_w, gpu.ecc_sbe_total, gpu.ecc_dbe_total) == (0.0, 60.0, 0, 0)
    assert 25 <= gpu.temperature_c <= 40
    assert (gpu.compute_mode, gpu.persistence_mode) == ("default", False)
    assert len({g.uuid for g in snapshot.gpus}) == 4


def test_the_same_seed_gives_the_same_node_and_another_seed_another(make_backend):
    first, again, other = (make_backend(seed=seed).snapshot() for seed in (3, 3, 4))
    assert [g.uuid for g in first.gpus] == [g.uuid for g in again.gpus] != [g.uuid for g in other.gpus]


def test_a_gpu_without_mig_reports_no_mig_mode(make_backend):
    gpu = make_backend(product="NVIDIA-L40S", gpus=1).snapshot().gpus[0]
    assert (gpu.mig_capable, gpu.mig_mode_current, gpu.mig_mode_pending) == (False, None, None)
    assert gpu.product == "NVIDIA-L40S" and gpu.pci_device_id == "0x26B910DE"


def test_gfd_product_label_for_models_the_catalog_does_not_know():
    assert gfd_product("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert gfd_product("NVIDIA RTX 6000 Ada Generation") == "NVIDIA-RTX-6000-Ada-Generation"


def test_processes_metrics_and_busy_follow_the_workload(make_backend):
    backend = make_backend()
    sim = backend.sim
    pid = sim.start_process(1, used_mib=4096)
    gpu0, gpu1 = backend.snapshot().gpus
    assert gpu1.processes[0].pid == pid and gpu1.processes[0].used_memory_mib == 4096
    assert (gpu1.processes[0].gpu_instance_id, gpu1.processes[0].compute_instance_id) == (None, None)
    assert gpu1.memory_used_mib == 4096 and gpu1.utilization_pct > 40 and gpu1.power_w > gpu0.power_w
    assert backend.busy_processes([gpu0.uuid]) == []
    assert backend.busy_processes([gpu0.uuid, gpu1.uuid]) == [(gpu1.uuid, pid)]
    sim.stop_process(pid)
    assert backend.busy_processes([gpu1.uuid]) == []


def test_background_workload_comes_and_goes_with_time(make_backend):
    now = [0.0]
    backend = make_backend(workload=True, gpus=8, clock=lambda: now[0])
    counts = []
    for window in range(12):
        now[0] = window * 300.0 + 1
        counts.append(sum(len(gpu.processes) for gpu in backend.snapshot().gpus))
    assert min(counts) < max(counts) and max(counts) > 0
    now[0] = 1.0
    assert sum(len(gpu.processes) for gpu in backend.snapshot().gpus) == counts[0]  # deterministic


def test_xid_events_are_drained_once(make_backend):
    backend = make_backend()
    assert backend.drain_xid_events() == []
    backend.sim.inject_xid(1, 79)
    backend.sim.inject_xid(0, 13, gpu_instance_id=2, compute_instance_id=0)
    events = backend.drain_xid_events()
    uuids = [gpu.uuid for gpu in backend.snapshot().gpus]
    assert [(e.gpu_uuid, e.xid, e.gpu_instance_id, e.compute_instance_id) for e in events] == [
        (uuids[1], 79, None, None),
        (uuids[0], 13, 2, 0),
    ]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", e.at) for e in events)
    assert backend.drain_xid_events() == []


def test_ecc_counters_are_the_volatile_ones(make_backend):
    backend = make_backend()
    backend.sim.add_ecc_errors(0, corrected=5, uncorrected=1)
    backend.sim.inject_xid(0, 48)  # a double-bit ECC error counts too (§10)
    gpu = backend.snapshot().gpus[0]
    assert (gpu.ecc_sbe_total, gpu.ecc_dbe_total) == (5, 2)
    backend.sim.reboot()
    assert backend.snapshot().gpus[0].ecc_dbe_total == 0


def test_mig_instances_and_devices_report_their_placements(make_backend):
    backend = make_backend()
    backend.apply_mig(backend.plan_mig(mig_settings({"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2})))
    gpu = backend.snapshot().gpus[0]
    assert (gpu.mig_mode_current, gpu.mig_mode_pending, gpu.utilization_pct) == (True, True, None)
    assert [(gi.profile, gi.profile_id, gi.start, gi.size) for gi in gpu.gpu_instances] == [
        ("2g.20gb", 14, 0, 2),
        ("1g.10gb", 19, 2, 1),
        ("1g.10gb", 19, 3, 1),
        ("3g.40gb", 9, 4, 4),
    ]
    devices = gpu.mig_devices
    assert [(d.profile, d.start, d.size, d.memory_mib) for d in devices] == [
        ("2g.20gb", 0, 2, 20096),  # what NVML reports: 19.62 GiB, not 2 × 9984
        ("1g.10gb", 2, 1, 9984),
        ("1g.10gb", 3, 1, 9984),
        ("3g.40gb", 4, 4, 40448),
    ]
    assert all(re.fullmatch(r"MIG-[0-9a-f-]{36}", d.uuid) for d in devices) and len({d.uuid for d in devices}) == 4
    assert [d.gpu_instance_id for d in devices] == [gi.gpu_instance_id for gi in gpu.gpu_instances]
    assert {d.compute_instance_id for d in devices} == {0}

    pid = backend.sim.start_process(0, 2048, gpu_instance_id=devices[3].gpu_instance_id)
    gpu = backend.snapshot().gpus[0]
    assert [(p.pid, p.gpu_instance_id, p.compute_instance_id) for p in gpu.processes] == [
        (pid, devices[3].gpu_instance_id, 0)
    ]


def test_a_compute_instance_smaller_than_its_gpu_instance_is_named_with_its_slices():
    sim = SimNvml(gpus=1, workload=False)
    backend = NvmlBackend(sim, run=sim.tools.run, which=sim.tools.which, host=sim.host)
    sim.gpus[0].mig_current = sim.gpus[0].mig_pending = True
    sim.nvmlInit()
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    position = pynvml.c_nvmlGpuInstancePlacement_t(0, 4)
    gi = sim.nvmlDeviceCreateGpuInstanceWithPlacement(handle, 9, ctypes.byref(position))
    sim.nvmlGpuInstanceCreateComputeInstance(gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE)
    sim.nvmlShutdown()
    gpu = backend.snapshot().gpus[0]
    assert gpu.gpu_instances == (GpuInstance("3g.40gb", 9, 0, 4, gpu.gpu_instances[0].gpu_instance_id),)
    assert [d.profile for d in gpu.mig_devices] == ["1c.3g.40gb"]
    backend.close()


def test_numa_falls_back_to_sysfs_when_the_driver_lacks_the_call(make_backend):
    backend = make_backend(gpus=4, numa_supported=False)
    assert [gpu.numa_node for gpu in backend.snapshot().gpus] == [0, 0, 1, 1]


def test_linux_host_reads_proc_and_sys(tmp_path):
    files = {
        "proc/sys/kernel/random/boot_id": "b00t\n",
        "proc/sys/vm/swappiness": "10\n",
        "proc/sys/vm/dirty_ratio": "15\n",
        "proc/sys/vm/dirty_background_ratio": "5\n",
        "sys/kernel/mm/transparent_hugepage/enabled": "always [madvise] never\n",
        "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor": "performance\n",
        "sys/bus/pci/devices/0000:3a:00.0/numa_node": "1\n",
        "sys/bus/pci/devices/0000:5d:00.0/numa_node": "-1\n",
    }
    for relative, text in files.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    for node in ("node0", "node1", "possible"):
        (tmp_path / "sys/devices/system/node" / node).mkdir(parents=True)
    host = LinuxHost(tmp_path)
    assert host.settings() == HostSettings("madvise", 10, "performance", 15, 5)
    assert (host.boot_id(), host.numa_nodes()) == ("b00t", 2)
    assert host.pci_numa_node("00000000:3A:00.0") == 1
    assert host.pci_numa_node("00000000:5D:00.0") == -1  # the backend turns "no NUMA affinity" into null
    assert host.pci_numa_node("00000000:99:00.0") is None
    assert LinuxHost(tmp_path / "empty").settings() == HostSettings(None, None, None, None, None)


def test_simulated_host_settings_are_writable(make_backend):
    backend = make_backend()
    backend.sim.host.set("swappiness", 1)
    backend.sim.host.set("thp", "never")
    assert backend.snapshot().host == HostSettings("never", 1, "performance", 20, 10)
    with pytest.raises(KeyError, match="not a host setting"):
        backend.sim.host.set("hugepages", 1)


def test_nvml_calls_before_init_fail_like_the_library():
    sim = SimNvml(gpus=1)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        sim.nvmlDeviceGetCount()
