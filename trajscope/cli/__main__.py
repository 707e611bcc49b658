"""``python -m trajscope.cli``: the same as the ``trajscope`` command."""

import sys

from trajscope.cli import main

sys.exit(main())
