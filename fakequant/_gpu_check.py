"""fakequant._gpu_check, the old import path of fakequant._diagnostics.gpu_check: this module is that one;
silent (a private path). fakequant/_moved.py lists the moves."""
from typing import TYPE_CHECKING

from ._moved import alias

if TYPE_CHECKING:  # what a type checker sees; at run time this module is fakequant._diagnostics.gpu_check
    from ._diagnostics.gpu_check import *  # noqa: F401,F403

alias(__name__)
