"""The install a person does (issue 26), checked as a person would see it.

- The user's command, ``pip install "durable-nb[lab]"``, with the wheel built from this
  checkout, into a fresh venv (pip's cache reused): JupyterLab started from that venv has the
  "Durable runs" sidebar, the server extension answers, a run parks for approval in a
  notebook, and after Kernel > Shut Down the panel's saved view approves through the server;
  re-running the cell finishes the run, its tool run once.
- The contributor's path, ``pip install -e ".[lab]"`` then ``durable-nb dev-setup``, the same
  (``jupyter labextension develop --overwrite .`` links the same build; ``jupyter server
  extension enable durable_nb.server`` cannot help: it refuses an extension no config names).
- A kernel whose Jupyter server lacks the extensions names them, and the command that fixes
  them, in the panel itself (and the kernel-side check against a real server either way).

The two install tests share one venv (JupyterLab and its dependencies, installed for real by
``pip install "durable-nb[lab]"``, take minutes): each removes durable-nb and what dev-setup
placed, then installs durable-nb its own way. Without the package index they skip, saying so,
except under CI=true.
Screenshots go to $DURABLE_NB_SHOTS, else the test's tmp dir.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from durable_nb.devsetup import LABEXTENSION, SERVER_CONFIG, dev_setup
from durable_nb.notebook import extensions
from durable_nb.server.api import API_VERSION
from tests.harness import wait_until
from tests.harness.commands import run_setup as _run
from tests.harness.lab import JupyterLab, LabPage, require_chromium, write_notebook

REPO = Path(__file__).resolve().parents[1]
SIDEBAR_TAB = ".jp-SideBar .lm-TabBar-tab[data-id='durable-nb-sidebar']"
VERSION = "0.1.0"

_SETUP_CELL = "%load_ext durable_nb\nprint('setup ok')"
_AGENT_CELL = """\
%%durable_agent install-deploy --title "Deploy to production"
plan = ctx.run("plan", lambda: "3 changes")
if ctx.approval("kubectl apply", {"cmd": "kubectl apply -f prod.yaml", "plan": plan}).approved:
    ctx.run("apply", lambda: open("side_effects.log", "a").write("applied\\n"))"""

def _shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("DURABLE_NB_SHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _fresh_venv(path: Path) -> tuple[Path, dict[str, str]]:
    """A new venv (no packages but pip) and the environment a shell in it has."""
    _run([sys.executable, "-m", "venv", str(path)])
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join([str(path / "bin"), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(path)
    return path / "bin" / "python", env


def _approve_after_shut_down(python: Path, root: Path, shots: Path, name: str) -> None:
    """JupyterLab from ``python``'s environment: the sidebar is there, the server extension
    answers, a parked run is approved from its dead kernel's panel and re-running the cell
    finishes it with its tool run once."""
    require_chromium()
    journal = root / "journal"
    env = {"DURABLE_NB_JOURNAL": str(journal), "HOME": str(root / "home"),
           "DURABLE_NB_INDEX": str(root / "index")}
    (root / "lab").mkdir()
    notebook = write_notebook(root / "lab" / "install.ipynb", [_SETUP_CELL, _AGENT_CELL])
    with JupyterLab(root / "lab", env=env, python=python) as lab:
        assert lab.api("GET", "/durable-nb/api/version") == {"version": VERSION,
                                                              "api": API_VERSION}
        with LabPage(lab, timeout=90) as page:
            page.open_notebook("install.ipynb")
            page.page.locator(SIDEBAR_TAB).click()
            sidebar = page.page.locator(".dnr-sidebar")
            sidebar.wait_for(state="visible")
            page.wait_kernel_idle(timeout=120)
            page.run_cell(0)
            page.wait_for_text("setup ok", cell_index=0)
            page.run_cell(1)
            page.wait_for_text("Approval needed", cell_index=1)
            sidebar.get_by_text("install-deploy").first.wait_for(state="visible")
            assert not page.cell(1).locator(".dnb-setup").count()  # nothing is missing
            assert not sidebar.locator(".dnr-version-problem").count()
            page.screenshot(shots / f"install-{name}-parked.png")

            page.shut_down_kernel()
            here = page.cell(1).locator(".dnb-decide-here")
            here.locator(".dnr-approve").wait_for(state="visible")
            page.cell(1).screenshot(path=str(shots / f"install-{name}-dead-kernel.png"))
            here.locator(".dnr-approve").click()
            here.locator(".dnr-decided").wait_for(state="visible")
            assert "re-run its cell to continue" in here.inner_text()
            page.cell(1).screenshot(path=str(shots / f"install-{name}-approved.png"))
            assert not (root / "lab" / "side_effects.log").exists()

            # Re-run the cell in a new kernel: the run continues after the approval.
            page.cell(1).locator(".jp-InputArea-editor .cm-content").click()
            page.page.keyboard.press("Control+s")
            wait_until(lambda: "dnb-decide-here" in notebook.read_text(), 30,
                       "the notebook saved with the panel's saved view")
            page.open_notebook("install.ipynb")
            page.wait_kernel_idle(timeout=120)
            page.run_cell(0)
            page.wait_for_text("setup ok", cell_index=0)
            page.run_cell(1)
            page.wait_for_text("DONE", cell_index=1, timeout=90)
            page.screenshot(shots / f"install-{name}-done.png")
    assert (root / "lab" / "side_effects.log").read_text() == "applied\n"


@pytest.fixture(scope="module")
def lab_venv(tmp_path_factory: pytest.TempPathFactory,
             durable_nb_wheel: Path) -> tuple[Path, dict[str, str]]:
    """A fresh venv in which the user's command, ``pip install "durable-nb[lab]"`` (the wheel
    for the index), ran: JupyterLab and every dependency installed for real, once for the
    module's install tests, each of which installs durable-nb again its own way."""
    require_chromium()
    python, env = _fresh_venv(tmp_path_factory.mktemp("install") / "venv")
    _run([str(python), "-m", "pip", "install", "-q", f"{durable_nb_wheel}[lab]"], env=env)
    return python, env


