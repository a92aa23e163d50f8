"""Where notifications go: the channels configured for a journal or a user, and a run's choice.

Read, each later one overriding the earlier per field: the user's file
(``$XDG_CONFIG_HOME/durable-nb/notify.toml``, by default ``~/.config/durable-nb/notify.toml``,
or the file ``$DURABLE_NB_NOTIFY_CONFIG`` names), the journal's (``notify.toml`` in a disk
journal's directory), then the environment (``DURABLE_NB_NOTIFY_*``)::

    [webhook]
    url = "https://example.org/hooks/durable-nb"
    secret = "a shared secret"          # signs each request (HMAC-SHA256)

    [slack]
    url = "https://hooks.slack.com/services/..."

    [email]
    host = "smtp.example.org"
    port = 587
    starttls = true
    username = "bot"
    password = "..."
    from = "durable-nb@example.org"
    to = ["oncall@example.org"]

    [events]
    send = ["waiting", "decided", "timed_out", "failed"]   # default: ["waiting"]

    [retry]
    attempts = 5            # per channel and request, then the delivery is "failed"
    first_delay = 1.0       # seconds before the second attempt, doubling up to max_delay
    max_delay = 30.0
    lease = 120.0           # a claim left unfinished this long (its process died) is taken over

    [links]
    base_url = "https://hub.example.org/user/ana/"   # the Jupyter server decision links open
    max_age = 604800        # seconds a link lives when its request has no deadline (7 days)
    enabled = true          # false: no decision links in messages

Secrets (the webhook's secret, the SMTP password, the Slack URL, which holds its token) stay
in this object: its ``repr`` leaves them out, and nothing of them is written to a journal.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Union

from ..errors import NotifyConfigError
from ..execution.retry import RetryPolicy

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - 3.10 only: tomli (a dependency there), imported when a file is read
    tomllib = None

__all__ = ["CHANNELS", "EVENTS", "EmailConfig", "LinksConfig", "NotifyConfig", "NotifySelection",
           "SlackConfig", "WebhookConfig", "choose", "load_config", "user_config_path"]

#: The channel names, as ``notify=`` and the delivery records name them.
CHANNELS = ("webhook", "slack", "email")

#: What can be notified: a request waiting (with its reminders and escalation), a request
#: decided by a person, decided by its deadline's policy, a run that failed.
EVENTS = ("waiting", "decided", "timed_out", "failed")

#: A run's ``notify=``: None (every configured channel), False or ``"none"`` (none), channel
#: names (a list, or one string with commas), or a :class:`NotifyConfig` of its own.
NotifySelection = Union[None, bool, str, Sequence[str], "NotifyConfig"]

DEFAULT_TIMEOUT = 10.0  # seconds for one attempt's connect and answer
DEFAULT_RETRY = RetryPolicy(max_attempts=5, initial_delay=1.0, max_delay=30.0)


@dataclass(frozen=True)
class WebhookConfig:
    """A JSON POST to ``url``, signed with ``secret`` when there is one."""
    url: str
    secret: str | None = field(default=None, repr=False)
    timeout: float = DEFAULT_TIMEOUT


@dataclass(frozen=True)
class SlackConfig:
    """A Slack-compatible incoming webhook (its URL is a secret: it holds the token)."""
    url: str = field(repr=False)
    timeout: float = DEFAULT_TIMEOUT


@dataclass(frozen=True)
class EmailConfig:
    """E-mail over SMTP to ``to`` from ``sender``; STARTTLS and login when asked."""
    host: str
    sender: str
    to: tuple[str, ...]
    port: int = 25
    starttls: bool = False
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    timeout: float = DEFAULT_TIMEOUT


@dataclass(frozen=True)
class LinksConfig:
    """Decision links (:mod:`durable_nb.notify.links`): the Jupyter server they open
    (``base_url``; None: the server this process knows, if any), how long one lives when its
    request has no deadline, and whether messages carry them at all."""
    base_url: str | None = None
    max_age: float = 7 * 24 * 3600.0
    enabled: bool = True


@dataclass(frozen=True)
class NotifyConfig:
    """The channels a parked run's request is sent to, and how deliveries are retried."""
    webhook: WebhookConfig | None = None
    slack: SlackConfig | None = None
    email: EmailConfig | None = None
    #: How a failed delivery is tried again: ``max_attempts`` in all, then it is failed.
    retry: RetryPolicy = field(default_factory=lambda: DEFAULT_RETRY)
    #: Seconds after which a claimed delivery nobody finished (its sender died) may be
    #: taken over by another process. Longer than one attempt plus the longest backoff.
    lease: float = 120.0
    #: The events notified (:data:`EVENTS`).
    events: tuple[str, ...] = ("waiting",)
    #: The decision links each message carries.
    links: LinksConfig = field(default_factory=LinksConfig)

    def channels(self) -> dict[str, Any]:
        """The configured channels by name."""
        return {name: getattr(self, name) for name in CHANNELS if getattr(self, name)}

    def only(self, names: Sequence[str]) -> "NotifyConfig":
        """This configuration with only the channels ``names`` (each must be configured)."""
        for name in names:
            if name not in CHANNELS:
                raise NotifyConfigError(f"notify names an unknown channel {name!r}: use "
                                        f"{', '.join(CHANNELS)} or 'none'.")
            if getattr(self, name) is None:
                raise NotifyConfigError(
                    f"notify names the channel {name!r}, but none is configured: set it in "
                    f"{user_config_path()} or with DURABLE_NB_NOTIFY_* (see the docs' "
                    f"Notifications page).")
        return replace(self, **{name: None for name in CHANNELS if name not in names})


