"""``bedside.toml``: the notifiers, what each receives, and how delivery behaves.

Secrets (webhook URLs, signing secrets, header values, command arguments taken from
the environment) are read from ``${NAME}`` references and never printed: every text
a notifier reports passes through ``NotifierConfig.scrub``.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bedside.collectors.errors import BedsideError
from bedside.detectors import finding
from bedside.detectors.finding import Severity

from ..playbooks.rules import PlaybookSettings, parse_playbooks

CONFIG_NAME = "bedside.toml"
NOTIFIER_TYPES = ("slack", "discord", "webhook", "command", "log")
_HTTP_TYPES = ("slack", "discord", "webhook")
_COMMON_KEYS = ("type", "min_severity", "kinds", "per_minute", "burst", "timeout_s")
_TYPE_KEYS = {
    "slack": ("url",),
    "discord": ("url",),
    "webhook": ("url", "secret", "headers"),
    "command": ("command",),
    "log": ("path",),
}
_ALERTS_KEYS = (
    "dashboard_url",
    "give_up_after_s",
    "retry_base_s",
    "retry_max_s",
    "digest_window_s",
    "digest_min_findings",
)
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MASK = "***"


class AlertConfigError(BedsideError):
    """bedside.toml is not valid: the message names the file and the key."""


@dataclass(frozen=True)
class NotifierConfig:
    """One named destination and the incidents it receives."""

    name: str
    type: str
    min_severity: Severity = Severity.WARNING
    kinds: tuple[str, ...] = ()
    per_minute: float = 10.0
    burst: int = 5
    timeout_s: float = 5.0
    url: str = ""
    secret: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    command: tuple[str, ...] = ()
    path: Path | None = None
    secrets: tuple[str, ...] = ()

    def accepts(self, severity: Severity, kinds: tuple[str, ...]) -> bool:
        """Whether an incident of this severity and these finding kinds is for this notifier."""
        return severity.level >= self.min_severity.level and (not self.kinds or bool(set(kinds) & set(self.kinds)))

    def scrub(self, text: str) -> str:
        """``text`` with every secret of this notifier masked."""
        for secret in sorted(self.secrets, key=len, reverse=True):
            text = text.replace(secret, MASK)
        return text

    @property
    def destination(self) -> str:
        """Where messages go, safe to print: scheme and host of a URL, a command's program, a log path."""
        if self.url:
            parts = urlsplit(self.url)
            return f"{parts.scheme}://{parts.hostname}{'' if parts.port is None else f':{parts.port}'}/{MASK}"
        if self.command:
            return f"command {self.scrub(self.command[0])}"
        return str(self.path) if self.path else "stderr"


@dataclass(frozen=True)
class AlertSettings:
    """The notifiers and the delivery policy shared by all of them."""

    notifiers: tuple[NotifierConfig, ...] = ()
    dashboard_url: str = ""
    give_up_after_s: float = 6 * 3600.0
    retry_base_s: float = 1.0
    retry_max_s: float = 300.0
    digest_window_s: float = 300.0
    digest_min_findings: int = 10
    source: Path | None = None
    playbooks: PlaybookSettings = field(default_factory=PlaybookSettings)

    def notifier(self, name: str) -> NotifierConfig:
        for notifier in self.notifiers:
            if notifier.name == name:
                return notifier
        known = ", ".join(n.name for n in self.notifiers) or "none"
        raise AlertConfigError(
            f"{self.source or 'the configuration'}: no notifier named {name!r} (configured: {known})"
        )


def find_config(run_dir: Path | None) -> Path | None:
    """``bedside.toml`` in the run directory, else in the directory that holds it, else None."""
    if run_dir is None:
        return None
    for folder in (run_dir, run_dir.resolve().parent):
        if (folder / CONFIG_NAME).is_file():
            return folder / CONFIG_NAME
    return None


DEFAULT_LOG_NOTIFIER = NotifierConfig(name="log", type="log")
"""Where incidents go when nothing is configured and a log is wanted (``bedside watch``)."""


