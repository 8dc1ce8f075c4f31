"""Logging helpers kept for scripts that import them."""
import logging

__all__ = ["reset_logger_handler"]


def reset_logger_handler() -> None:
    """Removes every handler of the root logger (for scripts whose other
    libraries installed handlers that garble the output format)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
