"""Executing a run's steps: their identity (:mod:`.scope`), the cursor that replays or runs
them (:mod:`.cursor`), what they were asked (:mod:`.inputs`), the ordered, fenced writer
of their entries (:mod:`.writer`), an approval's request while it waits for a person
(:mod:`.asking`) and the executions live in this process (:mod:`.live`)."""

from .cursor import (
    ChildStarter,
    Execution,
    NullObserver,
    Observer,
    Restart,
    Suspend,
    child_run_id,
    run_coroutine_here,
)
from .inputs import canonical, fingerprint, first_difference, load_request
from .scope import Scope, current_scope, enter, leave

__all__ = ["ChildStarter", "Execution", "NullObserver", "Observer", "Restart",
           "Scope", "Suspend", "canonical", "child_run_id", "current_scope", "enter",
           "fingerprint", "first_difference", "leave", "load_request", "run_coroutine_here"]
