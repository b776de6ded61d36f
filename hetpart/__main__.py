"""``python -m hetpart``: the same command line as ``hetpart``."""
import sys

from hetpart.driver.cli import main

sys.exit(main())
