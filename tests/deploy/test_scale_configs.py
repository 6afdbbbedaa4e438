"""deploy/scale/: Prometheus shards in agent mode remote-writing to VictoriaMetrics, with the
rules in vmalert.

Offline: every shard passes ``promtool check config --agent``; the shards are one set (same
jobs as ``deploy/prometheus.yml``, differing only in their shard number); the compose file
validates with ``docker-compose config``; vmalert loads the rules file with the shipped flags
(``-dryRun``: MetricsQL parse and templates), promtool checks the same file; every flag of the
VictoriaMetrics components is one Debian's VictoriaMetrics 1.79.5 knows, but for the cluster's
own (its cluster binaries are not packaged).

Real binaries (marked ``e2e``): the shipped shards' relabelling, run by one real Prometheus per
shard on ``file_sd`` targets, keeps each target on exactly one shard and a job's ranks
together; and alerts raised from series scraped by different shards reach a real Alertmanager
through a real VictoriaMetrics (single node) and vmalert running the shipped rules file.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, start_http_server

from tests.deploy.stack import DEPLOY, REPO, binary, default, run
from tests.polling import wait_for
from tests.ports import free_port
from trainguard import contract

T = TypeVar("T")
SCALE = DEPLOY / "scale"
COMPOSE = SCALE / "docker-compose.yml"
SHARDS = sorted(SCALE.glob("prometheus-shard-*.yml"), key=lambda p: int(p.stem.rsplit("-", 1)[1]))
SINGLE = DEPLOY / "prometheus.yml"
RULES = REPO / "trainguard" / "alerts" / "trainguard.rules.yml"
# The relabelling that makes a shard (everything else is deploy/prometheus.yml's).
SHARD_LABELS = {"__tmp_shard", "__tmp_shard_key"}
# Flags only VictoriaMetrics' cluster binaries have, which Debian does not package: the one
# part of the store's configuration no binary here can check.
CLUSTER_ONLY_FLAGS = {"storageNode", "replicationFactor"}
STORE_SERVICES = ("vmstorage", "vminsert", "vmselect")
# Prometheus, VictoriaMetrics, vmalert and Alertmanager starting on a loaded 2-core machine.
TIMEOUT = 120.0


def shard_number(path: Path) -> int:
    return int(path.stem.rsplit("-", 1)[1])


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


def services() -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = load(COMPOSE)["services"]
    return result


def flags(service: str) -> dict[str, str]:
    """A VictoriaMetrics service's command line as ``{flag: value}`` (``-name=value`` each)."""
    result = {}
    for argument in services()[service]["command"]:
        match = re.fullmatch(r"-([A-Za-z0-9.]+)(?:=(.*))?", argument)
        assert match, f"{service}: write {argument!r} as -flag=value or -flag"
        result[match[1]] = "true" if match[2] is None else match[2]
    return result


def store_services(kind: str) -> list[str]:
    return sorted(name for name in services() if re.fullmatch(rf"{kind}(-\d+)?", name))


def host_path(service: str, container_path: str) -> Path:
    """The repository file a compose service sees at ``container_path`` (bind mounts are
    relative to deploy/scale/)."""
    wanted = PurePosixPath(container_path)
    for volume in services()[service].get("volumes", []):
        source, target = str(volume).split(":")[:2]
        if not source.startswith("."):
            continue
        target_path = PurePosixPath(target)
        host = (SCALE / default(source)).resolve()
        if wanted == target_path:
            return host
        if target_path in wanted.parents:
            return host / wanted.relative_to(target_path)
    raise AssertionError(f"{service} has nothing mounted at {wanted}")


def sharding_removed(job: dict[str, Any]) -> dict[str, Any]:
    """A shard's scrape job without its sharding relabel rules (and, for the self-scrape,
    without the instance naming the shard)."""
    job = dict(job)
    kept = [
        rule
        for rule in job.pop("relabel_configs", [])
        if not {rule.get("target_label"), *rule.get("source_labels", [])} & SHARD_LABELS
        and not (job["job_name"] == "prometheus" and rule.get("target_label") == "instance")
    ]
    if kept:
        job["relabel_configs"] = kept
    return job


