"""`fairsim` (`cli`). Importing the Python API from here (`simulator.apps.run`, its old path)
still works: it lives in `simulator.api`."""

from simulator.api import *  # noqa: F403
from simulator.api import __all__  # noqa: F401
