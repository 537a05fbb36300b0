import os
import sys

# The tests import both the package under test and tests/harness from the checkout.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
