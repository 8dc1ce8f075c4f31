"""fakequant.distill, the old import path of fakequant.models.distill: this module is that one;
importing it warns (DeprecationWarning). fakequant/_moved.py lists the moves."""
from typing import TYPE_CHECKING

from ._moved import alias

if TYPE_CHECKING:  # what a type checker sees; at run time this module is fakequant.models.distill
    from .models.distill import *  # noqa: F401,F403

alias(__name__)
