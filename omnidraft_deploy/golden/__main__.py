"""``python -m omnidraft_deploy.golden``: write the golden files (``golden.write``)."""

from omnidraft_deploy.golden.write import main

raise SystemExit(main())
