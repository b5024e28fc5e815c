"""python -m studio: the command line (studio.cli)."""

from studio.cli import main

raise SystemExit(main())
