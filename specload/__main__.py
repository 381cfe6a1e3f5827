import sys

from specload.cli import main

sys.exit(main())
