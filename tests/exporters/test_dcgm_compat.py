"""``--dcgm-compat`` as a drop-in for dcgm-exporter 4.x, and our own families' hygiene.

Checked against dcgm-exporter release 4.5.3-4.8.2 (fixtures under ``fixtures/``): its labels
(``hostname``, ``DCGM_FI_DRIVER_VERSION``, ``err_code``/``err_msg``), framebuffer memory from
NVML's memory info v2, samples for every family in simulated mode, the compatibility table of
docs/exporter.md, and ``promtool check metrics`` on the simulated exporter's own exposition.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.exporters.conftest import (
    Samples,
    StaticProcesses,
    make_context,
    one,
    registry_of,
    require_binary,
    scrape,
    values,
)
from trainguard import contract
from trainguard.exporters import dcgm
from trainguard.exporters.collectors.gpu import GpuCollector
from trainguard.exporters.fake import DRIVER_VERSION, FakeProvider
from trainguard.exporters.provider import GpuFailure, GpuSample
from trainguard.exporters.registry import registered
from trainguard.exporters.simulated import SimulatedProvider

HERE = Path(__file__).parent
REPO = HERE.parents[1]
DEFAULT_COUNTERS = json.loads(
    (HERE / "fixtures" / "dcgm-exporter-default-counters-4.5.3-4.8.2.json").read_text()
)
# What promtool says about dcgm-exporter's own naming, kept on purpose (dashboards and rules
# written for dcgm-exporter select these names): `modelName` is camelCase, and one field's name
# ends in COUNTER. Nothing else may be flagged.
CAMEL_CASE = "label names should be written in 'snake_case' not 'camelCase'"
TYPE_IN_NAME = "metric name should not include type 'counter'"


class _V1Only(FakeProvider):
    """A fake driver without NVML memory info v2: used includes the reserved memory."""

    def sample(self) -> list[GpuSample | GpuFailure]:
        return [
            replace(
                s,
                memory_used_bytes=s.memory_used_bytes + (s.memory_reserved_bytes or 0),
                memory_reserved_bytes=None,
            )
            if isinstance(s, GpuSample)
            else s
            for s in super().sample()
        ]


def _dcgm(samples: Samples, name: str, gpu: str) -> float:
    return one(samples, name, gpu=gpu)


def test_labels_are_dcgm_exporter_s_with_hostname_and_driver_version(fake: FakeProvider) -> None:
    registry, _ = registry_of({"gpu": GpuCollector(make_context(fake, dcgm_compat=True))})
    samples = scrape(registry)
    compat = [key for key in samples if key[0].startswith("DCGM_")]
    assert compat
    for name, labels in compat:
        names = {label for label, _ in labels}
        extra = {"err_code", "err_msg"} if name == dcgm.XID_FIELD else set()
        assert names == set(dcgm.LABELS) | extra, name
        assert dict(labels)["hostname"] == "gpu-node-07"
        assert dict(labels)["DCGM_FI_DRIVER_VERSION"] == DRIVER_VERSION
        assert "Hostname" not in names


def test_framebuffer_memory_from_memory_info_v2(fake: FakeProvider) -> None:
    registry, _ = registry_of({"gpu": GpuCollector(make_context(fake, dcgm_compat=True))})
    samples = scrape(registry)
    used = _dcgm(samples, "DCGM_FI_DEV_FB_USED", "1")
    reserved = _dcgm(samples, "DCGM_FI_DEV_FB_RESERVED", "1")
    free = _dcgm(samples, "DCGM_FI_DEV_FB_FREE", "1")
    assert (used, reserved) == (52_000 + 1024, 512)  # MiB: used leaves the reserved memory out
    assert used + reserved + free == 81_559  # the H100's total, in MiB
    native = one(samples, contract.GPU_MEMORY_RESERVED.name, gpu="1")
    assert native == reserved * 2**20


def test_without_memory_info_v2_reserved_is_left_out_and_counted_as_used() -> None:
    registry, _ = registry_of({"gpu": GpuCollector(make_context(_V1Only(), dcgm_compat=True))})
    samples = scrape(registry)
    assert not values(samples, "DCGM_FI_DEV_FB_RESERVED")
    assert not values(samples, contract.GPU_MEMORY_RESERVED.name)
    used = _dcgm(samples, "DCGM_FI_DEV_FB_USED", "1")
    assert used == 52_000 + 1024 + 512
    assert used + _dcgm(samples, "DCGM_FI_DEV_FB_FREE", "1") == 81_559


def test_xid_errors_carry_err_code_and_dcgm_exporter_s_err_msg(fake: FakeProvider) -> None:
    fake.xids[(1, 13)] = 2
    fake.xids[(1, 79)] = 1  # the latest on GPU 1
    fake.xids[(4, 48)] = 1
    fake.xids[(5, 999)] = 1  # past dcgm-exporter's table
    registry, _ = registry_of({"gpu": GpuCollector(make_context(fake, dcgm_compat=True))})
    samples = scrape(registry)
    xid = dcgm.XID_FIELD
    assert one(samples, xid, gpu="1", err_code="79", err_msg="GPU has fallen off the bus") == 79
    assert one(samples, xid, gpu="4", err_code="48", err_msg="Double Bit ECC Error") == 48
    assert one(samples, xid, gpu="5", err_code="999", err_msg="Unknown Error") == 999
    assert one(samples, xid, gpu="0", err_code="0", err_msg="No Error") == 0
    # what a rule written as {err_code=~"48|79"} selects
    matched = {
        dict(labels)["gpu"]
        for (name, labels) in samples
        if name == xid and re.fullmatch("48|79", dict(labels)["err_code"])
    }
    assert matched == {"1", "4"}


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (8, "GPU stopped processing"),
        (31, "GPU memory page fault"),
        (45, "Preemptive cleanup, due to previous errors -- Most likely to see when running "
         "multiple cuda"),
        (63, "ECC page retirement or row remapping recording event"),
        (71, "CE4: Unknown Error"),
        (94, "Contained ECC error"),
        (103, "NVJPG5 Error"),
        (119, "GSP RPC Timeout"),
        (131, "Robust Channel CE15 Error"),
        (149, "NVLINK: NETIR Error"),
        (172, "Uncorrectable SRAM Error"),
        (173, "Unknown Error"),
    ],
)  # fmt: skip
def test_xid_messages_follow_dcgm_exporter(code: int, message: str) -> None:
    assert dcgm.xid_message(code) == message


def test_every_code_of_dcgm_exporter_s_table_has_its_message() -> None:
    assert sorted(dcgm.XID_MESSAGES) == list(range(173))  # 0..172, as in release 4.5.3-4.8.2


def test_simulated_gpus_give_a_sample_for_every_dcgm_family() -> None:
    provider = SimulatedProvider(3, StaticProcesses())
    registry, _ = registry_of(
        {"gpu": GpuCollector(make_context(provider, dcgm_compat=True))},  # type: ignore[arg-type]
        provider_kind="simulated",
    )
    text = generate_latest(registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in dcgm.NAMES:
        gpus = sorted(s.labels["gpu"] for s in families[name].samples)
        assert gpus == ["0", "1", "2"], name
    samples = scrape(registry)
    assert one(samples, "DCGM_FI_DEV_GPU_UTIL", gpu="0") == 0.0  # no training process: idle
    assert one(samples, "DCGM_FI_DEV_FB_RESERVED", gpu="0") == 512
    assert one(samples, "DCGM_FI_DEV_XID_ERRORS", gpu="2", err_msg="No Error") == 0
    assert {dict(k)["DCGM_FI_DRIVER_VERSION"] for k in values(samples, "DCGM_FI_DEV_GPU_TEMP")} == {
        "simulated"
    }


def test_nvml_up_is_absent_when_no_nvml_is_read() -> None:
    provider = SimulatedProvider(1, StaticProcesses())
    collector = GpuCollector(make_context(provider))  # type: ignore[arg-type]
    registry, _ = registry_of({"gpu": collector}, provider_kind="simulated")
    assert not values(scrape(registry), contract.NVML_UP.name)
    assert contract.NVML_UP.name not in {m.name for m in collector.describe()}
    # a provider that stands for NVML keeps it, 0 when NVML fails
    fake = FakeProvider(gpus=1, unavailable="Driver Not Loaded")
    registry, _ = registry_of({"gpu": GpuCollector(make_context(fake))})
    assert one(scrape(registry), contract.NVML_UP.name) == 0.0


def test_remapped_row_counts_and_states_are_separate_families(fake: FakeProvider) -> None:
    registry, _ = registry_of({"gpu": GpuCollector(make_context(fake))})
    samples = scrape(registry)
    counts = values(samples, contract.GPU_REMAPPED_ROWS.name, gpu="2")
    assert {dict(k)["kind"] for k in counts} == {"correctable", "uncorrectable"}
    assert sum(counts.values()) == 2  # rows: fake GPU 2 has 2 % 3 correctable, 0 uncorrectable
    assert one(samples, contract.GPU_ROW_REMAP_PENDING.name, gpu="2") == 0.0
    assert one(samples, contract.GPU_ROW_REMAP_FAILURE.name, gpu="2") == 0.0


def test_profiling_fields_are_dcgm_exporter_s_ratios_and_rates(fake: FakeProvider) -> None:
    registry, _ = registry_of({"gpu": GpuCollector(make_context(fake, dcgm_compat=True))})
    samples = scrape(registry)
    assert _dcgm(samples, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "3") == pytest.approx(0.46)
    assert _dcgm(samples, "DCGM_FI_PROF_SM_ACTIVE", "3") == pytest.approx(0.83)
    assert _dcgm(samples, "DCGM_FI_PROF_DRAM_ACTIVE", "3") == pytest.approx(0.33)
    assert _dcgm(samples, "DCGM_FI_PROF_NVLINK_TX_BYTES", "3") == pytest.approx(1.28e11)


def test_a_gpu_without_gpm_has_no_profiling_series(fake: FakeProvider) -> None:
    class _Ampere(FakeProvider):
        def sample(self) -> list[GpuSample | GpuFailure]:
            return [
                replace(s, activity=type(s.activity)()) if isinstance(s, GpuSample) else s
                for s in super().sample()
            ]

    registry, _ = registry_of({"gpu": GpuCollector(make_context(_Ampere(), dcgm_compat=True))})
    samples = scrape(registry)
    assert not values(samples, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")  # left out, never 0
    assert values(samples, "DCGM_FI_PROF_PCIE_TX_BYTES")  # NVML's own PCIe counter stays


# --- the compatibility table of docs/exporter.md ----------------------------------------------
_ROW = re.compile(r"^\| `(DCGM_[A-Z0-9_]+)` \| (\w+) \| (emitted|not emitted|label) \|", re.M)


def _compat_table() -> dict[str, tuple[str, str]]:
    text = (REPO / "docs" / "exporter.md").read_text()
    return {m.group(1): (m.group(2), m.group(3)) for m in _ROW.finditer(text)}


def test_the_docs_table_covers_every_default_counter_and_tells_the_truth() -> None:
    table = _compat_table()
    defaults = {f["name"]: f["type"] for f in DEFAULT_COUNTERS["fields"]}
    assert set(defaults) <= set(table), set(defaults) - set(table)
    for name, (kind, status) in table.items():
        if name in defaults:
            assert kind == defaults[name], name
        if status == "emitted":
            assert name in dcgm.NAMES, name
        elif status == "label":
            assert name in dcgm.LABELS, name
        else:
            assert name not in dcgm.NAMES, name
    assert set(dcgm.NAMES) <= set(table), set(dcgm.NAMES) - set(table)


# --- promtool on what the exporter serves -----------------------------------------------------
def _exposition(dcgm_compat: bool) -> bytes:
    provider = SimulatedProvider(2, StaticProcesses())
    context = make_context(provider, dcgm_compat=dcgm_compat)  # type: ignore[arg-type]
    collectors = {name: spec.factory(context) for name, spec in registered().items()}
    registry, supervisor = registry_of(collectors, provider_kind="simulated")
    try:
        return generate_latest(registry)
    finally:
        supervisor.close()


def _promtool(exposition: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [require_binary("promtool"), "check", "metrics"],
        input=exposition,
        capture_output=True,
        timeout=60,
        check=False,
    )


def test_promtool_finds_nothing_in_our_own_families() -> None:
    result = _promtool(_exposition(dcgm_compat=False))
    assert (result.returncode, result.stdout + result.stderr) == (0, b"")


def test_promtool_flags_only_dcgm_exporter_s_own_naming() -> None:
    exposition = _exposition(dcgm_compat=True)
    result = _promtool(exposition)
    assert result.returncode != 0
    flagged: dict[str, set[str]] = {}
    for line in (result.stdout + result.stderr).decode().splitlines():
        name, _, problem = line.partition(" ")
        flagged.setdefault(name, set()).add(problem)
    assert set(flagged) == set(dcgm.NAMES)
    for name, problems in flagged.items():
        expected = {CAMEL_CASE, TYPE_IN_NAME} if name.endswith("_COUNTER") else {CAMEL_CASE}
        assert problems == expected, name
    # and the rest of the same exposition, our families, is clean
    ours = b"".join(
        block
        for block in re.split(rb"(?m)^(?=# HELP )", exposition)
        if not block.startswith(b"# HELP DCGM_")
    )
    assert _promtool(ours).returncode == 0
