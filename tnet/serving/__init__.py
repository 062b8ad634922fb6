"""Serving-side tools (`python -m tnet.serving.follow`)."""