def _without_durable_nb(python: Path, env: dict[str, str]) -> None:
    """Uninstall durable-nb (pip removes the data files a wheel placed) and remove what
    dev-setup placed: the venv has durable-nb's dependencies and nothing of it."""
    _run([str(python), "-m", "pip", "uninstall", "-y", "-q", "durable-nb"], env=env)
    prefix = python.parents[1]
    for placed in (prefix / LABEXTENSION, prefix / SERVER_CONFIG):
        if placed.is_symlink() or placed.is_file():
            placed.unlink()
    assert not (prefix / LABEXTENSION).exists() and not (prefix / SERVER_CONFIG).exists()


@pytest.mark.browser
@pytest.mark.timeout(1800)  # the module's venv, JupyterLab installed for real: minutes
def test_the_users_install_from_the_wheel_gives_sidebar_server_and_deciding_after_shut_down(
        tmp_path: Path, lab_venv: tuple[Path, dict[str, str]], durable_nb_wheel: Path) -> None:
    python, env = lab_venv
    _without_durable_nb(python, env)
    # The README's command, `pip install "durable-nb[lab]"`, with the wheel for the index.
    _run([str(python), "-m", "pip", "install", "-q", f"{durable_nb_wheel}[lab]"], env=env)
    _approve_after_shut_down(python, tmp_path, _shots(tmp_path), "wheel")


@pytest.mark.browser
@pytest.mark.timeout(1800)
def test_the_contributors_editable_install_with_dev_setup_gives_the_same(
        tmp_path: Path, lab_venv: tuple[Path, dict[str, str]]) -> None:
    python, env = lab_venv
    _without_durable_nb(python, env)
    prefix = python.parents[1]
    # The contributor's path (without the test extra's packages, which these checks do not
    # use): an editable install places no data files; `durable-nb dev-setup` places both.
    _run([str(python), "-m", "pip", "install", "-q", "-e", f"{REPO}[lab]"], env=env)
    assert not (prefix / LABEXTENSION).exists() and not (prefix / SERVER_CONFIG).exists()
    try:
        _run([str(python.parent / "durable-nb"), "dev-setup"], cwd=tmp_path, env=env)
        built = REPO / "durable_nb" / "labextension"
        assert (prefix / LABEXTENSION).resolve() == built
        assert (prefix / SERVER_CONFIG).read_text() == (REPO / SERVER_CONFIG).read_text()
        # JupyterLab's own command links the same build (durable_nb._jupyter_labextension_paths).
        _run([str(python.parent / "jupyter"), "labextension", "develop", "--overwrite", "."],
             cwd=REPO, env=env)
        assert (prefix / LABEXTENSION).resolve() == built
        _approve_after_shut_down(python, tmp_path, _shots(tmp_path), "editable")
    finally:
        # The link points into this checkout: no later install may write through it.
        _without_durable_nb(python, env)


