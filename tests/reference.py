"""The plain-PyTorch reference of the contract lives in the package
(fakequant.reference, also used by `python -m fakequant info`)."""
from fakequant.reference import *  # noqa: F401,F403
from fakequant.reference import AMAX_EPSILON, amax_range, compute_dtype  # noqa: F401
