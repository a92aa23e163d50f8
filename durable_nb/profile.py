"""``durable-nb enable`` / ``%durable enable``: load durable_nb in every IPython kernel
(``durable-nb enable --undo``, ``durable-nb disable`` or ``%durable disable`` removes it).

It adds ``c.InteractiveShellApp.extensions.append("durable_nb.notebook.magics")`` to the
profile's ``ipython_config.py`` (read by terminal IPython and by every ipykernel started with
that profile), between marker lines that ``disable`` removes. After a kernel restart,
``%%durable_agent`` is there without ``%load_ext durable_nb``. The profile loads the magics'
module, not ``durable_nb`` itself, so that a notebook's own ``%load_ext durable_nb`` (the
README's first cell) is a silent no-op there, not IPython's "already loaded" message.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["config_file", "disable", "enable"]

_BEGIN = "# >>> durable_nb: added by `durable-nb enable`; `durable-nb disable` removes it >>>"
_END = "# <<< durable_nb <<<"
_BLOCK = f"""{_BEGIN}
# %%durable_agent and %durable in every IPython kernel and shell of this profile.
c.InteractiveShellApp.extensions.append("durable_nb.notebook.magics")
{_END}
"""


def config_file(profile: str = "default") -> Path:
    """The profile's ``ipython_config.py`` (the profile directory is created if missing)."""
    from IPython.core.profiledir import ProfileDir, ProfileDirError
    from IPython.paths import get_ipython_dir

    try:
        directory = ProfileDir.find_profile_dir_by_name(get_ipython_dir(), profile)
    except ProfileDirError:
        directory = ProfileDir.create_profile_dir_by_name(get_ipython_dir(), profile)
    return Path(directory.location) / "ipython_config.py"


def enable(profile: str = "default") -> str:
    """Add the extension to the profile's config; what was done, as a line to print."""
    path = config_file(profile)
    text = path.read_text() if path.exists() else ""
    if _BLOCK in text:
        return f"durable_nb is already enabled in {path}"
    if _BEGIN in text:  # written by an earlier version: replaced by this one's block
        _remove_block(path)
        text = path.read_text()
    prefix = "c = get_config()  # noqa\n\n" if not text.strip() else \
        ("" if text.endswith("\n") else "\n") + "\n"
    path.write_text(text + prefix + _BLOCK)
    return (f"enabled durable_nb in {path}: every IPython kernel of profile {profile!r} started "
            f"from now on loads it (restart running kernels). `durable-nb enable --undo` undoes "
            f"it.")


def disable(profile: str = "default") -> str:
    """Remove what :func:`enable` added; what was done, as a line to print."""
    path = config_file(profile)
    if not _remove_block(path):
        return f"durable_nb was not enabled in {path}"
    return f"disabled durable_nb in {path} (running kernels keep it until restarted)"


def _remove_block(path: Path) -> bool:
    """Remove the block :func:`enable` added from the config file; whether there was one."""
    text = path.read_text() if path.exists() else ""
    start = text.find(_BEGIN)
    if start < 0:
        return False
    end = text.find(_END, start)
    end = len(text) if end < 0 else end + len(_END)
    rest = (text[:start].rstrip("\n") + "\n" + text[end:].lstrip("\n")).lstrip("\n")
    if rest.strip() == "c = get_config()  # noqa":
        rest = ""
    path.write_text(rest)
    return True
