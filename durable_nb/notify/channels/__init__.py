"""The channels, in one registry: the three built in (:mod:`.webhook`, :mod:`.slack`,
:mod:`.email`) and those other packages install under the entry-point group
``durable_nb.channels``::

    # the plug-in's pyproject.toml
    [project.entry-points."durable_nb.channels"]
    teams = "durable_nb_teams:TeamsChannel"

Each is a class of the :class:`~.base.Channel` protocol. Its name is its ``[section]`` in
notify.toml and its ``notify=`` / ``--notify`` name; the config files, the environment and a
run's choice find channels only here. A plug-in is imported when it is used (its section or
one of its ``DURABLE_NB_NOTIFY_<NAME>_*`` variables is set, or a run names it), so a broken
one stops only the runs that use it, with a message naming it.
"""

from __future__ import annotations

import functools
from importlib.metadata import EntryPoint, entry_points

from ...errors import NotifyConfigError
from .base import (HEADLINES, WAITING_EVENTS, Channel, DeliveryFailed, Notice, Section,
                   details_text, header_text, post_json)
from .email import EmailConfig
from .slack import SlackConfig
from .webhook import WebhookConfig

__all__ = ["BUILT_IN", "ENTRY_POINT_GROUP", "HEADLINES", "WAITING_EVENTS", "Channel",
           "DeliveryFailed", "EmailConfig", "Notice", "Section", "SlackConfig",
           "WebhookConfig", "channel_class", "channel_names", "details_text", "header_text",
           "plugin_names", "post_json"]

ENTRY_POINT_GROUP = "durable_nb.channels"

#: Names no plug-in may take: notify.toml's other sections, ``notify=``'s switches.
RESERVED = ("events", "retry", "links", "none", "off", "all", "on")

#: The built-in channels by name, in the order they are sent.
BUILT_IN: dict[str, type[Channel]] = {cls.name: cls for cls in (WebhookConfig, SlackConfig,
                                                                 EmailConfig)}


@functools.lru_cache(maxsize=1)
def _plugins() -> dict[str, EntryPoint]:
    """The installed plug-ins' entry points by name (read once per process: a plug-in
    installed later is found after a restart)."""
    found: dict[str, EntryPoint] = {}
    for point in entry_points(group=ENTRY_POINT_GROUP):
        if point.name not in BUILT_IN and point.name not in RESERVED:  # never replaced
            found.setdefault(point.name, point)
    return found


def plugin_names() -> tuple[str, ...]:
    """The names of the installed plug-in channels (nothing imported)."""
    return tuple(_plugins())


def channel_names() -> tuple[str, ...]:
    """Every channel's name: the built-ins', then the plug-ins'."""
    return (*BUILT_IN, *plugin_names())


@functools.lru_cache(maxsize=None)
def channel_class(name: str) -> type[Channel]:
    """The channel class called ``name`` (a plug-in imported now);
    :class:`~durable_nb.errors.NotifyConfigError` when there is none or it cannot be
    loaded."""
    if name in BUILT_IN:
        return BUILT_IN[name]
    point = _plugins().get(name)
    if point is None:
        raise NotifyConfigError(f"there is no notification channel {name!r}: use "
                                f"{', '.join(channel_names())} (a plug-in adds one under the "
                                f"entry point group {ENTRY_POINT_GROUP!r}).")
    try:
        cls = point.load()
    except Exception as exc:
        raise NotifyConfigError(f"the channel plug-in {name!r} ({point.value}) cannot be "
                                f"loaded: {type(exc).__name__}: {exc}. Reinstall or "
                                f"uninstall it.") from None
    _check(cls, name, point.value)
    return cls


def _check(cls: object, name: str, where: str) -> None:
    missing = [attr for attr in ("name", "env", "from_config", "recipients", "message", "send")
               if not hasattr(cls, attr)]
    if missing:
        raise NotifyConfigError(f"the channel plug-in {name!r} ({where}) is not a channel: "
                                f"it lacks {', '.join(missing)}.")
    if getattr(cls, "name") != name:
        raise NotifyConfigError(f"the channel plug-in {name!r} ({where}) calls itself "
                                f"{getattr(cls, 'name')!r}: its entry point's name and its "
                                f"name must be the same.")
    prefix = f"DURABLE_NB_NOTIFY_{name.upper()}_"
    wrong = [v for v in getattr(cls, "env") if not v.startswith(prefix)]
    if wrong:
        raise NotifyConfigError(f"the channel plug-in {name!r} ({where}) reads "
                                f"{', '.join(wrong)}: its variables must start with {prefix}.")
