"""No secrets in the journal from the cell's source (issue 17, item 16): the source a run
keeps is journaled with secret-looking literals redacted, readable otherwise; the journal's
files, its copies and its exports never hold the keys.

Every key here is made up, and assembled from parts so that no secret scanner takes this
file for a leak."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import durable_nb as dn
from durable_nb.export import export_run
from durable_nb.redact import names_a_secret, redact_source
from durable_nb.runner import source_hash


def _made_up(prefix: str, body: str) -> str:
    return prefix + body


OPENAI = _made_up("sk-", "4f9Qm2Lx8Rt1Vb7Nc3Zp6Wd0Hs5Jk9YeTgA2uIo")
OPENAI_PROJECT = _made_up("sk-proj-", "Zq3f8LmN2pR7tX1vB9cD4eH6jK0sW5yA-T3BlbkFJq7Rx2")
ANTHROPIC = _made_up("sk-ant-", "api03-Xy7Qp2Lm9Rt4Vb1Nc8Zd3Wf6Hs0Jk5Ye-AbCdEfGh_IjKlMn")
AWS_KEY_ID = _made_up("AKIA", "Q3EXMPL7KZ2VN4TD")
AWS_SECRET = _made_up("q7Xz2Lm9Rt4Vb1Nc8Zd3", "Wf6Hs0Jk5Ye7Pa3Ub9Kw")
GITHUB = _made_up("ghp_", "k2Lm9Rt4Vb1Nc8Zd3Wf6Hs0Jk5Ye7Pa3Ub9Q")
GITHUB_PAT = _made_up("github_pat_", "11ABCDEFG0k2Lm9Rt4Vb1N_c8Zd3Wf6Hs0Jk5Ye7Pa3Ub9Qx")
SLACK = _made_up("xoxb-", "1234567890-0987654321-k2Lm9Rt4Vb1Nc8Zd")
BEARER = _made_up("eZ81kLm2Pq7Rt4", "Vb1Nc8Zd3Wf")
DB_PASSWORD = "Tr0ub4dor&3"
MYSQL_PASSWORD = "hunter2-but-longer"
PASSWORD = "correct horse battery staple"
TOKEN = "a-token-in-no-known-format"
SECRET = "the-client-secret-value"
NAMED_API_KEY = "an-api-key-in-no-known-format"

SECRETS = [OPENAI, OPENAI_PROJECT, ANTHROPIC, AWS_KEY_ID, AWS_SECRET, GITHUB, GITHUB_PAT, SLACK,
           BEARER, DB_PASSWORD, MYSQL_PASSWORD, PASSWORD, TOKEN, SECRET, NAMED_API_KEY]

CELL = f'''
import os
from openai import OpenAI
client = OpenAI(api_key="{OPENAI}")
project = OpenAI(api_key='{OPENAI_PROJECT}', base_url="https://api.example.com/v1")
claude = Anthropic(api_key="{ANTHROPIC}")
s3 = boto3.client("s3", "{AWS_KEY_ID}", "{AWS_SECRET}")
gh = Github("{GITHUB}")
pat = "{GITHUB_PAT}"
slack = WebClient(token="{SLACK}")
headers = {{"Authorization": "Bearer {BEARER}"}}
engine = create_engine("postgresql://app:{DB_PASSWORD}@db.internal:5432/sales")
shop = "mysql+pymysql://root:{MYSQL_PASSWORD}@localhost/shop"
password = "{PASSWORD}"
settings = {{"token": "{TOKEN}", "client_secret": '{SECRET}'}}
os.environ["MY_SERVICE_API_KEY"] = "{NAMED_API_KEY}"
from_env = OpenAI(api_key=os.environ["OPENAI_API_KEY"])
reply = ctx.chat(model="gpt-4o-mini", messages=[{{"role": "user", "content": "hi"}}],
                 max_tokens=500)
sha = "0123456789abcdef0123456789abcdef01234567"
'''


def test_every_kind_of_secret_is_redacted_and_the_code_stays_readable():
    redacted = redact_source(CELL)
    for secret in SECRETS:
        assert secret not in redacted, secret
    ast.parse(redacted)  # still Python, line for line
    assert redacted.count("\n") == CELL.count("\n")
    for kept in ('client = OpenAI(api_key="<redacted OpenAI key>")',
                 'claude = Anthropic(api_key="<redacted Anthropic key>")',
                 's3 = boto3.client("s3", "<redacted AWS key id>", "<redacted AWS secret>")',
                 'gh = Github("<redacted GitHub token>")',
                 'slack = WebClient(token="<redacted Slack token>")',
                 '"Authorization": "Bearer <redacted>"',
                 '"postgresql://app:<redacted>@db.internal:5432/sales"',
                 '"mysql+pymysql://root:<redacted>@localhost/shop"',
                 'password = "<redacted>"',
                 '{"token": "<redacted>", "client_secret": \'<redacted>\'}',
                 'os.environ["MY_SERVICE_API_KEY"] = "<redacted>"',
                 'base_url="https://api.example.com/v1"',
                 'OpenAI(api_key=os.environ["OPENAI_API_KEY"])',
                 'max_tokens=500', 'sha = "0123456789abcdef0123456789abcdef01234567"'):
        assert kept in redacted, kept


@pytest.mark.parametrize("line", [
    'url = f"postgresql://app:{password}@db/sales"',  # a placeholder, no secret
    'tokenizer = "cl100k_base"',
    'if token == "expected": pass',
    'key = "index"',
    'secret_name = "prod/db"',
])
def test_code_that_holds_no_secret_is_left_as_it_is(line):
    assert redact_source(line) == line


def test_the_journal_its_copy_and_its_export_never_hold_the_keys(tmp_path: Path):
    journal, copy = tmp_path / "journal", tmp_path / "copy"
    assert dn.execute("r", lambda ctx: ctx.run("step", lambda: "ok"), journal=journal,
                      source=CELL) == "ok"
    record = dn.get_run("r", journal=journal)
    assert record.source == redact_source(CELL)
    assert record.source_hash == source_hash(CELL)  # of the cell as written
    dn.copy_run("r", copy, journal=journal)
    notebook = export_run("r", tmp_path / "r.ipynb", journal=journal)
    exported = json.loads(Path(notebook).read_text())
    assert any('api_key="<redacted OpenAI key>"' in "".join(cell["source"])
               for cell in exported["cells"])
    files = [p for root in (journal, copy) for p in root.rglob("*") if p.is_file()]
    files.append(Path(notebook))
    for path in files:
        data = path.read_bytes()
        for secret in SECRETS:
            assert secret.encode() not in data, (path, secret)


def test_the_code_of_a_later_attempt_is_journaled_redacted_too(tmp_path: Path):
    # An edited cell resumes the run: its attempt keeps the code that ran it (for the export),
    # and that code must be redacted as the first one was.
    journal = tmp_path / "journal"

    def fails(ctx):
        ctx.run("step", lambda: "ok")
        raise RuntimeError("stopped before the end")

    with pytest.raises(RuntimeError):
        dn.execute("r", fails, journal=journal, source=CELL)
    edited = CELL + "\nprint('edited')\n"
    assert dn.execute("r", lambda ctx: ctx.run("step", lambda: "ok"), journal=journal,
                      source=edited) == "ok"
    assert redact_source(edited) in dn.get_run("r", journal=journal).sources.values()
    for path in (p for p in journal.rglob("*") if p.is_file()):
        data = path.read_bytes()
        for secret in SECRETS:
            assert secret.encode() not in data, (path, secret)


@pytest.mark.parametrize("name, secret", [
    ("api_key", True), ("OPENAI_API_KEY", True), ("x-api-key", True), ("auth_token", True),
    ("password", True), ("aws_secret_access_key", True), ("client_secret", True),
    ("max_tokens", False), ("token_budget", False), ("thread_id", False), ("user", False),
])
def test_a_name_says_whether_it_holds_a_secret_as_the_redacted_names_do(name, secret):
    assert names_a_secret(name) is secret
    # The same names, given a literal in code, are the ones redact_source replaces.
    assert ("<redacted>" in redact_source(f'{name.replace("-", "_")} = "value123"')) is secret
