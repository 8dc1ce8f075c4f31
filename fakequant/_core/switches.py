"""fakequant._core.switches, the old import path of fakequant._core.export_state: this module is that one;
silent (a private path). fakequant/_moved.py lists the moves."""
from typing import TYPE_CHECKING

from .._moved import alias

if TYPE_CHECKING:  # what a type checker sees; at run time this module is fakequant._core.export_state
    from .export_state import *  # noqa: F401,F403

alias(__name__)
