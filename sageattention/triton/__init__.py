"""Triton kernels: fused quantization (`quant`) and quantized attention (`attention`), glued by `pipeline`."""
