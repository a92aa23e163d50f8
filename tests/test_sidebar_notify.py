"""What a person sees in JupyterLab when a run asks for approval (issue 27), in a real
JupyterLab in headless Chromium over the real server extension and a directory journal
($DURABLE_NB_JOURNAL), with runs parked by separate Python processes (as from a terminal):

- a run that parks while the page is open brings one toast, whose "Review" opens its run
  view; later summaries, and a reload of the page, do not bring it again; a toast whose
  request is decided elsewhere goes away; a new session says in one toast how many wait;
- a run whose webhook answers 500 (a real HTTP receiver) is marked in the sidebar as not
  notified, with the reason as tooltip, and its run view lists the delivery's attempts;
- the run view shows the run's history: a decision, and a second decision refused.

Screenshots go to $DURABLE_NB_SHOTS, else the test's tmp dir.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Iterator

import pytest

from durable_nb.journal import DiskJournal
from durable_nb.notify.loopback import WebhookReceiver
from tests.harness.lab import JupyterLab, LabPage
from tests.test_sidebar import journal_dir, sidebar_lab  # noqa: F401 (a fixture)

pytestmark = pytest.mark.browser
pytest.importorskip("durable_nb.server", reason="durable_nb.server (the REST API) is missing")

SIDEBAR_TAB = ".jp-SideBar .lm-TabBar-tab[data-id='durable-nb-sidebar']"
TOAST = ".jp-toastContainer .Toastify__toast"

# A process of its own (a terminal's python): parks RUN_ID in JOURNAL, notifying the webhook
# URL when one is given (two attempts, no wait between them).
PARK = """\
import sys
import durable_nb as dn
from durable_nb.execution.retry import RetryPolicy
from durable_nb.notify import NotifyConfig, WebhookConfig

journal, run_id, title, url = sys.argv[1:5]
notify = None if not url else NotifyConfig(
    webhook=WebhookConfig(url, secret="hook-secret", timeout=10.0),
    retry=RetryPolicy(max_attempts=2, initial_delay=0.0, jitter=0.0))

def handler(ctx):
    if ctx.approval("send_email", {"to": run_id + "@example.com"}).approved:
        ctx.run("send", lambda: "sent")

assert dn.execute(run_id, handler, title=title, journal=journal, on_approval="park",
                  notify=notify) is None
"""
FINISH = """\
import sys
import durable_nb as dn
dn.execute(sys.argv[2], lambda ctx: ctx.run("step", lambda: 1), journal=sys.argv[1])
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, journal_dir: Path) -> Iterator[JupyterLab]:
    with sidebar_lab(tmp_path_factory, journal_dir, toasts=True) as server:
        yield server


def _shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("DURABLE_NB_SHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=120, check=True)


def _park(journal_dir: Path, run_id: str, title: str, url: str = "") -> None:
    _python(PARK, str(journal_dir), run_id, title, url)


def _cli(journal_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "durable_nb.cli", "--journal", str(journal_dir),
                           *args], capture_output=True, text=True, timeout=120)


def _open_sidebar(page: LabPage, *, reset: bool = True) -> None:
    page.page.goto(f"{page.lab.url}/lab?{'reset&' if reset else ''}token={page.lab.token}")
    sidebar = page.page.locator(".dnr-sidebar")
    page.page.locator(SIDEBAR_TAB).wait_for()
    if not sidebar.is_visible():
        page.page.locator(SIDEBAR_TAB).click()
    page.page.locator(".dnr-sidebar .dnr-sidebar-status").filter(has_text="run").wait_for()


def _listed(page: LabPage, run_id: str) -> None:
    page.page.locator(f".dnr-run[data-run='{run_id}']").wait_for()


def _settle(page: LabPage, journal_dir: Path, name: str) -> None:
    """Make the listing change (a run finished by another process) and wait until the page
    shows it: every summary before it has been applied."""
    _python(FINISH, str(journal_dir), name)
    _listed(page, name)


def _toasts(page: LabPage, text: str) -> list[str]:
    return [t for t in page.page.locator(TOAST).all_inner_texts() if text in t]


