"""One room for an approval request's life, from ask to done.

- :mod:`.policy`: who may decide (approvers' list, four-eyes, a shared link), when it is due
  (deadline, escalation, reminders), and the one grammar of a duration: pure functions.
- :mod:`.request`: a request's identity (id and digest) and the decision left for it; the
  executor's take.
- :mod:`.decide`: :func:`~.decide.decide`, the one way in for every path that decides.
- :mod:`.authority`: on a JupyterHub set up for it, whether this process writes a decision
  or hands it to the hub's service (:mod:`durable_nb.hub`), checked by :func:`~.decide.decide`.
- :mod:`.tick`: :func:`~.tick.tick`, what time makes due, applied by whoever sweeps.
- :mod:`.state`: what a waiting run amounts to, read without writing (``runs``, ``show``).
- :mod:`.links`: single-use decision links, deciding through :func:`~.decide.decide`.
- :mod:`.history`: the run's history of what people and policies did.
- :mod:`.wording`: the one wording of a decision.

Layers: this package imports only :mod:`durable_nb.journal`, :mod:`durable_nb.errors` and
:mod:`durable_nb.timestamps`. It sits above the journal and below :mod:`durable_nb.execution`
(whose waiting code asks, waits for and takes decisions with it) and everything above that.
It never imports :mod:`durable_nb.notify`, which imports it: :func:`~.tick.tick` hands
reminders and lapsed notices to the notification layer through a listener its caller passes.
"""
