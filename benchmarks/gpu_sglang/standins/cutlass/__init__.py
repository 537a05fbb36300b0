"""GPU BENCHMARK STAND-IN for NVIDIA's CuTe DSL package ``cutlass`` -- not the real thing, never
installed by the sgl-probe wheel.

SGLang 0.5.23's Llama MLP imports ``sglang.kernels.ops.gemm.cutedsl_dual_gemm`` on every CUDA
device, which runs ``import cutlass`` at module level, although that kernel only runs on SM100
(Blackwell). The real package (with its CUDA 13 libraries) is larger than what travels to the
benchmark machine. Importing works; any real use raises (``CUTLASS_STANDIN missing ...``).
"""
from _sgl_bench_anything import install, module_getattr

__version__ = "0.0.0+benchmark.standin"
__getattr__ = module_getattr("CUTLASS", "cutlass")
install("cutlass", "CUTLASS")
