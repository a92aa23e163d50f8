"""Retention: old runs removed from a journal, by hand (``durable-nb prune``,
:func:`durable_nb.prune`) or by the journal's policy, which its sweep applies.

- :mod:`.policy`: what a prune removes (age, statuses, prefix) and the journal's policy;
- :mod:`.plan`: which runs are removed and which are kept, and why (pure Python);
- :mod:`.sweep`: a plan carried out under the runs' leases, recorded, the space given back;
  the policy applied by a sweeper;
- :mod:`.prune`: :func:`durable_nb.prune`, with an export of each run first.

This package's ``__init__`` imports nothing: the sweepers' part (:mod:`.sweep`, through
:func:`durable_nb.notify.sweeper.sweep_journal`) sits below the exports :mod:`.prune` uses.
Retention depends on the approvals' durations, never the approvals on retention.
"""
