"""Who may approve, as a person sees it in JupyterLab (issue 27, item 3): a click on Approve
in the approvals inbox by a user not on the request's approvers' list is refused by the
server (403), the inbox says why and who may decide, and nothing is decided. A real
JupyterLab in headless Chromium with the server extension (tests/test_sidebar.py's fixtures).
Screenshots go to $DURABLE_NB_SHOTS, else a tmp dir."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import durable_nb as dn
from durable_nb import Status
from durable_nb.approvals.request import find_decision
from durable_nb.journal import DiskJournal
from tests.harness.lab import JupyterLab, LabPage

pytestmark = pytest.mark.browser
pytest.importorskip("durable_nb.server", reason="durable_nb.server (the REST API) is missing")

from tests.test_sidebar import _open_lab, _shots, journal, journal_dir, lab  # noqa: E402,F401


def test_the_inbox_says_who_may_decide_when_the_server_refuses_a_click(
    lab: JupyterLab, journal: DiskJournal, tmp_path: Path
) -> None:
    sent: list[str] = []

    def handler(ctx: Any) -> None:
        if ctx.approval("send_email", {"to": "board@example.com"}).approved:
            ctx.run("send", lambda: sent.append("board"))

    assert dn.execute("guarded", handler, title="Only ana approves", journal=journal,
                      on_approval="park", approvers=["ana"]) is None
    with LabPage(lab, timeout=60) as page:
        _open_lab(page)
        page.page.locator(".dnr-inbox-button").click()
        card = page.page.locator(".dnr-inbox .dnr-card[data-run='guarded']")
        card.locator(".dnr-approve").click()
        notice = page.page.locator(".dnr-inbox .dnr-notice .dnr-error")
        notice.wait_for(state="visible")
        text = notice.inner_text()
        page.page.screenshot(path=str(_shots(tmp_path) / "approvers-inbox-refused.png"))
    assert text.startswith("guarded: nothing was decided: run 'guarded': 'send_email' was not "
                           "decided: "), text
    assert "is not on its approvers' list; only ana may decide. Nothing was written." in text
    assert "Traceback" not in text
    record = journal.get_run("guarded")
    assert record.status is Status.WAITING_APPROVAL and sent == []
    assert find_decision(journal, "guarded", record.pending_approval) is None
    (event,) = journal.events("guarded")
    assert (event["kind"], event["via"]) == ("refused", "Jupyter server")
    dn.cancel("guarded", journal=journal)
