"""`python -m radixlm` runs the `radixlm` command."""

import sys

from radixlm.cli import main

sys.exit(main())
