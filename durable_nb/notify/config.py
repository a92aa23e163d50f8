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

    [teams]                 # a channel a package adds (durable_nb.notify.channels)
    url = "https://..."

The channels' sections and variables are the channels' own (each class's ``from_config`` and
``env``, found in the registry of :mod:`durable_nb.notify.channels`); this module reads the
files and the environment, and the settings that are not channels.

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
from .channels import (BUILT_IN, Channel, EmailConfig, Section, SlackConfig, WebhookConfig,
                       channel_class, channel_names, plugin_names)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - 3.10 only: tomli (a dependency there), imported when a file is read
    tomllib = None

__all__ = ["EVENTS", "EmailConfig", "LinksConfig", "NotifyConfig", "NotifySelection",
           "SlackConfig", "WebhookConfig", "check_selection", "choose", "load_config",
           "user_config_path"]

#: What can be notified: a request waiting (with its reminders and escalation), a request
#: decided by a person, decided by its deadline's policy, a run that failed.
EVENTS = ("waiting", "decided", "timed_out", "failed")

#: A run's ``notify=``: None (every configured channel), False or ``"none"`` (none), channel
#: names (a list, or one string with commas), or a :class:`NotifyConfig` of its own.
NotifySelection = Union[None, bool, str, Sequence[str], "NotifyConfig"]

#: The sections that are not channels.
SETTINGS = ("events", "retry", "links")
_SWITCHES = ("none", "off", "all", "on")

DEFAULT_RETRY = RetryPolicy(max_attempts=5, initial_delay=1.0, max_delay=30.0)


@dataclass(frozen=True)
class LinksConfig:
    """Decision links (:mod:`durable_nb.approvals.links`): the Jupyter server they open
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
    #: Channels of plug-ins (:mod:`durable_nb.notify.channels`), configured, each under its
    #: own ``name``.
    plugins: tuple[Channel, ...] = ()
    #: How a failed delivery is tried again: ``max_attempts`` in all, then it is failed.
    retry: RetryPolicy = field(default_factory=lambda: DEFAULT_RETRY)
    #: Seconds after which a claimed delivery nobody finished (its sender died) may be
    #: taken over by another process. Longer than one attempt plus the longest backoff.
    lease: float = 120.0
    #: The events notified (:data:`EVENTS`).
    events: tuple[str, ...] = ("waiting",)
    #: The decision links each message carries.
    links: LinksConfig = field(default_factory=LinksConfig)

    def __post_init__(self) -> None:
        for name, channel in (("webhook", self.webhook), ("slack", self.slack),
                              ("email", self.email)):
            if channel is not None and getattr(channel, "name", None) != name:
                raise NotifyConfigError(f"NotifyConfig({name}=...) takes a "
                                        f"{BUILT_IN[name].__name__}, not {channel!r}.")
        names = [getattr(p, "name", None) for p in self.plugins]
        for plugin, name in zip(self.plugins, names):
            if not isinstance(plugin, Channel) or name in BUILT_IN or names.count(name) > 1:
                raise NotifyConfigError(f"NotifyConfig(plugins=...) takes configured "
                                        f"channels of plug-ins, each name once, not "
                                        f"{plugin!r}.")

    def channels(self) -> dict[str, Channel]:
        """The configured channels by name (the built-ins first)."""
        built_in = {name: getattr(self, name) for name in BUILT_IN if getattr(self, name)}
        return {**built_in, **{plugin.name: plugin for plugin in self.plugins}}

    def only(self, names: Sequence[str]) -> "NotifyConfig":
        """This configuration with only the channels ``names`` (each must be configured)."""
        configured = self.channels()
        for name in names:
            if name not in configured:
                if name not in channel_names():
                    raise NotifyConfigError(f"notify names an unknown channel {name!r}: use "
                                            f"{', '.join(channel_names())} or 'none'.")
                raise NotifyConfigError(
                    f"notify names the channel {name!r}, but none is configured: set it in "
                    f"{user_config_path()} or with DURABLE_NB_NOTIFY_* (see the docs' "
                    f"Notifications page).")
        return replace(self, **{name: None for name in BUILT_IN if name not in names},
                       plugins=tuple(p for p in self.plugins if p.name in names))


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
    """Refuse a ``notify=`` that is not one of :data:`NotifySelection`'s forms, or names a
    channel that does not exist (built in or installed)."""
    if selection is None or isinstance(selection, (bool, NotifyConfig)):
        return
    names = selection.split(",") if isinstance(selection, str) else selection
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise NotifyConfigError(f"notify must be channel names ({', '.join(channel_names())}), "
                                f"'none', True/False or a NotifyConfig, not {selection!r}.")
    for name in (n.strip().lower() for n in names if n.strip()):
        if name not in (*_SWITCHES, *BUILT_IN) and name not in plugin_names():
            raise NotifyConfigError(f"notify names an unknown channel {name!r}: use "
                                    f"{', '.join(channel_names())}, 'all' or 'none'.")


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
        known = section in (*BUILT_IN, *SETTINGS) or section in plugin_names()
        if not known or not isinstance(values, dict):
            sections = ", ".join(f"[{name}]" for name in (*channel_names(), *SETTINGS))
            raise NotifyConfigError(f"the notification config {path} has an unknown section "
                                    f"[{section}]: use {sections}.")
    return data


_SETTINGS_ENV = {  # the settings' variables -> (section, field); channels declare their own
    "DURABLE_NB_NOTIFY_EVENTS": ("events", "send"),
    "DURABLE_NB_NOTIFY_LINK_BASE_URL": ("links", "base_url"),
    "DURABLE_NB_NOTIFY_LINK_MAX_AGE": ("links", "max_age"),
    "DURABLE_NB_NOTIFY_LINKS": ("links", "enabled"),
}


def _from_env(env: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """The sections the environment sets: the settings', each built-in channel's (its
    ``env``), and each plug-in's that has a ``DURABLE_NB_NOTIFY_<NAME>_`` variable set."""
    table = dict(_SETTINGS_ENV)
    for cls in BUILT_IN.values():
        table.update({variable: (cls.name, name) for variable, name in cls.env.items()})
    others = [v for v in env if v.startswith("DURABLE_NB_NOTIFY_") and v not in table
              and v != "DURABLE_NB_NOTIFY_CONFIG"]
    for name in plugin_names() if others else ():  # entry points read only when needed
        prefix = f"DURABLE_NB_NOTIFY_{name.upper()}_"
        if any(variable.startswith(prefix) and env[variable] for variable in others):
            cls = channel_class(name)
            table.update({variable: (name, key) for variable, key in cls.env.items()})
    found: dict[str, dict[str, Any]] = {}
    for variable, (section, name) in table.items():
        value = env.get(variable)
        if value:
            found.setdefault(section, {})[name] = value
    return found


