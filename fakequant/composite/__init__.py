"""The operators' rules written as plain-PyTorch composites: the rules themselves
(:mod:`fakequant.composite.rules`, production code: what ``torch.compile`` fuses, the only
implementation of the GGML and floating-point zero point rules, the exporters' scales and codes,
and what the tests compare the kernels to), and the compiled path that runs them under
``torch.compile`` (``compiled``: :func:`fakequant.set_compiled_path`, and the autograd function
around each rule)."""
