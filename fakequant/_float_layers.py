"""fakequant._float_layers, the old import path of fakequant.models._float_layers: this module is that one;
silent (a private path). fakequant/_moved.py lists the moves."""
from typing import TYPE_CHECKING

from ._moved import alias

if TYPE_CHECKING:  # what a type checker sees; at run time this module is fakequant.models._float_layers
    from .models._float_layers import *  # noqa: F401,F403

alias(__name__)