def test_dev_setup_links_the_build_and_writes_the_server_config_again_and_again(
        tmp_path: Path) -> None:
    for _ in range(2):  # a second run replaces what the first placed
        said = dev_setup(tmp_path)
        assert (tmp_path / LABEXTENSION).resolve() == REPO / "durable_nb" / "labextension"
        config = json.loads((tmp_path / SERVER_CONFIG).read_text())
        assert config == {"ServerApp": {"jpserver_extensions": {"durable_nb.server": True}}}
        assert "restart JupyterLab" in said


# -- a server without the extensions ---------------------------------------------------------

def _require_bare_environment() -> None:
    """These tests need this environment without durable_nb's data files (an editable install,
    as .ci/run makes it): a server started from it has neither extension."""
    prefix = Path(sys.prefix)
    placed = [path for path in (prefix / "share/jupyter/labextensions/durable-nb",
                                prefix / "etc/jupyter/jupyter_server_config.d/durable_nb.json")
              if path.exists()]
    enabled = prefix / "etc/jupyter/jupyter_server_config.json"
    if enabled.is_file() and "durable_nb.server" in enabled.read_text():
        placed.append(enabled)
    if placed:
        pytest.skip(f"this environment has durable_nb's extensions ({', '.join(map(str, placed))})"
                    f": a server without them cannot be started from it")


def _ask(lab: JupyterLab, monkeypatch: pytest.MonkeyPatch
         ) -> tuple[extensions.Missing | None, bool]:
    """The kernel-side check, as a kernel this server started would run it: what the server
    lacks, and whether it serves the Lab extension."""
    monkeypatch.setenv("JPY_PARENT_PID", str(lab.pid))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(lab.runtime_dir))
    return extensions._ask_server()


def test_the_kernel_side_check_asks_the_server_that_started_the_kernel(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _require_bare_environment()
    (tmp_path / "bare").mkdir()
    (tmp_path / "full").mkdir()
    with JupyterLab(tmp_path / "bare", checkout=False) as bare:
        missing, lab_served = _ask(bare, monkeypatch)
    assert missing is not None and missing.server and missing.lab and not lab_served
    with JupyterLab(tmp_path / "full") as full:
        assert _ask(full, monkeypatch) == (None, True)
    monkeypatch.setenv("JPY_PARENT_PID", str(os.getpid()))  # no server: nothing is claimed
    assert extensions._ask_server() == (None, False)


@pytest.mark.browser
@pytest.mark.timeout(600)
def test_a_panel_under_a_server_without_the_extensions_names_them_and_the_fix(
        tmp_path: Path) -> None:
    require_chromium()
    _require_bare_environment()
    shots = _shots(tmp_path)
    (tmp_path / "lab").mkdir()
    write_notebook(tmp_path / "lab" / "bare.ipynb", [_SETUP_CELL, _AGENT_CELL])
    env = {"DURABLE_NB_JOURNAL": str(tmp_path / "journal"), "HOME": str(tmp_path / "home"),
           "DURABLE_NB_INDEX": str(tmp_path / "index")}
    with JupyterLab(tmp_path / "lab", env=env, checkout=False) as lab, \
            LabPage(lab, timeout=90) as page:
        page.open_notebook("bare.ipynb")
        page.wait_kernel_idle()
        page.run_cell(0)
        page.wait_for_text("setup ok", cell_index=0)
        page.run_cell(1)
        page.wait_for_text("Approval needed", cell_index=1)
        setup = page.cell(1).locator(".dnb-live .dnb-setup")
        setup.wait_for(state="visible")
        said = setup.inner_text()
        # The saved view (what remains once the kernel is gone) says it too.
        assert page.cell(1).locator(".dnb-saved .dnb-setup").count() == 1
        page.cell(1).screenshot(path=str(shots / "panel-missing-extensions.png"))
    assert "no durable_nb JupyterLab extension and no server extension" in said
    # This checkout is installed editable here (as in .ci/run): the contributor's command.
    assert "Fix: durable-nb dev-setup (in the environment that runs JupyterLab)" in said
