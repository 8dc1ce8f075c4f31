"""The command line's checks of a build (``python -m fakequant``): ``info``'s self-check of every
operator against the rules in plain PyTorch (``self_check``), and ``gpu-check``'s run of the
kernels on this machine's GPU (``gpu_check``)."""
