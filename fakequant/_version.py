# The one version string of fakequant: setup.py reads it (the package metadata
# and the compiled build information), fakequant.__version__ re-exports it.
__version__ = "0.2.0"
