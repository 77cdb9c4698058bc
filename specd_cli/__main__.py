"""`python -m specd_cli ...` is the `specd` command (the launcher starts each service this way)."""
import sys

from specd_cli.main import main

sys.exit(main())