def settings_for(config: Path | None, run_dir: Path | None, *, default_log: bool = False) -> AlertSettings:
    """Settings from ``config``, else the run's ``bedside.toml``; without either, the log notifier or none."""
    path = config or find_config(run_dir)
    if path is not None:
        return load_settings(path, os.environ)
    return AlertSettings(notifiers=(DEFAULT_LOG_NOTIFIER,) if default_log else ())


def load_settings(path: Path, environ: Mapping[str, str]) -> AlertSettings:
    """Read and validate a configuration file; ``${NAME}`` references resolved from ``environ``."""
    try:
        document = tomllib.loads(path.read_text())
    except OSError as exc:
        raise AlertConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise AlertConfigError(f"{path}: not valid TOML: {exc}") from exc
    return parse_settings(document, environ, source=path)


def parse_settings(
    document: Mapping[str, Any], environ: Mapping[str, str], *, source: Path | None = None
) -> AlertSettings:
    """Settings from a parsed TOML document; errors name ``source`` and the bad key."""
    where = str(source or CONFIG_NAME)
    _only_keys(document, ("alerts", "notifiers", "playbooks"), where, "")
    alerts = _table(document.get("alerts", {}), where, "alerts")
    _only_keys(alerts, _ALERTS_KEYS, where, "alerts")
    notifiers = _table(document.get("notifiers", {}), where, "notifiers")
    reader = _Reader(where, environ)
    settings = AlertSettings(
        notifiers=tuple(
            reader.notifier(name, _table(body, where, f"notifiers.{name}")) for name, body in notifiers.items()
        ),
        dashboard_url=reader.url(alerts, "alerts", "dashboard_url", required=False),
        give_up_after_s=reader.number(alerts, "alerts", "give_up_after_s", AlertSettings.give_up_after_s),
        retry_base_s=reader.number(alerts, "alerts", "retry_base_s", AlertSettings.retry_base_s),
        retry_max_s=reader.number(alerts, "alerts", "retry_max_s", AlertSettings.retry_max_s),
        digest_window_s=reader.number(alerts, "alerts", "digest_window_s", AlertSettings.digest_window_s),
        digest_min_findings=int(
            reader.number(alerts, "alerts", "digest_min_findings", AlertSettings.digest_min_findings, integer=True)
        ),
        source=source,
        playbooks=parse_playbooks(document.get("playbooks"), where),
    )
    return settings


