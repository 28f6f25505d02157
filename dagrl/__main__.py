"""``python -m dagrl``: the same as the ``dagrl`` command."""

import sys

from dagrl.app.cli import command

sys.exit(command())
