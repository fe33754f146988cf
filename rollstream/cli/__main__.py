"""`python -m rollstream.cli`: the `rollstream` command, for a checkout without the console
script (tests and the demo's process group start their processes this way)."""

import sys

from rollstream.cli import main

sys.exit(main())
