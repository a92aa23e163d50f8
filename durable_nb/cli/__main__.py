"""``python -m durable_nb.cli``: the ``durable-nb`` command."""

import sys

from .main import main

sys.exit(main())
