"""`python -m radixlm.plan SUBCOMMAND ...` (same as `radixlm plan SUBCOMMAND ...`)."""

from __future__ import annotations

import sys

from radixlm.plan.cli import main

sys.exit(main())
