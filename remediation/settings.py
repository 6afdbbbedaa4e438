"""Configuration of the remediation service: one pydantic-settings object.

Every field can be set from the environment (prefix ``TRAINGUARD_REMEDIATION_``) or an ``.env``
file; the command line overrides a few of them. The bearer token is read from
``TRAINGUARD_REMEDIATION_TOKEN`` or from the file ``TRAINGUARD_REMEDIATION_TOKEN_FILE`` names
(a Kubernetes secret mount, a systemd credential); without one the service refuses to start
unless ``insecure_no_auth`` is set explicitly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class ConfigurationError(ValueError):
    """The settings cannot describe a service that is safe to start."""


class Settings(BaseSettings):
    """Everything the service reads at start-up."""

    model_config = SettingsConfigDict(
        env_prefix="TRAINGUARD_REMEDIATION_", env_file=".env", extra="ignore"
    )

    host: str = "127.0.0.1"
    port: int = Field(default=9095, ge=0, le=65535)

    # --- authentication ---
    token: SecretStr | None = None
    token_file: Path | None = None
    insecure_no_auth: bool = Field(
        default=False, description="Accept requests without a bearer token (development only)."
    )
    max_body_bytes: int = Field(default=1 << 20, gt=0)

    # --- storage ---
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

    # --- directives ---
    long_poll_max_seconds: float = Field(default=30.0, gt=0)
    directive_ttl_seconds: float = Field(default=3600.0, gt=0)

    # --- kubernetes executor ---
    kube_config: Path | None = Field(
        default=None, description="kubeconfig file; in-cluster configuration when unset."
    )
    kube_context: str | None = None
    kube_namespace: str = "default"
    kube_job_label: str = "trainguard.io/job-id"

    # --- slurm executor ---
    scontrol: str = "scontrol"

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

    def bearer_token(self) -> str | None:
        """The token clients must present, or None when auth is explicitly disabled.

        Raises ConfigurationError when no token is configured and auth is not disabled, or
        when the token file cannot be read or is empty.
        """
        if self.token is not None and self.token_file is not None:
            raise ConfigurationError("set either token or token_file, not both")
        value: str | None = None
        if self.token is not None:
            value = self.token.get_secret_value().strip()
        elif self.token_file is not None:
            try:
                value = self.token_file.read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ConfigurationError(
                    f"cannot read token_file {self.token_file}: {exc}"
                ) from exc
        if value:
            return value
        if value is not None:
            raise ConfigurationError("the configured bearer token is empty")
        if self.insecure_no_auth:
            return None
        raise ConfigurationError(
            "no bearer token: set TRAINGUARD_REMEDIATION_TOKEN or "
            "TRAINGUARD_REMEDIATION_TOKEN_FILE (or --insecure-no-auth for local development)"
        )
