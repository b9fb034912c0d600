import sys

from edgemux.cli.main import main

sys.exit(main())
