"""QoS node settings: GPU settings through NVML (over the simulated layer) and host tuning written to /proc and /sys."""

import errno
import json
from dataclasses import replace

import pynvml
import pytest

from agent.backends.nvml import NvmlBackend
from agent.errors import ApplyError
from agent.host import LinuxHost
from agent.protocol import GpuSettings, HostSettings, HostTuning, NodeSettings
from agent.simnvml import SimNvml

FULL = NodeSettings(
    GpuSettings(
        persistence_mode=True,
        compute_mode="exclusive_process",
        time_slice_interval="long",
        gpu_clock_min_mhz=1200,
        gpu_clock_max_mhz=1800,
        power_limit_w=450,
    ),
    HostTuning(
        transparent_hugepages="never",
        swappiness=10,
        cpu_governor="performance",
        dirty_ratio=15,
        dirty_background_ratio=5,
    ),
)


class RecordingNvml:
    """The simulated NVML, recording every call that changes a GPU as (function, GPU index, arguments)."""

    def __init__(self, sim: SimNvml):
        self.sim = sim
        self.calls = []

    def __getattr__(self, name):
        attribute = getattr(self.sim, name)
        if not name.startswith(("nvmlDeviceSet", "nvmlDeviceReset")):
            return attribute

        def record(handle, *args):
            self.calls.append((name, self.sim._gpu(handle).index, args))
            return attribute(handle, *args)

        return record

    def names(self):
        return [name for name, _, _ in self.calls]


@pytest.fixture
def nvml_backend():
    backends = []

    def make(gpus=2, host=None, product="NVIDIA-H100-80GB-HBM3"):
        sim = SimNvml(gpus=gpus, workload=False, product=product)
        recorder = RecordingNvml(sim)
        backend = NvmlBackend(recorder, run=sim.tools.run, which=sim.tools.which, host=host or sim.host)
        backends.append(backend)
        return backend, recorder, sim

    yield make
    for backend in backends:
        backend.close()


class KernelLikeHost(LinuxHost):
    """A LinuxHost over a temp tree whose THP file answers like the kernel's: all modes, the active one bracketed."""

    def _write(self, path, value):
        if path.name == "enabled" and path.parent.name == "transparent_hugepage":
            if value not in ("always", "madvise", "never"):
                raise OSError(errno.EINVAL, "Invalid argument")
            value = " ".join(f"[{mode}]" if mode == value else mode for mode in ("always", "madvise", "never"))
        super()._write(path, value)


@pytest.fixture
def host_tree(tmp_path):
    """/proc and /sys as a Linux host has them: 4 CPUs with cpufreq (acpi-cpufreq style), one offline CPU without."""
    root = tmp_path / "host"
    files = {
        "sys/kernel/mm/transparent_hugepage/enabled": "[always] madvise never",
        "proc/sys/vm/swappiness": "60",
        "proc/sys/vm/dirty_ratio": "20",
        "proc/sys/vm/dirty_background_ratio": "10",
        "proc/sys/kernel/random/boot_id": "0d1e7a7e-5b1c-4c7f-9d0e-3b8a4f1c2d3e",
    }
    for cpu in range(4):
        files[f"sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor"] = "powersave"
        files[f"sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_available_governors"] = "performance powersave"
    (root / "sys/devices/system/cpu/cpu4").mkdir(parents=True)  # offline: no cpufreq directory
    (root / "sys/devices/system/cpu/cpufreq").mkdir(parents=True)  # not a CPU
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text + "\n")
    return root


def governors(root):
    return [(root / f"sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor").read_text() for cpu in range(4)]


# --- GPU settings through NVML ---------------------------------------------------------------------------------------


