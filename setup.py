"""Only what pyproject.toml cannot say: two top-level folders ship inside the package.

templates/ and configs/ sit at the top of the repository (the design card) and ship in the wheel as
emitter/templates and emitter/configs, found through importlib.resources (emitter/resources.py).
`packages.find` only finds folders under their own names, and [tool.setuptools.package-dir] does not
add a package to the list, which is why a wheel built from pyproject.toml alone held no templates.
Every folder below them (a new family's templates/<family>/, configs/<family>/) is found by globbing and
listed as a data package, so it ships without an edit here and setuptools does not warn about it."""

from setuptools import find_namespace_packages, find_packages, setup

DATA = {  # package: (folder, file patterns)
    "emitter.templates": ("templates", ["*.j2", "*.h", "*.cuh", "*.hpp", "*.in"]),
    "emitter.configs": ("configs", ["*.yaml", "*.yml", "*.md"]),
}

packages = find_packages(include=["emitter", "emitter.*"])
package_data = {}
for package, (folder, patterns) in DATA.items():
    for sub in [package] + [f"{package}.{p}" for p in find_namespace_packages(where=folder)]:
        packages.append(sub)
        package_data[sub] = patterns

setup(
    packages=packages,
    package_dir={package: folder for package, (folder, _) in DATA.items()},
    package_data=package_data,
)
