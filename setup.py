"""Package discovery for the two source folders; everything else is in pyproject.toml.

``privguard/`` holds the core and ``integrations/`` the package ``privguard.integrations``
(pyproject's ``package-dir``). Both are walked, so no subpackage can be left out.
"""
from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["privguard", "privguard.*"]), "privguard.integrations",
                *(f"privguard.integrations.{p}" for p in find_packages("integrations"))])
