"""The "Durable runs" sidebar, the approvals inbox and the run view (issue 19), as a person uses
them: a real JupyterLab in headless Chromium, the real server extension (durable_nb.server)
over a directory journal ($DURABLE_NB_JOURNAL, which the kernels inherit), the extension as
built into durable_nb/labextension/.

- A run parks for approval, its kernel is restarted (the panel's link opens the run view), then
  run is approved from the inbox the sidebar opens; the card says "approved; re-run its cell to
  continue" and opens the notebook at that cell; re-running the cell finishes the run with the
  tool run once.
- A run parks for approval and its kernel is shut down: the notebook's panel output gives way
  to its saved view, whose Approve goes through the server ("approved by NAME; re-run its cell
  to continue", also once the notebook is saved and reopened); re-running the cell finishes the
  run with the tool run once. Decided in a terminal while that saved view shows its buttons,
  a click there is refused and the view shows the decision that stands.
- The sidebar says when the server extension is missing or of another version; the sidebar,
  a run view and the inbox come back after a page reload.
- An idle sidebar asks nothing: the server pushes the summary (`GET events`, server-sent
  events) and the sidebar fetches the listing when it changed; where the stream cannot be
  opened it polls `GET summary`. The count on the sidebar's tab follows approvals made from
  the CLI and from another notebook through the stream; a hostile title is shown as text.
- A decision on a request that changed since its card was drawn is refused (nothing written),
  and the inbox says so and shows the new request; a run is cancelled from its view.
- A batch with 12 pending approvals is approved from the inbox with "Approve all shown",
  each decision bound to what its card showed; the batch then finishes, each send once.

Screenshots (the sidebar, the inbox, the run view) go to $DURABLE_NB_SHOTS, else tmp dirs.
Needs the server extension (durable_nb.server); skipped, with that reason, where it is missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit

import pytest

import durable_nb as dn
from durable_nb import Status
from durable_nb.approvals.request import find_decision, pending_digest
from durable_nb.journal import DiskJournal
from tests.harness import wait_until
from tests.harness.lab import JupyterLab, LabPage, require_chromium, write_notebook

pytestmark = pytest.mark.browser

# The server half of issue 19 (h9's branch): the tests need its REST API.
pytest.importorskip("durable_nb.server", reason="durable_nb.server (the REST API) is missing")

REPO = Path(__file__).resolve().parents[1]
SIDEBAR_TAB = ".jp-SideBar .lm-TabBar-tab[data-id='durable-nb-sidebar']"
HOSTILE = "<img src=x onerror=\"window.dnbPwned=1\">"

_SETUP_CELL = "%load_ext durable_nb\nprint('setup ok')"
_AGENT_CELL = """\
%%durable_agent deploy --title "Deploy to production"
plan = ctx.run("plan", lambda: "3 changes")
if ctx.approval("kubectl apply", {"cmd": "kubectl apply -f prod.yaml", "plan": plan}).approved:
    ctx.run("apply", lambda: open("side_effects.log", "a").write("applied\\n"))"""


@pytest.fixture(scope="module")
def journal_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("journal") / "journal"


@contextlib.contextmanager
def sidebar_lab(tmp_path_factory: pytest.TempPathFactory, journal_dir: Path,
                **options: Any) -> Iterator[JupyterLab]:
    """One JupyterLab whose server and kernels use ``journal_dir`` (``options``: the
    harness's, e.g. ``toasts=True``)."""
    require_chromium()
    # An index of its own: the session's lists every journal the suite opened so far (hundreds,
    # each opened by every summary the sidebar polls), not what a user's server knows.
    env = {"DURABLE_NB_JOURNAL": str(journal_dir), "HOME": str(tmp_path_factory.mktemp("home")),
           "DURABLE_NB_INDEX": str(tmp_path_factory.mktemp("index"))}
    with JupyterLab(tmp_path_factory.mktemp("lab"), env=env, **options) as server:
        yield server


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, journal_dir: Path) -> Iterator[JupyterLab]:
    with sidebar_lab(tmp_path_factory, journal_dir) as server:
        yield server


