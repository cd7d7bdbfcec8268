import os
import sys

# Let the tests import calc.py from the project root without installing it.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