def user_config_path(env: Mapping[str, str] = os.environ) -> Path:
    """The user's notification config file."""
    if env.get("DURABLE_NB_NOTIFY_CONFIG"):
        return Path(env["DURABLE_NB_NOTIFY_CONFIG"]).expanduser()
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "durable-nb" / "notify.toml"


def load_config(journal_dir: str | os.PathLike | None = None,
                env: Mapping[str, str] = os.environ) -> NotifyConfig:
    """The configuration from the user's file, the journal's (``journal_dir/notify.toml``)
    and the environment; :class:`NotifyConfigError` naming the file and field that is wrong."""
    merged: dict[str, dict[str, Any]] = {}
    files = [user_config_path(env)]
    if journal_dir is not None:
        files.append(Path(journal_dir) / "notify.toml")
    for path in files:
        for section, values in _read_file(path).items():
            merged.setdefault(section, {}).update(values)
    for section, values in _from_env(env).items():
        merged.setdefault(section, {}).update(values)
    return _build(merged, " + ".join(str(p) for p in files) + " + DURABLE_NB_NOTIFY_*")


def choose(config: NotifyConfig, selection: NotifySelection) -> NotifyConfig:
    """A run's ``notify=`` applied to ``config``: the channels it is sent to."""
    if selection is None or selection is True:
        return config
    if isinstance(selection, NotifyConfig):
        return selection
    if selection is False:
        return config.only(())
    names = selection.split(",") if isinstance(selection, str) else list(selection)
    names = [n.strip().lower() for n in names if n.strip()]
    if names in (["none"], ["off"]):
        return config.only(())
    if names in (["all"], ["on"]):
        return config
    return config.only(names)


def check_selection(selection: Any) -> None:
    """Refuse a ``notify=`` that is not one of :data:`NotifySelection`'s forms."""
    if selection is None or isinstance(selection, (bool, NotifyConfig)):
        return
    names = selection.split(",") if isinstance(selection, str) else selection
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise NotifyConfigError(f"notify must be channel names ({', '.join(CHANNELS)}), "
                                f"'none', True/False or a NotifyConfig, not {selection!r}.")
    for name in (n.strip().lower() for n in names if n.strip()):
        if name not in (*CHANNELS, "none", "off", "all", "on"):
            raise NotifyConfigError(f"notify names an unknown channel {name!r}: use "
                                    f"{', '.join(CHANNELS)}, 'all' or 'none'.")


def _read_file(path: Path) -> dict[str, dict[str, Any]]:
    if not path.exists():
        return {}
    toml = tomllib
    if toml is None:
        try:
            import tomli as toml
        except ImportError:
            raise NotifyConfigError(f"reading {path} needs the TOML reader tomli on Python "
                                    f"3.10: pip install tomli") from None
    try:
        with open(path, "rb") as f:
            data = toml.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, toml.TOMLDecodeError) as exc:
        raise NotifyConfigError(f"the notification config {path} cannot be read: {exc}. "
                                f"Fix the file (TOML) or remove it.") from None
    for section, values in data.items():
        if section not in (*CHANNELS, "retry", "events", "links") \
                or not isinstance(values, dict):
            raise NotifyConfigError(f"the notification config {path} has an unknown section "
                                    f"[{section}]: use [webhook], [slack], [email], [events], "
                                    f"[retry], [links].")
    return data


_ENV = {  # variable suffix -> (section, field)
    "WEBHOOK": ("webhook", "url"), "WEBHOOK_SECRET": ("webhook", "secret"),
    "SLACK_WEBHOOK": ("slack", "url"),
    "SMTP_HOST": ("email", "host"), "SMTP_PORT": ("email", "port"),
    "SMTP_STARTTLS": ("email", "starttls"), "SMTP_USER": ("email", "username"),
    "SMTP_PASSWORD": ("email", "password"), "SMTP_FROM": ("email", "from"),
    "SMTP_TO": ("email", "to"), "EVENTS": ("events", "send"),
    "LINK_BASE_URL": ("links", "base_url"), "LINK_MAX_AGE": ("links", "max_age"),
    "LINKS": ("links", "enabled"),
}