@pytest.fixture
def journal(journal_dir: Path) -> Iterator[DiskJournal]:
    """The test process's handle on the journal the server shows (runs seeded, checked)."""
    opened = DiskJournal(journal_dir)
    try:
        yield opened
    finally:
        opened.close()


def _shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("DURABLE_NB_SHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _open_lab(page: LabPage) -> None:
    """Lab with the Durable runs sidebar open."""
    page.page.goto(f"{page.lab.url}/lab?reset&token={page.lab.token}")
    _show_sidebar(page)


def _show_sidebar(page: LabPage) -> None:
    """Open the Durable runs sidebar (a click on its tab when another panel is shown)."""
    sidebar = page.page.locator(".dnr-sidebar")
    if not sidebar.is_visible():
        page.page.locator(SIDEBAR_TAB).click()
    sidebar.wait_for(state="visible")


def _tab_count(page: LabPage, count: int) -> None:
    """Wait until the sidebar's tab shows ``count`` pending approvals (no badge for 0)."""
    tab = page.page.locator(SIDEBAR_TAB)
    if count:
        tab.and_(page.page.locator(f"[data-dnr-pending='{count}']")).wait_for(state="attached")
    else:
        tab.and_(page.page.locator(":not([data-dnr-pending])")).wait_for(state="attached")


def _park(journal: DiskJournal, run_id: str, title: str, sent: list[str]) -> None:
    def handler(ctx: Any) -> None:
        if ctx.approval("send_email", {"to": f"{run_id}@example.com"}).approved:
            ctx.run("send", lambda: sent.append(run_id))

    assert dn.execute(run_id, handler, title=title, journal=journal, on_approval="park") is None


def test_approved_in_the_inbox_with_the_kernel_gone_then_the_rerun_cell_finishes_once(
    lab: JupyterLab, journal: DiskJournal, tmp_path: Path
) -> None:
    shots = _shots(tmp_path)
    folder = lab.root_dir / "deploy"
    folder.mkdir()
    write_notebook(folder / "deploy.ipynb", [_SETUP_CELL, _AGENT_CELL])
    with LabPage(lab, timeout=60) as page:
        page.open_notebook("deploy/deploy.ipynb")
        page.wait_kernel_idle()
        page.run_cell(0)
        page.wait_for_text("setup ok", cell_index=0)
        page.run_cell(1)
        try:
            page.wait_for_text("Approval needed", cell_index=1)
        except Exception as exc:
            raise AssertionError(f"the run did not park; the cell shows: "
                                 f"{page.cell_output_text(1)!r}") from exc
        assert journal.get_run("deploy").status is Status.WAITING_APPROVAL
        # The kernel that parked it is gone (restarted): the panel's buttons are dead, its
        # link opens the run view.
        page.restart_kernel()
        page.cell(1).locator(".dnb-panel.jupyter-widgets-disconnected").wait_for(
            state="attached")
        page.cell(1).locator(".dnb-decide-here a[data-durable-nb-run='deploy']").first.click()
        view = page.page.locator(".dnr-runview:visible")
        view.locator(".dnr-card .dnr-approve").wait_for(state="visible")
        assert "kubectl apply -f prod.yaml" in view.locator(".dnr-details").inner_text()
        page.page.screenshot(path=str(shots / "run-view-waiting.png"))
        page.page.goto("about:blank")  # the notebook's tab and kernel go: nothing runs the run
        lab.delete_sessions()

        _open_lab(page)
        _tab_count(page, 1)
        row = page.page.locator(".dnr-group-waiting .dnr-run[data-run='deploy']")
        row.wait_for(state="visible")
        assert row.locator(".dnr-origin").inner_text() == "deploy.ipynb"  # its notebook
        page.page.locator(".dnr-sidebar").screenshot(path=str(shots / "sidebar-waiting.png"))

        page.page.locator(".dnr-inbox-button").click()
        card = page.page.locator(".dnr-inbox .dnr-card[data-run='deploy']")
        assert "kubectl apply -f prod.yaml" in card.locator(".dnr-details").inner_text()
        page.page.screenshot(path=str(shots / "inbox-one.png"))
        card.locator(".dnr-note").fill("ship it")
        card.locator(".dnr-approve").click()

        decided = page.page.locator(".dnr-inbox .dnr-decided, .dnr-sidebar .dnr-decided").first
        decided.wait_for(state="visible")
        assert "approved; re-run its cell to continue" in decided.inner_text()
        _tab_count(page, 0)
        pending = journal.get_run("deploy").pending_approval
        decision = find_decision(journal, "deploy", pending)
        assert decision["approved"] and decision["note"] == "ship it"
        assert decision["digest"] == pending_digest(pending)
        assert not (folder / "side_effects.log").exists()

        page.page.locator(".dnr-sidebar .dnr-run[data-run='deploy'] .dnr-open-cell").click()
        page.wait_kernel_idle()
        active = page.panel.locator(".jp-Cell.jp-mod-active")
        assert "%%durable_agent deploy" in active.inner_text()
        page.run_cell(0)
        page.wait_for_text("setup ok", cell_index=0)
        page.run_cell(1)
        page.wait_for_text("DONE", cell_index=1)

        _show_sidebar(page)
        page.page.locator(".dnr-group-done .dnr-run[data-run='deploy']").click()
        view = page.page.locator(".dnr-runview:visible")
        view.locator(".dnr-step").nth(2).wait_for(state="visible")
        view.locator(".dnr-step summary").nth(1).click()
        page.page.screenshot(path=str(shots / "run-view-done.png"))
        assert "kubectl apply" in view.inner_text() and "DONE" in view.inner_text()

    assert (folder / "side_effects.log").read_text() == "applied\n"
    assert journal.get_run("deploy").status is Status.DONE


def test_a_dead_kernels_panel_approves_through_the_server_and_the_rerun_cell_finishes_once(
    lab: JupyterLab, journal: DiskJournal, tmp_path: Path
) -> None:
    shots = _shots(tmp_path)
    folder = lab.root_dir / "panel"
    folder.mkdir()
    write_notebook(folder / "panel.ipynb",
                   [_SETUP_CELL, _AGENT_CELL.replace("deploy --title", "panel-deploy --title")])
    with LabPage(lab, timeout=60) as page:
        page.open_notebook("panel/panel.ipynb")
        page.wait_kernel_idle()
        page.run_cell(0)
        page.wait_for_text("setup ok", cell_index=0)
        page.run_cell(1)
        page.wait_for_text("Approval needed", cell_index=1)
        here = page.cell(1).locator(".dnb-decide-here")
        assert not here.is_visible()  # the kernel is alive: its panel's own buttons decide
        page.shut_down_kernel()
        # The dead panel gives way to its saved view, whose buttons go through the server.
        here.locator(".dnr-approve").wait_for(state="visible")
        assert not page.cell(1).locator(".dnb-live").is_visible()
        shown = page.cell(1).locator(".dnb-saved").inner_text()
        assert "kubectl apply -f prod.yaml" in shown
        page.cell(1).screenshot(path=str(shots / "panel-dead-kernel-waiting.png"))
        posted: list[dict] = []  # the decision sent (issue 32: the request's id and digest)
        page.page.on("request", lambda request: posted.append(json.loads(request.post_data))
                     if request.method == "POST" and "/durable-nb/api/run/decision"
                     in request.url else None)
        here.locator(".dnr-note").fill("from the panel")
        here.locator(".dnr-approve").click()
        here.locator(".dnr-decided").wait_for(state="visible")
        page.cell(1).screenshot(path=str(shots / "panel-dead-kernel-approved.png"))
        decided_text = here.inner_text()

        pending = journal.get_run("panel-deploy").pending_approval
        decision = find_decision(journal, "panel-deploy", pending)
        assert decision["approved"] and decision["note"] == "from the panel"
        assert decision["digest"] == pending_digest(pending)
        assert [(p["request_id"], p["digest"]) for p in posted] == [
            (pending["id"], pending_digest(pending))]
        assert decision["by"] and f"approved by {decision['by']};" in decided_text
        assert not (folder / "side_effects.log").exists()

        # Saved and opened again (a new kernel): the saved view tells the decision given.
        page.cell(1).locator(".jp-InputArea-editor .cm-content").click()
        page.page.keyboard.press("Control+s")
        notebook = folder / "panel.ipynb"
        wait_until(lambda: "dnb-decide-here" in notebook.read_text(), 30,
                   "the notebook saved with the panel's saved view")
        page.open_notebook("panel/panel.ipynb")
        reopened = page.cell(1).locator(".dnb-decide-here .dnr-decided")
        reopened.wait_for(state="visible")
        assert f"approved by {decision['by']}; re-run its cell to continue" in \
            reopened.inner_text()
        assert not page.cell(1).locator(".dnb-decide-here .dnr-approve").count()
        page.wait_kernel_idle()
        page.run_cell(0)
        page.wait_for_text("setup ok", cell_index=0)
        page.run_cell(1)
        page.wait_for_text("DONE", cell_index=1)
    assert (folder / "side_effects.log").read_text() == "applied\n"
    assert journal.get_run("panel-deploy").status is Status.DONE


def test_a_saved_view_whose_request_was_decided_elsewhere_shows_that_decision(
    lab: JupyterLab, journal: DiskJournal, tmp_path: Path
) -> None:
    """A decision is written once: the dead kernel's saved view still offers the buttons,
    the request is approved in a terminal meanwhile; Reject there is refused and the view
    shows the approval that stands, not an error beside live-looking buttons."""
    shots = _shots(tmp_path)
    folder = lab.root_dir / "elsewhere"
    folder.mkdir()
    write_notebook(folder / "elsewhere.ipynb",
                   [_SETUP_CELL, _AGENT_CELL.replace("deploy --title", "elsewhere --title")])
    with LabPage(lab, timeout=60) as page:
        page.open_notebook("elsewhere/elsewhere.ipynb")
        page.wait_kernel_idle()
        page.run_cell(0)
        page.wait_for_text("setup ok", cell_index=0)
        page.run_cell(1)
        page.wait_for_text("Approval needed", cell_index=1)
        page.shut_down_kernel()
        here = page.cell(1).locator(".dnb-decide-here")
        here.locator(".dnr-reject").wait_for(state="visible")
        approved = subprocess.run(
            [sys.executable, "-m", "durable_nb.cli", "--journal", str(journal.directory),
             "approve", "elsewhere", "--by", "ana"], capture_output=True, text=True,
            timeout=120, cwd=REPO)
        assert approved.returncode == 0, approved.stderr
        here.locator(".dnr-reject").click()
        here.locator(".dnr-decided").wait_for(state="visible")
        page.cell(1).screenshot(path=str(shots / "saved-view-decided-elsewhere.png"))
        assert "approved by ana; re-run its cell to continue" in here.inner_text()
        assert not here.locator(".dnr-reject").count() and not here.locator(".dnr-error").count()
    pending = journal.get_run("elsewhere").pending_approval
    decision = find_decision(journal, "elsewhere", pending)
    assert (decision["approved"], decision["by"], decision["via"]) == (True, "ana", "durable-nb")


def _answer_with(answer: dict) -> Any:
    """A route handler answering ``answer`` (status, body) as JSON."""
    return lambda route: route.fulfill(content_type="application/json", **answer)


def test_the_sidebar_says_when_the_server_extension_is_missing_or_of_another_version(
    lab: JupyterLab, tmp_path: Path
) -> None:
    shots = _shots(tmp_path)
    for answer, said in (
            ({"status": 404, "body": '{"message": "Not Found"}'},
             "The Jupyter server has no durable_nb extension"),
            ({"status": 200, "body": '{"version": "0.0.1"}'},
             "The Jupyter server runs durable_nb 0.0.1, this JupyterLab extension is 0.1.0")):
        with LabPage(lab, timeout=60) as page:
            page.page.route("**/durable-nb/api/version*", _answer_with(answer))
            _open_lab(page)
            problem = page.page.locator(".dnr-sidebar .dnr-version-problem")
            problem.wait_for(state="visible")
            assert said in problem.inner_text()
            page.page.locator(".dnr-sidebar").screenshot(
                path=str(shots / f"sidebar-version-{answer['status']}.png"))
    with LabPage(lab, timeout=60) as page:  # the real server: the same version, nothing said
        with page.page.expect_response(lambda r: "/durable-nb/api/version" in r.url), \
                page.page.expect_response(lambda r: "/durable-nb/api/runs" in r.url):
            _open_lab(page)  # the listing: fetched on the stream's first summary
        page.page.locator(".dnr-sidebar[data-dnr-live='stream']").wait_for(state="attached")
        assert not page.page.locator(".dnr-version-problem").count()


def _wait_for_saved_layout(lab: JupyterLab) -> None:
    """Wait until the workspace holds the sidebar as the left area's current panel, a run
    view and the inbox (JupyterLab saves the layout a moment after it changes)."""
    deadline = time.monotonic() + 60
    while True:
        data = lab.api("GET", "/lab/api/workspaces/default")["data"]
        left = data.get("layout-restorer:data", {}).get("left", {})
        if (left.get("current") == "durable-nb-sidebar"
                and any(key.startswith("durable-nb-run:") for key in data)
                and "durable-nb-inbox:inbox" in data):
            return
        assert time.monotonic() < deadline, f"the layout was never saved: {data}"
        time.sleep(0.2)


def test_the_sidebar_the_run_views_and_the_inbox_come_back_after_a_reload(
    lab: JupyterLab, journal: DiskJournal
) -> None:
    sent: list[str] = []
    _park(journal, "restored", "Open across a reload", sent)
    with LabPage(lab, timeout=60) as page:
        _open_lab(page)
        page.page.locator(".dnr-run[data-run='restored']").click()
        page.page.locator(".dnr-runview:visible").get_by_text("Open across a reload").first \
            .wait_for()
        page.page.locator(".dnr-inbox-button").click()
        page.page.locator(".dnr-inbox").wait_for(state="visible")
        # JupyterLab saves the layout to the workspace; the reload reads it from there.
        _wait_for_saved_layout(lab)
        page.page.goto(f"{lab.url}/lab?token={lab.token}")  # no ?reset: the layout is restored
        page.page.locator(".dnr-sidebar").wait_for(state="visible")
        page.page.locator("#jp-main-dock-panel .lm-TabBar-tab",
                          has_text="Approvals (").wait_for()
        page.page.locator("#jp-main-dock-panel .lm-TabBar-tab", has_text="restored").click()
        page.page.locator(".dnr-runview:visible").get_by_text("Open across a reload").first \
            .wait_for()
    dn.cancel("restored", journal=journal)


def _api_paths(page: LabPage) -> list[str]:
    """The paths of the API requests the page sends from now on (GETs carry a query)."""
    asked: list[str] = []
    page.page.on("request", lambda request: asked.append(urlsplit(request.url).path)
                 if "/durable-nb/api/" in request.url else None)
    return asked


def test_an_idle_sidebar_listens_to_the_stream_and_fetches_only_what_changed(
    lab: JupyterLab, journal: DiskJournal
) -> None:
    sent: list[str] = []
    _park(journal, "idle", "Parked while nobody looks", sent)
    with LabPage(lab, timeout=60) as page:
        _open_lab(page)
        page.page.locator(".dnr-sidebar[data-dnr-live='stream'] .dnr-run[data-run='idle']") \
            .wait_for()
        asked = _api_paths(page)
        _park(journal, "idle-2", "Parked from another process", sent)  # pushed by the server
        page.page.locator(".dnr-run[data-run='idle-2']").wait_for()
    # the listing and the inbox fetched once the summary changed; never the summary itself
    assert asked and all(path.endswith("/durable-nb/api/runs") for path in asked), asked
    for run_id in ("idle", "idle-2"):
        dn.cancel(run_id, journal=journal)


def test_a_sidebar_whose_stream_is_refused_polls_only_the_summary(
    lab: JupyterLab, journal: DiskJournal
) -> None:
    sent: list[str] = []
    _park(journal, "idle", "Parked while nobody looks", sent)
    with LabPage(lab, timeout=60) as page:
        # a server extension without the stream (or a proxy refusing it)
        page.page.route("**/durable-nb/api/events*",
                        _answer_with({"status": 404, "body": '{"message": "Not Found"}'}))
        _open_lab(page)
        page.page.locator(".dnr-sidebar[data-dnr-live='poll'] .dnr-run[data-run='idle']") \
            .wait_for()
        asked = _api_paths(page)
        for _ in range(3):  # three polls while nothing changes
            page.page.wait_for_event("request", lambda request: urlsplit(
                request.url).path.endswith("/durable-nb/api/summary"))
    assert asked and all(path.endswith("/durable-nb/api/summary") for path in asked), asked
    dn.cancel("idle", journal=journal)


def test_the_tab_count_follows_approvals_from_the_cli_and_from_another_notebook(
    lab: JupyterLab, journal: DiskJournal, tmp_path: Path
) -> None:
    sent: list[str] = []
    _park(journal, "cli-approved", "Approved from a terminal", sent)
    _park(journal, "nb-approved", "Approved from another notebook", sent)
    _park(journal, "hostile", HOSTILE, sent)
    folder = lab.root_dir / "other"
    folder.mkdir()
    write_notebook(folder / "other.ipynb", [
        "import durable_nb as dn\n"
        "print(dn.approve('nb-approved', 'from another notebook').approved)"])
    with LabPage(lab, timeout=60) as page:
        _open_lab(page)
        _tab_count(page, 3)
        page.page.locator(".dnr-sidebar[data-dnr-live='stream']").wait_for(state="attached")
        asked = _api_paths(page)
        title = page.page.locator(".dnr-run[data-run='hostile'] .dnr-run-title")
        assert title.inner_text() == HOSTILE
        assert page.page.evaluate("() => window.dnbPwned") is None

        env = {**os.environ, "PYTHONPATH": str(REPO)}
        subprocess.run([sys.executable, "-m", "durable_nb.cli", "--journal", str(journal.directory),
                        "approve", "cli-approved"], check=True, env=env, timeout=120)
        _tab_count(page, 2)

        page.open_notebook("other/other.ipynb")
        page.wait_kernel_idle()
        page.run_cell(0)
        page.wait_for_text("True", cell_index=0)
        _tab_count(page, 1)
        # both counts came through the stream: the summary was never asked
        assert not [path for path in asked if path.endswith("/api/summary")], asked
        # The last one is cancelled from its run view.
        _show_sidebar(page)
        page.page.locator(".dnr-run[data-run='hostile']").click()
        view = page.page.locator(".dnr-runview:visible")
        view.locator(".dnr-cancel").click()
        view.locator(".dnr-notice").get_by_text("hostile: cancelled").wait_for()
        _tab_count(page, 0)
        cancelled = page.page.locator(".dnr-group-cancelled .dnr-run[data-run='hostile']")
        assert "asks" not in cancelled.inner_text()  # its last request is no longer asked
        # The run view is drawn again from the cancelled run (not at once, as the list is):
        # its Approve goes, and nothing draws it back.
        view.locator(".dnr-approve").wait_for(state="detached")
        _tab_count(page, 0)
        assert not view.locator(".dnr-approve").count()
    assert find_decision(journal, "nb-approved",
                         journal.get_run("nb-approved").pending_approval)["approved"]
    assert journal.get_run("hostile").status is Status.CANCELLED
    assert sent == []  # decided, not resumed: nothing executes these runs


def test_a_decision_on_a_request_that_changed_since_it_was_shown_is_refused_and_said(
    lab: JupyterLab, journal: DiskJournal
) -> None:
    def drop(db: str) -> Any:
        def handler(ctx: Any) -> None:
            ctx.approval("drop database", {"db": db})
        return handler

    assert dn.execute("migrate", drop("staging"), journal=journal, on_approval="park") is None
    seen: dict[str, str] = {}  # the last answer the page got to each GET of the API
    frozen = False

    def answers(route: Any) -> None:
        """Pass the API's GETs through, or once frozen, answer what the page saw last."""
        url = route.request.url
        if urlsplit(url).path.endswith("/durable-nb/api/events"):
            # a stream never ends, so it cannot be replayed: the page polls instead
            route.fulfill(status=404, content_type="application/json", body="{}")
        elif route.request.method != "GET" or not (frozen and url in seen):
            response = route.fetch()
            if route.request.method == "GET":
                seen[url] = response.text()
            route.fulfill(response=response)
        else:
            route.fulfill(status=200, content_type="application/json", body=seen[url])

    with LabPage(lab, timeout=60) as page:
        page.page.route("**/durable-nb/api/**", answers)
        _open_lab(page)
        page.page.locator(".dnr-inbox-button").click()
        card = page.page.locator(".dnr-inbox .dnr-card[data-run='migrate']")
        assert '"db": "staging"' in card.locator(".dnr-details").inner_text()
        # The page stops seeing changes while the request at the step changes: the card
        # still shows staging when the person clicks.
        frozen = True
        assert dn.execute("migrate", drop("production"), journal=journal,
                          on_approval="park") is None
        card.locator(".dnr-approve").click()

        notice = page.page.locator(".dnr-inbox .dnr-notice .dnr-error")
        notice.wait_for(state="visible")
        assert "migrate: nothing was decided" in notice.inner_text()
        # Seeing changes again, the page shows the request as it is now.
        frozen = False
        card.locator(".dnr-details").get_by_text('"db": "production"').wait_for()
        assert "migrate: nothing was decided" in notice.inner_text()
    record = journal.get_run("migrate")
    assert record.status is Status.WAITING_APPROVAL
    assert record.pending_approval["details"] == {"db": "production"}
    assert find_decision(journal, "migrate", record.pending_approval) is None
    dn.cancel("migrate", journal=journal)


def test_a_batch_of_12_pending_approvals_is_approved_from_the_inbox(
    lab: JupyterLab, journal: DiskJournal, tmp_path: Path
) -> None:
    shots = _shots(tmp_path)
    sent: list[str] = []

    def email(ctx: Any, item: str) -> str:
        if ctx.approval("send_email", {"to": f"{item}@example.com"}).approved:
            ctx.run("send", lambda: sent.append(item))
            return "sent"
        return "kept"

    items = [f"user{i:02d}" for i in range(12)]
    dn.map(email, items, batch_id="mails", journal=journal, wait=False, on_approval="park")
    with LabPage(lab, timeout=60) as page:
        _open_lab(page)
        _tab_count(page, 12)
        page.page.locator(".dnr-inbox-button").click()
        batch = page.page.locator(".dnr-inbox .dnr-batch[data-batch='mails']")
        batch.locator(".dnr-card").nth(11).wait_for(state="visible")
        assert batch.locator(".dnr-card").count() == 12
        page.page.screenshot(path=str(shots / "inbox-batch.png"))

        batch.locator(".dnr-note").first.fill("bulk ok")
        batch.locator(".dnr-approve-all").click()
        dialog = page.page.locator(".jp-Dialog")
        assert dialog.locator(".dnr-dialog-list").inner_text().count("send_email") == 12
        dialog.locator("button.jp-mod-accept").click()
        page.page.locator(".dnr-notice").get_by_text("Batch mails: 12 approved").wait_for()
        _tab_count(page, 0)
        page.page.locator(".dnr-sidebar").screenshot(path=str(shots / "sidebar-batch-decided.png"))

    records = journal.list_runs(prefix="mails/")
    assert len(records) == 12
    for record in records:
        decision = find_decision(journal, record.run_id, record.pending_approval)
        assert decision["approved"] and decision["note"] == "bulk ok", record.run_id
    batch_run = dn.map(email, items, batch_id="mails", journal=journal)
    assert [item.result for item in batch_run.items] == ["sent"] * 12
    assert sorted(sent) == items
