"""The NVML provider itself. Tests marked ``gpu`` need an NVIDIA driver and GPU, else skip."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.exporters.conftest import one, rank_env, values
from tests.exporters.test_exporter_process import exporter, nvml_loadable
from trainguard import contract
from trainguard.exporters.nvml import NvmlProvider, gpu_count
from trainguard.exporters.provider import GpuSample, ProviderUnavailableError

HAS_NVML = nvml_loadable()
needs_gpu = pytest.mark.skipif(not HAS_NVML, reason="needs an NVIDIA driver and GPU (NVML)")


@pytest.mark.skipif(HAS_NVML, reason="NVML works here; this checks the no-driver path")
def test_without_a_driver_sampling_says_unavailable() -> None:
    provider = NvmlProvider()  # constructing touches nothing
    with pytest.raises(ProviderUnavailableError, match="NVML unavailable"):
        provider.sample()
    with pytest.raises(ProviderUnavailableError):  # and keeps retrying, never crashes
        provider.sample()
    assert provider.xid_counts() == []
    provider.close()
    assert gpu_count() == 0, "no driver: no GPUs, and no exception"


@pytest.mark.gpu
@needs_gpu
def test_real_gpus_give_sane_readings() -> None:
    provider = NvmlProvider()
    try:
        results = provider.sample()
        assert results
        for result in results:
            assert isinstance(result, GpuSample), result
            assert result.identity.uuid.startswith(("GPU-", "MIG-"))
            assert 0.0 <= result.utilization_ratio <= 1.0
            # v2's used leaves the driver's reserved memory out: 0 on an idle GPU
            assert 0 <= result.memory_used_bytes <= result.memory_total_bytes
            assert 0.0 < result.temperature_celsius < 120.0
            if result.power_watts is not None:
                assert 0.0 < result.power_watts < 2000.0
            if result.sm_clock_hertz is not None:
                assert 1e8 < result.sm_clock_hertz < 5e9
            if result.energy_joules is not None:
                assert result.energy_joules > 0
            # memory info v2 (drivers since R510): reserved apart from used, all within total
            assert result.memory_reserved_bytes is not None and result.memory_reserved_bytes > 0
            assert result.memory_free_bytes >= 0
            assert result.identity.driver_version.split(".")[0].isdigit()
        assert provider.identities()
        assert gpu_count() == len(results)
        time.sleep(1.5)  # the Xid thread waits in 1 s slices; it must still be alive
        assert provider._xid_thread is not None and provider._xid_thread.alive
    finally:
        provider.close()
    assert provider._xid_thread is not None and not provider._xid_thread.alive


@pytest.mark.gpu
@needs_gpu
def test_real_exporter_on_a_gpu_maps_a_cuda_process_to_its_rank() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    code = "import torch, time; x = torch.ones(1 << 28, device='cuda'); time.sleep(60)"
    env = {**os.environ, **rank_env(3, 0, TRAINGUARD_JOB_ID="gpu-test")}
    child = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        with exporter("--dcgm-compat", "--nccl.log-glob", "/nonexistent/*.log") as running:
            deadline = time.monotonic() + 60
            while True:
                samples = running.scrape()
                mapping = values(samples, "trainguard_gpu_process_info", job_id="gpu-test")
                if mapping or time.monotonic() > deadline:
                    break
                time.sleep(1)
            assert one(samples, contract.NVML_UP.name) == 1.0
            assert set(values(samples, contract.GPU_UP.name).values()) == {1.0}
            assert values(samples, "DCGM_FI_DEV_FB_USED")
            assert [dict(k)["rank"] for k in mapping] == ["3"]
    finally:
        child.kill()
        child.wait()


@pytest.mark.gpu
@needs_gpu
def test_gpm_activity_is_measured_between_two_samples_on_hopper() -> None:
    provider = NvmlProvider()
    try:
        first = [r for r in provider.sample() if isinstance(r, GpuSample)]
        if not provider._gpm:
            pytest.skip(f"no GPU here has GPM (Hopper or newer): {first[0].identity.name}")
        assert all(r.activity.sm_active is None for r in first)  # one snapshot, no interval
        time.sleep(1.0)
        second = [r for r in provider.sample() if isinstance(r, GpuSample)]
        for index in provider._gpm:
            activity = second[index].activity
            for ratio in (activity.graphics_active, activity.sm_active, activity.tensor_active):
                assert ratio is not None and 0.0 <= ratio <= 1.0, activity
            assert activity.dram_active is not None
    finally:
        provider.close()