def test_the_simulated_backend_applies_every_setting_and_the_report_shows_them(make_backend):
    backend = make_backend()
    before = backend.snapshot()
    assert {(g.power_limit_w, g.max_graphics_clock_mhz, g.applications_clock_mhz) for g in before.gpus} == {
        (700.0, 1980, 1770)
    }
    assert {g.graphics_clock_mhz for g in before.gpus} == {345}  # idle
    changes = backend.apply_node_settings(FULL)
    assert changes == [
        "persistence mode on on GPU 0, 1",
        "time slice long",
        "compute mode exclusive_process on GPU 0, 1",
        "GPU clocks locked to 1200-1800 MHz",
        "power limit 450 W on GPU 0, 1",
        "THP never (was madvise)",
        "swappiness 10 (was 60)",
        "dirty_ratio 15 (was 20)",
        "dirty_background_ratio 5 (was 10)",
    ]  # the governor already was performance
    after = backend.snapshot()
    for gpu in after.gpus:
        assert (gpu.persistence_mode, gpu.compute_mode, gpu.power_limit_w) == (True, "exclusive_process", 450.0)
        assert 1200 <= gpu.graphics_clock_mhz <= 1800  # idle, yet held inside the locked range
    assert after.host == HostSettings("never", 10, "performance", 15, 5)
    assert [gpu.time_slice for gpu in backend.sim.gpus] == [3, 3]
    assert [gpu.locked_clocks for gpu in backend.sim.gpus] == [(1200, 1800), (1200, 1800)]
    assert backend.apply_node_settings(FULL, previous=FULL) == ["time slice long"]  # nvidia-smi cannot be asked


def test_the_nvml_backend_calls_the_nvml_functions_for_clocks_power_persistence_and_compute_mode(nvml_backend):
    backend, nvml, sim = nvml_backend()
    backend.apply_node_settings(NodeSettings(FULL.gpu))
    setters = [(name, index, args) for name, index, args in nvml.calls if index == 1]
    assert setters == [
        ("nvmlDeviceSetPersistenceMode", 1, (pynvml.NVML_FEATURE_ENABLED,)),
        ("nvmlDeviceSetComputeMode", 1, (pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,)),
        ("nvmlDeviceSetGpuLockedClocks", 1, (1200, 1800)),
        ("nvmlDeviceSetPowerManagementLimit", 1, (450_000,)),  # milliwatts
    ]
    uuid = backend.snapshot().gpus[1].uuid
    assert ["/usr/bin/nvidia-smi", "compute-policy", "-i", uuid, "--set-timeslice", "3"] in sim.tools.calls

    nvml.calls.clear()
    dropped = NodeSettings(GpuSettings(persistence_mode=True))
    assert backend.apply_node_settings(dropped, previous=NodeSettings(FULL.gpu)) == [
        "time slice back to default",
        "compute mode default on GPU 0, 1",
        "GPU clocks unlocked",
        "power limit back to default on GPU 0, 1",
    ]
    assert sorted(set(nvml.names())) == [
        "nvmlDeviceResetGpuLockedClocks",
        "nvmlDeviceSetComputeMode",
        "nvmlDeviceSetPowerManagementLimit",
    ]
    assert ("nvmlDeviceSetPowerManagementLimit", 0, (700_000,)) in nvml.calls
    assert [gpu.locked_clocks for gpu in sim.gpus] == [None, None]
    assert [gpu.time_slice for gpu in sim.gpus] == [0, 0]


def test_settings_the_agent_did_not_set_are_left_alone(nvml_backend):
    backend, nvml, sim = nvml_backend()
    sim.gpus[0].locked_clocks = (900, 900)  # an admin's own nvidia-smi -lgc
    assert backend.apply_node_settings(NodeSettings(), previous=None) == []
    assert nvml.calls == [] and sim.gpus[0].locked_clocks == (900, 900)


def test_one_clock_bound_keeps_the_gpus_own_other_bound(nvml_backend):
    backend, nvml, _ = nvml_backend(gpus=1)
    assert backend.apply_node_settings(NodeSettings(GpuSettings(gpu_clock_min_mhz=1500))) == [
        "GPU clocks locked to 1500-1980 MHz"
    ]
    backend.apply_node_settings(NodeSettings(GpuSettings(gpu_clock_max_mhz=1000)))
    assert [args for name, _, args in nvml.calls] == [(1500, 1980), (210, 1000)]


