"""``bedside.toml``: every notifier type parses, ``${VAR}`` comes from the environment given, each mistake is
one ``AlertConfigError`` naming the file and the key, and secrets never show in errors or destinations."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bedside.app.service.alerts.config import (
    MASK,
    AlertConfigError,
    AlertSettings,
    NotifierConfig,
    find_config,
    load_settings,
    parse_settings,
)
from bedside.detectors.finding import Severity

SLACK_TOKEN = "T000/B000/slack-token-xyz"
DISCORD_TOKEN = "123456/discord-token-abc"
SIGNING_SECRET = "signing-secret-123"
BOT_TOKEN = "bot-token-456"
PAGER_KEY = "pager-key-789"
ENVIRON = {
    "SLACK_TOKEN": SLACK_TOKEN,
    "DISCORD_TOKEN": DISCORD_TOKEN,
    "SIGNING_SECRET": SIGNING_SECRET,
    "BOT_TOKEN": BOT_TOKEN,
    "PAGER_KEY": PAGER_KEY,
}
SECRETS = tuple(ENVIRON.values())

VALID = f'''
[alerts]
dashboard_url = "http://oncall-box:8501/"
give_up_after_s = 600
retry_base_s = 0.5
retry_max_s = 30
digest_window_s = 120
digest_min_findings = 4

[notifiers.team-slack]
type = "slack"
url = "https://hooks.slack.com/services/${{SLACK_TOKEN}}"
min_severity = "warning"

[notifiers.infra-discord]
type = "discord"
url = "https://discord.com/api/webhooks/${{DISCORD_TOKEN}}"
kinds = ["sdc", "hang", "straggler"]
per_minute = 2.5
burst = 2

[notifiers.incident-bot]
type = "webhook"
url = "https://bot.internal:8443/bedside"
secret = "${{SIGNING_SECRET}}"
headers = {{ Authorization = "Bearer ${{BOT_TOKEN}}" }}
timeout_s = 0.5

[notifiers.pager]
type = "command"
command = ["{sys.executable}", "-c", "pass", "--key=${{PAGER_KEY}}"]
min_severity = "critical"

[notifiers.journal]
type = "log"
path = "/var/log/bedside-alerts.log"
min_severity = "info"
'''


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bedside.toml"
    path.write_text(text)
    return path


def config_error(tmp_path: Path, text: str, environ: dict[str, str] = ENVIRON) -> str:
    """The message of the AlertConfigError that loading ``text`` raises."""
    path = write_config(tmp_path, text)
    with pytest.raises(AlertConfigError) as caught:
        load_settings(path, environ)
    return str(caught.value)


def notifier_toml(body: str, name: str = "hook", kind: str = "webhook") -> str:
    """One notifier's table; ``body`` adds or overrides keys (a url is given for the http types)."""
    url = "" if kind not in ("slack", "discord", "webhook") or "url =" in body else 'url = "https://example.com/h"\n'
    return f'[notifiers.{name}]\ntype = "{kind}"\n{url}{body}\n'


# -- a valid file ---------------------------------------------------------------------------------------------


def test_a_file_with_all_five_notifier_types_parses_with_references_resolved(tmp_path: Path) -> None:
    path = write_config(tmp_path, VALID)
    settings = load_settings(path, ENVIRON)
    assert settings.source == path
    assert (
        settings.dashboard_url,
        settings.give_up_after_s,
        settings.retry_base_s,
        settings.retry_max_s,
        settings.digest_window_s,
        settings.digest_min_findings,
    ) == ("http://oncall-box:8501", 600, 0.5, 30, 120, 4)
    by_name = {n.name: n for n in settings.notifiers}
    assert [n.type for n in settings.notifiers] == ["slack", "discord", "webhook", "command", "log"]

    slack = by_name["team-slack"]
    assert slack.url == f"https://hooks.slack.com/services/{SLACK_TOKEN}"
    assert (slack.min_severity, slack.kinds, slack.per_minute, slack.burst, slack.timeout_s) == (
        Severity.WARNING,
        (),
        10.0,
        5,
        5.0,
    )
    discord = by_name["infra-discord"]
    assert (discord.kinds, discord.per_minute, discord.burst) == (("sdc", "hang", "straggler"), 2.5, 2)
    bot = by_name["incident-bot"]
    assert (bot.secret, dict(bot.headers), bot.timeout_s) == (
        SIGNING_SECRET,
        {"Authorization": f"Bearer {BOT_TOKEN}"},
        0.5,
    )
    pager = by_name["pager"]
    assert pager.command == (sys.executable, "-c", "pass", f"--key={PAGER_KEY}")
    assert pager.min_severity is Severity.CRITICAL
    journal = by_name["journal"]
    assert (journal.path, journal.min_severity) == (Path("/var/log/bedside-alerts.log"), Severity.INFO)


