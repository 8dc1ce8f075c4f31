"""python tools/expect_import_error.py [TEXT]: `import fakequant` must raise the ImportError
of a library built for another torch (naming TEXT, when given) before the operator library
fakequant._C loads. Exit status 0 when it does, 1 otherwise. Run by make two-envs and make
install-check with the Python of an environment whose torch differs from the build's."""
import sys

try:
    import fakequant  # noqa: F401
except ImportError as e:
    if "fakequant._C" in sys.modules:
        sys.exit(f"the ImportError came after the operator library loaded: {e}")
    if len(sys.argv) > 1 and sys.argv[1] not in str(e):
        sys.exit(f"the ImportError does not name {sys.argv[1]!r}: {e}")
    print(f"  ImportError: {e}")
    sys.exit(0)
sys.exit("import fakequant raised no error")