@pytest.mark.parametrize(
    ("gpu", "message"),
    [
        (GpuSettings(gpu_clock_min_mhz=1200, gpu_clock_max_mhz=2500), "locked clocks 1200-2500 MHz are outside this"),
        (GpuSettings(gpu_clock_min_mhz=1800, gpu_clock_max_mhz=1200), "the minimum is above the maximum"),
        (GpuSettings(power_limit_w=900), "GPU 0, 1: power limit 900 W is outside this GPU's 200-700 W"),
        (GpuSettings(power_limit_w=100), "power limit 100 W is outside"),
    ],
)
def test_out_of_range_gpu_settings_are_refused_before_anything_is_touched(nvml_backend, gpu, message):
    backend, nvml, _ = nvml_backend()
    with pytest.raises(ApplyError, match=message):
        backend.apply_node_settings(NodeSettings(replace(gpu, persistence_mode=True, compute_mode="prohibited")))
    assert nvml.calls == []


def test_without_root_nvml_says_no_permission_and_the_message_says_why(nvml_backend):
    backend, _, sim = nvml_backend()
    sim.privileged = False
    with pytest.raises(ApplyError, match=r"GPU 0: set power limit 300 W: NVML_ERROR_NO_PERMISSION \(the agent must"):
        backend.apply_node_settings(NodeSettings(GpuSettings(power_limit_w=300)))


def test_a_failure_midway_names_what_changed_before_it(nvml_backend):
    backend, _, sim = nvml_backend()
    original = sim.nvmlDeviceSetPowerManagementLimit

    def refuse(handle, limit):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    sim.nvmlDeviceSetPowerManagementLimit = refuse
    with pytest.raises(ApplyError) as error:
        backend.apply_node_settings(NodeSettings(GpuSettings(compute_mode="prohibited", power_limit_w=300)))
    assert str(error.value) == (
        "GPU 0: set power limit 300 W: NVML_ERROR_UNKNOWN; changed before that: compute mode prohibited on GPU 0, 1"
    )
    sim.nvmlDeviceSetPowerManagementLimit = original


# --- host tuning written to /proc and /sys ---------------------------------------------------------------------------


def test_host_settings_are_read_from_proc_and_sys(host_tree):
    host = LinuxHost(host_tree)
    assert host.settings() == HostSettings("always", 60, "powersave", 20, 10)
    (host_tree / "sys/devices/system/cpu/cpu2/cpufreq/scaling_governor").write_text("performance\n")
    assert host.settings().cpu_governor == "mixed"
    assert LinuxHost(host_tree / "missing").settings() == HostSettings(None, None, None, None, None)


def test_the_host_writer_sets_every_file_and_reads_them_back(host_tree):
    host = KernelLikeHost(host_tree)
    changes = host.apply(FULL.host)
    assert changes == [
        "THP never (was always)",
        "swappiness 10 (was 60)",
        "CPU governor performance (was powersave)",
        "dirty_ratio 15 (was 20)",
        "dirty_background_ratio 5 (was 10)",
    ]
    assert (host_tree / "sys/kernel/mm/transparent_hugepage/enabled").read_text() == "always madvise [never]\n"
    assert (host_tree / "proc/sys/vm/swappiness").read_text() == "10\n"
    assert governors(host_tree) == ["performance\n"] * 4  # every CPU with cpufreq
    assert not (host_tree / "sys/devices/system/cpu/cpu4/cpufreq").exists()
    assert host.settings() == HostSettings("never", 10, "performance", 15, 5)
    assert host.apply(FULL.host) == []  # in place: nothing changes
    assert host.apply(HostTuning()) == []


