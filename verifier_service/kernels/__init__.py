"""Kernel-launch helpers below every other verifier floor: attention, model and tensor-parallel kernels use them."""