def normalised(path: Path) -> dict[str, Any]:
    """A shard's configuration with its own number replaced by a placeholder."""
    number = str(shard_number(path))
    config = load(path)
    for job in config["scrape_configs"]:
        for rule in job.get("relabel_configs", []):
            if rule.get("action") == "keep" and rule.get("source_labels") == ["__tmp_shard"]:
                assert rule["regex"] == number, f"{path.name}: keeps shard {rule['regex']}"
                rule["regex"] = "SHARD"
            if rule.get("target_label") == "instance":
                assert rule["replacement"] == f"prometheus-shard-{number}", path.name
                rule["replacement"] = "SHARD"
    return config


# --- the shards, offline ---------------------------------------------------------------------


def test_the_shards_are_one_set_that_differ_only_in_their_number() -> None:
    assert [shard_number(p) for p in SHARDS] == list(range(len(SHARDS))), "numbered 0..N-1"
    assert len(SHARDS) >= 2
    first = normalised(SHARDS[0])
    for path in SHARDS[1:]:
        assert normalised(path) == first, f"{path.name} differs from {SHARDS[0].name}"
    moduli = {
        rule["modulus"]
        for job in first["scrape_configs"]
        for rule in job.get("relabel_configs", [])
        if rule.get("action") == "hashmod"
    }
    assert moduli == {len(SHARDS)}, "every hashmod's modulus is the number of shard files"


