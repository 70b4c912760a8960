"""Only what pyproject.toml cannot say: two top-level folders ship inside the package.

templates/ and configs/ sit at the top of the repository (the design card) and ship in the wheel as
emitter/templates and emitter/configs, found through importlib.resources (emitter/resources.py).
`packages.find` only finds folders under their own names, and [tool.setuptools.package-dir] does not
add a package to the list, which is why a wheel built from pyproject.toml alone held no templates.
Every folder below them ships by the package-data globs in pyproject.toml (new families included)."""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["emitter", "emitter.*"]) + ["emitter.templates", "emitter.configs"],
    package_dir={"emitter.templates": "templates", "emitter.configs": "configs"},
)
