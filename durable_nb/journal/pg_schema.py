"""The PostgreSQL journal's schema: its tables and functions as an ordered list of migrations
(:data:`MIGRATIONS`), applied when a journal is opened, under an advisory lock; the version
checks that refuse a schema or format newer than this durable_nb; and the SQL of every query
the journal makes."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..errors import CorruptEntry, IncompatibleJournal, JournalError
from .pg_connection import DEFAULT_SCHEMA
from .pg_values import scope_owner_migration, value_statements

__all__ = ["FORMAT_VERSION", "MIGRATIONS"]

BATCH = 500  # entries fetched per query when a run's steps are read in order


def quoted(schema: str) -> str:
    return f'"{schema}"'


def _migrations(s: str) -> list[tuple[str, list[str]]]:
    """The schema's migrations, in order: (name, statements). Append only; never edit one
    that was released (a journal records which it applied by number)."""
    return [
        ("tables", [
            f"CREATE TABLE {s}.meta (key text PRIMARY KEY, value text NOT NULL)",
            f"""INSERT INTO {s}.meta (key, value) VALUES ('format', '{{"version": 2}}')""",
            f"""CREATE TABLE {s}.runs (run_id text COLLATE "C" PRIMARY KEY,
                created_at double precision NOT NULL, record text NOT NULL)""",
            f"CREATE INDEX runs_by_creation ON {s}.runs (created_at, run_id)",
            f"""CREATE TABLE {s}.steps (run_id text COLLATE "C" NOT NULL,
                position integer NOT NULL, entry text NOT NULL,
                PRIMARY KEY (run_id, position))""",
            f"""CREATE TABLE {s}.blobs (run_id text COLLATE "C" NOT NULL, digest text NOT NULL,
                value text NOT NULL, PRIMARY KEY (run_id, digest))""",
            f"""CREATE TABLE {s}.leases (run_id text COLLATE "C" PRIMARY KEY,
                token text NOT NULL, holder text NOT NULL,
                heartbeat_at timestamptz NOT NULL DEFAULT now())""",
            f"""CREATE TABLE {s}.requests (run_id text COLLATE "C" NOT NULL, kind text NOT NULL,
                value text NOT NULL, PRIMARY KEY (run_id, kind))""",
        ]),
        ("append_step and put_run in one statement each", [
            # 0: written; 1: fenced (the lease is not held by p_token); 2: position taken.
            f"""CREATE FUNCTION {s}.append_step(p_run text, p_position integer, p_entry text,
                    p_record text, p_token text, p_digests text[], p_blobs text[])
                RETURNS integer LANGUAGE plpgsql AS $fn$
                DECLARE
                    held text;
                    created double precision;
                BEGIN
                    IF p_token IS NOT NULL THEN
                        SELECT token INTO held FROM {s}.leases WHERE run_id = p_run FOR SHARE;
                        IF held IS DISTINCT FROM p_token THEN
                            RETURN 1;
                        END IF;
                    END IF;
                    INSERT INTO {s}.steps (run_id, position, entry)
                        VALUES (p_run, p_position, p_entry) ON CONFLICT DO NOTHING;
                    IF NOT FOUND THEN
                        RETURN 2;
                    END IF;
                    IF p_digests IS NOT NULL THEN
                        INSERT INTO {s}.blobs (run_id, digest, value)
                            SELECT p_run, b.digest, b.value
                            FROM unnest(p_digests, p_blobs) AS b(digest, value)
                            ON CONFLICT DO NOTHING;
                    END IF;
                    IF p_record IS NOT NULL THEN
                        UPDATE {s}.runs SET record = p_record WHERE run_id = p_run;
                        IF NOT FOUND THEN
                            BEGIN
                                created := (p_record::json ->> 'created_at')::double precision;
                            EXCEPTION WHEN others THEN
                                created := 0;
                            END;
                            INSERT INTO {s}.runs (run_id, created_at, record)
                                VALUES (p_run, coalesce(created, 0), p_record)
                                ON CONFLICT (run_id) DO UPDATE SET record = EXCLUDED.record;
                        END IF;
                    END IF;
                    RETURN 0;
                END
                $fn$""",
            # 0: written; 1: fenced.
            f"""CREATE FUNCTION {s}.put_run(p_run text, p_created double precision,
                    p_record text, p_token text)
                RETURNS integer LANGUAGE plpgsql AS $fn$
                DECLARE
                    held text;
                BEGIN
                    IF p_token IS NOT NULL THEN
                        SELECT token INTO held FROM {s}.leases WHERE run_id = p_run FOR SHARE;
                        IF held IS DISTINCT FROM p_token THEN
                            RETURN 1;
                        END IF;
                    END IF;
                    INSERT INTO {s}.runs (run_id, created_at, record)
                        VALUES (p_run, p_created, p_record)
                        ON CONFLICT (run_id) DO UPDATE
                        SET created_at = EXCLUDED.created_at, record = EXCLUDED.record;
                    RETURN 0;
                END
                $fn$""",
        ]),
        ("batches", [
            f"""CREATE TABLE {s}.batches (batch_id text COLLATE "C" PRIMARY KEY,
                created_at double precision NOT NULL, record text NOT NULL)""",
        ]),
        ("runs listed by status", [
            # The record's status in a column of its own, set by a trigger from the record
            # text whoever writes it (create_run, put_run, append_step), so that listings
            # filter and page on an index; a record that is not JSON gets NULL (listings
            # read it, and report it as damaged). An update that keeps the status stays a
            # HOT update.
            f"ALTER TABLE {s}.runs ADD COLUMN status text",
            f"""CREATE FUNCTION {s}.run_status() RETURNS trigger LANGUAGE plpgsql AS $fn$
                BEGIN
                    BEGIN
                        NEW.status := coalesce(NEW.record::json ->> 'status', 'RUNNING');
                    EXCEPTION WHEN others THEN
                        NEW.status := NULL;
                    END;
                    RETURN NEW;
                END
                $fn$""",
            f"""CREATE TRIGGER runs_status BEFORE INSERT OR UPDATE OF record ON {s}.runs
                FOR EACH ROW EXECUTE PROCEDURE {s}.run_status()""",
            f"UPDATE {s}.runs SET record = record",
            f"CREATE INDEX runs_by_status ON {s}.runs (status, created_at, run_id)",
        ]),
        ("notification deliveries", [
            # One row per (run, request, channel): claimed by INSERT ... ON CONFLICT DO
            # NOTHING, its outcome written by a compare-and-swap on the text.
            f"""CREATE TABLE {s}.deliveries (run_id text COLLATE "C" NOT NULL,
                key text NOT NULL, value text NOT NULL, PRIMARY KEY (run_id, key))""",
        ]),
        ("decisions written by the decider role", _decider_migration(s)),
        ("hub: runs their creator's, deadlines the decider's, nothing erased",
         _owner_migration(s)),
        ("keyed values", [
            # Journal.put_values: namespaces of ordered keys that belong to no run
            # (LangGraph's checkpoints); byte order ("C") as the disk journal's keys sort.
            f"""CREATE TABLE {s}.keyed_values (space text COLLATE "C" NOT NULL,
                key text COLLATE "C" NOT NULL, value text NOT NULL, PRIMARY KEY (space, key))""",
        ]),
        ("keyed values in scopes: a run's deleted and copied with it, written by its creator",
         scope_owner_migration(s)),
        ("runs counted by status", _counts_migration(s)),
    ]


def _counts_migration(s: str) -> list[str]:
    """The runs by status (``runs.status``; NULL not counted) kept in one row by triggers,
    so that counting them (``count_runs``, every listing and summary poll) reads one row,
    not every run. One row, not one per status: every change of status locks the same row,
    so two transactions that change several runs cannot deadlock on it. The trigger function
    is SECURITY DEFINER (the schema owner's) with a pinned ``search_path``: a hub user's
    role, which writes runs but cannot write this row, keeps it right too."""
    return [
        f"""CREATE TABLE {s}.run_counts (one boolean PRIMARY KEY DEFAULT true CHECK (one),
            counts jsonb NOT NULL)""",
        f"""CREATE FUNCTION {s}.count_run() RETURNS trigger LANGUAGE plpgsql
            SECURITY DEFINER AS $fn$
            BEGIN
                IF TG_OP <> 'INSERT' AND OLD.status IS NOT NULL THEN
                    UPDATE {s}.run_counts SET counts = jsonb_set(counts, ARRAY[OLD.status],
                        to_jsonb(coalesce((counts ->> OLD.status)::bigint, 0) - 1));
                END IF;
                IF TG_OP <> 'DELETE' AND NEW.status IS NOT NULL THEN
                    UPDATE {s}.run_counts SET counts = jsonb_set(counts, ARRAY[NEW.status],
                        to_jsonb(coalesce((counts ->> NEW.status)::bigint, 0) + 1));
                END IF;
                RETURN NULL;
            END
            $fn$""",
        f"ALTER FUNCTION {s}.count_run() SET search_path = pg_catalog, pg_temp",
        # In the migration's transaction: the triggers lock the table for writers until
        # the row counted below is committed with them.
        f"""CREATE TRIGGER runs_counted AFTER INSERT OR DELETE ON {s}.runs
            FOR EACH ROW EXECUTE PROCEDURE {s}.count_run()""",
        f"""CREATE TRIGGER runs_recounted AFTER UPDATE ON {s}.runs FOR EACH ROW
            WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE PROCEDURE {s}.count_run()""",
        f"""INSERT INTO {s}.run_counts (counts) SELECT coalesce(jsonb_object_agg(status, n),
            '{{}}') FROM (SELECT status, count(*) AS n FROM {s}.runs WHERE status IS NOT NULL
            GROUP BY status) AS c""",
    ]


def _decider_migration(s: str) -> list[str]:
    """Separation of duties in the database (:mod:`durable_nb.hub`): once an administrator
    names a decider role (``meta`` key ``decider``, ``{"role": NAME}``), only members of that
    role write decisions (request kinds ``decision``/``decision.ID``), decision links and
    notification claims (deliveries other than ``history/...``); any other role may only stamp ``taken_at`` on a decision (its
    run taking it), write a rejection by deadline, and journal an approval step only for a
    decision taken. Each run row records the login
    role that created it and the one that last wrote its record (``created_by``,
    ``written_by``, set here whatever the statement says), which the decider reads as the
    run's starter. Without a decider nothing is checked: the journal behaves as before.
    These are triggers, so they bind every role that does not own the tables."""
    refuse = ("RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege', MESSAGE = "
              "format('only the role %s (the durable-nb hub service) writes decisions "
              "in this journal, not %s: decide through the service', decider, session_user)")
    decider = (f"SELECT value::json ->> 'role' INTO decider FROM {s}.meta "
               f"WHERE key = 'decider'")
    return [
        f"ALTER TABLE {s}.runs ADD COLUMN created_by text, ADD COLUMN written_by text",
        f"""CREATE FUNCTION {s}.run_writer() RETURNS trigger LANGUAGE plpgsql AS $fn$
            BEGIN
                IF TG_OP = 'INSERT' THEN
                    NEW.created_by := session_user;
                    NEW.written_by := session_user;
                ELSE
                    NEW.created_by := OLD.created_by;
                    NEW.written_by := CASE WHEN NEW.record IS DISTINCT FROM OLD.record
                                      THEN session_user ELSE OLD.written_by END;
                END IF;
                RETURN NEW;
            END
            $fn$""",
        f"""CREATE TRIGGER runs_writer BEFORE INSERT OR UPDATE ON {s}.runs
            FOR EACH ROW EXECUTE PROCEDURE {s}.run_writer()""",
        f"""CREATE FUNCTION {s}.guard_decision() RETURNS trigger LANGUAGE plpgsql AS $fn$
            DECLARE
                decider text;
            BEGIN
                IF NEW.kind NOT LIKE 'decision%' AND
                        (TG_OP = 'INSERT' OR OLD.kind NOT LIKE 'decision%') THEN
                    RETURN NEW;
                END IF;
                {decider};
                IF decider IS NULL OR pg_has_role(session_user, decider, 'MEMBER') THEN
                    RETURN NEW;
                END IF;
                IF TG_OP = 'UPDATE' AND OLD.kind = NEW.kind AND OLD.run_id = NEW.run_id
                        AND OLD.value::jsonb ->> 'taken_at' IS NULL
                        AND NEW.value::jsonb - 'taken_at' = OLD.value::jsonb - 'taken_at' THEN
                    RETURN NEW;  -- the run takes the decision the decider wrote
                END IF;
                IF TG_OP = 'INSERT' AND NEW.value::jsonb ->> 'via' = 'timeout'
                        AND NEW.value::jsonb -> 'approved' = 'false'::jsonb THEN
                    RETURN NEW;  -- a deadline's rejection only stops a run
                END IF;
                {refuse};
            END
            $fn$""",
        f"""CREATE TRIGGER requests_decider BEFORE INSERT OR UPDATE ON {s}.requests
            FOR EACH ROW EXECUTE PROCEDURE {s}.guard_decision()""",
        f"""CREATE FUNCTION {s}.guard_approval_step() RETURNS trigger LANGUAGE plpgsql AS $fn$
            DECLARE
                decider text;
                step json;
            BEGIN
                -- Every step passes here: parsed only when a decider is named and this is
                -- not it (a substring test would be fooled by JSON's escapes).
                {decider};
                IF decider IS NULL OR pg_has_role(session_user, decider, 'MEMBER') THEN
                    RETURN NEW;
                END IF;
                -- json, not jsonb: a step's data may hold an escaped NUL, which jsonb
                -- refuses. Only a failed step ("ok": false) is not an approval given.
                step := NEW.entry::json;
                IF step ->> 'k' IS DISTINCT FROM 'approval' OR step ->> 'ok' = 'false' THEN
                    RETURN NEW;
                END IF;
                IF EXISTS (SELECT 1 FROM {s}.requests AS r WHERE r.run_id = NEW.run_id
                        AND r.kind LIKE 'decision%'
                        AND r.value::json ->> 'taken_at' IS NOT NULL
                        AND r.value::json ->> 'digest' = step -> 'r' ->> 'digest'
                        AND r.value::json ->> 'approved' = step -> 'r' ->> 'approved'
                        AND r.value::json ->> 'by' IS NOT DISTINCT FROM step -> 'r' ->> 'by')
                        THEN
                    RETURN NEW;
                END IF;
                {refuse};
            END
            $fn$""",
        f"""CREATE TRIGGER steps_approval BEFORE INSERT ON {s}.steps
            FOR EACH ROW EXECUTE PROCEDURE {s}.guard_approval_step()""",
        # A decision link decides as the person it was sent to: only the decider issues
        # and uses one (its record under ``link/``), so nobody else names a recipient; and
        # only the decider claims a notification, so nobody keeps the team's from being
        # sent by claiming it first. Everyone adds to a run's history (``history/``) and claims
        # an escalation once (its approvers are the request's own, which its run wrote).
        f"""CREATE FUNCTION {s}.guard_delivery() RETURNS trigger LANGUAGE plpgsql AS $fn$
            DECLARE
                decider text;
            BEGIN
                IF TG_OP = 'INSERT' AND (NEW.key LIKE 'history/%'
                                         OR NEW.key LIKE '%/escalation') THEN
                    RETURN NEW;
                END IF;
                {decider};
                IF decider IS NULL OR pg_has_role(session_user, decider, 'MEMBER') THEN
                    RETURN NEW;
                END IF;
                {refuse.replace("writes decisions", "sends notifications and decision links")};
            END
            $fn$""",
        f"""CREATE TRIGGER deliveries_decider BEFORE INSERT OR UPDATE ON {s}.deliveries
            FOR EACH ROW EXECUTE PROCEDURE {s}.guard_delivery()""",
    ]


def _owner_migration(s: str) -> list[str]:
    """Once a decider is named, what governs a decision is out of every user role's reach
    (closing what review found in :func:`_decider_migration`):

    - a run's row (its record, with the request's approvers' list and four-eyes) is written
      and deleted only by the role that created it, and its steps and stored inputs
      (``blobs``) are written, moved and deleted only by that role: another user cannot
      clear the policy a request of someone else's run is checked against, nor rewrite or
      move away its past;
    - only the decider writes a decision of any kind, a deadline's rejection too, and claims
      an escalation (whose approvers then decide): the service is the team's one sweeper;
      only the run's creator takes a decision (stamps ``taken_at``);
    - an approval step a user role journals (inserted or updated) repeats a decision the
      decider wrote at that step (the decision's ``key`` is the step's ``id``) and the run
      took, with its content: digest, approved, by, note, args, message, answer; the
      decision is the run's own or, for a copy (a fork kept by a re-run, ``copy_run``),
      one of a run the same role created;
    - nothing a user role deletes erases a decision or a history: no role but the decider
      deletes a decision or a delivery (history, links, claims); a run's pending requests
      (cancel, answers) are deleted only by its creator or the decider;
    - a user role adds to a run's history only the events a user's process writes on a hub
      (``refused``), each stamped with the login role that wrote it (``writer``).

    Every trigger function runs with ``search_path`` pinned to ``pg_catalog, pg_temp``:
    a role that can create objects somewhere cannot shadow a function, operator or type
    the checks use. (PostgreSQL 11 or newer: :func:`run_writer` reads ``OLD`` on INSERT.)

    A run whose creator the database does not know (one from before
    :func:`_decider_migration`) is written only by the decider. Without a decider nothing
    is checked, as before."""
    decider = (f"SELECT value::json ->> 'role' INTO decider FROM {s}.meta "
               f"WHERE key = 'decider'")
    not_decider = "decider IS NOT NULL AND NOT pg_has_role(session_user, decider, 'MEMBER')"

    def refuse(what: str, *args: str) -> str:
        text = what.replace("'", "''")
        return (f"RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege', MESSAGE = "
                f"format('{text}', {', '.join(args)})")

    not_owner = refuse("run %s was started by the role %s: only that role and %s (the "
                       "durable-nb hub service) write or delete its record and steps, not %s",
                       "run", "coalesce(owner, 'unknown')", "decider", "session_user")
    # The same field of a decision and of a step's result: absent and JSON null alike.
    same = " AND ".join(
        f"nullif(r.value::jsonb -> '{field}', 'null') IS NOT DISTINCT FROM "
        f"nullif((step -> 'r' -> '{field}')::jsonb, 'null')"
        for field in ("note", "args", "message", "answer"))
    matches = f"""r.kind LIKE 'decision%'
                        AND r.value::json ->> 'taken_at' IS NOT NULL
                        AND r.value::json ->> 'key' = step ->> 'id'
                        AND r.value::json ->> 'digest' = step -> 'r' ->> 'digest'
                        AND r.value::json ->> 'approved' = step -> 'r' ->> 'approved'
                        AND r.value::json ->> 'by' IS NOT DISTINCT FROM step -> 'r' ->> 'by'
                        AND {same}"""
    functions = ("run_status()", "run_writer()", "guard_decision()", "guard_approval_step()",
                 "guard_delivery()", "guard_run_steps()", "append_step(text, integer, text, "
                 "text, text, text[], text[])", "put_run(text, double precision, text, text)")
    return [
        f"""CREATE OR REPLACE FUNCTION {s}.run_writer() RETURNS trigger LANGUAGE plpgsql
            AS $fn$
            DECLARE
                decider text;
                run text := OLD.run_id;
                owner text := OLD.created_by;
            BEGIN
                IF TG_OP = 'INSERT' THEN
                    NEW.created_by := session_user;
                    NEW.written_by := session_user;
                    RETURN NEW;
                END IF;
                {decider};
                IF {not_decider} AND owner IS DISTINCT FROM session_user THEN
                    {not_owner};
                END IF;
                IF TG_OP = 'DELETE' THEN
                    RETURN OLD;
                END IF;
                NEW.created_by := OLD.created_by;
                NEW.written_by := CASE WHEN NEW.record IS DISTINCT FROM OLD.record
                                  THEN session_user ELSE OLD.written_by END;
                RETURN NEW;
            END
            $fn$""",
        f"""CREATE TRIGGER runs_owner BEFORE DELETE ON {s}.runs
            FOR EACH ROW EXECUTE PROCEDURE {s}.run_writer()""",
        # A step or stored input is its run's creator's to write, move or delete (both runs'
        # creator's, for an update that moves it); a run with no row yet (its first append
        # writes it) has nothing to protect.
        f"""CREATE FUNCTION {s}.guard_run_steps() RETURNS trigger LANGUAGE plpgsql AS $fn$
            DECLARE
                decider text;
                run text;
                owner text;
            BEGIN
                {decider};
                IF {not_decider} THEN
                    FOREACH run IN ARRAY CASE TG_OP WHEN 'DELETE' THEN ARRAY[OLD.run_id]
                            WHEN 'INSERT' THEN ARRAY[NEW.run_id]
                            ELSE ARRAY[OLD.run_id, NEW.run_id] END LOOP
                        SELECT created_by INTO owner FROM {s}.runs WHERE run_id = run;
                        IF FOUND AND owner IS DISTINCT FROM session_user THEN
                            {not_owner};
                        END IF;
                    END LOOP;
                END IF;
                RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
            END
            $fn$""",
        f"""CREATE TRIGGER steps_owner BEFORE INSERT OR UPDATE OR DELETE ON {s}.steps
            FOR EACH ROW EXECUTE PROCEDURE {s}.guard_run_steps()""",
        f"""CREATE TRIGGER blobs_owner BEFORE INSERT OR UPDATE OR DELETE ON {s}.blobs
            FOR EACH ROW EXECUTE PROCEDURE {s}.guard_run_steps()""",
        f"""CREATE OR REPLACE FUNCTION {s}.guard_approval_step() RETURNS trigger
            LANGUAGE plpgsql AS $fn$
            DECLARE
                decider text;
                step json;
            BEGIN
                -- Every step passes here: parsed only when a decider is named and this is
                -- not it (a substring test would be fooled by JSON's escapes).
                {decider};
                IF NOT ({not_decider}) THEN
                    RETURN NEW;
                END IF;
                -- json, not jsonb: a step's data may hold an escaped NUL, which jsonb
                -- refuses. Only a failed step ("ok": false) is not an approval given.
                step := NEW.entry::json;
                IF step ->> 'k' IS DISTINCT FROM 'approval' OR step ->> 'ok' = 'false' THEN
                    RETURN NEW;
                END IF;
                IF EXISTS (SELECT 1 FROM {s}.requests AS r WHERE r.run_id = NEW.run_id
                        AND {matches}) THEN
                    RETURN NEW;
                END IF;
                -- A copy of one of her runs (a fork kept by "re-run from here", copy_run)
                -- repeats the decisions its source took.
                IF EXISTS (SELECT 1 FROM {s}.requests AS r JOIN {s}.runs AS source
                        ON source.run_id = r.run_id AND source.created_by = session_user
                        WHERE {matches}) THEN
                    RETURN NEW;
                END IF;
                {refuse("only the role %s (the durable-nb hub service) writes decisions in "
                        "this journal, not %s: an approval step repeats a decision it wrote "
                        "for this run and step, which the run took", "decider",
                        "session_user")};
            END
            $fn$""",
        f"DROP TRIGGER steps_approval ON {s}.steps",
        f"""CREATE TRIGGER steps_approval BEFORE INSERT OR UPDATE ON {s}.steps
            FOR EACH ROW EXECUTE PROCEDURE {s}.guard_approval_step()""",
        f"""CREATE OR REPLACE FUNCTION {s}.guard_decision() RETURNS trigger
            LANGUAGE plpgsql AS $fn$
            DECLARE
                decider text;
            BEGIN
                {decider};
                IF NOT ({not_decider}) THEN
                    RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
                END IF;
                IF TG_OP = 'DELETE' THEN
                    IF OLD.kind LIKE 'decision%' THEN
                        {refuse("only the role %s (the durable-nb hub service) deletes a "
                                "decision, not %s", "decider", "session_user")};
                    END IF;
                    IF EXISTS (SELECT 1 FROM {s}.runs WHERE run_id = OLD.run_id
                               AND created_by IS DISTINCT FROM session_user) THEN
                        {refuse("only the role that started run %s and %s (the durable-nb "
                                "hub service) delete its requests, not %s", "OLD.run_id",
                                "decider", "session_user")};
                    END IF;
                    RETURN OLD;
                END IF;
                IF NEW.kind NOT LIKE 'decision%' AND
                        (TG_OP = 'INSERT' OR OLD.kind NOT LIKE 'decision%') THEN
                    RETURN NEW;
                END IF;
                IF TG_OP = 'UPDATE' AND OLD.kind = NEW.kind AND OLD.run_id = NEW.run_id
                        AND OLD.value::jsonb ->> 'taken_at' IS NULL
                        AND NEW.value::jsonb - 'taken_at' = OLD.value::jsonb - 'taken_at'
                        AND EXISTS (SELECT 1 FROM {s}.runs WHERE run_id = NEW.run_id
                                    AND created_by = session_user) THEN
                    RETURN NEW;  -- the run takes the decision the decider wrote
                END IF;
                {refuse("only the role %s (the durable-nb hub service) writes decisions in "
                        "this journal, not %s: decide through the service",
                        "decider", "session_user")};
            END
            $fn$""",
        f"""CREATE TRIGGER requests_delete BEFORE DELETE ON {s}.requests
            FOR EACH ROW EXECUTE PROCEDURE {s}.guard_decision()""",
        # A user's process adds to a run's history only its own refusals, stamped with the
        # role that wrote them; everything else in this store (links, claims of
        # notifications and escalations) is the decider's, and nothing here is deleted but
        # by it.
        f"""CREATE OR REPLACE FUNCTION {s}.guard_delivery() RETURNS trigger
            LANGUAGE plpgsql AS $fn$
            DECLARE
                decider text;
                event json;
            BEGIN
                {decider};
                IF NOT ({not_decider}) THEN
                    RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
                END IF;
                IF TG_OP = 'INSERT' AND NEW.key LIKE 'history/%' THEN
                    event := NEW.value::json;
                    IF json_typeof(event) = 'object' AND event ->> 'kind' = 'refused' THEN
                        -- json, not jsonb (an event's text may hold an escaped NUL): the
                        -- object with one more member, which a JSON reader takes as the
                        -- last of duplicate names.
                        NEW.value := left(rtrim(NEW.value, E' \\t\\r\\n'), -1) || ', "writer": '
                                     || to_json(session_user::text)::text || '}}';
                        RETURN NEW;
                    END IF;
                    {refuse("%s adds to a run's history only the refusals its processes "
                            "meet, not an event of kind %s: the durable-nb hub service "
                            "(%s) records the rest", "session_user",
                            "coalesce(event ->> 'kind', 'none')", "decider")};
                END IF;
                IF TG_OP = 'DELETE' THEN
                    {refuse("only the role %s (the durable-nb hub service) deletes a run's "
                            "history, links and notifications, not %s", "decider",
                            "session_user")};
                END IF;
                {refuse("only the role %s (the durable-nb hub service) sends notifications, "
                        "decision links and escalations in this journal, not %s", "decider",
                        "session_user")};
            END
            $fn$""",
        f"""CREATE TRIGGER deliveries_delete BEFORE DELETE ON {s}.deliveries
            FOR EACH ROW EXECUTE PROCEDURE {s}.guard_delivery()""",
        *(f"ALTER FUNCTION {s}.{function} SET search_path = pg_catalog, pg_temp"
          for function in functions),
    ]


#: The names of the schema migrations, in order (version N is ``MIGRATIONS[N - 1]``).
MIGRATIONS = [name for name, _ in _migrations(quoted(DEFAULT_SCHEMA))]
#: The format version of the entries and records; the same wire format as the disk journal.
FORMAT_VERSION = 2


def _lock_key(schema: str) -> int:
    digest = hashlib.sha256(f"durable_nb migrations {schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class PgSchema:
    """The schema part of :class:`~durable_nb.journal.postgres.PostgresJournal`: opening,
    migrating and checking its schema, and its statements."""

    @staticmethod
    def _statements(s: str) -> dict[str, str]:
        return {
            "find_run": f"SELECT record, created_by FROM {s}.runs WHERE run_id = %s",
            "create_run": f"INSERT INTO {s}.runs (run_id, created_at, record) VALUES (%s, %s, %s) "
                          f"ON CONFLICT DO NOTHING",
            "put_run": f"SELECT {s}.put_run(%s, %s, %s, %s)",
            # Ids from a prefix to the end of its range (prefix_end): byte order, COLLATE "C".
            # The start of a listing: _listing adds the status filter, order and limit.
            "list_runs": f"SELECT r.run_id, r.record, r.created_by FROM {s}.runs AS r "
                         f"WHERE r.run_id >= %s AND r.run_id < %s",
            "list_runs_counted": f"SELECT r.run_id, r.record, r.created_by, "
                                 f"(SELECT max(position) FROM {s}.steps "
                                 f"WHERE run_id = r.run_id) FROM {s}.runs AS r "
                                 f"WHERE r.run_id >= %s AND r.run_id < %s",
            "count_runs": f"SELECT status, count(*) FROM {s}.runs WHERE run_id >= %s "
                          f"AND run_id < %s GROUP BY status",
            "count_all_runs": f"SELECT key, value::bigint FROM {s}.run_counts, "
                              f"jsonb_each_text(counts) WHERE value::bigint > 0",
            "put_batch": f"INSERT INTO {s}.batches (batch_id, created_at, record) VALUES (%s, %s, %s) "
                         f"ON CONFLICT (batch_id) DO UPDATE SET record = EXCLUDED.record",
            "find_batch": f"SELECT record FROM {s}.batches WHERE batch_id = %s",
            "list_batches": f"SELECT batch_id, record FROM {s}.batches ORDER BY created_at, batch_id",
            "get_step": f"SELECT entry FROM {s}.steps WHERE run_id = %s AND position = %s",
            "has_step": f"SELECT 1 FROM {s}.steps WHERE run_id = %s AND position = %s",
            "steps": f"SELECT position, entry FROM {s}.steps WHERE run_id = %s AND position >= %s "
                     f"ORDER BY position LIMIT {BATCH}",
            "count_steps": f"SELECT max(position) FROM {s}.steps WHERE run_id = %s",
            "append_step": f"SELECT {s}.append_step(%s, %s, %s, %s, %s, %s, %s)",
            "truncate": f"DELETE FROM {s}.steps WHERE run_id = %s AND position >= %s",
            "insert_step": f"INSERT INTO {s}.steps (run_id, position, entry) VALUES (%s, %s, %s)",
            "drop_blobs": f"DELETE FROM {s}.blobs WHERE run_id = %s AND digest = ANY(%s)",
            "update_record": f"UPDATE {s}.runs SET record = %s WHERE run_id = %s",
            **{f"rename_{table}": f"UPDATE {s}.{table} SET run_id = %s WHERE run_id = %s"
               for table in ("steps", "blobs")},
            "get_blob": f"SELECT value FROM {s}.blobs WHERE run_id = %s AND digest = %s",
            "lease": f"SELECT holder, extract(epoch FROM now() - heartbeat_at)::float8 "
                     f"FROM {s}.leases WHERE run_id = %s",
            "lease_for_share": f"SELECT token FROM {s}.leases WHERE run_id = %s FOR SHARE",
            "lease_for_update": f"SELECT holder, extract(epoch FROM now() - heartbeat_at)::float8 "
                                f"FROM {s}.leases WHERE run_id = %s FOR UPDATE",
            "insert_lease": f"INSERT INTO {s}.leases (run_id, token, holder, heartbeat_at) "
                            f"VALUES (%s, %s, %s, now()) ON CONFLICT DO NOTHING",
            "replace_lease": f"UPDATE {s}.leases SET token = %s, holder = %s, heartbeat_at = now() "
                             f"WHERE run_id = %s",
            "renew_lease": f"UPDATE {s}.leases SET heartbeat_at = now() "
                           f"WHERE run_id = %s AND token = %s",
            "release_lease": f"DELETE FROM {s}.leases WHERE run_id = %s AND token = %s",
            # One statement, one transaction: the NOTIFY is delivered when the request is
            # committed, never before it can be read.
            "put_request": f"WITH written AS (INSERT INTO {s}.requests (run_id, kind, value) "
                           f"VALUES (%s, %s, %s) ON CONFLICT (run_id, kind) DO UPDATE "
                           f"SET value = EXCLUDED.value RETURNING run_id, kind) "
                           f"SELECT pg_notify(%s, json_build_object('run_id', run_id, "
                           f"'kind', kind)::text) FROM written",
            # Write-once: of writers racing, exactly one inserts (the others wait for its
            # commit and then do nothing); the NOTIFY goes with the one insert.
            "add_request": f"WITH written AS (INSERT INTO {s}.requests (run_id, kind, value) "
                           f"VALUES (%s, %s, %s) ON CONFLICT (run_id, kind) DO NOTHING "
                           f"RETURNING run_id, kind) "
                           f"SELECT pg_notify(%s, json_build_object('run_id', run_id, "
                           f"'kind', kind)::text) FROM written",
            # Compare and set, in one statement: the row is locked while it is compared.
            "swap_request": f"WITH written AS (UPDATE {s}.requests SET value = %s "
                            f"WHERE run_id = %s AND kind = %s AND value::jsonb = %s::jsonb "
                            f"RETURNING run_id, kind) "
                            f"SELECT pg_notify(%s, json_build_object('run_id', run_id, "
                            f"'kind', kind)::text) FROM written",
            # A rewind's: on a hub, a user role keeps the run's decisions (only the decider
            # deletes one); a decision is taken only under its request's id, which a
            # request asked anew after the rewind does not share.
            "delete_requests_rewound": f"DELETE FROM {s}.requests WHERE run_id = %s "
                                       f"AND (kind NOT LIKE 'decision%%' OR NOT EXISTS ("
                                       f"SELECT 1 FROM {s}.meta WHERE key = 'decider' AND NOT "
                                       f"pg_has_role(session_user, value::json ->> 'role', "
                                       f"'MEMBER')))",
            "get_request": f"SELECT value FROM {s}.requests WHERE run_id = %s AND kind = %s",
            "requests_of": f"SELECT run_id, kind, value FROM {s}.requests "
                           f"WHERE run_id = ANY(%s)",
            "leases_of": f"SELECT run_id, holder, "
                         f"extract(epoch FROM now() - heartbeat_at)::float8 "
                         f"FROM {s}.leases WHERE run_id = ANY(%s)",
            "deliveries_of": f"SELECT run_id, key, value FROM {s}.deliveries "
                             f"WHERE run_id = ANY(%s) ORDER BY run_id, key",
            "delete_request": f"DELETE FROM {s}.requests WHERE run_id = %s AND kind = %s",
            "add_delivery": f"INSERT INTO {s}.deliveries (run_id, key, value) VALUES (%s, %s, %s) "
                            f"ON CONFLICT DO NOTHING",
            "swap_delivery": f"UPDATE {s}.deliveries SET value = %s "
                             f"WHERE run_id = %s AND key = %s AND value = %s",
            "deliveries": f"SELECT key, value FROM {s}.deliveries WHERE run_id = %s ORDER BY key",
            **value_statements(s),
            **{f"delete_{table}": f"DELETE FROM {s}.{table} WHERE run_id = %s"
               for table in ("steps", "blobs", "leases", "requests", "deliveries", "runs")},
            "delete_batch": f"DELETE FROM {s}.batches WHERE batch_id = %s",
            # The journal's settings and own history: rows of meta under keys of their own
            # (setting/NAME, event/TIME-RANDOM); on a hub only the service's role writes meta.
            "get_meta": f"SELECT value FROM {s}.meta WHERE key = %s",
            "put_meta": f"INSERT INTO {s}.meta (key, value) VALUES (%s, %s) "
                        f"ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
            "add_meta": f"INSERT INTO {s}.meta (key, value) VALUES (%s, %s) "
                        f"ON CONFLICT DO NOTHING",
            "delete_meta": f"DELETE FROM {s}.meta WHERE key = %s",
            "journal_events": f"SELECT value FROM {s}.meta WHERE key LIKE 'event/%%' "
                              f"ORDER BY key COLLATE \"C\"",
            "size_on_disk": "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) "
                            "FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace "
                            "WHERE n.nspname = %s AND c.relkind = 'r'",
            "vacuum": f"VACUUM {s}.runs, {s}.steps, {s}.blobs, {s}.leases, {s}.requests, "
                      f"{s}.deliveries, {s}.batches, {s}.meta",
        }

    def _schema_version(self, conn: Any) -> int | None:
        """How many migrations the schema has, or None if it has no journal."""
        found = conn.execute("SELECT to_regclass(%s)", (f"{quoted(self.schema)}.migrations",)).fetchone()
        if found[0] is None:
            return None
        return conn.execute(f"SELECT coalesce(max(version), 0) FROM {quoted(self.schema)}.migrations"
                            ).fetchone()[0]

    def _refuse_newer(self, version: int) -> None:
        if version > len(MIGRATIONS):
            raise IncompatibleJournal(
                f"the journal at {self.location} has schema version {version}, newer than this "
                f"durable_nb understands ({len(MIGRATIONS)}). Upgrade durable_nb "
                f"(pip install -U 'durable-nb[postgres]') or use another schema (?schema=...).")

    def _open_schema(self, conn: Any) -> None:
        """Check the server, apply pending migrations (not when read-only), check the format."""
        encoding = conn.execute("SHOW server_encoding").fetchone()[0]
        if encoding.upper() not in ("UTF8", "SQL_ASCII"):
            raise JournalError(
                f"the database of the journal at {self.location} has encoding {encoding}; the "
                f"journal stores UTF-8 text. Use a database created with ENCODING 'UTF8'.")
        version = self._schema_version(conn)
        if version is None and self.read_only:
            raise JournalError(
                f"there is no journal at {self.location} (no schema {self.schema!r} with a "
                f"migrations table). Check the URL's database and ?schema=; a read-only journal "
                f"is never created.")
        if version is not None:
            self._refuse_newer(version)
        if version != len(MIGRATIONS):
            if self.read_only:
                raise JournalError(
                    f"the journal at {self.location} has schema version {version}, older than "
                    f"this durable_nb's {len(MIGRATIONS)}; open it once without read_only=True "
                    f"to migrate it.")
            self._migrate(conn)
        self._check_format(conn)

    def _migrate(self, conn: Any) -> None:
        s = quoted(self.schema)
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(self.schema),))
            # CREATE SCHEMA IF NOT EXISTS needs CREATE on the database even when the schema
            # is there: a role given only a schema of its own must not be asked for it.
            if conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s",
                            (self.schema,)).fetchone() is None:
                conn.execute(f"CREATE SCHEMA {s}")
            conn.execute(f"""CREATE TABLE IF NOT EXISTS {s}.migrations (
                version integer PRIMARY KEY, name text NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now())""")
            applied = conn.execute(f"SELECT coalesce(max(version), 0) FROM {s}.migrations"
                                   ).fetchone()[0]
            self._refuse_newer(applied)
            for version, (name, statements) in enumerate(_migrations(s), start=1):
                if version <= applied:
                    continue
                for statement in statements:
                    conn.execute(statement)
                conn.execute(f"INSERT INTO {s}.migrations (version, name) VALUES (%s, %s)",
                             (version, name))

    def _check_format(self, conn: Any) -> None:
        row = conn.execute(f"SELECT value FROM {quoted(self.schema)}.meta WHERE key = 'format'"
                           ).fetchone()
        try:
            version = json.loads(row[0])["version"] if row else None
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptEntry("format", f"unreadable format marker ({exc})") from None
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise IncompatibleJournal(
                f"the journal at {self.location} has format version {version!r}, newer than "
                f"this durable_nb understands ({FORMAT_VERSION}). Upgrade durable_nb "
                f"(pip install -U 'durable-nb[postgres]') or use another schema (?schema=...).")
