import sys

from partner_harvest.cli import main

# Only as ``python -m partner_harvest.cli``: a plugins folder wrongly holding these sources
# makes Airflow execute this file as a module named ``__main__`` (the plugin then refuses
# to load and says why), and the command line must not run inside an Airflow process.
if __spec__ is not None and __spec__.name == "partner_harvest.cli.__main__":
    sys.exit(main())
