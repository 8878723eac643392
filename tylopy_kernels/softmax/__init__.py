"""Softmax kernels: one warp per row (``row``) and the streaming, online-softmax forms (``streaming``)."""