def _from_env(env: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for suffix, (section, name) in _ENV.items():
        value = env.get(f"DURABLE_NB_NOTIFY_{suffix}")
        if value:
            found.setdefault(section, {})[name] = value
    return found


def _build(data: dict[str, dict[str, Any]], where: str) -> NotifyConfig:
    def need(section: str, name: str) -> Any:
        if not data[section].get(name):
            raise NotifyConfigError(f"[{section}] needs {name!r} (in {where}).")
        return data[section][name]

    def number(section: str, name: str, default: float, kind: type = float) -> Any:
        value = data.get(section, {}).get(name, default)
        try:
            value = kind(value)
        except (TypeError, ValueError):
            raise NotifyConfigError(f"[{section}] {name} must be a number, not {value!r} "
                                    f"(in {where}).") from None
        if value <= 0:
            raise NotifyConfigError(f"[{section}] {name} must be positive (in {where}).")
        return value

    config: dict[str, Any] = {}
    if "webhook" in data:
        config["webhook"] = WebhookConfig(
            url=_url(need("webhook", "url"), "webhook", where),
            secret=data["webhook"].get("secret") or None,
            timeout=number("webhook", "timeout", DEFAULT_TIMEOUT))
    if "slack" in data:
        config["slack"] = SlackConfig(url=_url(need("slack", "url"), "slack", where),
                                      timeout=number("slack", "timeout", DEFAULT_TIMEOUT))
    if "email" in data:
        to = need("email", "to")
        to = tuple(a.strip() for a in (to.split(",") if isinstance(to, str) else to)
                   if a.strip())
        config["email"] = EmailConfig(
            host=need("email", "host"), sender=need("email", "from"), to=to,
            port=number("email", "port", 25, int),
            starttls=_flag(data["email"].get("starttls", False)),
            username=data["email"].get("username") or None,
            password=data["email"].get("password") or None,
            timeout=number("email", "timeout", DEFAULT_TIMEOUT))
    known = ("attempts", "first_delay", "max_delay", "lease")
    for name in data.get("retry", {}):
        if name not in known:
            raise NotifyConfigError(f"[retry] has no field {name!r}: use "
                                    f"{', '.join(known)} (in {where}).")
    config["retry"] = replace(
        DEFAULT_RETRY, max_attempts=number("retry", "attempts", DEFAULT_RETRY.max_attempts, int),
        initial_delay=number("retry", "first_delay", DEFAULT_RETRY.initial_delay),
        max_delay=number("retry", "max_delay", DEFAULT_RETRY.max_delay))
    config["lease"] = number("retry", "lease", NotifyConfig.lease)
    if "events" in data:
        config["events"] = _events(data["events"], where)
    config["links"] = _links(data.get("links", {}), number, where)
    return NotifyConfig(**config)


def _events(section: dict[str, Any], where: str) -> tuple[str, ...]:
    for name in section:
        if name != "send":
            raise NotifyConfigError(f"[events] has no field {name!r}: use send (in {where}).")
    send = section.get("send", ["waiting"])
    names = send.split(",") if isinstance(send, str) else send
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise NotifyConfigError(f"[events] send must be a list of {', '.join(EVENTS)} "
                                f"(in {where}).")
    chosen = tuple(dict.fromkeys(n.strip().lower() for n in names if n.strip()))
    for name in chosen:
        if name not in EVENTS:
            raise NotifyConfigError(f"[events] send names an unknown event {name!r}: use "
                                    f"{', '.join(EVENTS)} (in {where}).")
    return chosen


def _links(values: dict[str, Any], number: Any, where: str) -> LinksConfig:
    known = ("base_url", "max_age", "enabled")
    for name in values:
        if name not in known:
            raise NotifyConfigError(f"[links] has no field {name!r}: use "
                                    f"{', '.join(known)} (in {where}).")
    base_url = values.get("base_url") or None
    if base_url is not None:
        base_url = _url(base_url, "links", where, "base_url")
        base_url = base_url if base_url.endswith("/") else base_url + "/"
    return LinksConfig(base_url=base_url,
                       max_age=number("links", "max_age", LinksConfig.max_age),
                       enabled=_flag(values.get("enabled", True)))


def _url(value: Any, section: str, where: str, name: str = "url") -> str:
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        raise NotifyConfigError(f"[{section}] {name} must be an http(s) URL (in {where}).")
    return value


def _flag(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)