def _build(data: dict[str, dict[str, Any]], where: str) -> NotifyConfig:
    config: dict[str, Any] = {}
    plugins = []
    for name in BUILT_IN:
        if name in data:
            config[name] = BUILT_IN[name].from_config(data[name], where)
    for name in data:
        if name not in BUILT_IN and name not in SETTINGS:
            plugins.append(channel_class(name).from_config(data[name], where))
    retry = Section(data.get("retry", {}), "retry", where)
    retry.known(("attempts", "first_delay", "max_delay", "lease"))
    config["retry"] = replace(
        DEFAULT_RETRY, max_attempts=retry.number("attempts", DEFAULT_RETRY.max_attempts, int),
        initial_delay=retry.number("first_delay", DEFAULT_RETRY.initial_delay),
        max_delay=retry.number("max_delay", DEFAULT_RETRY.max_delay))
    config["lease"] = retry.number("lease", NotifyConfig.lease)
    if "events" in data:
        config["events"] = _events(data["events"], where)
    config["links"] = _links(Section(data.get("links", {}), "links", where))
    return NotifyConfig(plugins=tuple(plugins), **config)


def _events(section: dict[str, Any], where: str) -> tuple[str, ...]:
    Section(section, "events", where).known(("send",))
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


def _links(section: Section) -> LinksConfig:
    section.known(("base_url", "max_age", "enabled"))
    base_url = section.url("base_url") if section.values.get("base_url") else None
    if base_url is not None and not base_url.endswith("/"):
        base_url += "/"
    return LinksConfig(base_url=base_url,
                       max_age=section.number("max_age", LinksConfig.max_age),
                       enabled=section.flag("enabled", True))
