"""Shared pytest setup: hypothesis profile sized for a 2-core CI machine."""
import os

from hypothesis import settings

settings.register_profile("ci", max_examples=25, deadline=None)
settings.register_profile("dev", max_examples=10, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
