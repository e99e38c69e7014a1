"""The script agents' hook settings run: ``PYTHON -S .../gitlease/enforce/hookmain.py pre-edit claude``.

Run as a file, so that the command in the settings (which some agents show the model with a refusal) stays
short. Its own folder would come first on ``sys.path``; it is replaced by the folder holding ``gitlease``
before anything else is imported (``-S``: no site packages, the hook's fast start).
"""

import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gitlease.enforce.entry import main  # noqa: E402

main()