def _table(value: Any, where: str, key: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise AlertConfigError(f"{where}: {key} must be a table, got {type(value).__name__}")
    return value


def _only_keys(table: Mapping[str, Any], allowed: tuple[str, ...], where: str, prefix: str) -> None:
    for key in table:
        if key not in allowed:
            name = f"{prefix}.{key}" if prefix else key
            raise AlertConfigError(f"{where}: unknown key {name!r} (expected one of {', '.join(allowed)})")


class _Reader:
    """Reads typed values out of the document, resolving references and remembering secrets."""

    def __init__(self, where: str, environ: Mapping[str, str]) -> None:
        self.where = where
        self.environ = environ
        self.secrets: list[str] = []

    def fail(self, key: str, problem: str) -> AlertConfigError:
        return AlertConfigError(f"{self.where}: {key}: {problem}")

    def notifier(self, name: str, body: Mapping[str, Any]) -> NotifierConfig:
        prefix = f"notifiers.{name}"
        if not _NAME.match(name):
            raise self.fail(prefix, "a notifier's name is 1 to 64 letters, digits, '.', '_' or '-'")
        kind = body.get("type")
        if kind not in NOTIFIER_TYPES:
            raise self.fail(f"{prefix}.type", f"expected one of {', '.join(NOTIFIER_TYPES)}, got {kind!r}")
        _only_keys(body, _COMMON_KEYS + _TYPE_KEYS[kind], self.where, prefix)
        self.secrets = []
        severity = body.get("min_severity", Severity.WARNING.value)
        if severity not in [s.value for s in Severity]:
            raise self.fail(f"{prefix}.min_severity", f"expected info, warning or critical, got {severity!r}")
        values: dict[str, Any] = {
            "name": name,
            "type": kind,
            "min_severity": Severity(severity),
            "kinds": self.kinds(body, prefix),
            "per_minute": self.number(body, prefix, "per_minute", NotifierConfig.per_minute),
            "burst": int(self.number(body, prefix, "burst", NotifierConfig.burst, integer=True)),
            "timeout_s": self.number(body, prefix, "timeout_s", NotifierConfig.timeout_s),
        }
        if kind in _HTTP_TYPES:
            values["url"] = self.url(body, prefix, "url", required=True, secret=True)
        if kind == "webhook":
            values["secret"] = self.text(body, prefix, "secret", secret=True) if "secret" in body else ""
            values["headers"] = self.headers(body, prefix)
        if kind == "command":
            values["command"] = self.command(body, prefix)
        if kind == "log" and "path" in body:
            values["path"] = Path(self.text(body, prefix, "path"))
        return NotifierConfig(**values, secrets=tuple(s for s in self.secrets if s))

    def resolve(self, key: str, raw: str, *, secret: bool) -> str:
        def substitute(match: re.Match) -> str:
            variable = match.group(1)
            if variable not in self.environ:
                raise self.fail(key, f"environment variable {variable} is not set")
            self.secrets.append(self.environ[variable])
            return self.environ[variable]

        value = _REFERENCE.sub(substitute, raw)
        if secret:
            self.secrets.append(value)
        return value

    def text(self, table: Mapping[str, Any], prefix: str, key: str, *, secret: bool = False) -> str:
        value = table.get(key)
        if not isinstance(value, str) or not value:
            raise self.fail(f"{prefix}.{key}", "expected a non-empty string")
        return self.resolve(f"{prefix}.{key}", value, secret=secret)

    def url(self, table: Mapping[str, Any], prefix: str, key: str, *, required: bool, secret: bool = False) -> str:
        if key not in table and not required:
            return ""
        value = self.text(table, prefix, key, secret=secret)
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            shown = MASK if secret else repr(value)
            raise self.fail(f"{prefix}.{key}", f"expected an http(s) URL with a host, got {shown}")
        return value.rstrip("/") if key == "dashboard_url" else value

    def number(
        self, table: Mapping[str, Any], prefix: str, key: str, default: float, *, integer: bool = False
    ) -> float:
        value = table.get(key, default)
        wanted = "an integer >= 1" if integer else "a number > 0"
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
            raise self.fail(f"{prefix}.{key}", f"expected {wanted}, got {value!r}")
        if not math.isfinite(value) or value <= 0:
            raise self.fail(f"{prefix}.{key}", f"expected {wanted}, got {value!r}")
        return float(value)

    def kinds(self, table: Mapping[str, Any], prefix: str) -> tuple[str, ...]:
        value = table.get("kinds", [])
        if not isinstance(value, list) or not all(isinstance(k, str) for k in value):
            raise self.fail(f"{prefix}.kinds", "expected a list of finding kinds")
        known = finding.FINDING_KINDS  # read from the registry only when a configuration names kinds
        unknown = [k for k in value if k not in known]
        if unknown:
            raise self.fail(f"{prefix}.kinds", f"unknown kind {unknown[0]!r} (expected {', '.join(known)})")
        return tuple(value)

    def headers(self, table: Mapping[str, Any], prefix: str) -> dict[str, str]:
        headers = _table(table.get("headers", {}), self.where, f"{prefix}.headers")
        return {str(name): self.text(headers, f"{prefix}.headers", name, secret=True) for name in headers}

    def command(self, table: Mapping[str, Any], prefix: str) -> tuple[str, ...]:
        value = table.get("command")
        if not isinstance(value, list) or not value or not all(isinstance(a, str) and a for a in value):
            raise self.fail(f"{prefix}.command", "expected a non-empty list of strings (program, then arguments)")
        argv = tuple(self.resolve(f"{prefix}.command", a, secret=False) for a in value)
        if shutil.which(argv[0]) is None:
            shown = MASK if _REFERENCE.search(value[0]) else repr(argv[0])
            raise self.fail(f"{prefix}.command", f"program {shown} not found")
        return argv