def test_a_run_parked_from_a_terminal_brings_one_toast_that_opens_it(
    lab: JupyterLab, journal_dir: Path, tmp_path: Path
) -> None:
    shots = _shots(tmp_path)
    with LabPage(lab, timeout=60) as page:
        _open_sidebar(page)
        _settle(page, journal_dir, "warm-up")  # the page has seen the journal: nothing waits
        assert page.page.locator(TOAST).count() == 0

        _park(journal_dir, "deploy", "Deploy to production")
        toast = page.page.locator(TOAST).filter(has_text="deploy")
        toast.wait_for()
        toast.screenshot(path=str(shots / "toast-alone.png"))  # waits for it to stop sliding
        page.page.screenshot(path=str(shots / "toast-new-request.png"))
        said = toast.inner_text()
        # Later summaries (another run finished) do not show it again.
        _settle(page, journal_dir, "tick-1")
        _settle(page, journal_dir, "tick-2")
        again = _toasts(page, "deploy")

        toast.locator("button", has_text="Review").click()
        header = page.page.locator(".dnr-runview:visible .dnr-run-header")
        header.wait_for()
        opened = header.locator(".dnr-run-id").inner_text()
        card = page.page.locator(".dnr-runview:visible .dnr-card").inner_text()
        toast.wait_for(state="detached")  # the action closed it

        # A reload in the same session: the request was toasted already.
        _open_sidebar(page, reset=False)
        _listed(page, "deploy")
        _settle(page, journal_dir, "tick-3")
        after_reload = _toasts(page, "deploy")

        # Another request toasts; decided in a terminal, its toast goes away.
        _park(journal_dir, "backup", "")
        second = page.page.locator(TOAST).filter(has_text="backup")
        second.wait_for()
        digest = DiskJournal(journal_dir, read_only=True).get_run("backup") \
            .pending_approval["digest"]
        assert _cli(journal_dir, "approve", "backup", "--expect", digest).returncode == 0
        second.wait_for(state="detached")
    assert said.startswith("Run deploy (Deploy to production) asks for approval: send_email"), said
    assert "Review" in said and "Inbox" in said
    assert len(again) == 1, again
    assert opened == "deploy" and "send_email" in card
    assert after_reload == []

    # A new session (another browser): one toast says how many wait, not one per request.
    with LabPage(lab, timeout=60) as page:
        _open_sidebar(page)
        waiting = page.page.locator(TOAST).filter(has_text="waiting")
        waiting.wait_for()
        page.page.screenshot(path=str(shots / "toast-waiting.png"))
        texts = page.page.locator(TOAST).all_inner_texts()
        waiting.locator("button", has_text="Open inbox").click()
        page.page.locator(".dnr-inbox .dnr-card[data-run='deploy']").wait_for()
    assert len(texts) == 1 and texts[0].startswith("1 request for approval is waiting"), texts


def test_a_webhook_answering_500_shows_as_failed_in_the_sidebar_and_the_run_view(
    lab: JupyterLab, journal_dir: Path, tmp_path: Path
) -> None:
    shots = _shots(tmp_path)
    with WebhookReceiver("hook-secret", status=500) as hook:
        _park(journal_dir, "ship", "Ship the release", hook.url)  # exits once both attempts failed
        # (The process also sends, once, what nobody sent for the runs already waiting.)
        sent = [r for r in hook.requests if r["delivery"].startswith("ship/")]
        assert len(sent) == 2 and all(r["verified"] for r in sent)
    with LabPage(lab, timeout=60) as page:
        _open_sidebar(page)
        marker = page.page.locator(".dnr-run[data-run='ship'] .dnr-delivery-problem")
        marker.wait_for()
        marked = (marker.inner_text(), marker.get_attribute("class"), marker.get_attribute("title"))
        page.page.locator(".dnr-sidebar").screenshot(path=str(shots / "sidebar-delivery-failed.png"))
        # Only a run waiting for a decision says how its notification went.
        others = page.page.locator(
            ".dnr-group:not([data-group='waiting']) .dnr-delivery-problem").count()
        page.page.locator(".dnr-run[data-run='ship'] .dnr-run-id").click()
        section = page.page.locator(".dnr-runview:visible .dnr-notifications")
        section.wait_for()
        listed = section.inner_text()
        section.screenshot(path=str(shots / "runview-notifications.png"))
    text, classes, tooltip = marked
    assert text == "⚠ notification failed" and "dnr-delivery-failed" in classes
    assert tooltip.startswith("webhook failed after 2 attempts: HTTP 500"), tooltip
    assert others == 0
    assert "Notifications (1 delivery)" in listed and "webhook failed" in listed
    assert listed.count("failed: HTTP 500") == 2, listed


def test_the_run_view_shows_the_decision_and_the_refused_second_decision(
    lab: JupyterLab, journal_dir: Path, tmp_path: Path
) -> None:
    _park(journal_dir, "audit", "Audited")
    digest = DiskJournal(journal_dir, read_only=True).get_run("audit").pending_approval["digest"]
    assert _cli(journal_dir, "approve", "audit", "fine", "--by", "ana",
                "--expect", digest).returncode == 0
    refused = _cli(journal_dir, "reject", "audit", "--by", "bob", "--expect", digest)
    assert refused.returncode != 0 and "already approved by ana" in refused.stderr + refused.stdout
    events = DiskJournal(journal_dir, read_only=True).events("audit")
    with LabPage(lab, timeout=60) as page:
        _open_sidebar(page)
        page.page.locator(".dnr-run[data-run='audit'] .dnr-run-id").click()
        history = page.page.locator(".dnr-runview:visible .dnr-history")
        history.wait_for()
        rows = [row.locator("span").all_inner_texts()
                for row in history.locator(".dnr-event").all()]
        heading = history.locator("h3").inner_text()
        history.screenshot(path=str(_shots(tmp_path) / "runview-history.png"))
    when = [datetime.fromtimestamp(e["at"]).strftime("%Y-%m-%d %H:%M:%S") for e in events]
    assert heading == "History (2 events)"
    assert rows[0] == [when[0], "decided", "approved by ana via durable-nb"]
    assert rows[1][:2] == [when[1], "refused"]
    assert re.fullmatch(r"a decision by bob via durable-nb to reject was refused: the request "
                        r"was already approved by ana via durable-nb at \S+ \S+", rows[1][2])
