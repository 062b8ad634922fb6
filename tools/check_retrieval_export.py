"""Checks a retrieval SavedModel without tnet: see tnet/serving/checks.py.

Kept for checkouts and scripts that call it by path; the code is
`tnet/serving/checks.py` (run here by path, so this process never imports tnet).
"""
import os
import runpy
import sys

sys.argv[0] = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "tnet", "serving", "checks.py")
runpy.run_path(sys.argv[0], run_name="__main__")