@pytest.mark.parametrize("path", SHARDS, ids=lambda p: p.name)
def test_promtool_checks_each_shard_in_agent_mode(path: Path) -> None:
    result = run(binary("promtool", "Debian: prometheus"), "check", "config", "--agent", path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_refuses_a_shard_that_would_evaluate_rules(tmp_path: Path) -> None:
    """Agent mode has no rule engine: a shard given rules is refused, so the check above
    would catch rules left on a shard."""
    config = load(SHARDS[0])
    config["rule_files"] = [str(RULES)]
    broken = tmp_path / SHARDS[0].name
    broken.write_text(yaml.safe_dump(config))
    result = run(binary("promtool", "Debian: prometheus"), "check", "config", "--agent", broken)
    assert result.returncode != 0
    assert "rule_files" in result.stdout + result.stderr


def test_the_shards_scrape_what_one_prometheus_scrapes_with_the_same_labels() -> None:
    """Apart from the sharding, each scrape job is deploy/prometheus.yml's, and no external
    label is added: the store receives the series one Prometheus would hold, so the rules
    (written for one Prometheus) select and join them unchanged. The one difference:
    deploy/prometheus.yml also scrapes the compose demo's exporter by name, which no
    sharded deployment has."""
    single = {job["job_name"]: job for job in load(SINGLE)["scrape_configs"]}
    del single[contract.SCRAPE_JOB_EXPORTER]["static_configs"]
    for path in SHARDS:
        config = load(path)
        assert "external_labels" not in config.get("global", {}), path.name
        assert not {"rule_files", "alerting"} & set(config), (
            f"{path.name}: the rules run in vmalert"
        )
        jobs = {job["job_name"]: sharding_removed(job) for job in config["scrape_configs"]}
        assert jobs == single, path.name
        assert config["global"]["scrape_interval"] == load(SINGLE)["global"]["scrape_interval"]


def test_every_shard_remote_writes_to_vminsert_in_vmalert_s_tenant() -> None:
    tenant = urlsplit(flags("vmalert")["datasource.url"]).path.split("/")[2]
    for path in SHARDS:
        (target,) = load(path)["remote_write"]
        url = urlsplit(target["url"])
        assert url.hostname == "vminsert" and url.port == 8480, path.name
        assert url.path == f"/insert/{tenant}/prometheus/api/v1/write", path.name
        assert not target.get("send_exemplars"), "VictoriaMetrics stores no exemplars"


# --- the store and vmalert, offline ----------------------------------------------------------


def test_the_compose_file_validates() -> None:
    result = run(binary("docker-compose", "Debian: docker-compose"), "-f", COMPOSE, "config", "-q")
    assert result.returncode == 0, result.stderr


def test_the_compose_file_runs_every_shard_on_its_own_file() -> None:
    shards = sorted(name for name in services() if name.startswith("prometheus-shard-"))
    assert shards == [f"prometheus-shard-{shard_number(p)}" for p in SHARDS]
    for path in SHARDS:
        service = services()[f"prometheus-shard-{shard_number(path)}"]
        assert "--agent" in service["command"]
        assert "--config.file=/etc/trainguard/prometheus.yml" in service["command"]
        assert host_path(service=f"prometheus-shard-{shard_number(path)}",
                         container_path="/etc/trainguard/prometheus.yml") == path  # fmt: skip


def test_every_file_the_compose_file_mounts_exists() -> None:
    for name, service in services().items():
        for volume in service.get("volumes", []):
            source = str(volume).split(":")[0]
            if source.startswith("."):
                assert (SCALE / source).exists(), f"{name}: {source}"
    for name, secret in load(COMPOSE)["secrets"].items():
        assert (SCALE / default(secret["file"])).is_file(), name


def test_vmalert_reads_the_rules_file_and_talks_to_the_store_and_alertmanager() -> None:
    vmalert = flags("vmalert")
    assert host_path("vmalert", vmalert["rule"]) == RULES
    for flag, service, port in (
        ("datasource.url", "vmselect", 8481),
        ("remoteRead.url", "vmselect", 8481),
        ("remoteWrite.url", "vminsert", 8480),
        ("notifier.url", "alertmanager", 9093),
    ):
        url = urlsplit(vmalert[flag])
        assert (url.hostname, url.port) == (service, port), flag
    assert vmalert["evaluationInterval"] == load(SINGLE)["global"]["evaluation_interval"]
    alertmanager = services()["alertmanager"]
    config = host_path("alertmanager", "/etc/alertmanager/alertmanager.yml")
    assert config == REPO / "trainguard" / "alerts" / "alertmanager.yml"
    assert any(
        str(a).startswith("--config.file=/etc/alertmanager/") for a in alertmanager["command"]
    )


def test_vminsert_and_vmselect_name_every_storage_node() -> None:
    nodes = store_services("vmstorage")
    assert len(nodes) >= 2
    for service, port in (("vminsert", 8400), ("vmselect", 8401)):
        assert flags(service)["storageNode"].split(",") == [f"{n}:{port}" for n in nodes]
    replication = int(flags("vminsert")["replicationFactor"])
    assert 1 <= replication <= len(nodes)
    if replication > 1:
        assert flags("vmselect").get("dedup.minScrapeInterval"), "replicas come back twice"


def known_flags(tool: str) -> set[str]:
    result = run(binary(tool, "Debian: victoria-metrics"), "-help")
    return set(re.findall(r"^\s+-([A-Za-z0-9.]+)", result.stdout + result.stderr, re.MULTILINE))


def test_every_store_flag_is_one_victoriametrics_knows() -> None:
    known = known_flags("victoria-metrics")
    assert "storageDataPath" in known, "the help output was read"
    for kind in STORE_SERVICES:
        for service in store_services(kind):
            unknown = set(flags(service)) - known - CLUSTER_ONLY_FLAGS
            assert not unknown, f"{service}: {unknown}"


def vmalert_dry_run(rules: Path) -> subprocess.CompletedProcess[str]:
    """vmalert with every shipped flag, checking ``rules`` and exiting: an unknown flag, a
    rule MetricsQL cannot parse or a template it cannot compile fails it."""
    arguments = [f"-{k}={v}" for k, v in flags("vmalert").items() if k != "rule"]
    return run(
        binary("vmalert", "Debian: victoria-metrics"), *arguments, f"-rule={rules}", "-dryRun"
    )


def test_vmalert_loads_the_rules_file_with_the_shipped_flags() -> None:
    result = vmalert_dry_run(RULES)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_vmalert_s_check_refuses_a_rule_it_cannot_evaluate(tmp_path: Path) -> None:
    broken = load(RULES)
    broken["groups"][0]["rules"].append({"alert": "Broken", "expr": "sum(rate(x[5m]) by"})
    path = tmp_path / "broken.rules.yml"
    path.write_text(yaml.safe_dump(broken))
    result = vmalert_dry_run(path)
    assert result.returncode != 0
    assert "Broken" in result.stdout + result.stderr


def test_promtool_checks_the_rules_file_vmalert_loads() -> None:
    result = run(binary("promtool", "Debian: prometheus"), "check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr


# --- real binaries ---------------------------------------------------------------------------


def start(stack: ExitStack, command: list[str], log: Path) -> None:
    """Starts a server for the test's duration; stops it (terminate, then kill) at the end."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )

    def stop() -> None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    stack.callback(stop)


def get(url: str, **params: str) -> Any:
    try:
        response = httpx.get(url, params=params, timeout=5)
    except httpx.HTTPError:
        return None
    return response.json() if response.status_code == 200 else None


def shard_config(
    path: Path, workdir: Path, groups: dict[str, list[dict[str, Any]]], remote_write: str
) -> Path:
    """The shipped shard with its discovery swapped for file_sd files in ``workdir``, 1 s
    intervals, and ``remote_write`` as its store; its relabelling is untouched."""
    config = load(path)
    config["global"]["scrape_interval"] = "1s"
    for job in config["scrape_configs"]:
        name = job["job_name"]
        if name == "prometheus":
            job["static_configs"] = [{"targets": ["127.0.0.1:1"]}]
            continue
        job.pop("file_sd_configs", None)
        job.pop("static_configs", None)
        job.pop("scrape_interval", None)
        targets = workdir / f"{name}.json"
        targets.write_text(json.dumps(groups.get(name, [])))
        job["file_sd_configs"] = [{"files": [str(targets)], "refresh_interval": "1s"}]
    config["remote_write"][0]["url"] = remote_write
    out = workdir / path.name
    out.write_text(yaml.safe_dump(config))
    return out


def start_shards(
    stack: ExitStack,
    tmp_path: Path,
    groups: dict[str, list[dict[str, Any]]],
    remote_write: str,
) -> tuple[dict[int, str], list[Path]]:
    """One real Prometheus in agent mode per shipped shard; their URLs and logs."""
    prometheus = binary("prometheus", "Debian: prometheus")
    urls, logs = {}, []
    for path in SHARDS:
        number = shard_number(path)
        workdir = tmp_path / f"shard-{number}"
        workdir.mkdir()
        config = shard_config(path, workdir, groups, remote_write)
        port = free_port()
        log = workdir / "prometheus.log"
        start(
            stack,
            [
                prometheus,
                "--enable-feature=agent",
                f"--config.file={config}",
                f"--storage.agent.path={workdir / 'data'}",
                # Stop at once: unsent samples are of no use to the test.
                "--storage.remote.flush-deadline=1s",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            log,
        )
        urls[number] = f"http://127.0.0.1:{port}"
        logs.append(log)
    return urls, logs


def rank_target(address: str, job_id: str, rank: int, node: str) -> dict[str, Any]:
    """A rank's file_sd target group, as the hook writes it."""
    values = (job_id, str(rank), str(rank % 8), node)
    labels = dict(zip(contract.RANK_IDENTITY_LABELS, values, strict=True))
    return {"targets": [address], "labels": labels}


Kept = dict[int, list[dict[str, str]]]


def kept_targets(urls: dict[int, str], expected: int) -> Kept | None:
    """Each shard's active targets (their discovered labels), once every shard has sorted
    all ``expected`` targets into kept or dropped."""
    result: Kept = {}
    for number, url in urls.items():
        answer = get(f"{url}/api/v1/targets")
        if answer is None:
            return None
        data = answer["data"]
        active = [t for t in data["activeTargets"] if t["scrapePool"] != "prometheus"]
        dropped = data["droppedTargets"]
        if len(active) + len(dropped) != expected:
            return None
        result[number] = [t["discoveredLabels"] for t in active]
    return result


@pytest.mark.e2e
def test_the_shards_partition_the_targets_and_keep_a_job_together(tmp_path: Path) -> None:
    # Relabelling happens at discovery, before any scrape: the targets are loopback
    # addresses (127.0.0.0/8) where nothing listens, each its own.
    ranks = [
        rank_target(f"127.1.{j}.{r + 1}:9", f"job-{j}", r, f"node-{j}-{r // 8}")
        for j in range(30)
        for r in range(1 + j % 8)
    ]
    # A job of 23,457 ranks, seen through a few of them: blocks of 10,000 ranks.
    big = [0, 1, 7, 9999, 10000, 10001, 15000, 19999, 20000, 23456]
    ranks += [rank_target(f"127.2.{r // 250}.{r % 250 + 1}:9", "huge", r, "n") for r in big]
    # On Kubernetes a pod of several ranks names them <pod>/<local rank>: keyed by job.
    ranks += [rank_target(f"127.3.0.{r + 1}:9", "pods", r, "p") for r in range(4)]
    for target in ranks[-4:]:
        target["labels"][contract.LABEL_RANK] = (
            f"pods-0/{target['labels'][contract.LABEL_LOCAL_RANK]}"
        )
    exporters = [{"targets": [f"127.4.0.{n + 1}:9"]} for n in range(20)]
    remediation = [{"targets": ["127.5.0.1:9"]}, {"targets": ["127.5.0.2:9"]}]
    groups = {
        contract.SCRAPE_JOB_RANKS: ranks,
        contract.SCRAPE_JOB_EXPORTER: exporters,
        contract.SCRAPE_JOB_REMEDIATION: remediation,
    }
    everything = ranks + exporters + remediation
    with ExitStack() as stack:
        urls, logs = start_shards(stack, tmp_path, groups, "http://127.0.0.1:1/api/v1/write")
        kept = wait_for(
            f"every shard sorting {len(everything)} targets",
            lambda: kept_targets(urls, len(everything)),
            TIMEOUT,
            *logs,
        )

    def key(labels: dict[str, str]) -> str:
        return labels["__address__"]

    owners: dict[str, list[int]] = {}
    for number, targets in kept.items():
        for labels in targets:
            owners.setdefault(key(labels), []).append(number)
    assert sorted(owners) == sorted(g["targets"][0] for g in everything), "every target kept"
    assert all(len(shards) == 1 for shards in owners.values()), {
        k: v for k, v in owners.items() if len(v) > 1
    }

    def shards_of(job_id: str, ranks_in: range | None = None) -> set[int]:
        return {
            owners[g["targets"][0]][0]
            for g in ranks
            if g["labels"][contract.LABEL_JOB_ID] == job_id
            and (ranks_in is None or int(g["labels"][contract.LABEL_RANK]) in ranks_in)
        }

    for j in range(30):
        assert len(shards_of(f"job-{j}")) == 1, f"job-{j} is split"
    assert len(shards_of("pods")) == 1
    for block in (range(0, 10000), range(10000, 20000), range(20000, 30000)):
        assert len(shards_of("huge", block)) == 1, f"ranks {block} of one job are split"
    # The hash spreads the jobs: every shard scrapes some ranks.
    rank_owners = {owners[g["targets"][0]][0] for g in ranks}
    assert rank_owners == set(urls)


def serve(stack: ExitStack, registry: CollectorRegistry) -> str:
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)

    stack.callback(stop)
    return f"127.0.0.1:{port}"


def alerts_at(alertmanager: str, name: str) -> list[dict[str, str]]:
    answer = get(f"{alertmanager}/api/v2/alerts", filter=f"alertname={name}")
    return [a["labels"] for a in answer] if isinstance(answer, list) else []


@pytest.mark.e2e
def test_alerts_from_every_shard_reach_alertmanager_through_the_store(tmp_path: Path) -> None:
    """Ranks of jobs scraped by different shards raise TrainingNCCLTimeout; one vmalert on
    one VictoriaMetrics, with the shipped rules and flags, sends both to Alertmanager, with
    the labels one Prometheus would have given them."""
    with ExitStack() as stack:
        # Two ranks per job, each rank its own /metrics with a collective-timeout counter.
        counters: dict[tuple[str, int], Any] = {}
        ranks = []
        for j in range(6):
            for rank in range(2):
                registry = CollectorRegistry()
                timeouts = Counter(
                    contract.COLLECTIVE_TIMEOUTS.client_name,
                    contract.COLLECTIVE_TIMEOUTS.documentation,
                    list(contract.RANK_IDENTITY_LABELS),
                    registry=registry,
                )
                target = rank_target(serve(stack, registry), f"job-{j}", rank, f"node-{j}")
                counters[(f"job-{j}", rank)] = timeouts.labels(**target["labels"])
                ranks.append(target)

        vm_port, vmalert_port, am_port = free_port(), free_port(), free_port()
        store = f"http://127.0.0.1:{vm_port}"
        alertmanager = f"http://127.0.0.1:{am_port}"
        # Single-node VictoriaMetrics stands in for the cluster: the flags of vmselect and
        # vmstorage that it shares, the cluster's replication flags aside.
        store_flags = {
            k: v
            for service in ("vmselect", *store_services("vmstorage"))
            for k, v in flags(service).items()
            if k not in CLUSTER_ONLY_FLAGS and k != "storageDataPath"
        }
        logs = [tmp_path / "victoria-metrics.log", tmp_path / "vmalert.log"]
        start(
            stack,
            [
                binary("victoria-metrics", "Debian: victoria-metrics"),
                *(f"-{k}={v}" for k, v in store_flags.items()),
                f"-storageDataPath={tmp_path / 'vm-data'}",
                f"-httpListenAddr=127.0.0.1:{vm_port}",
            ],
            logs[0],
        )
        am_config = tmp_path / "alertmanager.yml"
        am_config.write_text(
            yaml.safe_dump({"route": {"receiver": "none"}, "receivers": [{"name": "none"}]})
        )
        logs.append(tmp_path / "alertmanager.log")
        start(
            stack,
            [
                binary("prometheus-alertmanager", "Debian: prometheus-alertmanager"),
                f"--config.file={am_config}",
                f"--storage.path={tmp_path / 'am-data'}",
                f"--web.listen-address=127.0.0.1:{am_port}",
                "--cluster.listen-address=",
            ],
            logs[-1],
        )
        # vmalert as shipped, the cluster URLs pointed at the single node, evaluating every 2 s.
        local = {
            "datasource.url": store,
            "remoteRead.url": store,
            "remoteWrite.url": store,
            "notifier.url": alertmanager,
            "evaluationInterval": "2s",
            "rule": str(RULES),
        }
        start(
            stack,
            [
                binary("vmalert", "Debian: victoria-metrics"),
                *(f"-{k}={local.get(k, v)}" for k, v in flags("vmalert").items()),
                f"-httpListenAddr=127.0.0.1:{vmalert_port}",
            ],
            logs[1],
        )
        urls, shard_logs = start_shards(
            stack, tmp_path, {contract.SCRAPE_JOB_RANKS: ranks}, f"{store}/api/v1/write"
        )
        logs += shard_logs
        kept = wait_for(
            "the shards sorting the ranks", lambda: kept_targets(urls, len(ranks)), TIMEOUT, *logs
        )
        shard_of = {t[contract.LABEL_JOB_ID]: n for n, targets in kept.items() for t in targets}
        # Two jobs that different shards scrape.
        first = next(iter(shard_of))
        second = next(job for job, shard in shard_of.items() if shard != shard_of[first])

        series = contract.COLLECTIVE_TIMEOUTS.name

        def stored(expr: str, count: int) -> list[dict[str, Any]] | None:
            answer = get(f"{store}/api/v1/query", query=expr)
            found = answer["data"]["result"] if answer else []
            return found if len(found) == count else None

        wait_for(
            "every rank's series in the store", lambda: stored(series, len(ranks)), TIMEOUT, *logs
        )
        for job in (first, second):
            counters[(job, 1)].inc()
        raised = time.monotonic()
        name = contract.Alert.TRAINING_NCCL_TIMEOUT.value

        def both() -> list[dict[str, str]] | None:
            found = alerts_at(alertmanager, name)
            return found if len(found) >= 2 else None

        firing = wait_for(f"{name} for {first} and {second} at Alertmanager", both, TIMEOUT, *logs)
        latency = time.monotonic() - raised

    identity = (contract.LABEL_JOB_ID, contract.LABEL_RANK, contract.LABEL_NODE)
    assert sorted(tuple(a[k] for k in identity) for a in firing) == sorted(
        [(first, "1", f"node-{first[4:]}"), (second, "1", f"node-{second[4:]}")]
    )
    for labels in firing:
        # The labels one Prometheus gives the alert: the rule's and the rank's identity,
        # nothing naming a shard, a vmalert group or a scrape target.
        assert set(labels) == {"alertname", "severity", *contract.RANK_IDENTITY_LABELS}, labels
    print(f"counter increment to {name} at Alertmanager: {latency:.1f} s")
