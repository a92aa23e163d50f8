"""Separation of duties on JupyterHub: decisions written only by a hub-managed service.

Without a hub nothing here applies: a journal names no decider role
(:meth:`~durable_nb.journal.Journal.decision_authority`) and whoever can write it decides,
as the threat model's "advisory" wording says. On a hub set up as the deployment page
describes, three parts hold the rule:

- the **database** (:mod:`durable_nb.journal.pg_schema`'s last migration, the grants of
  :meth:`~durable_nb.journal.PostgresJournal.become_decider`): only the decider role writes
  a decision (a deadline's too), claims an escalation or a notification, and deletes a
  decision or a history; the users' roles park, read, resume and take decisions, each
  writing only the runs it created (the database records which role that is);
- the **service** (:mod:`durable_nb.hub.service`), started by the hub at
  ``/services/durable-nb/`` and logging in as the decider role: it decides as the hub user
  the hub's OAuth or a hub API token names, with the starter read from the database and the
  addresses from the administrator's configuration (:mod:`durable_nb.hub.config`);
- **every other process** (a kernel, a panel, the CLI, a single-user server's REST API):
  :func:`~durable_nb.approvals.authority.decided_elsewhere` sends its decision to the service with
  the hub API token its server was given, or refuses it when there is none.

That check lives in the approvals room (:mod:`durable_nb.approvals.authority`, called by
its one :func:`~durable_nb.approvals.decide.decide`), so every path goes through it; this
package (the service and its configuration) sits on top of everything.
"""
