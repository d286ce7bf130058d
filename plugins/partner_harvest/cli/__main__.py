import sys

from partner_harvest.cli import main

sys.exit(main())
