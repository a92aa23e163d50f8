"""What the "Durable runs" sidebar and the inbox say at a glance (issue 26), read in a real
JupyterLab in headless Chromium over the real server extension and two directory journals
($DURABLE_NB_JOURNAL and $DURABLE_NB_DIR):

- two runs both called "weather", from two notebooks of the same name and two journals, say
  which notebook and journal each is from (the full paths in the tooltip);
- the inbox's tab title fits its tab: "Approvals (3)", the long form as its tooltip;
- a journal outside the server's root that another program of the user opened is listed only
  when "Show every journal of this user" is ticked, named by its absolute path (issue 41);
- the sidebar, the run view and the inbox write dates as the CLI, the panel and the export do
  (``2026-12-01 08:45:07``, local time; the page's time zone is Asia/Kathmandu here).

Screenshots go to $DURABLE_NB_SHOTS, else the test's tmp dir.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator
from zoneinfo import ZoneInfo

import pytest

import durable_nb as dn
from durable_nb.journal import DiskJournal
from durable_nb.journal.index import record_opened
from tests.harness.lab import JupyterLab, LabPage, require_chromium

pytestmark = pytest.mark.browser
pytest.importorskip("durable_nb.server", reason="durable_nb.server (the REST API) is missing")

SIDEBAR_TAB = ".jp-SideBar .lm-TabBar-tab[data-id='durable-nb-sidebar']"
ZONE = "Asia/Kathmandu"  # UTC+05:45
# 2026-12-01 03:00:07 and 03:00:11 UTC, as a clock in Kathmandu shows them.
CREATED, CREATED_TEXT = 1796094007, "2026-12-01 08:45:07"
ASKED, ASKED_TEXT = 1796094011, "2026-12-01 08:45:11"


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("places")
    return {"root": base / "root", "trips": base / "root" / "trips" / "journal",
            "home": base / "root" / "home" / "journal", "other": base / "pytest-7" / "journal",
            "index": base / "index"}


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, places: dict[str, Path]) -> Iterator[JupyterLab]:
    """A JupyterLab showing two journals under its root, seeded: "weather" parked in each
    (from trips/weather.ipynb and home/weather.ipynb), "deploy" parked in the first (from
    ops/deploy.ipynb), "nightly" done in the second (a script's); and "stray" parked in a
    journal outside its root that the user's index names (another program's test run)."""
    require_chromium()
    root = places["root"]
    for folder in ("trips", "home", "ops"):
        (root / folder).mkdir(parents=True)
    _park(places["trips"], "weather", root / "trips" / "weather.ipynb")
    _park(places["home"], "weather", root / "home" / "weather.ipynb")
    _park(places["trips"], "deploy", root / "ops" / "deploy.ipynb")
    _park(places["other"], "stray", places["other"].parent / "test_stray.py")
    saved = os.environ.get("DURABLE_NB_INDEX")
    os.environ["DURABLE_NB_INDEX"] = str(places["index"])
    try:
        record_opened(str(places["other"].resolve()))
    finally:
        os.environ.pop("DURABLE_NB_INDEX")
        if saved is not None:
            os.environ["DURABLE_NB_INDEX"] = saved
    script = DiskJournal(places["home"])
    try:
        dn.execute("nightly", lambda ctx: ctx.run("report", lambda: "ok"), journal=script)
    finally:
        script.close()
    env = {"DURABLE_NB_JOURNAL": str(places["trips"]), "DURABLE_NB_DIR": str(places["home"]),
           "HOME": str(tmp_path_factory.mktemp("home")),
           "DURABLE_NB_INDEX": str(places["index"])}
    with JupyterLab(root, env=env) as server:
        yield server


def _park(location: Path, run_id: str, notebook: Path) -> None:
    """Park ``run_id`` for approval as a cell of ``notebook`` would, created and asked at the
    known moments."""
    journal = DiskJournal(location)
    try:
        def handler(ctx: Any) -> None:
            if ctx.approval("send_email", {"to": f"{run_id}@example.com"}).approved:
                ctx.run("send", lambda: "sent")

        assert dn.execute(run_id, handler, title="Daily report", journal=journal,
                          on_approval="park") is None
        record = journal.get_run(run_id)
        record.notebook, record.cell_id = str(notebook), "c0ffee"
        record.created_at = CREATED
        record.pending_approval["requested_at"] = ASKED
        journal.put_run(record)
    finally:
        journal.close()


def _shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("DURABLE_NB_SHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _open_sidebar(page: LabPage) -> None:
    page.page.goto(f"{page.lab.url}/lab?reset&token={page.lab.token}")
    sidebar = page.page.locator(".dnr-sidebar")
    if not sidebar.is_visible():
        page.page.locator(SIDEBAR_TAB).click()
    page.page.locator(".dnr-run[data-run='nightly']").wait_for()


def _local(ts: float) -> str:
    return datetime.fromtimestamp(ts, ZoneInfo(ZONE)).strftime("%Y-%m-%d %H:%M:%S")


def test_two_runs_of_one_name_say_which_notebook_and_journal_each_is_from(
    lab: JupyterLab, places: dict[str, Path], tmp_path: Path
) -> None:
    with LabPage(lab, timeout=60) as page:
        _open_sidebar(page)
        origins = {row.get_attribute("data-run") + " " + row.locator(".dnr-origin").inner_text()
                   for row in page.page.locator(".dnr-run").all()}
        tooltips = [row.get_attribute("title") for row in
                    page.page.locator(".dnr-run[data-run='weather'] .dnr-origin").all()]
        page.page.locator(".dnr-sidebar").screenshot(path=str(_shots(tmp_path) /
                                                              "sidebar-origins.png"))
        page.page.locator(".dnr-run[data-run='deploy'] .dnr-run-id").click()
        header = page.page.locator(".dnr-runview:visible .dnr-run-header")
        header.wait_for()
        said = header.inner_text()
    # The notebooks by name, their folder only where two share a name; the journal too, as
    # the runs come from two.
    assert origins == {"weather trips/weather.ipynb · journal trips/journal",
                       "weather home/weather.ipynb · journal home/journal",
                       "deploy deploy.ipynb · journal trips/journal",
                       "nightly outside a notebook · journal home/journal"}
    root = places["root"]
    assert sorted(tooltips) == sorted(
        f"Notebook: {root / folder / 'weather.ipynb'}\nJournal: {places[folder]}"
        for folder in ("trips", "home"))
    # The run view names the journal by its location (its id means nothing to a person).
    assert f"notebook ops/deploy.ipynb · journal {places['trips']}" in said


def test_the_inbox_tab_title_fits_its_tab_among_many(lab: JupyterLab, tmp_path: Path) -> None:
    with LabPage(lab, timeout=60) as page:
        page.page.set_viewport_size({"width": 1024, "height": 768})  # a laptop's
        _open_sidebar(page)
        # Five tabs besides the inbox's (the launcher and four run views) share the bar.
        for index in range(4):
            page.page.locator(".dnr-sidebar .dnr-run .dnr-run-id").nth(index).click()
            page.page.locator(".dnr-runview").nth(index).locator(".dnr-stats").wait_for(
                state="attached")
        page.page.locator(".dnr-inbox-button").click()
        page.page.locator(".dnr-inbox .dnr-card").first.wait_for()
        tab = page.page.locator("#jp-main-dock-panel .lm-TabBar-tab[data-id='durable-nb-inbox']")
        label = tab.locator(".lm-TabBar-tabLabel")
        text = label.inner_text()
        clipped = label.evaluate("node => node.scrollWidth > node.clientWidth")
        caption = tab.get_attribute("title")
        page.page.locator("#jp-main-dock-panel .lm-TabBar").first.screenshot(
            path=str(_shots(tmp_path) / "inbox-tab.png"))
    assert (text, clipped) == ("Approvals (3)", False)
    assert caption == "Approvals inbox: 3 pending approvals"


def test_the_sidebar_run_view_and_inbox_write_dates_as_everywhere_else(
    lab: JupyterLab, places: dict[str, Path], tmp_path: Path
) -> None:
    updated = {}
    for folder in ("trips", "home"):
        journal = DiskJournal(places[folder], read_only=True)
        try:
            updated[folder] = {r.run_id: _local(r.updated_at) for r in journal.list_runs()}
        finally:
            journal.close()
    shots = _shots(tmp_path)
    with LabPage(lab, timeout=60, timezone_id=ZONE) as page:
        _open_sidebar(page)
        deploy = page.page.locator(".dnr-run[data-run='deploy']").inner_text()
        nightly = page.page.locator(".dnr-run[data-run='nightly']").inner_text()
        page.page.locator(".dnr-sidebar").screenshot(path=str(shots / "sidebar-dates.png"))
        page.page.locator(".dnr-run[data-run='deploy']").click()
        stats = page.page.locator(".dnr-runview:visible .dnr-stats")
        stats.wait_for()
        run_view = stats.inner_text()
        page.page.locator(".dnr-runview:visible").screenshot(path=str(shots / "runview-dates.png"))
        page.page.locator(".dnr-inbox-button").click()
        card = page.page.locator(".dnr-inbox .dnr-card[data-run='deploy'] .dnr-pending-head")
        card.wait_for()
        inbox = card.inner_text()
        page.page.locator(".dnr-inbox").screenshot(path=str(shots / "inbox-dates.png"))
    assert updated["trips"]["deploy"] in deploy
    assert updated["home"]["nightly"] in nightly
    assert f"started {CREATED_TEXT}" in run_view
    assert f"updated {updated['trips']['deploy']}" in run_view
    assert f"asked {ASKED_TEXT}" in inbox


def test_the_sidebar_lists_this_server_s_journals_and_the_others_when_asked(
    lab: JupyterLab, places: dict[str, Path], tmp_path: Path
) -> None:
    """On e76e470 the first sidebar listed "stray" (and counted its request) from a journal
    outside the server's folder, labelled "journal pytest-7/journal" at best."""
    shots = _shots(tmp_path)
    with LabPage(lab, timeout=60) as page:
        _open_sidebar(page)
        sidebar = page.page.locator(".dnr-sidebar")
        box = sidebar.locator("label.dnr-every")
        label = box.inner_text().strip()
        ticked_at_first = box.locator("input").is_checked()
        listed_at_first = sorted(r.get_attribute("data-run")
                                 for r in sidebar.locator(".dnr-run").all())
        inbox_at_first = sidebar.locator(".dnr-inbox-button").inner_text()
        sidebar.screenshot(path=str(shots / "sidebar-this-server.png"))
        box.locator("input").check()
        stray = sidebar.locator(".dnr-run[data-run='stray']")
        stray.wait_for()
        stray_origin = stray.locator(".dnr-origin").inner_text()
        deploy_origin = sidebar.locator(".dnr-run[data-run='deploy'] .dnr-origin").inner_text()
        inbox_with_all = sidebar.locator(".dnr-inbox-button").inner_text()
        sidebar.screenshot(path=str(shots / "sidebar-every-journal.png"))
        box.locator("input").uncheck()
        stray.wait_for(state="detached")
    assert label == "Show every journal of this user" and not ticked_at_first
    assert listed_at_first == ["deploy", "nightly", "weather", "weather"]
    assert inbox_at_first == "Approvals inbox (3)"
    assert stray_origin.endswith(f"journal {places['other'].resolve()}"), stray_origin
    assert deploy_origin == "deploy.ipynb · journal trips/journal"
    assert inbox_with_all == "Approvals inbox (4)"
