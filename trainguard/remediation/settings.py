"""Configuration of the remediation service: one pydantic-settings object.

Every field can be set from the environment (prefix ``TRAINGUARD_REMEDIATION_``) or an ``.env``
file; the command line overrides a few of them. The bearer token is read from
``TRAINGUARD_REMEDIATION_TOKEN`` or from the file ``TRAINGUARD_REMEDIATION_TOKEN_FILE`` names
(a Kubernetes secret mount, a systemd credential); without one the service refuses to start
unless ``insecure_no_auth`` is set explicitly.

That token is Alertmanager's and the ranks': it posts alerts, fetches and acknowledges
directives and reads the audit trail. Approving or rejecting actions and resetting circuit
breakers take a second, operator token (``TRAINGUARD_REMEDIATION_OPERATOR_TOKEN`` or
``TRAINGUARD_REMEDIATION_OPERATOR_TOKEN_FILE``), so that a leaked webhook secret cannot let a
destructive action through; without one those endpoints are closed.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from trainguard.thresholds import Thresholds, ThresholdsError, default_path

ENV_PREFIX = "TRAINGUARD_REMEDIATION_"


class ConfigurationError(ValueError):
    """The settings cannot describe a service that is safe to start."""


class Settings(BaseSettings):
    """Everything the service reads at start-up."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_file=".env", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(default=9095, ge=0, le=65535)

    # --- authentication ---
    token: SecretStr | None = None
    token_file: Path | None = None
    insecure_no_auth: bool = Field(
        default=False, description="Accept requests without a bearer token (development only)."
    )
    operator_token: SecretStr | None = None
    operator_token_file: Path | None = None
    max_body_bytes: int = Field(default=1 << 20, gt=0)

    # --- storage ---
    database_url: SecretStr | None = Field(
        default=None,
        description="Postgres URL (postgresql://user:password@host:5432/db) for replicas "
        "sharing one database; SQLite at db_path when unset.",
    )
    db_path: Path = Path("trainguard-remediation.db")
    # FULL fsyncs every commit (survives power loss); NORMAL survives a killed process only.
    sqlite_synchronous: Literal["FULL", "NORMAL"] = "FULL"

    # --- policy and guards ---
    policy_file: Path | None = Field(
        default=None, description="YAML policy; the shipped default policy when unset."
    )
    dry_run: bool = Field(default=True, description="Record decisions, execute nothing.")
    require_approval: bool = Field(
        default=True, description="Destructive actions wait for POST /v1/actions/{id}/approve."
    )
    cooldown_seconds: float = Field(
        default=900.0, ge=0, description="Default per-(job, action) cooldown."
    )
    budget_per_hour: int = Field(
        default=6,
        ge=1,
        description="Actions per job per rolling hour; one more trips the job's circuit breaker.",
    )
    default_scheduler: Literal["local", "kubernetes", "slurm"] = "local"

    # --- worker ---
    sweep_interval_seconds: float = Field(default=5.0, gt=0)
    executor_timeout_seconds: float = Field(default=60.0, gt=0)
    takeover_grace_seconds: float = Field(
        default=90.0,
        gt=0,
        description="Postgres replicas: how long a worker that takes the lock over waits before "
        "it resumes the actions left running (the replica that lost the lock may still be "
        "executing one); longer than executor_timeout_seconds plus the ~30 s a lost session "
        "takes to notice.",
    )

    # --- the inbox ---
    decide_within_seconds: float = Field(
        default=15.0,
        ge=0,
        description="While notifications keep arriving, deciding defers to accepting them "
        "until the oldest undecided notification has waited this long; past it, deciding "
        "takes a fifth of the time. An alert's own delay (rule evaluation, its for:, "
        "Alertmanager's group_wait) is longer than this.",
    )

    # --- directives ---
    long_poll_max_seconds: float = Field(default=30.0, gt=0)
    directive_ttl_seconds: float = Field(default=3600.0, gt=0)
    directive_ack_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        description="How long a directive action waits for the ranks' acknowledgements before "
        "it fails and the next step of its plan runs.",
    )
    directive_ack_settle_seconds: float = Field(
        default=2.0,
        ge=0,
        description="When no rank was polling as the directive was queued (so which ranks it "
        "reaches is unknown): how long after the first acknowledgement it counts as done.",
    )

    # --- kubernetes executor ---
    kube_config: Path | None = Field(
        default=None, description="kubeconfig file; in-cluster configuration when unset."
    )
    kube_context: str | None = None
    kube_namespace: str = "default"
    kube_job_label: str = "trainguard.io/job-id"

    # --- slurm executor ---
    scontrol: str = "scontrol"

    # --- the thresholds the rules were rendered from ---
    thresholds_file: Path | None = Field(
        default=None,
        description="The thresholds.yml the alert rules were rendered from: the incident "
        "reports judge by it and the page links to its runbook_base_url; the packaged one when "
        "unset.",
    )

    # --- diagnose reports attached to actions ---
    diagnose_prometheus_url: str | None = Field(
        default=None,
        description="Prometheus to diagnose each executed action's job from; no reports when "
        "unset.",
    )
    diagnose_window_seconds: float = Field(default=7200.0, gt=0)
    diagnose_timeout_seconds: float = Field(default=30.0, gt=0)
    diagnose_dumps_dir: Path | None = Field(
        default=None, description="The ranks' Flight Recorder dump folder, if mounted here."
    )

    # --- verification of each repair (incidents) ---
    prometheus_url: str | None = Field(
        default=None,
        description="Prometheus (http://prometheus:9090) the verifier reads the jobs' progress "
        "and alerts from; without it, a repair is verified by its alerts resolving alone.",
    )
    alertmanager_url: str | None = Field(
        default=None,
        description="Alertmanager (http://alertmanager:9093) the page action posts to; without "
        "it, page actions fail saying so.",
    )
    public_url: str | None = Field(
        default=None,
        description="Base URL of this service in the links of pages; http://<host>:<port> "
        "when unset.",
    )
    verify_interval_seconds: float = Field(
        default=5.0, gt=0, description="How often the verifier looks at open incidents."
    )
    verify_directive_seconds: float = Field(
        default=180.0, gt=0, description="Verification deadline after a directive."
    )
    verify_restart_seconds: float = Field(
        default=300.0, gt=0, description="Verification deadline after restart_from_checkpoint."
    )
    verify_exclude_seconds: float = Field(
        default=300.0, gt=0, description="Verification deadline after exclude_node."
    )
    verify_drain_seconds: float = Field(
        default=600.0, gt=0, description="Verification deadline after drain_node."
    )
    verify_progress_seconds: float = Field(
        default=60.0,
        gt=0,
        description="How long a job must keep stepping after a repair to count as recovered "
        "(above its step time and a few scrape intervals).",
    )
    verify_page_seconds: float = Field(
        default=300.0,
        gt=0,
        description="Verification deadline after page, annotate or advice alone: how long a "
        "human has before the incident closes unrecovered.",
    )

    # --- HTTP service discovery of ranks and exporters (GET/POST/DELETE /v1/discovery/<kind>) ---
    discovery_max_targets: int = Field(
        default=20000,
        ge=1,
        description="The most live registrations of one kind (ranks, exporters); more are "
        "refused with 429, so that no client can blow up Prometheus' target list.",
    )
    discovery_max_targets_per_job: int = Field(
        default=10000, ge=1, description="The most live rank registrations of one job_id."
    )
    discovery_max_ttl_seconds: float = Field(
        default=3600.0,
        ge=1,
        description="The longest TTL a registration may ask for (a dead process stays listed "
        "that long).",
    )

    @model_validator(mode="after")
    def _grace_outlasts_an_execution(self) -> Settings:
        # Only replicas sharing a Postgres database take over from one another.
        shared = self.database_url is not None
        if shared and self.takeover_grace_seconds <= self.executor_timeout_seconds:
            raise ValueError(
                "takeover_grace_seconds must exceed executor_timeout_seconds: a replica that "
                "lost the lock may still be executing for that long"
            )
        return self

    @cached_property
    def thresholds(self) -> Thresholds:
        """The thresholds file, read once. Raises ConfigurationError when it cannot be read or
        is not a valid thresholds file."""
        path = self.thresholds_file or default_path()
        try:
            return Thresholds.load(path)
        except (OSError, ThresholdsError) as exc:
            raise ConfigurationError(f"{ENV_PREFIX}THRESHOLDS_FILE {path}: {exc}") from exc

    def incident_base_url(self) -> str:
        """The base of incident links (``public_url``, else this service's address)."""
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")

    def database(self) -> Path | str:
        """What the store opens: the Postgres URL on the psycopg driver, else the SQLite file.

        Raises ConfigurationError when the URL cannot be parsed or is not a Postgres URL.
        """
        if self.database_url is None:
            return self.db_path
        from trainguard.remediation.store import StoreError, normalise_url

        try:
            url = normalise_url(self.database_url.get_secret_value())
            return url.render_as_string(hide_password=False)
        except StoreError as exc:
            raise ConfigurationError(f"{ENV_PREFIX}DATABASE_URL: {exc}") from exc

    def bearer_token(self) -> str | None:
        """The token clients must present, or None when auth is explicitly disabled.

        Raises ConfigurationError when no token is configured and auth is not disabled, or
        when the token file cannot be read or is empty.
        """
        value = _read_token("token", self.token, self.token_file)
        if value is not None:
            return value
        if self.insecure_no_auth:
            return None
        raise ConfigurationError(
            f"no bearer token: set {ENV_PREFIX}TOKEN or {ENV_PREFIX}TOKEN_FILE "
            "(or --insecure-no-auth for local development)"
        )

    def operator_bearer_token(self) -> str | None:
        """The token that approves, rejects and resets breakers; None when none is configured.

        Raises ConfigurationError when the token file cannot be read, the token is empty, or it
        is the webhook token (which would make the separation pointless).
        """
        value = _read_token("operator_token", self.operator_token, self.operator_token_file)
        if value is not None and value == _read_token("token", self.token, self.token_file):
            raise ConfigurationError("the operator token must differ from the webhook token")
        return value


def _read_token(name: str, secret: SecretStr | None, path: Path | None) -> str | None:
    """The token given inline or in a file (stripped); None when neither is set."""
    if secret is not None and path is not None:
        raise ConfigurationError(f"set either {name} or {name}_file, not both")
    value: str | None = None
    if secret is not None:
        value = secret.get_secret_value().strip()
    elif path is not None:
        try:
            value = path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigurationError(f"cannot read {name}_file {path}: {exc}") from exc
    if value == "":
        raise ConfigurationError(f"the configured {name.replace('_', ' ')} is empty")
    return value
