"""The extensions as a user installs them (issue 19's install check): the JupyterLab extension
prebuilt in the wheel, found and served by JupyterLab with no Node anywhere on PATH, and the
server extension listed enabled (skipped where durable_nb.server is missing).

The wheel is built from this checkout as ``python -m build`` does (an isolated build: pip
fetches the build backend, setuptools, from its index or cache) and installed with ``--no-deps``
into a fresh venv that sees the test venv's packages through a ``.pth`` file; the venv's PATH
holds only its own ``bin``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import sysconfig
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

from tests.harness.lab import _free_port

REPO = Path(__file__).resolve().parents[1]
SHARE = "share/jupyter/labextensions/durable-nb"


@pytest.fixture(scope="module")
def wheel(durable_nb_wheel: Path) -> Path:
    return durable_nb_wheel  # conftest: built once per run, shared with tests/test_install.py


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    """A fresh venv with the wheel installed, the test venv's packages importable."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = next((root / "lib").glob("python3*/site-packages"))
    (site / "test-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # --ignore-installed: the test venv's own (editable) durable-nb is neither seen nor touched.
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--ignore-installed", "--prefix", str(root), str(wheel)],
                   check=True, timeout=300)
    return root


def _env(venv: Path, home: Path) -> dict[str, str]:
    """No Node: PATH is the venv's bin only; Jupyter's user dirs are empty."""
    home.mkdir(exist_ok=True)
    return {"PATH": str(venv / "bin"), "HOME": str(home),
            "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_DATA_DIR": str(home / "data"),
            "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
            "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces")}


def test_the_wheel_ships_the_built_extension_where_jupyterlab_looks(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        data = [n.split(".data/data/", 1)[1] for n in names if ".data/data/" + SHARE in n]
        package = json.loads(archive.read(next(n for n in names
                                                if n.endswith(f"{SHARE}/package.json"))))
    assert f"{SHARE}/package.json" in data and f"{SHARE}/install.json" in data
    entry = package["jupyterlab"]["_build"]["load"]  # static/remoteEntry.<hash>.js
    assert f"{SHARE}/{entry}" in data
    assert package["name"] == "durable-nb"


def test_jupyterlab_lists_and_serves_the_extension_without_node(venv: Path,
                                                                 tmp_path: Path) -> None:
    env = _env(venv, tmp_path / "home")
    python = str(venv / "bin" / "python")
    listed = subprocess.run([python, "-m", "jupyterlab.labextensions", "list"], env=env,
                            capture_output=True, text=True, timeout=120)
    text = re.sub(r"\x1b\[[0-9;]*m", "", listed.stdout + listed.stderr)
    assert re.search(r"durable-nb v[\d.]+ enabled OK", text), text

    port, token = _free_port(), "t0ken"
    server = subprocess.Popen(
        [python, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}",
         "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={tmp_path}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        page = _get(f"http://127.0.0.1:{port}/lab?token={token}", deadline=180)
        config = json.loads(re.search(r'id="jupyter-config-data"[^>]*>(.*?)</script>', page,
                                      re.S).group(1))
        [extension] = [e for e in config["federated_extensions"] if e["name"] == "durable-nb"]
        script = _get(f"http://127.0.0.1:{port}/lab/extensions/durable-nb/{extension['load']}"
                      f"?token={token}", deadline=10)
        assert "durable-nb" in script
    finally:
        server.terminate()
        server.wait(timeout=30)


def _get(url: str, deadline: float) -> str:
    """The body of ``url``, asked until the server answers (it is starting)."""
    until = time.monotonic() + deadline
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.read().decode()
        except OSError:
            if time.monotonic() > until:
                raise
            time.sleep(0.3)


def test_jupyter_server_lists_the_server_extension_enabled(venv: Path, tmp_path: Path) -> None:
    pytest.importorskip("durable_nb.server", reason="durable_nb.server (the REST API) is missing")
    code = "from jupyter_server.extension.serverextension import main; main()"
    listed = subprocess.run([str(venv / "bin" / "python"), "-c", code, "list"],
                            env=_env(venv, tmp_path / "home"), capture_output=True, text=True,
                            timeout=120)
    text = re.sub(r"\x1b\[[0-9;]*m", "", listed.stdout + listed.stderr)
    assert re.search(r"durable_nb\.server enabled", text), text
    assert re.search(r"durable_nb\.server [^\n]*OK", text), text


def test_the_frontend_says_the_version_of_the_package_it_ships_in() -> None:
    """The sidebar compares FRONTEND_VERSION with the server extension's ``GET version``
    (durable_nb's version): all three must say the same, or every install reads as a
    mismatch."""
    import tomllib

    source = (REPO / "labextension" / "src" / "api.ts").read_text()
    frontend = re.search(r"FRONTEND_VERSION = '([^']+)'", source).group(1)
    package = json.loads((REPO / "labextension" / "package.json").read_text())["version"]
    python = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert frontend == package == python


def test_the_sidebar_writes_a_cost_as_the_cli_and_the_panel_do() -> None:
    """The sidebar's and run view's cost (dom.ts ``cost``) is ``format_cost``'s text: a tiny
    cost keeps two significant digits instead of reading "$0.0000"; a zero cost shows none
    (a free model says "free" once, on the run's cost line, not beside every row)."""
    import os
    import shutil

    from durable_nb.summary import format_cost

    built = REPO / "labextension" / "lib" / "dom.js"
    node = shutil.which("node")
    if not built.exists() or node is None:
        if os.environ.get("CI"):
            pytest.fail(f"{built} or node missing: .ci/run's labextension phase builds it")
        pytest.skip("the Lab extension's TypeScript is not built (cd labextension && jlpm build)")
    values = [0.000015, 0.0000031, 0.00012, 0.0021, 0.0099, 0.5, 1.234, 42.5]
    script = (f"import {{cost}} from {json.dumps(built.as_uri())};"
              f"console.log(JSON.stringify({json.dumps([0, *values])}.map(cost)))")
    out = subprocess.run([node, "--input-type=module", "-e", script], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    shown = json.loads(out)
    assert shown[0] == ""
    assert shown[1:] == [format_cost(v) for v in values]
    assert "$0.0000" not in shown