@pytest.mark.parametrize(
    ("tuning", "message"),
    [
        (
            HostTuning(cpu_governor="schedutil"),
            r"CPU governor schedutil is not available .*offers: performance powersave",
        ),
        (HostTuning(dirty_background_ratio=25), r"dirty_background_ratio \(25\) must be lower than dirty_ratio \(20\)"),
        (HostTuning(swappiness=300), "swappiness must be 0 to 200, not 300"),
        (HostTuning(cpu_governor="perf; reboot"), "is not a CPU governor name"),
    ],
)
def test_a_tuning_the_host_cannot_take_is_refused_before_writing(host_tree, tuning, message):
    host = LinuxHost(host_tree)
    with pytest.raises(ApplyError, match=message):
        host.apply(tuning)
    assert host.settings() == HostSettings("always", 60, "powersave", 20, 10)


def test_not_root_gives_a_clear_message_not_a_crash(host_tree, monkeypatch):
    host = LinuxHost(host_tree)

    def denied(path, value):
        if "vm" in path.parts:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        LinuxHost._write(host, path, value)

    monkeypatch.setattr(host, "_write", denied)
    with pytest.raises(ApplyError) as error:
        host.apply(HostTuning(cpu_governor="performance", swappiness=10, dirty_ratio=30))
    message = str(error.value)
    assert f"cannot write {host_tree}/proc/sys/vm/swappiness: permission denied (the agent must run as root" in message
    assert f"cannot write {host_tree}/proc/sys/vm/dirty_ratio: permission denied" in message
    assert message.endswith("; changed before that: CPU governor performance (was powersave)")


def test_read_only_and_missing_files_are_named(host_tree, monkeypatch):
    host = LinuxHost(host_tree)

    def read_only(path, value):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(host, "_write", read_only)
    with pytest.raises(ApplyError) as error:
        host.apply(HostTuning(cpu_governor="performance"))
    assert str(error.value) == (
        f"host tuning: cannot write {host_tree}/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor: read-only file "
        "system (unprivileged containers see /proc/sys and /sys read-only) (and 3 more CPUs); nothing was changed"
    )

    (host_tree / "sys/kernel/mm/transparent_hugepage/enabled").unlink()
    with pytest.raises(ApplyError, match=r"transparent_hugepage/enabled does not exist on this host"):
        LinuxHost(host_tree).apply(HostTuning(transparent_hugepages="madvise"))


def test_a_host_without_cpufreq_says_so(host_tree):
    for cpu in range(4):
        for file in (host_tree / f"sys/devices/system/cpu/cpu{cpu}/cpufreq").iterdir():
            file.unlink()
        (host_tree / f"sys/devices/system/cpu/cpu{cpu}/cpufreq").rmdir()
    with pytest.raises(ApplyError, match="no CPU frequency scaling on this host"):
        LinuxHost(host_tree).apply(HostTuning(cpu_governor="performance"))


def test_the_nvml_backend_tunes_a_linux_host(nvml_backend, host_tree):
    backend, _, _ = nvml_backend(host=KernelLikeHost(host_tree))
    assert backend.apply_node_settings(NodeSettings(host=HostTuning(swappiness=1))) == ["swappiness 1 (was 60)"]
    assert backend.snapshot().host.swappiness == 1
    assert json.loads(json.dumps(backend.snapshot().host.to_dict()))["cpu_governor"] == "powersave"


def test_the_simulated_host_refuses_like_a_real_one(make_backend):
    backend = make_backend()
    backend.sim.host.writable = False
    with pytest.raises(ApplyError, match="cannot write /proc/sys/vm/swappiness: permission denied"):
        backend.apply_node_settings(NodeSettings(host=HostTuning(swappiness=5)))
    backend.sim.host.available_governors = {"performance", "powersave"}
    with pytest.raises(ApplyError, match="CPU governor ondemand is not available"):
        backend.check_node_settings(NodeSettings(host=HostTuning(cpu_governor="ondemand")))
    assert backend.snapshot().host.swappiness == 60