def test_defaults_apply_when_the_alerts_table_and_optional_keys_are_absent() -> None:
    settings = parse_settings({"notifiers": {"j": {"type": "log"}}}, {})
    assert settings == AlertSettings(notifiers=(NotifierConfig(name="j", type="log"),))
    assert settings.notifiers[0].destination == "stderr"
    assert parse_settings({}, {}).notifiers == ()


def test_a_notifier_accepts_incidents_at_or_above_its_severity_with_one_of_its_kinds() -> None:
    notifier = NotifierConfig(name="n", type="log", min_severity=Severity.WARNING, kinds=("sdc", "hang"))
    assert notifier.accepts(Severity.CRITICAL, ("loss_spike", "sdc"))
    assert notifier.accepts(Severity.WARNING, ("hang",))
    assert not notifier.accepts(Severity.INFO, ("sdc",))
    assert not notifier.accepts(Severity.CRITICAL, ("loss_spike",))
    assert NotifierConfig(name="all", type="log").accepts(Severity.WARNING, ("loss_spike",))


def test_references_come_from_the_environ_given_not_the_process_environment(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOOK_HOST", "from-the-process")
    text = notifier_toml('url = "https://${HOOK_HOST}/a/${HOOK_HOST}"')
    [notifier] = load_settings(write_config(tmp_path, text), {"HOOK_HOST": "given.example"}).notifiers
    assert notifier.url == "https://given.example/a/given.example"
    message = config_error(tmp_path, text, environ={})
    assert "environment variable HOOK_HOST is not set" in message


def test_find_config_looks_in_the_run_then_in_the_folder_that_holds_it(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "gpt"
    run.mkdir(parents=True)
    assert find_config(run) is None and find_config(None) is None
    (tmp_path / "runs" / "bedside.toml").write_text("")
    assert find_config(run) == tmp_path / "runs" / "bedside.toml"
    (run / "bedside.toml").write_text("")
    assert find_config(run) == run / "bedside.toml"


def test_asking_for_an_unknown_notifier_names_those_configured() -> None:
    settings = parse_settings({"notifiers": {"a": {"type": "log"}, "b": {"type": "log"}}}, {})
    with pytest.raises(AlertConfigError, match=r"no notifier named 'c' \(configured: a, b\)"):
        settings.notifier("c")


# -- mistakes -------------------------------------------------------------------------------------------------

MISTAKES = {
    "unknown top-level table": ("[alert]\ngive_up_after_s = 5\n", "'alert'"),
    "unknown alerts key": ("[alerts]\nretry_s = 5\n", "'alerts.retry_s'"),
    "unknown notifier key": (notifier_toml('colour = "red"'), "'notifiers.hook.colour'"),
    "key of another type": (notifier_toml('path = "/tmp/x"'), "'notifiers.hook.path'"),
    "unknown type": (notifier_toml("", kind="teams"), "notifiers.hook.type"),
    "missing type": ('[notifiers.hook]\nurl = "https://example.com"\n', "notifiers.hook.type"),
    "bad min_severity": (notifier_toml('min_severity = "urgent"'), "notifiers.hook.min_severity"),
    "unknown kind": (notifier_toml('kinds = ["loss_spike", "oom"]'), "notifiers.hook.kinds"),
    "kinds not a list": (notifier_toml('kinds = "sdc"'), "notifiers.hook.kinds"),
    "missing env var": (notifier_toml('url = "https://example.com/${NOT_SET_ANYWHERE}"'), "notifiers.hook.url"),
    "missing url": ('[notifiers.hook]\ntype = "slack"\n', "notifiers.hook.url"),
    "url without scheme": (notifier_toml('url = "hooks.slack.com/services/x"'), "notifiers.hook.url"),
    "url of another scheme": (notifier_toml('url = "ftp://example.com/x"'), "notifiers.hook.url"),
    "bad dashboard_url": ('[alerts]\ndashboard_url = "oncall-box:8501"\n', "alerts.dashboard_url"),
    "zero per_minute": (notifier_toml("per_minute = 0"), "notifiers.hook.per_minute"),
    "negative burst": (notifier_toml("burst = -1"), "notifiers.hook.burst"),
    "fractional burst": (notifier_toml("burst = 1.5"), "notifiers.hook.burst"),
    "negative timeout": (notifier_toml("timeout_s = -0.5"), "notifiers.hook.timeout_s"),
    "infinite timeout": (notifier_toml("timeout_s = inf"), "notifiers.hook.timeout_s"),
    "text timeout": (notifier_toml('timeout_s = "5"'), "notifiers.hook.timeout_s"),
    "boolean burst": (notifier_toml("burst = true"), "notifiers.hook.burst"),
    "zero give_up_after_s": ("[alerts]\ngive_up_after_s = 0\n", "alerts.give_up_after_s"),
    "negative retry_base_s": ("[alerts]\nretry_base_s = -1\n", "alerts.retry_base_s"),
    "nan retry_max_s": ("[alerts]\nretry_max_s = nan\n", "alerts.retry_max_s"),
    "zero digest_window_s": ("[alerts]\ndigest_window_s = 0\n", "alerts.digest_window_s"),
    "zero digest_min_findings": ("[alerts]\ndigest_min_findings = 0\n", "alerts.digest_min_findings"),
    "command program not found": (
        notifier_toml('command = ["no-such-program-bedside", "-x"]', kind="command"),
        "notifiers.hook.command",
    ),
    "empty command": (notifier_toml("command = []", kind="command"), "notifiers.hook.command"),
    "empty secret": (notifier_toml('secret = ""'), "notifiers.hook.secret"),
    "header not text": (notifier_toml("headers = { X-Retries = 3 }"), "notifiers.hook.headers.X-Retries"),
    "bad notifier name": (notifier_toml("", name='"team slack"'), "notifiers.team slack"),
    "notifiers not a table": ('notifiers = "slack"\n', "notifiers"),
}


@pytest.mark.parametrize("text, key", MISTAKES.values(), ids=MISTAKES.keys())
def test_a_mistake_is_one_error_naming_the_file_and_the_key(tmp_path: Path, text: str, key: str) -> None:
    message = config_error(tmp_path, text)
    assert str(tmp_path / "bedside.toml") in message
    assert key in message
    assert "\n" not in message


def test_a_file_that_is_not_toml_is_an_error_naming_the_file(tmp_path: Path) -> None:
    message = config_error(tmp_path, '[notifiers.hook]\ntype = "log\n')
    assert str(tmp_path / "bedside.toml") in message and "not valid TOML" in message


def test_a_missing_file_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(AlertConfigError, match=r"cannot read .*nowhere\.toml"):
        load_settings(tmp_path / "nowhere.toml", {})


def test_a_parsed_document_without_a_file_is_named_bedside_toml() -> None:
    with pytest.raises(AlertConfigError, match=r"^bedside\.toml: notifiers\.x\.type"):
        parse_settings({"notifiers": {"x": {"type": "pager"}}}, {})


# -- secrets --------------------------------------------------------------------------------------------------

SECRET_MISTAKES = {
    "bad url made of a secret": (
        notifier_toml('url = "hooks.slack.com/${SLACK_TOKEN}"', kind="slack"),
        "notifiers.hook.url",
    ),
    "bad literal url": (notifier_toml(f'url = "ftp://hooks.example/{SLACK_TOKEN}"'), "notifiers.hook.url"),
    "bad key after secrets": (
        notifier_toml(
            'url = "https://h.example/${SLACK_TOKEN}"\nsecret = "${SIGNING_SECRET}"\n'
            'headers = { A = "${BOT_TOKEN}" }\nburst = 0'
        ),
        "notifiers.hook.burst",
    ),
    "missing variable beside a secret": (
        notifier_toml('url = "https://h.example/${SLACK_TOKEN}/${NOT_SET_X}"'),
        "notifiers.hook.url",
    ),
    "empty header beside a secret": (
        notifier_toml('secret = "${SIGNING_SECRET}"\nheaders = { A = "" }'),
        "notifiers.hook.headers.A",
    ),
    "command missing beside a secret": (
        notifier_toml('command = ["no-such-program-bedside", "--key=${PAGER_KEY}"]', kind="command"),
        "notifiers.hook.command",
    ),
}


@pytest.mark.parametrize("text, key", SECRET_MISTAKES.values(), ids=SECRET_MISTAKES.keys())
def test_errors_never_show_a_secret(tmp_path: Path, text: str, key: str) -> None:
    message = config_error(tmp_path, text)
    assert key in message
    assert not [secret for secret in SECRETS if secret in message]


def test_destinations_show_scheme_host_and_port_only(tmp_path: Path) -> None:
    settings = load_settings(write_config(tmp_path, VALID), ENVIRON)
    shown = {n.name: n.destination for n in settings.notifiers}
    assert shown == {
        "team-slack": f"https://hooks.slack.com/{MASK}",
        "infra-discord": f"https://discord.com/{MASK}",
        "incident-bot": f"https://bot.internal:8443/{MASK}",
        "pager": f"command {sys.executable}",
        "journal": "/var/log/bedside-alerts.log",
    }
    assert not [s for s in SECRETS for d in shown.values() if s in d]


def test_scrub_masks_every_secret_of_a_notifier_and_leaves_other_text(tmp_path: Path) -> None:
    by_name = {n.name: n for n in load_settings(write_config(tmp_path, VALID), ENVIRON).notifiers}
    slack, bot, pager = by_name["team-slack"], by_name["incident-bot"], by_name["pager"]
    assert slack.scrub(f"POST {slack.url} failed") == f"POST {MASK} failed"
    assert slack.scrub(f"token {SLACK_TOKEN} leaked") == f"token {MASK} leaked"
    said = bot.scrub(f"headers Authorization: Bearer {BOT_TOKEN}; signed with {SIGNING_SECRET}")
    assert BOT_TOKEN not in said and SIGNING_SECRET not in said and said.startswith("headers Authorization:")
    assert PAGER_KEY not in pager.scrub(" ".join(pager.command))
    assert by_name["journal"].scrub("nothing secret here") == "nothing secret here"
